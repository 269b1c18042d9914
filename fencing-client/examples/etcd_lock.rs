//! The etcd backend from code: two workers contend for one lock on etcd, and a fenced
//! resource refuses the first worker's write once the second holds the lock.
//!
//! ```text
//! cargo run -p fencing-client --features etcd --example etcd_lock -- http://127.0.0.1:2379
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::put;
use fencing_client::{EtcdLockClient, LockBackendExt, LockError};
use fencing_layer::{FencingLayer, FencingToken};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints: Vec<String> = std::env::args().skip(1).collect();
    let endpoints = if endpoints.is_empty() { vec!["http://127.0.0.1:2379".to_owned()] } else { endpoints };

    // A resource fenced by the layer: it keeps the last write and the token it came with.
    let doc: Arc<Mutex<String>> = Arc::default();
    let app = Router::new()
        .route(
            "/docs/report",
            put(|State(doc): State<Arc<Mutex<String>>>, token: FencingToken, body: String| async move {
                *doc.lock().unwrap() = format!("{body} (token {token})");
            })
            .route_layer(FencingLayer::new()), // on the route's method router, as the README places it
        )
        .with_state(Arc::clone(&doc));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/docs/report", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::builder().no_proxy().build()?;

    let locks = EtcdLockClient::connect(&endpoints).await?;
    let first = locks.lease("report", "worker-1", Duration::from_secs(10)).await?;
    println!(
        "worker-1 holds {:?}: token {}, etcd lease {}, granted ttl {:?}",
        locks.lock_key("report"),
        first.token(),
        first.lease_id(),
        first.grant().ttl
    );
    match locks.lease("report", "worker-2", Duration::from_secs(10)).await {
        Err(e @ LockError::Held { .. }) => println!("worker-2: {e}"),
        other => println!("worker-2: unexpected {other:?}"),
    }
    let r = first.fence_reqwest(http.put(&url).body("worker-1's report")).send().await?;
    println!("worker-1 writes with token {}: {}", first.token(), r.status());

    let stale = first.token();
    first.release().await?;
    let second = locks.lease("report", "worker-2", Duration::from_secs(10)).await?;
    println!("worker-1 released; worker-2 holds it with token {}", second.token());
    let r = second.fence_reqwest(http.put(&url).body("worker-2's report")).send().await?;
    println!("worker-2 writes with token {}: {}", second.token(), r.status());

    // worker-1, unaware it no longer holds the lock, writes again.
    let r =
        fencing_client::header::fence_reqwest(http.put(&url).body("worker-1, late"), stale).send().await?;
    println!("worker-1 writes late with token {stale}: {}", r.status());
    println!("the resource holds: {}", doc.lock().unwrap());
    second.release().await?;
    Ok(())
}
