//! The holes an outside attack found in replica claims, as tests against real
//! PostgreSQL where the hole is PostgreSQL's: unsafe timings, a deadline armed
//! late, a background session that cannot connect, forged notifications, busy
//! and locked rows, expired rows left by a dead replica, the key limit, a
//! stalled renewal of thousands of claims. (A blocked worker, a handler that
//! never yields and an abandoned grant are in the conformance suite every
//! engine runs: `conformance.rs`.) Each replica is a real axum server; one
//! probe records every handler's entry and exit in one order (one mutex: one
//! clock), and the order is checked.

use std::sync::Arc;
use std::time::Duration;

use crate::common::replicas::{PgReplica, Probe, Replica, Setup};
use crate::common::stall::StallProxy;
use crate::common::{BOUND, TestDb, port_of, with_port};
use fencing_layer::FencingLayer;
use fencing_layer::claims::ClaimTiming;
use fencing_layer::store::{SharedRefusal, SharedStore, StoreError};
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};
use test_support::OwnPg;
use tokio::time::Instant;

/// Valid 800 ms after a renewal is sent, renewed every 200 ms (each bounded
/// by 200 ms), expiring 1 s after the database wrote it.
fn short() -> ClaimTiming {
    ClaimTiming::for_term(Duration::from_secs(1))
}

fn drain(bound: Duration) -> FencingLayer {
    FencingLayer::new().drain_timeout(bound)
}

/// Timings that cannot keep a claim are refused when the store is made, with
/// the rule they break: a renewal every 3 s for a 1 s term (the attack's), and
/// a renewal period plus its bound at term − margin.
#[test]
fn unsafe_timings_are_refused_at_construction() {
    let config: tokio_postgres::Config = "host=127.0.0.1 user=postgres".parse().unwrap();
    let pool = fencing_postgres::pool(config.clone(), PoolLimits::default()).unwrap();
    let ms = Duration::from_millis;
    for timing in [
        ClaimTiming { term: ms(1000), renew_every: ms(3000), renew_timeout: ms(3000), margin: ms(100) },
        ClaimTiming { term: ms(1000), renew_every: ms(450), renew_timeout: ms(450), margin: ms(100) },
        ClaimTiming { term: ms(1000), renew_every: ms(100), renew_timeout: ms(100), margin: ms(1000) },
    ] {
        let refused = PgSharedStore::with_timing(pool.clone(), config.clone(), PgFence::new(), timing);
        let error = refused.expect_err("an unsafe timing was taken").to_string();
        assert!(error.contains("unsafe claim timing"), "{error}");
    }
    let safe = ClaimTiming { term: ms(1000), renew_every: ms(300), renew_timeout: ms(200), margin: ms(100) };
    assert!(PgSharedStore::with_timing(pool, config, PgFence::new(), safe).is_ok());
}

/// A 500 ms term, and the route of the replica's background session cut while
/// a request is inside, in six rounds. Each time the claim's deadline is
/// armed at its grant, the request is stopped (503 claim-lost) before the row
/// can expire, and the raise on the other replica gets in only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_500ms_term_with_the_background_route_cut_stops_in_time() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::default();
    let timing = ClaimTiming::for_term(Duration::from_millis(500));
    let two = Arc::new(Replica::build(&probe, drain(BOUND), Setup::new(db.config(), timing)).await);
    for key in 1..=6_u64 {
        let proxy = StallProxy::start(([127, 0, 0, 1], port_of(&db.config())).into()).await;
        let cut = Setup {
            session: with_port(&db.config(), proxy.addr.port(), "routed"),
            ..Setup::new(db.config(), timing)
        };
        let one = Arc::new(Replica::build(&probe, drain(BOUND), cut).await);
        probe.hold(key * 10);
        let inside = one.spawn_post(key, key * 10);
        probe.wait_inside(key, key * 10, 1).await;
        proxy.sever();
        let raise = two.spawn_post(key, key * 10 + 1);
        let (status, problem) = inside.await.unwrap();
        assert_eq!(status, 503, "round {key}: {problem}");
        assert_eq!(problem["type"], "urn:fencing:problem:claim-lost");
        assert_eq!(raise.await.unwrap().0, 200, "round {key}");
        assert!(probe.at((key, key * 10, false)) < probe.at((key, key * 10 + 1, true)), "round {key}");
        probe.release(key * 10);
    }
    probe.assert_invariants();
}

/// A background session that can never connect: the store says so when it
/// starts, and grants nothing (503, no handler reached) rather than claims
/// nobody could renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_that_cannot_connect_is_refused_and_grants_nothing() {
    let Some(db) = TestDb::create().await else { return };
    let nowhere = with_port(&db.config(), test_support::free_port(), "routed");
    let pool = fencing_postgres::pool(db.config(), PoolLimits::default()).unwrap();
    let store = PgSharedStore::with_timing(pool, nowhere, PgFence::new(), short()).unwrap();
    store.migrate().await.unwrap();
    let error = store.ready().await.expect_err("a session that cannot connect was taken");
    assert!(error.to_string().contains("no background session"), "{error}");
    match store.admit("/r/1", 1, Duration::from_secs(1)).await {
        Err(SharedRefusal::Unavailable(error)) => {
            assert!(error.to_string().contains("no background session"))
        }
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("a claim was granted that nobody can renew"),
    }
    let rows: i64 =
        db.connect().await.query_one("SELECT count(*) FROM fencing_marks_claims", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0, "a claim row was written");
}

