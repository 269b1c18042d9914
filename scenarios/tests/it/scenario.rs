//! The seed's scenario, run in-process over real HTTP, checked outcome by outcome.

use std::process::Command;
use std::time::Duration;

use scenarios::scenario::{self, A_IN_FLIGHT_WRITE, A_WRITE, B_WRITE};

use crate::common::{scenario_within, stdout_of_success};
use crate::svg_check;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_has_the_expected_outcomes() {
    let report = scenario_within(Duration::from_secs(60), scenario::run()).await;

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

/// The timeline picture of a real run: every actor, grant, token and outcome is
/// labelled, and it renders to a picture that is not blank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_shows_the_three_rounds() {
    let report = scenario_within(Duration::from_secs(60), scenario::run()).await;
    assert_eq!(report.problems(), Vec::<String>::new());
    let svg = report.timeline().to_svg();
    let texts = svg_check::texts(&svg);
    let has = |wanted: &str| assert!(texts.iter().any(|t| t == wanted), "no label {wanted:?} in {texts:?}");
    for lane in ["lock service", "client A", "client B", "resource"] {
        has(lane);
    }
    let (off, on, flight) = (&report.without_fencing, &report.with_fencing, &report.in_flight);
    for run in [off, on, flight] {
        has(&format!("grant A: token {}", run.a_token));
        has(&format!("grant B: token {}", run.b_token));
    }
    has("A's lease expired");
    has("paused (GC, SIGSTOP…)");
    has("no fencing: no mark");
    // Round 1: the stale write is stored after the newer one.
    has(&format!("write, token {} → 201 stored", off.b_token));
    has(&format!("write, token {} → 201 stored after a newer token!", off.a_token));
    // Round 2: refused, the mark at B's token.
    has(&format!("write, token {} → 409 stale: refused", on.a_token));
    has(&format!("mark {}", on.b_token));
    // Round 3: A's write inside the handler, B's at the door, both stored in token order.
    has("inside the handler");
    has("waiting at the door");
    has(&format!("mark {}", flight.a_token));
    has(&format!("write, token {} → 201 stored", flight.a_token));
    has(&format!("write, token {} → 201 stored after waiting", flight.b_token));
    has("3 · A's write in flight: B waits at the door");

    let pixels = svg_check::render(&svg);
    eprintln!("{pixels:?}");
    assert!(pixels.width > 600 && pixels.height > 300, "{pixels:?}");
    // Bars, points and lines cover about 7 % of the page (the white page and the
    // sections' light shading do not count): at least 3 %.
    assert!(pixels.inked > pixels.total / 30, "{pixels:?}");
    assert!(pixels.flag_red > 40, "the stale write stored is drawn red: {pixels:?}");
}

#[test]
fn the_binary_prints_the_scenario_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let timeline = dir.path().join("timeline.svg");
    let stdout =
        stdout_of_success(Command::new(env!("CARGO_BIN_EXE_scenarios")).arg("--timeline").arg(&timeline));
    let lines = assert_prints_the_three_outcomes(&stdout);
    assert_eq!(lines[5], format!("timeline: {}", timeline.display()));
    let svg = std::fs::read_to_string(&timeline).expect("the timeline was written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
}

/// Asserts the scenario's printout (`scenarios`, whatever the token
/// source) shows the three expected outcomes in its first five lines; all its lines.
pub(crate) fn assert_prints_the_three_outcomes(stdout: &str) -> Vec<&str> {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], r#"without fencing: ["B: write under valid lease" "A: write from expired lease"]"#);
    assert!(lines[1].starts_with("A rejected: 409 Conflict: fencing token "), "{stdout}");
    assert_eq!(lines[2], r#"with fencing: ["B: write under valid lease"]"#);
    assert_eq!(lines[3], r#"in flight: ["A: write admitted before B's grant" "B: write under valid lease"]"#);
    assert!(
        lines[4].ends_with("B's write arrived while A's was inside the handler, and waited for it"),
        "{stdout}"
    );
    lines
}
