//! Two figures of replica claims on etcd (BENCHMARKS.md §16), against a
//! loopback etcd of your choosing:
//!
//! 1. The latency of a raise across 3 replicas when the lower token's
//!    requests have already left (every replica still holds its claim on it).
//! 2. What one replica's renewal (one keepalive of its lease, then a read of
//!    its claims and their marks) takes with N claims held (1,000, 5,000 and
//!    20,000 by default), and whether any claim lapsed.
//!
//! Replicas are in-process (three layers, each with its own `EtcdSharedStore`
//! and etcd connection); requests go straight to the routers, without sockets.
//! Everything lives under a prefix of the run's own (`etcd-claims/<pid>/`).
//!
//! ```sh
//! etcd --data-dir /tmp/etcd-bench &
//! cargo run --release -p fencing-etcd --example etcd_claims -- http://127.0.0.1:2379
//! ```

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use fencing_etcd::EtcdSharedStore;
use fencing_layer::FencingLayer;
use fencing_layer::store::SharedStore;
use tower::ServiceExt;

async fn replica(endpoint: &str, prefix: &str) -> Result<Router, Box<dyn std::error::Error>> {
    let store = EtcdSharedStore::connect([endpoint], prefix).await?;
    store.ready().await?;
    let layer = FencingLayer::new().drain_timeout(Duration::from_secs(10)).shared_store(store);
    Ok(Router::new().route("/r/{key}", post(|| async { "ok" })).route_layer(layer))
}

async fn send(router: &Router, uri: &str, token: u64) -> StatusCode {
    let request =
        Request::post(uri).header("fencing-token", token).body(Body::empty()).expect("a valid request");
    router
        .clone()
        .oneshot(request)
        .await
        .map_or(StatusCode::INTERNAL_SERVER_ERROR, |response| response.status())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

async fn raises(endpoint: &str, prefix: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(replica(endpoint, prefix).await?);
    }
    let mut latencies = Vec::new();
    let mut refused = 0;
    for round in 0..200_u64 {
        let lower = 2 * round + 1;
        for router in &replicas {
            // Each replica claims the lower token; its request leaves at once.
            refused += usize::from(send(router, "/r/raise", lower).await != StatusCode::OK);
        }
        let started = Instant::now();
        let status = send(&replicas[(round % 3) as usize], "/r/raise", lower + 1).await;
        latencies.push(started.elapsed());
        refused += usize::from(status != StatusCode::OK);
    }
    latencies.sort();
    println!(
        "a raise across 3 replicas, lower requests already left ({} raises, {refused} not 200): p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.9)),
        ms(percentile(&latencies, 0.99)),
        ms(latencies.last().copied().unwrap_or_default()),
    );
    Ok(())
}

/// One replica holds a request inside on each of `claims` keys for 10 s.
async fn renewals(endpoint: &str, prefix: &str, claims: usize) -> Result<(), Box<dyn std::error::Error>> {
    let store = EtcdSharedStore::connect([endpoint], prefix).await?;
    store.ready().await?;
    let started = Instant::now();
    let mut permits = Vec::with_capacity(claims);
    let keys: Vec<String> = (0..claims).map(|i| format!("/scale/{i}")).collect();
    for chunk in keys.chunks(64) {
        let admissions: Vec<_> =
            chunk.iter().map(|key| tokio::spawn(store.admit(key, 1, Duration::from_secs(10)))).collect();
        for admission in admissions {
            permits.push(admission.await?.map_err(|refusal| format!("{refusal:?}"))?);
        }
    }
    let taken = started.elapsed();
    // Past the setup's own load: every claim renewed at least once since.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (mut took, mut seen, mut asked) = (Vec::new(), None, 0);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let last = store.claims().last_renewal();
        if last != seen
            && let Some(report) = last
        {
            took.push(report.took);
            asked += report.claims;
            seen = last;
        }
    }
    took.sort();
    // A claim still valid admits its token in memory.
    let valid = keys.iter().filter(|key| matches!(store.try_admit(key, 1), Some(Ok(_)))).count();
    drop(permits);
    println!(
        "{claims} claims (taken in {:.1} s): {} renewals in 10 s, {:.0} claims each on average; took p50 {:.1} ms, max {:.1} ms; claims still valid: {valid} of {claims}",
        taken.as_secs_f64(),
        took.len(),
        asked as f64 / took.len().max(1) as f64,
        took.first().map_or(0.0, |_| ms(percentile(&took, 0.5))),
        ms(took.last().copied().unwrap_or_default()),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().ok_or("usage: etcd_claims http://127.0.0.1:2379 [claims...]")?;
    let url: axum::http::Uri = endpoint.parse()?;
    if !matches!(url.host(), Some("127.0.0.1" | "localhost" | "[::1]")) {
        return Err("not a loopback etcd; refusing".into());
    }
    let sizes: Vec<usize> = args.map(|n| n.parse()).collect::<Result<_, _>>()?;
    let sizes = if sizes.is_empty() { vec![1_000, 5_000, 20_000] } else { sizes };
    let run = std::process::id();
    raises(&endpoint, &format!("etcd-claims/{run}/raises/")).await?;
    for claims in sizes {
        renewals(&endpoint, &format!("etcd-claims/{run}/renewals-{claims}/"), claims).await?;
    }
    Ok(())
}
