//! Shared test plumbing: an app to fence, a real server on 127.0.0.1, a raw HTTP/1.1 client.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::post;
use bytes::Bytes;
use fencing_layer::{FencingLayer, FencingToken, key::KeyExtractor, respond::RejectionResponder};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// One request the handler saw: the `{name}` path parameter and the token, if fenced.
pub type Write = (String, Option<u64>);

/// What the handler saw: one entry per request that reached it.
#[derive(Clone, Default)]
pub struct Writes(Arc<Mutex<Vec<Write>>>);

impl Writes {
    pub fn seen(&self) -> Vec<Write> {
        self.0.lock().unwrap().clone()
    }
}

/// `POST|PUT|DELETE|PATCH|GET|HEAD|OPTIONS|TRACE /logs/{name}`, recording the name and the token
/// the layer put into the extensions; fenced with `layer` through `route_layer`.
pub fn app<E, R>(layer: FencingLayer<E, R>) -> (Router, Writes)
where
    E: KeyExtractor<Body> + Clone + Send + Sync + 'static,
    R: RejectionResponder<Body> + Clone + Send + Sync + 'static,
{
    let writes = Writes::default();
    let record = writes.clone();
    let handler = move |Path(name): Path<String>, token: Option<FencingToken>| {
        let record = record.clone();
        async move {
            record.0.lock().unwrap().push((name, token.map(FencingToken::get)));
            "ok"
        }
    };
    let routes = post(handler.clone())
        .put(handler.clone())
        .delete(handler.clone())
        .patch(handler.clone())
        .get(handler.clone())
        .options(handler.clone())
        .trace(handler);
    (Router::new().route("/logs/{name}", routes).route_layer(layer), writes)
}

/// A server on an ephemeral loopback port; stopped when dropped.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(router: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self { addr, stop: Some(stop), task }
    }

    /// Sends one request on a fresh connection; every header in `headers` is sent as its own line.
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &[u8])]) -> Reply {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        let conn = tokio::spawn(conn);
        let mut request = Request::builder().method(method).uri(path).header("host", self.addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        let response =
            sender.send_request(request.body(Full::new(Bytes::from_static(b"x"))).unwrap()).await.unwrap();
        let reply = Reply::read(response).await;
        drop(sender);
        let _ = conn.await;
        reply
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        (&mut self.task).await.unwrap();
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub async fn read<B>(response: http::Response<B>) -> Self
    where
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Self { status: parts.status, headers: parts.headers, body }
    }

    /// The problem+json body; fails the test when the response is not one.
    pub fn problem(&self) -> serde_json::Value {
        assert_eq!(self.headers["content-type"], "application/problem+json", "{self:?}");
        let problem: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        assert_eq!(problem["status"], self.status.as_u16(), "{problem}");
        assert!(problem["type"].as_str().unwrap().starts_with("urn:fencing:problem:"));
        assert!(!problem["detail"].as_str().unwrap().is_empty());
        problem
    }
}

/// What happened inside the handler, in one total order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The handler started for `(key, token)`.
    Enter(u64, u64),
    /// The handler returned.
    Exit(u64, u64),
    /// The handler's future was dropped before it returned.
    Dropped(u64, u64),
}

/// A handler at `/r/{key}` that records its entry and exit, and can be held
/// inside until released, per token.
#[derive(Clone, Default)]
pub struct Probe {
    events: Arc<Mutex<Vec<Event>>>,
    gates: Arc<Mutex<std::collections::HashMap<u64, Arc<tokio::sync::Semaphore>>>>,
}

struct Inside {
    probe: Probe,
    key: u64,
    token: u64,
    done: bool,
}

impl Drop for Inside {
    fn drop(&mut self) {
        let event =
            if self.done { Event::Exit(self.key, self.token) } else { Event::Dropped(self.key, self.token) };
        self.probe.events.lock().unwrap().push(event);
    }
}

impl Probe {
    /// Requests with `token` stay inside the handler until [`release`](Self::release).
    pub fn hold(&self, token: u64) {
        self.gate(token);
    }

    pub fn release(&self, token: u64) {
        self.gate(token).close();
    }

    fn gate(&self, token: u64) -> Arc<tokio::sync::Semaphore> {
        let mut gates = self.gates.lock().unwrap();
        gates.entry(token).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(0))).clone()
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    pub fn router<E, R>(&self, layer: FencingLayer<E, R>) -> Router
    where
        E: KeyExtractor<Body> + Clone + Send + Sync + 'static,
        R: RejectionResponder<Body> + Clone + Send + Sync + 'static,
    {
        let probe = self.clone();
        let handler = move |Path(key): Path<u64>, token: FencingToken| {
            let probe = probe.clone();
            async move {
                let token = token.get();
                probe.events.lock().unwrap().push(Event::Enter(key, token));
                let mut inside = Inside { probe: probe.clone(), key, token, done: false };
                let gate = probe.gates.lock().unwrap().get(&token).cloned();
                if let Some(gate) = gate {
                    let _ = gate.acquire().await;
                }
                inside.done = true;
                "ok"
            }
        };
        Router::new().route("/r/{key}", post(handler)).route_layer(layer)
    }

    /// Sends `token`'s request for `key` through `router`, held inside the
    /// handler until [`release`](Self::release), and returns once it is inside.
    pub async fn spawn_held(&self, router: &Router, key: u64, token: u64) -> JoinHandle<Reply> {
        self.hold(token);
        let request = spawn_post(router, key, token);
        self.wait_for(Event::Enter(key, token)).await;
        request
    }

    /// Waits (on whatever clock the runtime has) until `event` has happened.
    pub async fn wait_for(&self, event: Event) {
        while !self.events().contains(&event) {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

/// A fenced POST to `/r/{key}` with `token`, through `oneshot`.
pub async fn post_token(router: &Router, key: u64, token: u64) -> Reply {
    use tower::ServiceExt;
    let request =
        Request::post(format!("/r/{key}")).header("fencing-token", token).body(Body::empty()).unwrap();
    Reply::read(router.clone().oneshot(request).await.unwrap()).await
}

/// [`post_token`] on a task of its own.
pub fn spawn_post(router: &Router, key: u64, token: u64) -> JoinHandle<Reply> {
    let router = router.clone();
    tokio::spawn(async move { post_token(&router, key, token).await })
}
