//! `GET /metrics` on a real server: a stale write, then a scrape. The only test
//! in this binary, because it installs the process's global recorder.

use demo_resource::{Config, Resource, Served};
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_write_shows_in_the_scrape() {
    let handle = demo_resource::install_prometheus().unwrap();
    let resource = Resource::open(Config::in_memory()).unwrap().with_metrics(handle);
    let running = resource.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = running.base_url();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let write = |token: &'static str| {
        http.post(format!("{base}/logs/orders")).header("fencing-token", token).body("x").send()
    };
    // Before any request, every series is there at zero: an alert on
    // `increase(...{outcome="stale"}[5m]) > 0` sees the first stale write.
    let fresh = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let fresh: Vec<&str> = fresh.lines().collect();
    for expected in [
        r#"fencing_requests_total{outcome="stale",layer="demo-resource"} 0"#,
        r#"fencing_requests_total{outcome="admitted",layer="demo-resource"} 0"#,
        r#"fencing_requests_total{outcome="unfenced",layer="demo-resource"} 0"#,
        r#"fencing_raises_total{layer="demo-resource"} 0"#,
        r#"fencing_tracked_keys{layer="demo-resource"} 0"#,
        r#"fencing_requests_inside{layer="demo-resource"} 0"#,
        r#"fencing_drain_wait_seconds_count{layer="demo-resource"} 0"#,
        r#"fencing_durable_record_seconds_count{layer="demo-resource"} 0"#,
    ] {
        assert!(
            fresh.contains(&expected),
            "no line {expected:?} before any request in:\n{}",
            fresh.join("\n")
        );
    }
    assert_eq!(write("5").await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(write("5").await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(write("4").await.unwrap().status(), StatusCode::CONFLICT);

    let scrape = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(scrape.status(), StatusCode::OK);
    let content_type = scrape.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = scrape.text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for expected in [
        r#"fencing_requests_total{outcome="stale",layer="demo-resource"} 1"#,
        r#"fencing_requests_total{outcome="admitted",layer="demo-resource"} 2"#,
        r#"fencing_requests_total{outcome="drain-timeout",layer="demo-resource"} 0"#,
        r#"fencing_raises_total{layer="demo-resource"} 1"#,
        r#"fencing_tracked_keys{layer="demo-resource"} 1"#,
        r#"fencing_requests_inside{layer="demo-resource"} 0"#,
        "# TYPE fencing_requests_total counter",
        "# TYPE fencing_drain_wait_seconds histogram",
        // The drain-wait histogram's buckets exist before anything waited.
        r#"fencing_drain_wait_seconds_bucket{layer="demo-resource",le="0.0005"} 0"#,
        r#"fencing_drain_wait_seconds_count{layer="demo-resource"} 0"#,
        r#"fencing_durable_record_seconds_count{layer="demo-resource"} 0"#,
    ] {
        assert!(lines.contains(&expected), "no line {expected:?} in:\n{text}");
    }
    // No series names a resource key.
    assert!(!text.contains("orders"), "{text}");
    running.shutdown().await.unwrap();
}
