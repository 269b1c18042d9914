//! The billing scenario against a real Redis (a private `redis-server` on an
//! ephemeral 127.0.0.1 port), the local PostgreSQL (a database of its own,
//! dropped at the end) and the payment stand-in: the three outcomes, the binary,
//! and a property test over where the pause falls, with and without the key.
//!
//! Without redis-server or PostgreSQL these tests print SKIPPED and pass, unless `CI=true`.

use std::process::Command;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use scenarios::billing::{self, Options, PausePoint, Protection, Report, Scenario, Step, Stopped, predict};
use test_support::{Redis, skip};

use crate::common::stdout_of_success;
use crate::svg_check;

const PG_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres?connect_timeout=3";
const BOUND: Duration = Duration::from_secs(60);

/// A private Redis (test-support's: no AOF, killed on drop) and the options
/// pointing at it, or `None` (after SKIPPED).
async fn servers() -> Option<(Redis, Options)> {
    if let Err(e) = tokio_postgres::connect(PG_ADMIN, tokio_postgres::NoTls).await {
        return skip(&format!("PostgreSQL not reachable at 127.0.0.1:5432 as postgres: {e}"));
    }
    // Up once it answers PING (the scenario would otherwise start a Redis of its own).
    let redis = Redis::start_with(&["--appendonly", "no"]).await?;
    let options = Options {
        redis_url: redis.url(),
        postgres_url: PG_ADMIN.into(),
        customers: 5,
        ttl: Duration::from_millis(150),
    };
    Some((redis, options))
}

