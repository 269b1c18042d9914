//! What the backend tests share: a real fenced resource, a loopback TCP proxy that
//! can stop answering, and the loud skip when a server is not installed.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::put;
use fencing_layer::{FencingLayer, FencingToken};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// `None` after a loud SKIPPED line, unless `CI=true`: then the test fails.
pub fn skip<T>(what: &str) -> Option<T> {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true and {what}: these tests must run in CI");
    // Straight to stderr: the harness captures `eprintln!` of passing tests.
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {what} ***\n");
    None
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub type Docs = Arc<Mutex<HashMap<String, (String, u64)>>>;

/// `PUT /docs/{name}` stores the body with the token that wrote it; the layer rejects
/// stale tokens per path.
pub async fn fenced_resource() -> (String, Docs) {
    async fn write(
        State(docs): State<Docs>,
        Path(name): Path<String>,
        token: FencingToken,
        body: String,
    ) -> &'static str {
        docs.lock().unwrap().insert(name, (body, token.get()));
        "stored"
    }
    let docs = Docs::default();
    let app = Router::new()
        .route("/docs/{name}", put(write))
        .route_layer(FencingLayer::new())
        .with_state(Arc::clone(&docs));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), docs)
}

/// `PUT {base}/docs/{name}` with `Fencing-Token: token`; the status.
pub async fn write_doc(base: &str, name: &str, token: u64, body: &str) -> u16 {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let req = fencing_client::fence_reqwest(http.put(format!("{base}/docs/{name}")), token);
    req.body(body.to_owned()).send().await.unwrap().status().as_u16()
}

/// Waits (at most `limit`) for the lease's cancellation; returns when it fired.
pub async fn cancelled_at(lease: &fencing_client::Lease, limit: Duration) -> Instant {
    tokio::time::timeout(limit, lease.cancelled()).await.expect("lease not cancelled in time");
    Instant::now()
}

/// A loopback TCP proxy that forwards to `upstream` until `blackhole()`: then it cuts
/// every open connection and accepts new ones without ever answering.
pub struct Proxy {
    pub addr: SocketAddr,
    forwarding: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let forwarding = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (f, c) = (forwarding.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                if f.load(Ordering::SeqCst) {
                    let conn = tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                    c.lock().unwrap().push(conn);
                } else {
                    held.push(inbound);
                }
            }
        });
        Proxy { addr, forwarding, conns, accept }
    }

    pub fn blackhole(&self) {
        self.forwarding.store(false, Ordering::SeqCst);
        let conns: Vec<_> = self.conns.lock().unwrap().drain(..).collect();
        for c in conns {
            c.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.blackhole();
        self.accept.abort();
    }
}
