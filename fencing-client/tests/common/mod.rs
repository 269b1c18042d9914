//! What the backend tests share beyond test-support: a real fenced resource and
//! a wait for a lease's cancellation. `tests/it` includes it as `common`; a test
//! file of its own can too (`mod common;`), and finds test-support's skip, free
//! port and proxy here as before.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::put;
use fencing_layer::{FencingLayer, FencingToken};
use tokio::time::Instant;

#[allow(unused_imports)]
pub use test_support::{Proxy, free_port, skip};

/// What the fenced resource stores: name → (body, the token that wrote it).
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
        .route("/docs/{name}", put(write).route_layer(FencingLayer::new())) // per route, as the README says
        .with_state(Arc::clone(&docs));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), docs)
}

/// `PUT {base}/docs/{name}` with `Fencing-Token: token`; the status.
pub async fn write_doc(base: &str, name: &str, token: u64, body: &str) -> u16 {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let req = fencing_client::header::fence_reqwest(http.put(format!("{base}/docs/{name}")), token);
    req.body(body.to_owned()).send().await.unwrap().status().as_u16()
}

/// Waits (at most `limit`) for the lease's cancellation; returns when it fired.
pub async fn cancelled_at(lease: &fencing_client::Lease, limit: Duration) -> Instant {
    tokio::time::timeout(limit, lease.cancelled()).await.expect("lease not cancelled in time");
    Instant::now()
}

/// A lease whose server stopped answering is lost by its local deadline at the
/// latest: its renewal fails (refused, reset or timed out) first, or the keeper's
/// deadline timer fires, which tokio may deliver a few ms late.
pub async fn lost_by_its_deadline(lease: &fencing_client::Lease) {
    use fencing_client::{LockError, LossReason};
    let limit = lease.deadline().saturating_duration_since(Instant::now()) + Duration::from_secs(1);
    let at = cancelled_at(lease, limit).await;
    assert!(!lease.is_valid());
    assert!(at <= lease.deadline() + Duration::from_millis(50), "{:?} after", at - lease.deadline());
    match lease.loss_reason() {
        Some(LossReason::RenewalFailed(LockError::Transport(_) | LockError::Timeout))
        | Some(LossReason::DeadlinePassed) => {}
        other => panic!("unexpected loss reason {other:?}"),
    }
}
