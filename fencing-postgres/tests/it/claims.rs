//! Replica claims when PostgreSQL sessions die in ways only PostgreSQL has: a
//! terminated session, one of its two background connections ended, a
//! restarted server, the database down; and the two ways of fencing refusing
//! each other's keys. (A handler longer than the term, a
//! stalled route, a lost connection and a raise storm are in the conformance
//! suite every engine runs: `conformance.rs`.) Each replica is a real axum
//! server; one probe records every handler's entry and exit in one order, and
//! the order is checked.
//!
//! Restarts and terminations run on a PostgreSQL server of the test's own
//! (test-support's `OwnPg`), never the shared one.

use std::sync::Arc;
use std::time::Duration;

use crate::common::replicas::{PgReplica, Probe, Replica};
use crate::common::{BOUND, Rng, TestDb, with_port};
use fencing_layer::FencingLayer;
use fencing_layer::claims::ClaimTiming;
use fencing_postgres::{FenceError, PgFence, PoolLimits};
use test_support::OwnPg;
use tokio::time::Instant;

/// Short claims, so that expiries happen within a test: valid 800 ms after a
/// renewal is sent, renewed every 200 ms, expiring 1 s after it is written.
fn short() -> ClaimTiming {
    ClaimTiming {
        term: Duration::from_secs(1),
        renew_every: Duration::from_millis(200),
        renew_timeout: Duration::from_millis(200),
        margin: Duration::from_millis(200),
    }
}

fn drain(bound: Duration) -> FencingLayer {
    FencingLayer::new().drain_timeout(bound)
}

/// Two replicas on `pg` (the first named `replica-one`, 1 s claims), and a
/// request with token 1 held inside the first.
async fn held_on_replica_one(
    pg: &OwnPg,
    probe: &Probe,
) -> (Arc<Replica>, Arc<Replica>, tokio::task::JoinHandle<(u16, serde_json::Value)>) {
    let config = with_port(&pg.config(), pg.port, "replica-one");
    let one =
        Arc::new(Replica::with_timing(probe, config, drain(BOUND), PoolLimits::default(), short()).await);
    let two = Arc::new(
        Replica::with_timing(probe, pg.config(), drain(BOUND), PoolLimits::default(), short()).await,
    );
    probe.hold(1);
    let held = one.spawn_post(1, 1);
    probe.wait_inside(1, 1, 1).await;
    (one, two, held)
}

/// Every session of one replica is terminated (`pg_terminate_backend`) while
/// its request is inside: it opens a new session and renews its claim, and the
/// raise waits for the request to leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminated_session_does_not_free_the_claim() {
    let Some(pg) = OwnPg::start() else { return };
    let probe = Probe::default();
    let (_one, two, held) = held_on_replica_one(&pg, &probe).await;
    let admin = crate::common::connect_to(&pg.config()).await;
    let killed: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'replica-one'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 1, "no session of replica one was found");
    let raise = two.spawn_post(1, 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!raise.is_finished(), "token 2 got an answer while token 1 was inside");
    probe.release(1);
    assert_eq!(held.await.unwrap().0, 200);
    assert_eq!(raise.await.unwrap().0, 200);
    assert!(probe.at((1, 1, false)) < probe.at((1, 2, true)));
    probe.assert_invariants();
}

/// A replica's session is two connections: renewals, and hints (`LISTEN`,
/// on a thread of its own). Either one terminated alone ends the whole
/// session: the keeper opens a new one (a new `LISTEN` connection, the old
/// one gone, none left behind), in time to keep the claim of the request
/// inside, and a raise on another replica still waits for that request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn either_background_connection_ending_ends_the_session() {
    let Some(pg) = OwnPg::start() else { return };
    let probe = Probe::default();
    let (_one, two, held) = held_on_replica_one(&pg, &probe).await;
    let admin = crate::common::connect_to(&pg.config()).await;
    // The hint connection's last statement is its LISTEN; the renewals' one, a renewal.
    for (which, last_statement) in [("hints", "LISTEN %"), ("renewals", "%unnest(%")] {
        let listening = backend(&admin, "LISTEN %").await;
        let target = backend(&admin, last_statement).await;
        admin.execute("SELECT pg_terminate_backend($1)", &[&target]).await.unwrap();
        let reopened = async {
            while listeners(&admin).await.contains(&listening) || listeners(&admin).await.len() != 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(short().term, reopened).await.unwrap_or_else(|_| {
            panic!("the {which} connection ended; the old LISTEN connection is still there, or no new one")
        });
        assert!(!held.is_finished(), "the request inside lost its claim when the {which} connection ended");
    }
    let raise = two.spawn_post(1, 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!raise.is_finished(), "token 2 got an answer while token 1 was inside");
    probe.release(1);
    assert_eq!(held.await.unwrap().0, 200);
    assert_eq!(raise.await.unwrap().0, 200);
    probe.assert_invariants();
}

