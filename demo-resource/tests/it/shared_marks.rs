//! Two real `demo-resource serve --postgres URL --shared-marks` processes on one
//! fresh database: the layer decides through replica claims shared in
//! PostgreSQL (default timing: a 5 s term, renewed every second). The first
//! two scenarios run again with the claims in etcd (`serve --postgres URL
//! --etcd ENDPOINT`: the data in PostgreSQL, the marks in a throwaway etcd,
//! fencing-etcd's default 4 s term).
//!
//! - the seed's scenario across the replicas: token 1 on A, token 2 on B, then
//!   token 1 on A is refused (409) and the log holds token 1's and token 2's writes;
//! - A killed (`kill -9`) while its write with token 1 is inside: token 2 on B
//!   is admitted once A's claim has expired (within the term plus slack), and A's
//!   write is not in the log;
//! - a raise on B waits for A's write in flight and answers only after it.
//!
//! Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth), and `etcd`
//! for the etcd runs; without them each test says SKIPPED and passes, unless
//! `CI=true`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::Value;
use test_support::ChildServer;
use test_support::{BOUND, Etcd, TestDb};

/// Where the replicas' claims live.
enum Marks<'a> {
    /// `--shared-marks`: in the data's database, fencing-layer's default 5 s term.
    Postgres,
    /// `--etcd ENDPOINT`: in etcd, fencing-etcd's default 4 s term.
    Etcd(&'a Etcd),
}

impl Marks<'_> {
    fn args(&self) -> Vec<&str> {
        match self {
            Self::Postgres => vec!["--shared-marks"],
            Self::Etcd(etcd) => vec!["--etcd", &etcd.endpoint],
        }
    }

    fn term(&self) -> Duration {
        match self {
            Self::Postgres => Duration::from_secs(5),
            Self::Etcd(_) => Duration::from_secs(4),
        }
    }
}
/// What the tests allow beyond the term: the raise's poll (100 ms), process
/// and database scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(2);

/// A running `demo-resource serve --shared-marks` (test-support's child server,
/// SIGKILLed when dropped).
type Replica = ChildServer;

/// Starts two replicas on `db` with `marks` at once and waits for their `listening on`.
fn pair(db: &TestDb, marks: &Marks<'_>) -> (Replica, Replica) {
    let spawn = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
        command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &db.url()]).args(marks.args());
        ChildServer::spawn(command.env("RUST_LOG", "error").stderr(Stdio::inherit()))
    };
    let (a, b) = (spawn(), spawn());
    (a.ready(), b.ready())
}

fn client() -> Client {
    Client::builder().no_proxy().timeout(BOUND).build().unwrap()
}

