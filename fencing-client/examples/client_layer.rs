//! `FencedClientLayer` around hyper-util's client, end to end on loopback: the demo lock
//! service and a fenced axum resource run in this process. A write goes out fenced; a slow
//! write is in flight when the lock service forgets the lease (as when it expires there
//! during a pause) and is cancelled; the next write is refused without being sent.
//!
//! ```text
//! cargo run -p fencing-client --example client_layer
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::routing::put;
use demo_lock_service::{Config, LockService};
use fencing_client::{DemoLockClient, LeaseOptions, LockBackendExt};
use fencing_layer::{FencingLayer, FencingToken};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let locks = LockService::open(Config::new(dir.path()))?.spawn("127.0.0.1:0".parse()?).await?;

    // The resource: fenced writes, one of them slow; it counts the requests it gets.
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    // The layer on each route's method router (clones share one store), as the README places it.
    let fencing = FencingLayer::new();
    let app = Router::new()
        .route(
            "/docs/report",
            put(|token: FencingToken| async move { format!("stored under token {token}") })
                .route_layer(fencing.clone()),
        )
        .route("/slow/report", put(|| tokio::time::sleep(Duration::from_secs(60))).route_layer(fencing))
        .layer(axum::middleware::map_request(move |request: axum::extract::Request| {
            count.fetch_add(1, Ordering::SeqCst);
            async move { request }
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let options = LeaseOptions::default().renew_every(Duration::from_millis(100));
    let lease = DemoLockClient::new(locks.base_url())?
        .lease_with("report", "worker-1", Duration::from_secs(10), options)
        .await?;
    let client = ServiceBuilder::new()
        .layer(lease.layer())
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let put = |path: &str| http::Request::put(format!("{base}{path}")).body(Full::new(Bytes::from("v2")));

    let response = client.clone().oneshot(put("/docs/report")?).await?;
    let status = response.status();
    println!(
        "write: {status} {}",
        String::from_utf8_lossy(&response.into_body().collect().await?.to_bytes())
    );

    let slow = tokio::spawn(client.clone().oneshot(put("/slow/report")?));
    tokio::time::sleep(Duration::from_millis(200)).await;
    locks.service().release(lease.lease_id()).await?;
    lease.cancelled().await;
    let lost = tokio::time::Instant::now();
    let error = slow.await?.unwrap_err();
    println!("slow write, in flight: {error} ({:?} after the loss)", lost.elapsed());

    let error = client.oneshot(put("/docs/report")?).await.unwrap_err();
    println!("next write: {error}");
    println!("requests the resource got: {}", served.load(Ordering::SeqCst));
    Ok(())
}