/// `instance`'s charge requests for `customer`.
fn attempts_for<'a>(instance: &'a billing::Instance, customer: &str) -> Vec<&'a billing::Attempt> {
    instance.charges.iter().filter(|attempt| attempt.customer == customer).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rounds_have_the_three_outcomes() {
    let Some((_redis, options)) = servers().await else { return };
    let report: Report =
        tokio::time::timeout(BOUND, billing::run(&options)).await.expect("within a minute").expect("it runs");
    print!("{report}");
    let customers: Vec<String> = (1..=5).map(|n| format!("cus_{n}")).collect();
    let [unfenced, before_mark, after_mark, keyed] = report.rounds.as_slice() else {
        panic!("four rounds: {report:?}")
    };
    for round in &report.rounds {
        assert_eq!(round.customers, customers);
        assert_eq!(round.pause.customer, 2, "paused at cus_3");
        assert!(round.a.token < round.b.token, "B's grant has the higher token: {round:?}");
        assert_eq!(round.b.stopped, None);
    }

    // Unfenced: B charges what A had not noted; A, awake, charges the rest of its list again.
    assert_eq!(unfenced.counts(), [1, 1, 2, 2, 2]);
    assert_eq!(unfenced.charged_twice(), ["cus_3", "cus_4", "cus_5"]);
    assert_eq!(unfenced.charges.len(), 8);
    assert_eq!(unfenced.a.stopped, None);
    assert!(unfenced.a.charges.iter().chain(&unfenced.b.charges).all(|attempt| !attempt.replayed));

    // The record fenced, A paused before its mark: refused at the mark, nobody charged twice.
    assert_eq!(before_mark.counts(), [1; 5]);
    assert_eq!(
        before_mark.a.stopped,
        Some(Stopped::MarkRefused { customer: "cus_3".into(), highest: before_mark.b.token })
    );
    assert_eq!(before_mark.a.charges.len(), 2, "A charged cus_1 and cus_2 only");

    // Paused between the mark and the call: A's call goes out anyway; only its record is refused.
    assert_eq!(after_mark.counts(), [1, 1, 2, 1, 1]);
    assert_eq!(after_mark.charged_twice(), ["cus_3"]);
    assert_eq!(
        after_mark.a.stopped,
        Some(Stopped::RecordRefused { customer: "cus_3".into(), highest: after_mark.b.token })
    );
    let (a3, b3) = (attempts_for(&after_mark.a, "cus_3"), attempts_for(&after_mark.b, "cus_3"));
    assert!(a3.len() == 1 && b3.len() == 1 && a3[0].charge_id != b3[0].charge_id && !a3[0].replayed);

    // Record and key: the same pause, everyone charged once; A's late call is B's charge replayed.
    assert_eq!(keyed.counts(), [1; 5]);
    assert_eq!(keyed.charges.len(), 5);
    assert_eq!(
        keyed.a.stopped,
        Some(Stopped::RecordRefused { customer: "cus_3".into(), highest: keyed.b.token })
    );
    let (a3, b3) = (attempts_for(&keyed.a, "cus_3"), attempts_for(&keyed.b, "cus_3"));
    assert!(a3.len() == 1 && b3.len() == 1, "{keyed:?}");
    assert!(a3[0].replayed && !b3[0].replayed, "{keyed:?}");
    assert_eq!(a3[0].charge_id, b3[0].charge_id);
    // The key names (run, customer), not the holder: both sent the same one.
    let key =
        fencing_client::idempotency::IdempotencyKey::for_operation(&keyed.run, "charge:cus_3").to_string();
    assert_eq!(a3[0].idempotency_key.as_deref(), Some(key.as_str()));
    assert_eq!(b3[0].idempotency_key.as_deref(), Some(key.as_str()));
    assert!(after_mark.a.charges.iter().chain(&after_mark.b.charges).all(|a| a.idempotency_key.is_none()));

    assert_eq!(report.problems(), Vec::<String>::new());
    // The check is not vacuous: the unfenced outcome where the key should have held is flagged.
    let mut broken = report.clone();
    broken.rounds[3].charges = unfenced.charges.clone();
    broken.rounds[3].a.stopped = None;
    let problems = broken.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("charges per customer [1, 1, 1, 1, 1] (got [1, 1, 2, 2, 2])"),
        "{problems:?}"
    );

    // Keys that differ between the holders (a key made from the token, say) are flagged too.
    let mut broken = report.clone();
    let a_cus_3 = broken.rounds[3].a.charges.iter_mut().find(|a| a.customer == "cus_3").unwrap();
    a_cus_3.idempotency_key =
        Some(fencing_client::idempotency::IdempotencyKey::for_operation("7", "charge:cus_3").to_string());
    let problems = broken.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("both instances send cus_3's charge with one key"), "{problems:?}");

    let printed = report.to_string();
    let lines: Vec<&str> = printed.lines().collect();
    assert!(lines[0].starts_with("billing job for 5 customers; lock: SET fencing-billing-"), "{printed}");
    assert!(lines[0].ends_with(&format!("NX PX 150 on {}", options.redis_url)), "{printed}");
    assert_eq!(
        lines[1],
        r#"unfenced, A paused before charging cus_3: 8 charges [cus_1:1 cus_2:1 cus_3:2 cus_4:2 cus_5:2]; charged twice: ["cus_3" "cus_4" "cus_5"]"#
    );
    assert!(lines[4].starts_with("fenced record, A paused before marking cus_3: 5 charges"), "{printed}");
    assert!(lines[6].contains("its mark of cus_3 was refused"), "{printed}");
    assert!(lines[7].ends_with(r#"charged twice: ["cus_3"]"#), "{printed}");
    assert!(lines[9].contains("went through as ch_000006 (the provider cannot check tokens)"), "{printed}");
    assert!(lines[10].starts_with(
        "fenced record + idempotency key, A paused between marking cus_3 and charging it: 5 charges"
    ));
    assert!(
        lines[12].contains(&format!(
            "(Idempotency-Key {}…, as B's) was answered with ch_000003, a replay: no money moved",
            &key[..12]
        )),
        "{printed}"
    );

    // The picture names the doubles and the refusals.
    let svg = report.timeline().to_svg();
    let texts = svg_check::texts(&svg);
    let has = |wanted: &str| assert!(texts.iter().any(|t| t == wanted), "no label {wanted:?} in {texts:?}");
    for lane in ["Redis lock", "instance A", "instance B", "run record", "provider"] {
        has(lane);
    }
    has("1 · unfenced: cus_3, cus_4, cus_5 charged twice");
    has("2 · record, paused before a mark: everyone charged once");
    has("3 · record, paused after the mark: cus_3 charged twice");
    has("4 · record + key: everyone charged once");
    has("charge cus_4 again!");
    has(&format!("mark cus_3 → refused ({})", before_mark.b.token));
    has(&format!("record cus_3 → refused ({})", keyed.b.token));
    has("cus_3: replay of ch_000003");
    has(&format!("run's token {}", keyed.b.token));
    has("a customer charged twice");
    let pixels = svg_check::render(&svg);
    assert!(pixels.flag_red > 40, "the doubled charges are ringed red: {pixels:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_prints_the_rounds_and_exits_zero() {
    let Some((_redis, options)) = servers().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let timeline = dir.path().join("billing.svg");
    let stdout = tokio::task::spawn_blocking(move || {
        stdout_of_success(
            Command::new(env!("CARGO_BIN_EXE_scenarios"))
                .args(["billing", "--redis-url", &options.redis_url, "--ttl-ms", "150"])
                .args(["--customers", "4", "--timeline"])
                .arg(&timeline),
        )
    });
    let stdout = tokio::time::timeout(BOUND, stdout).await.expect("within a minute").unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 14, "{stdout}");
    assert!(lines[0].starts_with("billing job for 4 customers; lock: SET "), "{stdout}");
    assert!(lines[1].ends_with(r#"charged twice: ["cus_3" "cus_4"]"#), "{stdout}");
    assert!(lines[4].ends_with("charged twice: []"), "{stdout}");
    assert!(lines[7].ends_with(r#"charged twice: ["cus_3"]"#), "{stdout}");
    assert!(lines[10].ends_with("charged twice: []"), "{stdout}");
    assert!(lines[13].starts_with("timeline: "), "{stdout}");
    let svg = std::fs::read_to_string(dir.path().join("billing.svg")).expect("the timeline was written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
}

fn pause_points(customers: usize) -> impl Strategy<Value = (Protection, PausePoint)> {
    let protection =
        prop_oneof![Just(Protection::Unfenced), Just(Protection::Record), Just(Protection::RecordAndKey)];
    let step = prop_oneof![Just(Step::BeforeMark), Just(Step::BeforeCall), Just(Step::BeforeRecord)];
    (protection, 0..customers, step)
        .prop_map(|(protection, customer, step)| (protection, PausePoint { customer, step }))
}

/// Wherever A's pause falls: with the key every customer is charged exactly
/// once; with the record alone exactly when the pause falls outside the
/// mark-to-record window; unfenced, everyone from the pause on is charged twice.
/// Each real round is checked against [`predict`], and the prediction's own
/// claims about the key are checked too.
#[test]
fn wherever_the_pause_falls_the_key_charges_everyone_once() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let Some((_redis, mut options)) = runtime.block_on(servers()) else { return };
    options.customers = 4;
    options.ttl = Duration::from_millis(100);
    let scenario = runtime.block_on(Scenario::connect(&options)).expect("servers up");
    // Locked only inside `block_on`, one case at a time: the runner wants a `Fn`.
    let scenario = tokio::sync::Mutex::new(scenario);
    let mut runner = TestRunner::new(Config { cases: 24, failure_persistence: None, ..Config::default() });
    let result = runner.run(&pause_points(options.customers), |(protection, pause)| {
        let round = runtime
            .block_on(async {
                let mut scenario = scenario.lock().await;
                tokio::time::timeout(BOUND, scenario.round(protection, pause)).await
            })
            .map_err(|_| TestCaseError::fail("a round took over a minute"))?
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let predicted = predict(protection, options.customers, pause);
        prop_assert_eq!(round.counts(), predicted.charges.clone(), "{:?}", round);
        prop_assert!(round.problems().is_empty(), "{:?}", round.problems());
        let doubled = predicted.charges.iter().filter(|n| **n > 1).count();
        match protection {
            Protection::RecordAndKey => prop_assert_eq!(doubled, 0),
            Protection::Record => {
                let in_window = pause.step != Step::BeforeMark;
                prop_assert_eq!(doubled, usize::from(in_window));
            }
            Protection::Unfenced => prop_assert_eq!(doubled, options.customers - pause.customer),
        }
        Ok(())
    });
    let finished = runtime.block_on(scenario.into_inner().finish(Vec::new()));
    result.unwrap();
    finished.expect("the database is dropped");
}