/// Appends `body` to `path` on `replica` with `token` (and `query`): status and problem or body.
async fn append(
    http: &Client,
    replica: &Replica,
    path: &str,
    query: &str,
    token: u64,
    body: &str,
) -> (u16, Value) {
    let url = format!("{}{path}{query}", replica.base());
    let response = http.post(url).header("Fencing-Token", token).body(body.to_owned()).send().await;
    let response = response.expect("the replica answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A log's `(token, value)` entries, empty when nothing was appended.
async fn log(http: &Client, replica: &Replica, path: &str) -> Vec<(u64, String)> {
    let response = http.get(format!("{}{path}", replica.base())).send().await.unwrap();
    if response.status() == 404 {
        return Vec::new();
    }
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let entries = body["entries"].as_array().unwrap().iter();
    entries.map(|e| (e["token"].as_u64().unwrap(), e["value"].as_str().unwrap().to_owned())).collect()
}

/// Waits until a session of the database began a transaction since `since`
/// (the database's clock) and sits idle in it: a write in its `delay_ms` wait.
async fn write_inside(db: &tokio_postgres::Client, since: &str) {
    let sql = "SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND state = 'idle in transaction' AND xact_start >= $1::text::timestamptz";
    let waited = tokio::time::timeout(BOUND, async {
        while db.query_one(sql, &[&since]).await.unwrap().get::<_, i64>(0) < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    waited.await.expect("the delayed write never got inside its transaction");
}

async fn db_now(db: &tokio_postgres::Client) -> String {
    db.query_one("SELECT clock_timestamp()::text", &[]).await.unwrap().get(0)
}

/// The seed's scenario across two replicas: the stale holder's write reaches
/// the replica that did not take the newer token's write, and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_scenario_across_replicas_refuses_the_stale_write() {
    seed_scenario(&Marks::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_scenario_across_replicas_refuses_the_stale_write_with_claims_in_etcd() {
    let Some(etcd) = Etcd::start().await else { return };
    seed_scenario(&Marks::Etcd(&etcd)).await;
}

async fn seed_scenario(marks: &Marks<'_>) {
    let Some(db) = TestDb::create().await else { return };
    let (a, b) = pair(&db, marks);
    let http = client();
    let path = "/logs/seed";
    assert_eq!(append(&http, &a, path, "", 1, "a1").await.0, 201);
    assert_eq!(append(&http, &b, path, "", 2, "b2").await.0, 201);
    // B's write was admitted, so A's claim on 1 was released or had expired:
    // A must refuse token 1 from now on. 503 (the database busy) is retried,
    // within a bound; a 2xx is a stale write admitted, and fails at once.
    let started = Instant::now();
    let refused = loop {
        let (status, body) = append(&http, &a, path, "", 1, "a1-late").await;
        match status {
            409 => break body,
            503 if started.elapsed() < BOUND => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => panic!("token 1 on A after token 2 on B: {status} {body}"),
        }
    };
    eprintln!("token 1 on A refused after {:?}: {refused}", started.elapsed());
    assert_eq!(log(&http, &a, path).await, [(1, "a1".to_owned()), (2, "b2".to_owned())]);
    assert_eq!(log(&http, &b, path).await, [(1, "a1".to_owned()), (2, "b2".to_owned())]);
}

/// A replica killed with a write inside: the other replica admits the next
/// token once the dead replica's claim has expired (no session of A keeps it,
/// and nothing frees it earlier), and the killed write never lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_request_holds_the_key_until_its_claim_expires() {
    killed_mid_request(&Marks::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_request_holds_the_key_until_its_etcd_lease_ends() {
    let Some(etcd) = Etcd::start().await else { return };
    killed_mid_request(&Marks::Etcd(&etcd)).await;
}

async fn killed_mid_request(marks: &Marks<'_>) {
    let term = marks.term();
    let Some(db) = TestDb::create().await else { return };
    let (mut a, b) = pair(&db, marks);
    let http = client();
    let admin = db.connect().await;
    let path = "/logs/killed";
    assert_eq!(append(&http, &a, path, "", 1, "a1").await.0, 201);
    let since = db_now(&admin).await;
    let held = {
        let http = http.clone();
        let url = format!("{}{path}?delay_ms=10000", a.base());
        tokio::spawn(async move { http.post(url).header("Fencing-Token", 1).body("a1-killed").send().await })
    };
    write_inside(&admin, &since).await;
    a.kill_9();
    let killed = Instant::now();
    assert!(held.await.unwrap().is_err(), "the killed replica answered");
    // The raise waits for A's claim (at most the layer's drain bound, the term,
    // per request: a 503 drain-timeout is asked again).
    let admitted_after = loop {
        let (status, body) = append(&http, &b, path, "", 2, "b2").await;
        eprintln!("token 2 on B: {status} {:?} after the kill", killed.elapsed());
        match status {
            201 => break killed.elapsed(),
            503 if killed.elapsed() < term + SLACK => {}
            _ => panic!("token 2 on B {:?} after the kill: {status} {body}", killed.elapsed()),
        }
    };
    eprintln!("token 2 admitted on B {admitted_after:?} after A was killed (claim term {term:?})");
    assert!(admitted_after <= term + SLACK, "admitted only after {admitted_after:?}");
    // A's claim was renewed at most a renewal period (term / 5) before the
    // kill, and a dead replica's claim is freed by nothing but its expiry.
    assert!(
        admitted_after >= term - term / 5 - Duration::from_millis(500),
        "admitted after {admitted_after:?}: before A's claim could have expired"
    );
    assert_eq!(log(&http, &b, path).await, [(1, "a1".to_owned()), (2, "b2".to_owned())]);
}

/// A raise on B waits for A's write in flight with the lower token: it answers
/// only after A's write returned, and the log has them in token order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_waits_for_the_other_replicas_write_in_flight() {
    let Some(db) = TestDb::create().await else { return };
    let (a, b) = pair(&db, &Marks::Postgres);
    let http = client();
    let admin = db.connect().await;
    let path = "/logs/in-flight";
    let since = db_now(&admin).await;
    let slow = {
        let http = http.clone();
        let url = format!("{}{path}?delay_ms=1500", a.base());
        tokio::spawn(async move {
            let response = http.post(url).header("Fencing-Token", 1).body("a1-slow").send().await.unwrap();
            (response.status().as_u16(), Instant::now())
        })
    };
    write_inside(&admin, &since).await;
    let sent = Instant::now();
    let (status, body) = append(&http, &b, path, "", 2, "b2").await;
    let raised = Instant::now();
    assert_eq!(status, 201, "{body}");
    let (slow_status, slow_done) = slow.await.unwrap();
    assert_eq!(slow_status, 201, "A's write inside was not let finish");
    assert!(raised >= slow_done, "token 2 answered {:?} before A's write returned", slow_done - raised);
    eprintln!(
        "token 2 on B answered {:?} after it was sent, {:?} after A's write returned",
        raised - sent,
        raised - slow_done
    );
    assert_eq!(log(&http, &a, path).await, [(1, "a1-slow".to_owned()), (2, "b2".to_owned())]);
}
