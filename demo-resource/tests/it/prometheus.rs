//! The documented alert rules and the demo's scrape, against Debian's
//! `prometheus` package: `promtool test rules` and `check metrics`, and a real
//! Prometheus that must fire `FencingStaleWrite` on the first stale write after
//! a start. Without `prometheus`/`promtool` on the `PATH` the tests that need
//! them say SKIPPED and pass, unless `CI=true`.

mod tools;

use std::time::Duration;

use reqwest::Method;
use tools::{Demo, Prometheus, get, prometheus_tool, promtool, send, workspace};

const DEMO: &str = env!("CARGO_BIN_EXE_demo-resource");

/// docs/metrics.md shows docs/alerts/fencing.yml as it is, and the promtool
/// tests cover every rule in it: neither can drift from the other.
#[test]
fn the_docs_show_the_rules_file_and_its_tests_cover_every_rule() {
    let docs = std::fs::read_to_string(workspace().join("docs/metrics.md")).unwrap();
    let rules = std::fs::read_to_string(workspace().join("docs/alerts/fencing.yml")).unwrap();
    let alerting = &docs[docs.find("## Alerting").expect("an Alerting section")..];
    let start = alerting.find("```yaml\n").expect("a yaml block under Alerting") + "```yaml\n".len();
    let shown = &alerting[start..start + alerting[start..].find("```\n").unwrap()];
    assert_eq!(shown, rules, "docs/metrics.md's rules differ from docs/alerts/fencing.yml");
    let tests = std::fs::read_to_string(workspace().join("docs/alerts/fencing.test.yml")).unwrap();
    let names: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    for name in names {
        assert!(
            tests.contains(&format!("alertname: {name}\n        exp_alerts:\n          - exp_labels:")),
            "no promtool test sees {name} fire"
        );
    }
}

/// `promtool check rules` and `promtool test rules` (each rule on series that
/// start after a restart).
#[test]
fn promtool_checks_the_rules_and_runs_their_tests() {
    let Some(promtool_bin) = prometheus_tool("promtool") else { return };
    let alerts = workspace().join("docs/alerts");
    promtool(&promtool_bin, &["check", "rules", alerts.join("fencing.yml").to_str().unwrap()], "");
    promtool(&promtool_bin, &["test", "rules", alerts.join("fencing.test.yml").to_str().unwrap()], "");
}

/// `promtool check metrics` on `GET /metrics`, before any request and after a
/// write, a stale one and a refusal without a token.
#[test]
fn promtool_accepts_the_resource_scrape() {
    let Some(promtool_bin) = prometheus_tool("promtool") else { return };
    let demo = Demo::start(DEMO, &["serve", "--listen", "127.0.0.1:0", "--in-memory"]);
    let scrape = || get(&format!("http://{}/metrics", demo.addr)).expect("a scrape").1;
    let fresh = scrape();
    assert!(fresh.contains("fencing_requests_total{outcome=\"stale\",layer=\"demo-resource\"} 0"), "{fresh}");
    promtool(&promtool_bin, &["check", "metrics"], &fresh);
    let log = format!("http://{}/logs/orders", demo.addr);
    assert_eq!(send(Method::POST, &log, Some("5")).unwrap().0, 201);
    assert_eq!(send(Method::POST, &log, Some("4")).unwrap().0, 409);
    assert_eq!(send(Method::POST, &log, None).unwrap().0, 428);
    let after = scrape();
    assert!(after.contains("fencing_requests_total{outcome=\"stale\",layer=\"demo-resource\"} 1"), "{after}");
    promtool(&promtool_bin, &["check", "metrics"], &after);
}

/// The failure the zeros fix, end to end: a real Prometheus scrapes a fresh
/// `demo-resource serve --in-memory` every second; right after its first
/// scrape, a write and a stale write. The documented alert must fire.
#[test]
fn a_real_prometheus_fires_the_documented_alert_on_the_first_stale_write() {
    let Some(prometheus_bin) = prometheus_tool("prometheus") else { return };
    let demo = Demo::start(DEMO, &["serve", "--listen", "127.0.0.1:0", "--in-memory"]);
    let rules = workspace().join("docs/alerts/fencing.yml");
    let prometheus = Prometheus::start(&prometheus_bin, "demo-resource", demo.addr, &rules);
    let bound = Duration::from_secs(30);

    // Right after the first scrape (whatever it held), the writes.
    prometheus.wait_for(bound, "a first scrape", |p| p.query(r#"up{job="demo-resource"} == 1"#).pop());
    let stale = r#"fencing_requests_total{job="demo-resource",outcome="stale"}"#;
    let first = prometheus.query(stale);
    let log = format!("http://{}/logs/orders", demo.addr);
    assert_eq!(send(Method::POST, &log, Some("5")).unwrap().0, 201);
    assert_eq!(send(Method::POST, &log, Some("4")).unwrap().0, 409);

    let alert = prometheus.wait_for(bound, "firing FencingStaleWrite", |p| {
        let alerts = p.api("alerts")["alerts"].as_array().cloned().unwrap_or_default();
        alerts.into_iter().find(|a| a["labels"]["alertname"] == "FencingStaleWrite" && a["state"] == "firing")
    });
    assert_eq!(alert["labels"]["layer"], "demo-resource", "{alert}");
    assert_eq!(alert["labels"]["severity"], "page", "{alert}");
    // It fired because the first scrape held the series at 0.
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["value"][1], "0", "{first:?}");
    // The other rules stay quiet: nothing else happened.
    let others = prometheus.query(r#"ALERTS{alertname!="FencingStaleWrite"}"#);
    assert!(others.is_empty(), "{others:?}");
}
