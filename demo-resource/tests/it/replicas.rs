//! Several real `demo-resource serve --postgres URL` processes on one database:
//! replicas of one resource. With the fence in each write's transaction, stale
//! writes are refused whichever replica they reach, and a replica killed in the
//! middle of a write leaves nothing behind; with `--local-marks` (per-process
//! marks only) the same schedules let stale writes through, which the checks
//! here must catch.
//!
//! Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth); without it
//! each test says SKIPPED and passes, unless `CI=true`. `FENCING_REPLICA_SEED=S`
//! replays a random schedule.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Client, Method};
use serde_json::{Value, json};
use test_support::ChildServer;
use test_support::{BOUND, TestDb};

/// A running `demo-resource serve` (test-support's child server: SIGKILLed when
/// dropped, so a failed assertion never leaves it behind).
type Replica = ChildServer;

/// Starts `n` replicas on `db` at once (so their migrations race), each with
/// `args` after `--postgres URL`, and waits for their `listening on`.
fn start_replicas(db: &TestDb, n: usize, args: &[&str]) -> Vec<Replica> {
    let starting: Vec<_> = (0..n)
        .map(|_| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
            command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &db.url()]).args(args);
            ChildServer::spawn(command.env("RUST_LOG", "error").stderr(Stdio::inherit()))
        })
        .collect();
    starting.into_iter().map(|replica| replica.ready()).collect()
}

fn client() -> Client {
    Client::builder().no_proxy().timeout(BOUND).build().unwrap()
}

/// A write: the status and the JSON body (`Null` when there is none); `None`
/// when the connection failed.
async fn write(http: &Client, method: Method, url: String, token: u64, body: &str) -> Option<(u16, Value)> {
    let response =
        http.request(method, url).header("Fencing-Token", token).body(body.to_owned()).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.unwrap_or(Value::Null)))
}

async fn append(http: &Client, replica: &Replica, path: &str, token: u64, body: &str) -> (u16, Value) {
    let url = format!("{}{path}", replica.base());
    write(http, Method::POST, url, token, body).await.expect("the replica answers")
}

