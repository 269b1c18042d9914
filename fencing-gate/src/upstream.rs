//! The upstream's connections: HTTP/1.1, kept alive, the most recently used
//! first, on hyper's connection API.
//!
//! A connection goes back to the pool only when its last response has been
//! read to the end ([`Upstream`](crate::body::Upstream) hands it back); one
//! that broke, or whose response was left unread, is dropped. A request goes
//! out once, except when hyper hands it back unsent (a reused connection found
//! closed before a byte was written): then it goes once more, on a new
//! connection. A request that may have reached the upstream is never resent.
//!
//! Why not hyper-util's pooled client: it keys connections by scheme and host
//! with SipHash, and hands each connection back through a task of its own;
//! the gate has one upstream, so its pool is a stack behind a mutex held for a
//! push or a pop (with hyper's header buffer left on the stack, 53,300 → 46,100
//! instructions per fenced request through the gate, BENCHMARKS.md §18).

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How long an idle connection is kept (hyper-util's default, which the gate had before).
const IDLE: Duration = Duration::from_secs(60);

/// One upstream's idle keep-alive connections.
pub(crate) struct Pool {
    host: String,
    port: u16,
    /// `Host` for a request that came without one (an HTTP/1.0 client's).
    authority: HeaderValue,
    connect_timeout: Duration,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    sender: SendRequest<Incoming>,
    since: Instant,
}

/// A connection the request went out on; handed back with [`Pool::put`] once
/// its response has been read to the end.
pub(crate) type Sender = SendRequest<Incoming>;

/// Why an exchange failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be opened: nothing was sent.
    Connect(io::Error),
    /// The connection failed with the request on it: it may have been applied.
    Sent(hyper::Error),
}

impl Pool {
    /// A pool for `upstream` (`http://host[:port]`, checked by the config).
    pub(crate) fn new(upstream: &Uri, connect_timeout: Duration) -> Self {
        let host = upstream.host().unwrap_or("127.0.0.1");
        // `[::1]` in a URI, `::1` to connect to.
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = upstream.port_u16().unwrap_or(80);
        let authority = upstream.authority().map_or("127.0.0.1", |a| a.as_str());
        let authority = HeaderValue::from_str(authority).expect("an authority is a valid header value");
        Self { host, port, authority, connect_timeout, idle: Mutex::new(Vec::new()) }
    }

    /// Sends `request` (its URI in origin form) and returns the response head
    /// with the connection it came on.
    pub(crate) async fn send(
        &self,
        mut request: Request<Incoming>,
    ) -> Result<(Response<Incoming>, Sender), SendError> {
        if !request.headers().contains_key(header::HOST) {
            request.headers_mut().insert(header::HOST, self.authority.clone());
        }
        let (mut sender, reused) = match self.take() {
            Some(sender) => (sender, true),
            None => (self.connect().await?, false),
        };
        match sender.try_send_request(request).await {
            Ok(response) => Ok((response, sender)),
            Err(mut error) => match error.take_message() {
                // Unsent, on a connection that had gone: once more, on a new one.
                Some(request) if reused => {
                    let mut sender = self.connect().await?;
                    let response = sender.send_request(request).await.map_err(SendError::Sent)?;
                    Ok((response, sender))
                }
                _ => Err(SendError::Sent(error.into_error())),
            },
        }
    }

    /// Hands back a connection whose last response was read to the end.
    pub(crate) fn put(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|poison| poison.into_inner());
        // The oldest are at the front: those idle too long go (their upstream may close them anyway).
        let stale = idle.iter().take_while(|entry| now.duration_since(entry.since) > IDLE).count();
        idle.drain(..stale);
        idle.push(Idle { sender, since: now });
    }

    /// The most recently used idle connection that is open and ready.
    fn take(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|poison| poison.into_inner());
        let mut waiting = Vec::new();
        let mut found = None;
        while let Some(entry) = idle.pop() {
            if entry.sender.is_closed() || entry.since.elapsed() > IDLE {
                continue;
            }
            if entry.sender.is_ready() {
                found = Some(entry.sender);
                break;
            }
            // Its dispatcher has not yet seen its last response end: rare; it stays.
            waiting.push(entry);
        }
        idle.extend(waiting.into_iter().rev());
        found
    }

    /// Opens a connection, within the connect bound, and runs it on a task of its own.
    async fn connect(&self) -> Result<Sender, SendError> {
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(SendError::Connect(error)),
            Err(_) => {
                let detail = format!("connecting took over {} ms", self.connect_timeout.as_millis());
                return Err(SendError::Connect(io::Error::new(io::ErrorKind::TimedOut, detail)));
            }
        };
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| SendError::Connect(io::Error::other(error)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%error, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}
