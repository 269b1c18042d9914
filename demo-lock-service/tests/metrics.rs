//! `GET /metrics` on a real lock service: grants, conflicts, expiries,
//! keepalives and releases. The only test in this binary, because it installs
//! the process's global recorder.

use std::time::Duration;

use demo_lock_service::{Config, LockService};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_shows_in_the_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let handle = demo_lock_service::install_prometheus().unwrap();
    let config = Config::new(dir.path()).with_metrics(handle);
    let running = LockService::open(config).unwrap().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = running.base_url();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let acquire = |name: &'static str, holder: &'static str, ttl_ms: u64| {
        http.post(format!("{base}/v1/leases"))
            .json(&json!({"name": name, "holder": holder, "ttl_ms": ttl_ms}))
            .send()
    };

    let a = acquire("a", "h1", 60_000).await.unwrap();
    assert_eq!(a.status(), StatusCode::CREATED);
    let lease: Value = a.json().await.unwrap();
    let lease_id = lease["lease_id"].as_str().unwrap();
    assert_eq!(acquire("a", "h2", 60_000).await.unwrap().status(), StatusCode::CONFLICT);
    let keepalive = http.post(format!("{base}/v1/leases/{lease_id}/keepalive")).send().await.unwrap();
    assert_eq!(keepalive.status(), StatusCode::OK);
    let release = http.delete(format!("{base}/v1/leases/{lease_id}")).send().await.unwrap();
    assert_eq!(release.status(), StatusCode::NO_CONTENT);
    // b's lease runs out; the next grant forgets it.
    assert_eq!(acquire("b", "h1", 50).await.unwrap().status(), StatusCode::CREATED);
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(acquire("b", "h2", 60_000).await.unwrap().status(), StatusCode::CREATED);

    let text = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for expected in [
        "lock_service_grants_total 3",
        "lock_service_conflicts_total 1",
        "lock_service_keepalives_total 1",
        "lock_service_releases_total 1",
        "lock_service_expiries_total 1",
        "# TYPE lock_service_grants_total counter",
    ] {
        assert!(lines.contains(&expected), "no line {expected:?} in:\n{text}");
    }
    running.shutdown().await.unwrap();
}
