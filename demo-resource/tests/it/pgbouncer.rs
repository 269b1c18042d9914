//! Replicas behind PgBouncer (Debian's package, a stock configuration of the
//! test's own: test-support's `PgBouncer`), in session and in transaction
//! pooling: two `demo-resource serve --postgres` processes started at once
//! through it, and then, in each mode:
//!
//! - the seed's scenario across them (token 1 on A, token 2 on B, token 1 on A: 409);
//! - the lock bound: a higher token behind a lower one's slow write answers 503
//!   after about 5 s (`lock_timeout`), not when the slow write ends;
//! - `kill -9` of A with its write inside: token 2's next holder gets in on B
//!   promptly (the pooler ends the dead client's server session), and the
//!   killed write never lands;
//! - a short load through the pooler: no 5xx.
//!
//! Also: a replica told "session" behind a transaction pooler refuses to start
//! and says why; and `--shared-marks` through a transaction pooler with the
//! claims session on a direct URL (`--claims-url`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Client;
use test_support::{BOUND, ChildServer, PgBouncer, PoolMode, TestDb};

/// A `serve --postgres` replica through `bouncer` with `extra` flags.
fn replica(bouncer: &PgBouncer, db: &TestDb, extra: &[&str]) -> test_support::Starting {
    let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &bouncer.url(db.name())]).args(extra);
    ChildServer::spawn(command.env("RUST_LOG", "error").stderr(Stdio::inherit()))
}

fn client() -> Client {
    Client::builder().no_proxy().timeout(BOUND).build().unwrap()
}

/// POSTs `body` to `path` on `replica` with `token`: the status.
async fn post(http: &Client, replica: &ChildServer, path: &str, token: u64, body: &str) -> u16 {
    let url = format!("{}{path}", replica.base());
    let response = http.post(url).header("Fencing-Token", token).body(body.to_owned()).send().await;
    response.expect("the replica answers").status().as_u16()
}

/// The log's tokens, in order.
async fn tokens(http: &Client, replica: &ChildServer, path: &str) -> Vec<u64> {
    let body: serde_json::Value =
        http.get(format!("{}{path}", replica.base())).send().await.unwrap().json().await.unwrap();
    body["entries"].as_array().unwrap().iter().map(|entry| entry["token"].as_u64().unwrap()).collect()
}