/// The pid of a backend of replica one whose last statement is like `last_statement` (waits for one).
async fn backend(admin: &tokio_postgres::Client, last_statement: &str) -> i32 {
    let found = async {
        loop {
            if let Some(pid) = pids(admin, last_statement).await.first() {
                return *pid;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(BOUND, found).await.unwrap_or_else(|_| panic!("no backend ran {last_statement}"))
}

/// The pids of replica one's backends that listen.
async fn listeners(admin: &tokio_postgres::Client) -> Vec<i32> {
    pids(admin, "LISTEN %").await
}

async fn pids(admin: &tokio_postgres::Client, last_statement: &str) -> Vec<i32> {
    let sql = "SELECT pid FROM pg_stat_activity WHERE application_name = 'replica-one' AND query LIKE $1";
    admin.query(sql, &[&last_statement]).await.unwrap().iter().map(|row| row.get(0)).collect()
}

/// The database restarts (every session ends) under a load of raises, equal
/// and stale tokens routed at random over two replicas. Requests may get 503
/// while it is down; the order of entries and exits keeps both invariants, and
/// the marks survive the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_restart_under_load_lets_no_token_overlap() {
    let Some(pg) = OwnPg::start() else { return };
    let probe = Probe::jittery();
    let limits = PoolLimits { wait: Duration::from_secs(1), ..PoolLimits::default() };
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let replica =
            Replica::with_timing(&probe, pg.config(), drain(Duration::from_secs(3)), limits, short());
        replicas.push(Arc::new(replica.await));
    }
    let stop = Instant::now() + Duration::from_secs(4);
    let mut rng = Rng::from_clock();
    let mut tasks = Vec::new();
    for worker in 0..8_u64 {
        let (replicas, mut rng) = (replicas.clone(), rng.fork());
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            let mut round = 0;
            while Instant::now() < stop {
                let token = round / 10 + rng.below(2) + worker % 2;
                statuses.push(replicas[rng.below(2) as usize].post(rng.below(2), token).await.0);
                round += 1;
            }
            statuses
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let restart = tokio::task::spawn_blocking(move || {
        pg.restart();
        pg
    });
    let pg = restart.await.unwrap();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    assert!(statuses.iter().all(|s| [200, 409, 503].contains(s)), "{statuses:?}");
    assert!(statuses.iter().filter(|s| **s == 200).count() > 20, "{statuses:?}");
    probe.assert_invariants();
    // Every admitted token is at most the key's mark after the restart.
    let admin = crate::common::connect_to(&pg.config()).await;
    for key in 0..2_u64 {
        let admitted = probe.events().iter().filter(|e| e.0 == key && e.2).map(|e| e.1).max();
        let mark = crate::common::mark(&admin, &format!("/r/{key}")).await.map(|m| m.parse::<u64>().unwrap());
        assert!(admitted <= mark, "key {key}: admitted {admitted:?} but the mark is {mark:?}");
    }
}

/// A key fenced through the shared store refuses `PgFence::fence`, and a key
/// fenced in a transaction refuses the shared store: never silently neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_two_ways_of_fencing_refuse_each_others_keys() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::default();
    let one = Replica::with_timing(&probe, db.config(), drain(BOUND), PoolLimits::default(), short()).await;
    assert_eq!(one.post(1, 5).await.0, 200);
    let fence = PgFence::new();
    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    match fence.fence(&tx, "/r/1", 6).await {
        Err(FenceError::FencedByClaims { key }) => assert_eq!(key, "/r/1"),
        other => panic!("expected FencedByClaims, got {other:?}"),
    }
    drop(tx);
    let tx = client.transaction().await.unwrap();
    fence.fence(&tx, "/r/2", 3).await.unwrap();
    tx.commit().await.unwrap();
    let (status, problem) = one.post(2, 4).await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("fenced in-transaction"), "{problem}");
    assert_eq!(
        crate::common::mark(&db.connect().await, "/r/2").await.as_deref(),
        Some("3"),
        "the mark moved"
    );
}

/// The database goes away (the test's own server, stopped). A token the
/// replica knows is stale still gets 409, and its current token is still
/// admitted under its claim, with no database work; once the claim lapses, a
/// request is 503 and reaches no handler. Nothing is admitted without a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_database_down_known_stale_is_409_and_nothing_new_is_admitted() {
    let Some(pg) = OwnPg::start() else { return };
    let probe = Probe::default();
    let limits = PoolLimits { wait: Duration::from_millis(500), ..PoolLimits::default() };
    let one = Replica::with_timing(&probe, pg.config(), drain(Duration::from_secs(1)), limits, short()).await;
    assert_eq!(one.post(1, 4).await.0, 200);
    assert_eq!(one.post(1, 5).await.0, 200);
    let pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        pg
    })
    .await
    .unwrap();
    let stopped = Instant::now();
    assert_eq!(one.post(1, 4).await.0, 409, "a stale token the replica knows about");
    if stopped.elapsed() < Duration::from_millis(500) {
        assert_eq!(one.post(1, 5).await.0, 200, "the current token under a claim still valid here");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await; // past the claim's local deadline
    let before = probe.events().len();
    let (status, problem) = one.post(1, 5).await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["type"], "urn:fencing:problem:store-unavailable");
    let (status, _) = one.post(2, 1).await;
    assert_eq!(status, 503);
    assert_eq!(probe.events().len(), before, "a request reached the handler without a claim");
    assert_eq!(one.post(1, 3).await.0, 409, "still known stale");
    drop(pg);
}