/// A role with no privilege on the tables can `NOTIFY` the replicas' channel:
/// a raise to u64::MAX for a key they hold, a release, garbage, and a flood of
/// 3,000 raises with 8 KB keys. Nothing changes what the replicas admit: they
/// read the mark before they act, and a raise heard is only a reason to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_notifications_change_nothing() {
    let Some(pg) = OwnPg::start() else { return };
    let probe = Probe::default();
    let one = Arc::new(Replica::build(&probe, drain(BOUND), Setup::new(pg.config(), short())).await);
    let two = Arc::new(Replica::build(&probe, drain(BOUND), Setup::new(pg.config(), short())).await);
    let admin = crate::common::connect_to(&pg.config()).await;
    admin
        .batch_execute("CREATE ROLE forger LOGIN; REVOKE ALL ON ALL TABLES IN SCHEMA public FROM forger")
        .await
        .unwrap();
    let mut as_forger = pg.config();
    as_forger.user("forger");
    let forger = crate::common::connect_to(&as_forger).await;
    let denied = forger.query("SELECT * FROM fencing_marks", &[]).await;
    assert!(denied.is_err(), "the forger can read the marks: the test proves nothing");
    let channel = PgFence::new().claims_channel().to_owned();
    // The holder of token 5 on both replicas, a request of it held inside one.
    assert_eq!(one.post(1, 5).await.0, 200);
    assert_eq!(two.post(1, 5).await.0, 200);
    probe.hold(5);
    let held = one.spawn_post(1, 5);
    probe.wait_inside(1, 5, 1).await;
    for payload in ["r 18446744073709551615 /r/1", "l 5 /r/1", "r 6 /r/1", "r x /r/1", "garbage", "r 7 /r/2"]
    {
        forger.execute("SELECT pg_notify($1, $2)", &[&channel, &payload]).await.unwrap();
    }
    let before = rss_kib();
    let flood = format!(
        "SELECT pg_notify('{channel}', 'r 18446744073709551615 /r/' || i || repeat('x', 7900)) FROM generate_series(1, 3000) i"
    );
    forger.batch_execute(&flood).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // 3,000 notes of 8 KB, heard by two replicas: 47 MB each when they were kept.
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 16 * 1024, "the flood cost {grown} KiB");
    for replica in [&one, &two] {
        let store = replica.store.as_ref().unwrap();
        assert_ne!(store.claims().known_mark("/r/1"), Some(u64::MAX), "a forged mark was taken as fact");
        let admitted = store.admit("/r/1", 5, BOUND).await;
        assert!(admitted.is_ok(), "the holder was turned away after forged notifications: {admitted:?}");
    }
    assert!(!held.is_finished(), "the request inside was stopped by a forged notification");
    // A real raise still overtakes: the replicas read the mark it wrote.
    let raise = two.spawn_post(1, 6);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!raise.is_finished(), "token 6 got in while token 5 was inside");
    probe.release(5);
    assert_eq!(held.await.unwrap().0, 200);
    assert_eq!(raise.await.unwrap().0, 200);
    assert_eq!(one.post(1, 5).await.0, 409);
    probe.assert_invariants();
}

/// This process's resident memory, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Another transaction holds one of a replica's claim rows for two terms. The
/// renewal skips that row (never waits on it, never fails the others): the
/// request under that claim alone is stopped at its deadline, the one under
/// the other claim runs on. A release whose row is locked gives up after the
/// lock timeout, not the pool's wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_locked_row_costs_one_claim() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::default();
    let setup = Setup { session: db.config(), ..Setup::new(db.config(), short()) };
    let mut named = db.config();
    named.application_name("locked-row");
    let one = Arc::new(Replica::build(&probe, drain(BOUND), Setup { pool: named, ..setup }).await);
    probe.hold(1);
    let (a, b) = (one.spawn_post(1, 1), one.spawn_post(2, 1));
    probe.wait_inside(1, 1, 1).await;
    probe.wait_inside(2, 1, 1).await;
    let mut admin = db.connect().await;
    let lock = admin.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM fencing_marks_claims WHERE key = '/r/1' FOR UPDATE", &[]).await.unwrap();
    let (status, problem) = a.await.unwrap();
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["type"], "urn:fencing:problem:claim-lost");
    tokio::time::sleep(short().term).await;
    assert!(!b.is_finished(), "the claim on the other key was lost too");
    // The claim on /r/1 is being released (nobody inside); its row is still locked.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let watcher = db.connect().await;
    let waiting: i64 = watcher
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'locked-row' AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(waiting, 0, "a release still waits on the locked row past its lock timeout");
    lock.rollback().await.unwrap();
    probe.release(1);
    assert_eq!(b.await.unwrap().0, 200);
    probe.assert_invariants();
}