async fn read(http: &Client, replica: &Replica, path: &str) -> (u16, Value) {
    let response = http.get(format!("{}{path}", replica.base())).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// A log's `(token, value)` entries, empty when nothing was appended.
async fn log(http: &Client, replica: &Replica, path: &str) -> Vec<(u64, String)> {
    let (status, body) = read(http, replica, path).await;
    if status == 404 {
        return Vec::new();
    }
    assert_eq!(status, 200, "{body}");
    let entries = body["entries"].as_array().unwrap().iter();
    entries.map(|e| (e["token"].as_u64().unwrap(), e["value"].as_str().unwrap().to_owned())).collect()
}

/// Waits until `n` sessions of the database are inside a transaction, idle (so
/// in a `delay_ms` wait); with `fenced`, past the fence: holding a mark row.
/// Only transactions begun since `since` (the database's clock, from [`db_now`])
/// count: an earlier request's transaction can still be rolling back.
async fn inside_transactions(db: &tokio_postgres::Client, n: i64, fenced: bool, since: &str) {
    let sql = "SELECT count(DISTINCT a.pid) FROM pg_stat_activity a
        LEFT JOIN pg_locks l ON l.pid = a.pid AND l.relation = 'fencing_marks'::regclass
            AND l.mode = 'RowExclusiveLock' AND l.granted
        WHERE a.datname = current_database() AND a.state = 'idle in transaction'
            AND (NOT $1 OR l.pid IS NOT NULL) AND a.xact_start >= $2::text::timestamptz";
    let waited = tokio::time::timeout(BOUND, async {
        while db.query_one(sql, &[&fenced, &since]).await.unwrap().get::<_, i64>(0) < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    waited.await.unwrap_or_else(|_| panic!("{n} writes never got inside their transactions"));
}

/// The database's clock now, for [`inside_transactions`].
async fn db_now(db: &tokio_postgres::Client) -> String {
    db.query_one("SELECT clock_timestamp()::text", &[]).await.unwrap().get(0)
}

/// The keys the random schedule writes: three logs and one key-value pair.
const PATHS: [&str; 4] = ["/logs/r0", "/logs/r1", "/logs/r2", "/kv/r"];

/// What the checker found in one run of the random schedule.
#[derive(Debug, Default)]
struct Checked {
    /// Writes answered 2xx, per path: `(token, value)`.
    acked: BTreeMap<&'static str, Vec<(u64, String)>>,
    /// Writes acknowledged although a higher token for the path had been
    /// acknowledged before they were sent.
    stale_acked: Vec<String>,
    /// Log entries with a lower token than the entry before them.
    out_of_order: Vec<String>,
    /// A key-value pair whose final token is not the highest acknowledged.
    kv_behind: Vec<String>,
    refused: usize,
    unavailable: usize,
}

impl Checked {
    fn violations(&self) -> usize {
        self.stale_acked.len() + self.out_of_order.len() + self.kv_behind.len()
    }
}

/// Six writers send `per_writer` writes each, to random replicas and paths:
/// mostly the path's current token, sometimes a new holder's higher one, and
/// often (30 %) the previous holder's (a paused holder waking up); a fifth of them
/// stall inside the handler (`delay_ms`). Then everything is read back.
async fn random_schedule(replicas: &[Replica], seed: u64, per_writer: usize) -> Checked {
    #[derive(Default)]
    struct Shared {
        current: BTreeMap<&'static str, u64>,
        highest_acked: BTreeMap<&'static str, u64>,
        checked: Checked,
    }
    let http = client();
    let bases: Arc<Vec<String>> = Arc::new(replicas.iter().map(|r| r.base()).collect());
    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut writers = Vec::new();
    for id in 0..6 {
        let (http, bases, shared) = (http.clone(), Arc::clone(&bases), Arc::clone(&shared));
        let mut rng = StdRng::seed_from_u64(rng.random());
        writers.push(tokio::spawn(async move {
            for n in 0..per_writer {
                let path = PATHS[rng.random_range(0..PATHS.len())];
                let base = &bases[rng.random_range(0..bases.len())];
                let (token, highest_before) = {
                    let mut state = shared.lock().unwrap();
                    let current = state.current.entry(path).or_insert(1);
                    if rng.random_bool(0.1) {
                        *current += 1; // a new holder
                    }
                    let current = *current;
                    let token = if current > 1 && rng.random_bool(0.3) { current - 1 } else { current };
                    (token, state.highest_acked.get(path).copied().unwrap_or(0))
                };
                let query = if rng.random_bool(0.2) {
                    format!("?delay_ms={}", rng.random_range(50..400))
                } else {
                    String::new()
                };
                let value = format!("w{id}n{n}t{token}");
                let method = if path.starts_with("/kv/") { Method::PUT } else { Method::POST };
                let url = format!("{base}{path}{query}");
                let (status, body) =
                    write(&http, method, url, token, &value).await.expect("the replica answers");
                let mut state = shared.lock().unwrap();
                match status {
                    200 | 201 => {
                        if token < highest_before {
                            let stale = format!("{path} {value}: token {token} after {highest_before}");
                            state.checked.stale_acked.push(stale);
                        }
                        let highest = state.highest_acked.entry(path).or_default();
                        *highest = (*highest).max(token);
                        state.checked.acked.entry(path).or_default().push((token, value));
                    }
                    409 => state.checked.refused += 1,
                    // A wait past its bound: the layer's drain, the row lock, the pool.
                    503 => state.checked.unavailable += 1,
                    other => panic!("{path} {value}: unexpected {other} {body}"),
                }
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let mut checked = std::mem::take(&mut shared.lock().unwrap().checked);

    // Read back through any replica: every acknowledged write is there, nothing
    // else; per log, tokens never decrease; a key holds its highest token.
    for path in PATHS {
        let acked = checked.acked.get(path).cloned().unwrap_or_default();
        let replica = &replicas[rng.random_range(0..replicas.len())];
        if path.starts_with("/kv/") {
            let (status, body) = read(&http, replica, path).await;
            let highest = acked.iter().map(|(token, _)| *token).max();
            let token = body["token"].as_u64();
            assert_eq!(status == 200, highest.is_some(), "{path}: {body}");
            let written = acked.iter().any(|(t, v)| Some(*t) == token && body["value"] == v.as_str());
            assert!(status == 404 || written, "{path}: {body} was never acknowledged");
            if token != highest {
                checked.kv_behind.push(format!("{path}: holds {body}, highest acknowledged {highest:?}"));
            }
            continue;
        }
        let entries = log(&http, replica, path).await;
        for pair in entries.windows(2) {
            if pair[1].0 < pair[0].0 {
                checked.out_of_order.push(format!("{path}: {:?} after {:?}", pair[1], pair[0]));
            }
        }
        let mut present: Vec<_> = entries.clone();
        let mut expected = acked;
        present.sort();
        expected.sort();
        assert_eq!(present, expected, "{path}: the log is not exactly the acknowledged writes");
    }
    checked
}

fn seed() -> u64 {
    let seed = std::env::var("FENCING_REPLICA_SEED").ok().map(|s| s.parse().expect("a number"));
    let seed = seed.unwrap_or(0x5eed);
    eprintln!("FENCING_REPLICA_SEED={seed}");
    seed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_refuse_stale_writes_whichever_replica_they_reach() {
    let Some(db) = TestDb::create().await else { return };
    let started = Instant::now();
    let replicas = start_replicas(&db, 3, &[]);
    let checked = random_schedule(&replicas, seed(), 40).await;
    let acked: usize = checked.acked.values().map(Vec::len).sum();
    eprintln!(
        "--postgres, 3 replicas: {acked} acknowledged, {} refused, {} unavailable, {} violations in {:.1?}",
        checked.refused,
        checked.unavailable,
        checked.violations(),
        started.elapsed()
    );
    assert_eq!(checked.violations(), 0, "{checked:#?}");
    // The schedule did race stale tokens against newer ones, and mostly got through.
    assert!(checked.refused > 0 && acked > 120, "{checked:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_local_marks_the_same_schedule_lets_stale_writes_through() {
    let Some(db) = TestDb::create().await else { return };
    let started = Instant::now();
    let replicas = start_replicas(&db, 3, &["--local-marks"]);
    let checked = random_schedule(&replicas, seed(), 40).await;
    let acked: usize = checked.acked.values().map(Vec::len).sum();
    eprintln!(
        "--local-marks, 3 replicas: {acked} acknowledged, {} refused, {} unavailable, {} violations \
         ({} stale acknowledged, {} out of order, {} kv behind) in {:.1?}",
        checked.refused,
        checked.unavailable,
        checked.violations(),
        checked.stale_acked.len(),
        checked.out_of_order.len(),
        checked.kv_behind.len(),
        started.elapsed()
    );
    // Per-process marks are not enough: the checker must see the failure. (A
    // stale write acknowledged after a newer one is also out of order in the log;
    // a log out of order can also come from a stale write racing a newer one.)
    assert!(checked.violations() > 0, "{checked:#?}");
}

/// The seed's scenario across two replicas, twice: A (token 1) is paused, B
/// (token 2) writes through replica 1, A wakes and writes through replica 2,
/// which never saw token 2. Then A's write is already inside its transaction
/// (stalled) on replica 2 when B writes through replica 1.
/// Returns A's and B's statuses and bodies and the two logs.
async fn seed_scenario(local_marks: bool) -> Option<[(u16, Value); 6]> {
    let db = TestDb::create().await?;
    let args: &[&str] = if local_marks { &["--local-marks"] } else { &[] };
    let replicas = start_replicas(&db, 2, args);
    let http = client();
    let b = append(&http, &replicas[0], "/logs/seed", 2, "B").await;
    let a = append(&http, &replicas[1], "/logs/seed", 1, "A").await;
    let after = read(&http, &replicas[0], "/logs/seed").await;

    let path = "/logs/in-flight";
    let slow = format!("{}{path}?delay_ms=1500", replicas[1].base());
    let sql = db.connect().await;
    let since = db_now(&sql).await;
    let a_slow = tokio::spawn(async move { write(&client(), Method::POST, slow, 1, "A").await });
    inside_transactions(&sql, 1, !local_marks, &since).await;
    let b_in_flight = append(&http, &replicas[0], path, 2, "B").await;
    let a_in_flight = a_slow.await.unwrap().expect("replica 2 answers");
    let in_flight = read(&http, &replicas[1], path).await;
    Some([a, b, after, a_in_flight, b_in_flight, in_flight])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenario_across_replicas_refuses_the_paused_holder() {
    let Some([a, b, log, a_in_flight, b_in_flight, in_flight]) = seed_scenario(false).await else { return };
    assert_eq!(b, (201, json!({"log": "seed", "index": 0, "token": 2})));
    // Replica 2 never saw token 2; the database's mark did.
    assert_eq!(a.0, 409, "{a:?}");
    assert_eq!(a.1["type"], "urn:fencing:problem:stale-token");
    assert_eq!((&a.1["presented_token"], &a.1["highest_token"]), (&json!(1), &json!(2)));
    assert_eq!(log, (200, json!({"entries": [{"token": 2, "value": "B"}]})));
    // In flight: B waited at the fence for A's transaction to end, so A's write,
    // admitted first, is not applied after B's.
    assert_eq!((a_in_flight.0, b_in_flight.0), (201, 201), "{a_in_flight:?} {b_in_flight:?}");
    let entries = json!({"entries": [{"token": 1, "value": "A"}, {"token": 2, "value": "B"}]});
    assert_eq!(in_flight, (200, entries));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenario_with_local_marks_accepts_the_paused_holder() {
    let Some([a, b, log, a_in_flight, b_in_flight, in_flight]) = seed_scenario(true).await else { return };
    // The failure the in-transaction fence exists for: A's stale write is
    // accepted by the replica that never saw token 2, and lands after B's.
    assert_eq!(b.0, 201, "{b:?}");
    assert_eq!(a, (201, json!({"log": "seed", "index": 1, "token": 1})));
    let entries = json!({"entries": [{"token": 2, "value": "B"}, {"token": 1, "value": "A"}]});
    assert_eq!(log, (200, entries.clone()));
    assert_eq!((a_in_flight.0, b_in_flight.0), (201, 201), "{a_in_flight:?} {b_in_flight:?}");
    assert_eq!(in_flight, (200, entries));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_write_leaves_nothing_applied_and_nothing_locked() {
    let Some(db) = TestDb::create().await else { return };
    let mut replicas = start_replicas(&db, 3, &[]);
    let http = client();
    let sql = db.connect().await;
    assert_eq!(append(&http, &replicas[1], "/logs/k", 1, "before").await.0, 201);
    let put = write(&http, Method::PUT, format!("{}/kv/k", replicas[1].base()), 1, "before").await;
    assert_eq!(put.unwrap().0, 201);

    // Replica 0 takes a log append and a put with token 2, each stalled inside
    // its transaction after the fence: raised marks not committed, rows locked.
    let victim = replicas[0].base();
    let since = db_now(&sql).await;
    let doomed = [("POST", "/logs/k"), ("PUT", "/kv/k")].map(|(method, path)| {
        let url = format!("{victim}{path}?delay_ms=2000");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        tokio::spawn(async move { write(&client(), method, url, 2, "doomed").await })
    });
    inside_transactions(&sql, 2, true, &since).await;
    replicas[0].kill_9();
    for write in doomed {
        assert_eq!(write.await.unwrap(), None, "the killed replica answered");
    }

    // Through the others, at once: the same token on the log, a higher one on
    // the key. Neither waits for a lock the dead replica held.
    let started = Instant::now();
    assert_eq!(append(&http, &replicas[1], "/logs/k", 2, "after").await.0, 201);
    let put = write(&http, Method::PUT, format!("{}/kv/k", replicas[2].base()), 3, "after").await;
    assert_eq!(put.unwrap().0, 200);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "the keys stayed locked for {waited:?}");

    // Nothing of the killed writes: the log's indexes have no gap, marks are the new writes'.
    let entries = json!({"entries": [{"token": 1, "value": "before"}, {"token": 2, "value": "after"}]});
    assert_eq!(read(&http, &replicas[2], "/logs/k").await, (200, entries));
    let (_, kv) = read(&http, &replicas[1], "/kv/k").await;
    assert_eq!(kv, json!({"key": "k", "token": 3, "value": "after"}));
    let rows = sql
        .query("SELECT key, mark::text FROM fencing_marks ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
        .collect::<Vec<_>>();
    assert_eq!(rows, [("/kv/k".into(), "3".into()), ("/logs/k".into(), "2".into())]);
    let heads: i64 =
        sql.query_one("SELECT next FROM demo_log_heads WHERE name = 'k'", &[]).await.unwrap().get(0);
    assert_eq!(heads, 2);
    // The killed replica's sessions are gone (the server ended them when their sockets closed).
    let stuck = "SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND state LIKE 'idle in transaction%'";
    let gone = tokio::time::timeout(Duration::from_secs(5), async {
        while sql.query_one(stuck, &[]).await.unwrap().get::<_, i64>(0) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    gone.await.expect("no session is left inside a transaction");
    // And the fence still works: token 1 is stale on every replica.
    assert_eq!(append(&http, &replicas[2], "/logs/k", 1, "stale").await.0, 409);
    eprintln!("after kill -9 the keys were written again in {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_is_a_503() {
    let Some(db) = TestDb::create().await else { return };
    let replicas = start_replicas(&db, 1, &[]);
    let base = replicas[0].base();
    let sql = db.connect().await;
    let since = db_now(&sql).await;
    // The pool's 16 connections, each inside a stalled transaction.
    let stalled: Vec<_> = (0..16)
        .map(|i| {
            let url = format!("{base}/kv/p{i}?delay_ms=7000");
            tokio::spawn(async move { write(&client(), Method::PUT, url, 1, "v").await })
        })
        .collect();
    inside_transactions(&sql, 16, true, &since).await;
    let http = client();
    let started = Instant::now();
    let response =
        http.put(format!("{base}/kv/q")).header("Fencing-Token", 1).body("v").send().await.unwrap();
    let waited = started.elapsed();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "urn:fencing:problem:database-unavailable", "{problem}");
    // It waited for a connection, as long as the pool's bound (5 s), not forever.
    assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(7), "{waited:?}");
    for write in stalled {
        assert_eq!(write.await.unwrap().map(|(status, _)| status), Some(201));
    }
    // Nothing of the refused write.
    assert_eq!(read(&http, &replicas[0], "/kv/q").await.0, 404);
}

#[test]
fn local_marks_needs_postgres() {
    for args in
        [&["--local-marks"][..], &["--in-memory", "--local-marks"], &["--data-dir", "x", "--local-marks"]]
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_demo-resource"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill(); // still serving: the assertion below fails
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--local-marks") || stderr.contains("--postgres"), "{stderr}");
    }
}

/// A server that could lose an acknowledged commit is refused with the flag that accepts it
/// named; with `--accept-volatile-commits` it is served. The session here turns
/// `synchronous_commit` off through the URL (the shared server is not changed): a crash could
/// then take back a raised mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_could_lose_a_commit_is_refused_unless_accepted() {
    let Some(db) = TestDb::create().await else { return };
    let volatile = format!("{}&options=-c%20synchronous_commit%3Doff", db.url());
    let refused = Command::new(env!("CARGO_BIN_EXE_demo-resource"))
        .args(["serve", "--listen", "127.0.0.1:0", "--postgres", &volatile])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("synchronous_commit") && stderr.contains("--accept-volatile-commits"),
        "{stderr}"
    );

    let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &volatile, "--accept-volatile-commits"]);
    let accepted = ChildServer::spawn(command.env("RUST_LOG", "error").stderr(Stdio::inherit())).ready();
    let http = client();
    assert_eq!(append(&http, &accepted, "/logs/volatile", 3, "served").await.0, 201);
    assert_eq!(append(&http, &accepted, "/logs/volatile", 2, "stale").await.0, 409);
}
