//! Two figures of replica claims (BENCHMARKS.md §13), against a loopback
//! PostgreSQL database of your choosing:
//!
//! 1. 1,000 slow requests (1 s each) inside at once on one replica whose pool
//!    has 4 connections: how many were inside together, and how long all took.
//! 2. The latency of a raise across 3 replicas when the lower token's
//!    requests have already left (every replica still holds its claim on it).
//!
//! Replicas are in-process (three layers, each with its own `PgSharedStore`,
//! pool and background session); requests are sent straight to the routers,
//! without sockets, so only the layer and the database are measured.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres fencing_bench
//! cargo run --release -p fencing-postgres --example claims_figures -- "host=127.0.0.1 user=postgres dbname=fencing_bench"
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use fencing_layer::FencingLayer;
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};
use tower::ServiceExt;

#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

fn replica(
    config: &fencing_postgres::PgConnect,
    inside: &Arc<Inside>,
) -> Result<Router, Box<dyn std::error::Error>> {
    let limits = PoolLimits { max_size: 4, ..PoolLimits::default() };
    let pool = fencing_postgres::pool(config.clone(), limits)?;
    let store = PgSharedStore::new(pool, config.clone(), PgFence::new());
    let inside = Arc::clone(inside);
    let handler = move |request: Request<Body>| {
        let inside = Arc::clone(&inside);
        async move {
            let slow = request.uri().query() == Some("slow");
            let now = inside.now.fetch_add(1, Ordering::SeqCst) + 1;
            inside.most.fetch_max(now, Ordering::SeqCst);
            if slow {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            inside.now.fetch_sub(1, Ordering::SeqCst);
            "ok"
        }
    };
    let layer = FencingLayer::new().drain_timeout(Duration::from_secs(10)).shared_store(store);
    Ok(Router::new().route("/r/{key}", post(handler)).route_layer(layer))
}

async fn send(router: &Router, uri: &str, token: u64) -> StatusCode {
    let request =
        Request::post(uri).header("fencing-token", token).body(Body::empty()).expect("a valid request");
    router
        .clone()
        .oneshot(request)
        .await
        .map(|response| response.status())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).ok_or("usage: claims_figures '<loopback PostgreSQL config>'")?;
    let config: fencing_postgres::PgConnect = url.parse()?;
    let loopback = config.config().get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => name == "127.0.0.1" || name == "localhost",
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !loopback {
        return Err("not a loopback database; refusing".into());
    }
    let pool = fencing_postgres::pool(config.clone(), PoolLimits::default())?;
    PgFence::new().migrate(&*pool.get().await?).await?;
    // Fresh keys for this run.
    let run = std::process::id();

    let inside = Arc::new(Inside::default());
    let replicas: Vec<Router> = (0..3).map(|_| replica(&config, &inside)).collect::<Result<_, _>>()?;

    // 1. 1,000 slow requests at once on one replica with a pool of 4.
    let started = Instant::now();
    let uri = format!("/r/slow-{run}?slow");
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let (router, uri) = (replicas[0].clone(), uri.clone());
            tokio::spawn(async move { send(&router, &uri, 1).await })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += usize::from(task.await? == StatusCode::OK);
    }
    println!(
        "1,000 slow requests (1 s each), one replica, pool of 4: {ok} answered 200, at most {} inside at once, all done in {:.2} s",
        inside.most.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64()
    );

    // 2. Raises across 3 replicas whose lower-token requests have left.
    let key = format!("/r/raise-{run}");
    let mut latencies = Vec::new();
    let mut refused = 0;
    for round in 0..200_u64 {
        let lower = 2 * round + 1;
        for router in &replicas {
            // Each replica claims the lower token; its request leaves at once.
            refused += usize::from(send(router, &key, lower).await != StatusCode::OK);
        }
        let raiser = &replicas[(round % 3) as usize];
        let started = Instant::now();
        let status = send(raiser, &key, lower + 1).await;
        latencies.push(started.elapsed());
        refused += usize::from(status != StatusCode::OK);
    }
    latencies.sort();
    println!(
        "a raise across 3 replicas, lower requests already left ({} raises, {refused} not 200): p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.9).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
    Ok(())
}