/// A dead replica's claims (rows that expired long ago) are swept by a live
/// replica within its sweep period (5 terms); live rows are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_claims_of_a_dead_replica_are_swept() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::default();
    let one = Arc::new(Replica::build(&probe, drain(BOUND), Setup::new(db.config(), short())).await);
    let admin = db.connect().await;
    admin
        .batch_execute(
            "INSERT INTO fencing_marks_claims (key, replica, token, grant_id, expires_at)
             SELECT '/dead/' || i, 'dead-replica', 1, i, clock_timestamp() - interval '1 minute'
             FROM generate_series(1, 500) i",
        )
        .await
        .unwrap();
    probe.hold(1);
    let live = one.spawn_post(1, 1);
    probe.wait_inside(1, 1, 1).await;
    let swept = async {
        loop {
            let dead: i64 = admin
                .query_one("SELECT count(*) FROM fencing_marks_claims WHERE replica = 'dead-replica'", &[])
                .await
                .unwrap()
                .get(0);
            if dead == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(short().term * 7, swept).await.expect("the dead replica's claims were not swept");
    let live_rows: i64 =
        admin.query_one("SELECT count(*) FROM fencing_marks_claims", &[]).await.unwrap().get(0);
    assert_eq!(live_rows, 1, "the live claim was swept too");
    probe.release(1);
    assert_eq!(live.await.unwrap().0, 200);
}

/// `max_keys` applies to a shared store: a replica holding claims on as many
/// keys as it may answers 503 for one more (fail closed), and takes it once a
/// claim is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_key_limit_applies_to_claims() {
    let Some(db) = TestDb::create().await else { return };
    let pool = fencing_postgres::pool(db.config(), PoolLimits::default()).unwrap();
    let store = PgSharedStore::with_timing(pool, db.config(), PgFence::new(), short()).unwrap().max_keys(2);
    store.migrate().await.unwrap();
    store.ready().await.unwrap();
    let a = store.admit("/r/1", 1, BOUND).await.expect("first key");
    let _b = store.admit("/r/2", 1, BOUND).await.expect("second key");
    match store.admit("/r/3", 1, BOUND).await {
        Err(SharedRefusal::Unavailable(StoreError::KeyTableFull { limit: 2 })) => {}
        Err(other) => panic!("expected KeyTableFull, got {other:?}"),
        Ok(_) => panic!("a third key was claimed past a limit of two"),
    }
    // A key already claimed is not a new key.
    drop(store.admit("/r/1", 1, BOUND).await.expect("a key already held"));
    drop(a);
    // Idle, /r/1's claim is released within two renewal periods; then /r/3 fits.
    let fits = async {
        loop {
            if store.admit("/r/3", 1, BOUND).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(short().term * 2, fits).await.expect("the limit stayed full after a release");
}

/// A replica holds 3,000 claims, and its background session stalls in the
/// middle of a renewal (the network hangs, no reset). The renewal held no row
/// lock past its own statement: raises of those keys on another replica get
/// in once the claims have expired in the database (about a term), none gets
/// 503, and the stalled replica gives up its claims on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_renewal_with_thousands_of_claims_holds_up_no_raise() {
    let Some(db) = TestDb::create().await else { return };
    let proxy = StallProxy::start(([127, 0, 0, 1], port_of(&db.config())).into()).await;
    let session = with_port(&db.config(), proxy.addr.port(), "stalled-session");
    let pool = fencing_postgres::pool(db.config(), PoolLimits::default()).unwrap();
    let one = PgSharedStore::with_timing(pool, session, PgFence::new(), short()).unwrap();
    one.migrate().await.unwrap();
    one.ready().await.unwrap();
    let mut permits = Vec::new();
    for chunk in (0..3_000).collect::<Vec<u32>>().chunks(100) {
        let admissions: Vec<_> =
            chunk.iter().map(|key| tokio::spawn(one.admit(&format!("/r/{key}"), 1, BOUND))).collect();
        for admission in admissions {
            permits.push(admission.await.unwrap().expect("a claim on a fresh key"));
        }
    }
    // Stall the session the moment a renewal is running on it.
    let watcher = db.connect().await;
    let running = async {
        loop {
            let active: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'stalled-session' AND state = 'active'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if active > 0 {
                return;
            }
        }
    };
    tokio::time::timeout(BOUND, running).await.expect("no renewal ran");
    proxy.stall();
    let stalled = Instant::now();
    let probe = Probe::default();
    let two = Arc::new(
        Replica::build(&probe, drain(Duration::from_secs(4)), Setup::new(db.config(), short())).await,
    );
    let raises: Vec<_> = (0..3_000).step_by(150).map(|key| two.spawn_post(key, 2)).collect();
    for raise in raises {
        let (status, problem) = raise.await.unwrap();
        assert_eq!(status, 200, "{problem}");
    }
    let waited = stalled.elapsed();
    assert!(waited < short().term * 3, "the raises waited {waited:?} for a term of {:?}", short().term);
    assert!(one.claims().last_renewal().is_some());
    drop(permits);
    proxy.resume();
}
