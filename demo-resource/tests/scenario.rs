//! The seed's scenario, run in-process over real HTTP, checked outcome by outcome.

use std::process::Command;
use std::time::Duration;

use demo_resource::scenario::{self, A_IN_FLIGHT_WRITE, A_WRITE, B_WRITE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_has_the_expected_outcomes() {
    let report = tokio::time::timeout(Duration::from_secs(60), scenario::run())
        .await
        .expect("the scenario finishes within a minute")
        .expect("the scenario runs");

    // Without fencing both writes land, the stale one last; the resource saw no tokens.
    let off = &report.without_fencing;
    assert!(off.a_token < off.b_token, "B's grant has the higher token: {off:?}");
    assert!(off.a.accepted() && off.b.accepted(), "{off:?}");
    assert_eq!(off.values(), [B_WRITE, A_WRITE]);
    assert!(off.log.iter().all(|entry| entry.token.is_none()), "{off:?}");

    // With fencing A's write is refused as stale, naming both tokens.
    let on = &report.with_fencing;
    assert!(on.a_token < on.b_token, "{on:?}");
    assert!(on.b.accepted(), "{on:?}");
    assert_eq!(on.a.status, 409, "{on:?}");
    let stale = format!("fencing token {} is stale", on.a_token);
    assert!(on.a.reason.starts_with("Conflict: ") && on.a.reason.contains(&stale), "{on:?}");
    assert!(on.a.reason.contains(&format!("the highest seen is {}", on.b_token)), "{on:?}");
    assert_eq!(on.values(), [B_WRITE]);
    assert_eq!(on.log[0].token, Some(on.b_token));

    // A's admitted write finishes first; B's waited for it; tokens never fall.
    let flight = &report.in_flight;
    assert!(report.b_arrived_while_a_inside);
    assert!(flight.a.accepted() && flight.b.accepted(), "{flight:?}");
    assert_eq!(flight.values(), [A_IN_FLIGHT_WRITE, B_WRITE]);
    let tokens: Vec<_> = flight.log.iter().map(|entry| entry.token).collect();
    assert_eq!(tokens, [Some(flight.a_token), Some(flight.b_token)]);
    assert!(flight.a_token < flight.b_token);

    assert_eq!(report.problems(), Vec::<String>::new());
    let printed = report.to_string();
    let mut lines = printed.lines();
    assert_eq!(
        lines.next(),
        Some(r#"without fencing: ["B: write under valid lease" "A: write from expired lease"]"#)
    );
    assert_eq!(lines.next(), Some(format!("A rejected: 409 {}", on.a.reason).as_str()));
    assert_eq!(lines.next(), Some(r#"with fencing: ["B: write under valid lease"]"#));
    assert_eq!(
        lines.next(),
        Some(r#"in flight: ["A: write admitted before B's grant" "B: write under valid lease"]"#)
    );

    // The check is not vacuous: the seed's failure, and a stale entry after a newer one, are flagged.
    let mut broken = report.clone();
    broken.with_fencing = broken.without_fencing.clone();
    assert_eq!(
        broken.problems(),
        ["with fencing, A's write is rejected 409", "with fencing, the log is [B's]"]
    );
    let mut broken = report.clone();
    broken.in_flight.log.reverse();
    assert_eq!(
        broken.problems(),
        ["in flight, the log is [A's, B's]", "in flight, no older token follows a newer one"]
    );
}

#[test]
fn the_binary_prints_the_scenario_and_exits_zero() {
    let output = Command::new(env!("CARGO_BIN_EXE_demo-resource"))
        .arg("scenario")
        .env("RUST_LOG", "warn")
        .output()
        .expect("demo-resource runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], r#"without fencing: ["B: write under valid lease" "A: write from expired lease"]"#);
    assert!(lines[1].starts_with("A rejected: 409 Conflict: fencing token "), "{stdout}");
    assert_eq!(lines[2], r#"with fencing: ["B: write under valid lease"]"#);
    assert_eq!(lines[3], r#"in flight: ["A: write admitted before B's grant" "B: write under valid lease"]"#);
    assert!(
        lines[4].ends_with("B's write arrived while A's was inside the handler, and waited for it"),
        "{stdout}"
    );
}
