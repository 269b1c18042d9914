//! Shared test plumbing: an app to fence, a real server on 127.0.0.1, a raw HTTP/1.1 client.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::post;
use bytes::Bytes;
use fencing_layer::{FencingLayer, FencingToken, KeyExtractor, RejectionResponder};
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
    let handler = move |Path(name): Path<String>, token: Option<axum::Extension<FencingToken>>| {
        let record = record.clone();
        async move {
            record.0.lock().unwrap().push((name, token.map(|t| t.0.get())));
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
        assert!(problem["type"].as_str().unwrap().starts_with(fencing_layer::PROBLEM_TYPE_PREFIX));
        assert!(!problem["detail"].as_str().unwrap().is_empty());
        problem
    }
}