fn mode_flag(mode: PoolMode) -> &'static str {
    match mode {
        PoolMode::Session => "session",
        PoolMode::Transaction => "transaction",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_through_pgbouncer_in_session_pooling() {
    through_pgbouncer(PoolMode::Session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_through_pgbouncer_in_transaction_pooling() {
    through_pgbouncer(PoolMode::Transaction).await;
}

async fn through_pgbouncer(mode: PoolMode) {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, mode).await else { return };
    let flags = ["--pg-pooling", mode_flag(mode)];
    // Started together: both migrate at once, through the pooler.
    let (a, b) = (replica(&bouncer, &db, &flags), replica(&bouncer, &db, &flags));
    let (mut a, b) = (a.ready(), b.ready());
    let http = client();

    // The seed's scenario.
    let path = "/logs/seed";
    assert_eq!(post(&http, &a, path, 1, "a1").await, 201);
    assert_eq!(post(&http, &b, path, 2, "b2").await, 201);
    assert_eq!(post(&http, &a, path, 1, "a1-late").await, 409, "the stale write got through");
    assert_eq!(tokens(&http, &b, path).await, [1, 2]);

    // The lock bound: token 4 waits behind token 3's 10 s write, then 503 at lock_timeout (5 s).
    let path = "/logs/bound";
    assert_eq!(post(&http, &a, path, 3, "a3").await, 201);
    let slow = {
        let (http, url) = (http.clone(), format!("{}{path}?delay_ms=10000", a.base()));
        tokio::spawn(async move { http.post(url).header("Fencing-Token", 3).body("slow").send().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let status = post(&http, &b, path, 4, "b4").await;
    let waited = asked.elapsed();
    eprintln!("{mode:?} pooling: token 4 behind a 10 s write: {status} after {waited:?}");
    assert_eq!(status, 503, "a higher token behind a slow write");
    assert!(
        waited >= Duration::from_millis(4500) && waited < Duration::from_secs(9),
        "503 after {waited:?}, not ~5 s"
    );
    assert_eq!(slow.await.unwrap().unwrap().status(), 201);

    // kill -9 with a write inside: the next holder gets in, the killed write never lands.
    let path = "/logs/killed";
    let held = {
        let (http, url) = (http.clone(), format!("{}{path}?delay_ms=10000", a.base()));
        tokio::spawn(async move { http.post(url).header("Fencing-Token", 5).body("killed").send().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.kill_9();
    let killed = Instant::now();
    assert!(held.await.unwrap().is_err(), "the killed replica answered");
    let status = post(&http, &b, path, 6, "b6").await;
    let after = killed.elapsed();
    eprintln!("{mode:?} pooling: token 6 on B {status} {after:?} after A was killed");
    assert_eq!(status, 201);
    assert!(after < Duration::from_secs(4), "the dead replica's transaction held the key for {after:?}");
    assert_eq!(tokens(&http, &b, path).await, [6], "the killed write landed");

    // A short load: 8 writers on keys of their own for 2 s; no 5xx.
    let (mut ok, mut failed) = (0, Vec::new());
    let writers = (0..8).map(|writer| {
        let (http, base) = (http.clone(), b.base());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                let url = format!("{base}/logs/load-{writer}");
                let sent = http.post(url).header("Fencing-Token", 7).body("x").send().await;
                match sent.map(|response| response.status().as_u16()) {
                    Ok(201) => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
            }
            (ok, failed)
        })
    });
    for writer in writers.collect::<Vec<_>>() {
        let (n, f) = writer.await.unwrap();
        ok += n;
        failed.extend(f);
    }
    eprintln!("{mode:?} pooling: load of 8 writers for 2 s: {ok} written, {} failed", failed.len());
    assert!(
        failed.is_empty(),
        "{} of {} writes failed: {:?}",
        failed.len(),
        ok + failed.len() as u32,
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 0);
}

/// Behind a pooler in transaction mode, a replica left in session mode would
/// lose its lock bound: it refuses to start, naming the setting, the pooler and the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_replica_behind_a_transaction_pooler_refuses_to_start() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, PoolMode::Transaction).await else { return };
    let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &bouncer.url(db.name())]);
    let out =
        tokio::task::spawn_blocking(move || command.stdin(Stdio::null()).output()).await.unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(!out.status.success(), "it started");
    for words in ["lock_timeout", "transaction", "PgBouncer", "--pg-pooling transaction"] {
        assert!(stderr.contains(words), "the refusal does not say {words:?}: {stderr}");
    }
}

/// `--shared-marks` through a transaction pooler, the claims session straight
/// to PostgreSQL (`--claims-url`): the seed's scenario holds, and a replica
/// killed with a write inside holds the key until its claim expires, no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_marks_through_a_transaction_pooler_with_a_direct_claims_session() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, PoolMode::Transaction).await else { return };
    let direct = db.url();
    let flags = ["--shared-marks", "--pg-pooling", "transaction", "--claims-url", &direct];
    let (a, b) = (replica(&bouncer, &db, &flags), replica(&bouncer, &db, &flags));
    let (mut a, b) = (a.ready(), b.ready());
    let http = client();
    let path = "/logs/shared";
    assert_eq!(post(&http, &a, path, 1, "a1").await, 201);
    assert_eq!(post(&http, &b, path, 2, "b2").await, 201);
    assert_eq!(post(&http, &a, path, 1, "a1-late").await, 409, "the stale write got through");
    let held = {
        let (http, url) = (http.clone(), format!("{}{path}?delay_ms=10000", a.base()));
        tokio::spawn(async move { http.post(url).header("Fencing-Token", 3).body("killed").send().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.kill_9();
    let killed = Instant::now();
    assert!(held.await.unwrap().is_err(), "the killed replica answered");
    let term = Duration::from_secs(5);
    let admitted_after = loop {
        match post(&http, &b, path, 4, "b4").await {
            201 => break killed.elapsed(),
            503 if killed.elapsed() < term + Duration::from_secs(2) => {}
            status => panic!("token 4 on B {:?} after the kill: {status}", killed.elapsed()),
        }
    };
    eprintln!("shared marks via the pooler: token 4 admitted on B {admitted_after:?} after A was killed");
    assert!(admitted_after <= term + Duration::from_secs(2));
    assert_eq!(tokens(&http, &b, path).await, [1, 2, 4], "the killed write landed");
}

/// `--shared-marks` through a transaction pooler with no `--claims-url`: the
/// replicas' `LISTEN` hears nothing, each says so once, and a raise across
/// replicas falls back to the renewals and the 100 ms poll: with the default
/// 5 s term (a renewal every second, each bounded by a second), within about
/// 2.1 s, never the term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_marks_without_a_claims_url_say_hints_are_lost_and_raises_fall_back_to_polls() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, PoolMode::Transaction).await else { return };
    let spawn = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
        command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &bouncer.url(db.name())]);
        command.args(["--shared-marks", "--pg-pooling", "transaction"]).stderr(Stdio::piped());
        ChildServer::spawn(command.env("RUST_LOG", "warn"))
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.ready(), b.ready());
    let http = client();
    // Each new session waits up to 2 s for its test notification.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut waits = Vec::new();
    for round in 0..3u64 {
        let path = format!("/logs/fallback-{round}");
        assert_eq!(post(&http, &a, &path, 1, "a1").await, 201);
        let asked = Instant::now();
        assert_eq!(post(&http, &b, &path, 2, "b2").await, 201);
        waits.push(asked.elapsed());
        assert_eq!(post(&http, &a, &path, 1, "a1-late").await, 409, "the stale write got through");
    }
    eprintln!("raises across replicas without hints: {waits:?}");
    assert!(waits.iter().all(|wait| *wait < Duration::from_millis(3500)), "a raise waited {waits:?}");
    for replica in [&a, &b] {
        let warned = replica.stderr().matches("does not hear the claims channel").count();
        assert_eq!(warned, 1, "the warning, once: {}", replica.stderr());
    }
}
