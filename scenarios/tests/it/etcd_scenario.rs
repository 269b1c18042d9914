//! The seed's scenario with etcd issuing the tokens: a real etcd on ephemeral
//! 127.0.0.1 ports (test-support's), stopped on drop (also on panic).
//!
//! Without an `etcd` binary on PATH (or in `$ETCD_BIN`) these tests print
//! "SKIPPED: etcd not installed" and pass, unless `CI=true`, where that is a failure.

use std::process::Command;
use std::time::Duration;

use fencing_client::EtcdLockClient;
use fencing_client::drivers::etcd_client::GetOptions;
use scenarios::scenario::{self, A_IN_FLIGHT_WRITE, A_WRITE, B_WRITE, TokenSource};
use test_support::Etcd;

use crate::common::{scenario_within, stdout_of_success};
use crate::scenario::assert_prints_the_three_outcomes;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_with_etcd_tokens_has_the_expected_outcomes() {
    let Some(etcd) = Etcd::start().await else { return };
    let source = TokenSource::Etcd { endpoints: vec![etcd.endpoint.clone()], ca_file: None };
    let report = scenario_within(Duration::from_secs(60), scenario::run_with(source)).await;

    let (off, on, flight) = (&report.without_fencing, &report.with_fencing, &report.in_flight);
    // Without fencing both writes land, the stale one last.
    assert!(off.a.accepted() && off.b.accepted(), "{off:?}");
    assert_eq!(off.values(), [B_WRITE, A_WRITE]);
    // With fencing A's write is refused as stale, naming both etcd tokens.
    assert!(on.b.accepted(), "{on:?}");
    assert_eq!(on.a.status, 409, "{on:?}");
    assert!(on.a.reason.contains(&format!("fencing token {} is stale", on.a_token)), "{on:?}");
    assert!(on.a.reason.contains(&format!("the highest seen is {}", on.b_token)), "{on:?}");
    assert_eq!(on.values(), [B_WRITE]);
    // In flight: A's admitted write finishes first, B's waited for it.
    assert!(report.b_arrived_while_a_inside);
    assert_eq!(flight.values(), [A_IN_FLIGHT_WRITE, B_WRITE]);
    let tokens: Vec<_> = flight.log.iter().map(|entry| entry.token).collect();
    assert_eq!(tokens, [Some(flight.a_token), Some(flight.b_token)]);
    assert_eq!(report.problems(), Vec::<String>::new());

    // The tokens are etcd revisions: cluster-wide, so strictly increasing across the
    // three locks in the order they were granted, and no higher than etcd's revision now.
    let granted = [off.a_token, off.b_token, on.a_token, on.b_token, flight.a_token, flight.b_token];
    assert!(granted.windows(2).all(|w| w[0] < w[1]), "{granted:?}");
    let client = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();
    let mut kv = client.client().clone();
    let left = kv.get("fencing/locks/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert!(left.kvs().is_empty(), "B released and A's leases expired: no lock key is left");
    let revision = left.header().unwrap().revision() as u64;
    assert!(revision > flight.b_token, "etcd revision {revision}, last token {}", flight.b_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_the_scenario_against_etcd() {
    let Some(etcd) = Etcd::start().await else { return };
    let endpoint = etcd.endpoint.clone();
    let stdout = tokio::task::spawn_blocking(move || {
        stdout_of_success(Command::new(env!("CARGO_BIN_EXE_scenarios")).args([
            "--lock-backend",
            "etcd",
            "--etcd-endpoints",
            &endpoint,
        ]))
    })
    .await
    .unwrap();
    assert_prints_the_three_outcomes(&stdout);
    drop(etcd);
}

#[test]
fn an_unreachable_etcd_fails_the_scenario_with_a_clear_error() {
    let endpoint = format!("http://127.0.0.1:{}", test_support::free_port());
    let output = Command::new(env!("CARGO_BIN_EXE_scenarios"))
        .args(["--lock-backend", "etcd", "--etcd-endpoints", &endpoint])
        .output()
        .expect("scenarios runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "no outcomes are printed");
    assert!(stderr.contains("scenario failed to run: A acquires: transport error"), "{stderr}");
}
