//! `promtool check metrics` (Debian's `prometheus` package) on a real
//! `demo-lock-service`'s `GET /metrics`, before any request and after some:
//! every counter exists at 0 from the start. Without `promtool` on the `PATH`
//! the test says SKIPPED and passes, unless `CI=true`.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use test_support::{ChildServer, prometheus_tool, promtool};

/// A running `demo-lock-service` on a loopback ephemeral port; killed when dropped.
struct Service {
    base: String,
    _server: ChildServer,
    _dir: tempfile::TempDir,
}

impl Service {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_demo-lock-service"));
        command.args(["--listen", "127.0.0.1:0", "--data-dir"]).arg(dir.path()).env("RUST_LOG", "warn");
        let server = ChildServer::start(command.stderr(Stdio::null()));
        Self { base: server.base(), _server: server, _dir: dir }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_scrape_and_every_counter_starts_at_zero() {
    let Some(promtool_bin) = prometheus_tool("promtool") else { return };
    let service = Service::start();
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    let scrape = || async {
        http.get(format!("{}/metrics", service.base)).send().await.unwrap().text().await.unwrap()
    };

    let fresh = scrape().await;
    for name in ["grants", "conflicts", "expiries", "keepalives", "releases"] {
        let line = format!("lock_service_{name}_total 0");
        assert!(fresh.lines().any(|l| l == line), "no {line:?} before any request in:\n{fresh}");
    }
    promtool(&promtool_bin, &["check", "metrics"], &fresh);

    let acquire = |holder: &'static str| {
        http.post(format!("{}/v1/leases", service.base))
            .json(&json!({"name": "billing", "holder": holder, "ttl_ms": 60_000}))
            .send()
    };
    assert_eq!(acquire("A").await.unwrap().status(), 201);
    assert_eq!(acquire("B").await.unwrap().status(), 409);
    let after = scrape().await;
    assert!(after.lines().any(|l| l == "lock_service_grants_total 1"), "{after}");
    assert!(after.lines().any(|l| l == "lock_service_conflicts_total 1"), "{after}");
    promtool(&promtool_bin, &["check", "metrics"], &after);
}
