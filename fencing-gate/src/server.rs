//! Accepting connections and serving them: HTTP/1.1 and h2c on one port,
//! the gate's refusals before the layer, and a graceful shutdown.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use fencing_layer::Fencing;
use http::{Request, Response, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use pin_project_lite::pin_project;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_service::Service;

use crate::body::GateBody;
use crate::config::{Limits, Upgrades};
use crate::exchange::Shared;
use crate::forward::{self, Forwarder, Peer};
use crate::problem::GateProblem;
use crate::proxy::Proxy;
use crate::routes::RouteKeys;
use crate::tunnel;

/// What every connection's service shares.
pub(crate) struct Front {
    pub(crate) fenced: Fencing<Proxy, RouteKeys>,
    pub(crate) forwarder: Forwarder,
    pub(crate) limits: Limits,
    pub(crate) upgrades: Upgrades,
    pub(crate) shared: Arc<Shared>,
}

/// One connection's service: the gate's own checks, then the fenced proxy.
#[derive(Clone)]
struct Connection {
    front: Arc<Front>,
    peer: Arc<Peer>,
}

/// An upgrade passed through: rare enough to box.
type Tunnel = Pin<Box<dyn Future<Output = Response<GateBody>> + Send>>;

pin_project! {
    #[project = AnswerProj]
    enum Answer {
        Now { #[pin] response: Ready<Result<Response<GateBody>, Infallible>> },
        Fenced { #[pin] call: <Fencing<Proxy, RouteKeys> as Service<Request<Incoming>>>::Future },
        Tunnel { tunnel: Tunnel },
    }
}

impl Future for Answer {
    type Output = Result<Response<GateBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AnswerProj::Now { response } => response.poll(cx),
            AnswerProj::Fenced { call } => call.poll(cx),
            AnswerProj::Tunnel { tunnel } => tunnel.as_mut().poll(cx).map(Ok),
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for Connection {
    type Response = Response<GateBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, mut request: Request<Incoming>) -> Answer {
        let front = &self.front;
        let upgrade = request.headers().contains_key(header::UPGRADE);
        let refused = forward::refusal(&request, &front.limits).or_else(|| {
            (upgrade && front.upgrades == Upgrades::Refuse).then(|| {
                (GateProblem::UpgradeRefused, "upgrades are refused here ([forwarding] upgrades)".into())
            })
        });
        if let Some((problem, detail)) = refused {
            front.shared.metrics.refused(problem);
            return Answer::Now { response: ready(Ok(problem.response(detail))) };
        }
        if upgrade {
            let (front, peer) = (Arc::clone(front), Arc::clone(&self.peer));
            let tunnel = async move {
                tunnel::pass(Arc::clone(&front.shared), &front.forwarder, request, &peer).await
            };
            return Answer::Tunnel { tunnel: Box::pin(tunnel) };
        }
        front.forwarder.rewrite(&mut request, &self.peer);
        let mut fenced = front.fenced.clone();
        // The layer's readiness is the proxy's, which is always ready: asked, as
        // tower's contract wants, without a wait to wire up.
        let ready = fenced.poll_ready(&mut Context::from_waker(Waker::noop()));
        debug_assert!(ready.is_ready());
        Answer::Fenced { call: fenced.call(request) }
    }
}

/// Serves `listener` until `shutdown` completes, then stops accepting and
/// gives the requests inside up to `grace` to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    front: Arc<Front>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's own limits sit at or above the gate's, so that the gate answers
    // oversized headers itself (431 problem+json); past these, hyper does (431, bare).
    let limits = &front.limits;
    let mut http1 = builder.http1();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .max_buf_size(limits.max_header_bytes.saturating_mul(2).max(64 * 1024));
    // Left unset, hyper takes 100 into a buffer on the stack; set (even to 100),
    // it fills a buffer of that size on every request (about 1,600 instructions).
    if limits.max_header_count > 100 {
        http1.max_headers(limits.max_header_count);
    }
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes.saturating_mul(2)).unwrap_or(u32::MAX));
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // At the limit, stop accepting: new connections wait in the backlog.
        let room = tokio::select! {
            room = Arc::clone(&connections).acquire_owned() => room.expect("never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = Connection { front: Arc::clone(&front), peer: Arc::new(front.forwarder.peer(peer)) };
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, error = %error, "connection ended with an error");
            }
            drop(room);
        });
    }
    drop(listener);
    tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down: no new connections");
    let tasks = front.shared.tasks.clone();
    tasks.close();
    let finished = async {
        graceful.shutdown().await;
        tasks.wait().await;
    };
    match tokio::time::timeout(grace, finished).await {
        Ok(()) => tracing::info!("every request inside finished"),
        Err(_) => tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "requests still inside after the grace period"
        ),
    }
}
