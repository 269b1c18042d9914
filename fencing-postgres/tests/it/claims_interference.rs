//! What another session on the database can do to the replicas' claims
//! (issue 47), as tests against real PostgreSQL: flood the claims channel
//! with `NOTIFY` (no privilege needed), hold a lock on the mark table while a
//! new replica migrates (what `pg_dump` does), delete a claim row by hand.
//! Each replica is a real axum server; one probe records every handler's
//! entry and exit in one order (one mutex: one clock), and the order is checked.

use std::sync::Arc;
use std::time::Duration;

use crate::common::replicas::{PgReplica, Probe, Replica, Setup};
use crate::common::{BOUND, TestDb};
use fencing_layer::FencingLayer;
use fencing_layer::claims::{ClaimStore, ClaimTiming};
use fencing_postgres::{FenceError, PgFence};
use test_support::OwnPg;
use test_support::replicas::key;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, Config};

/// Valid 900 ms after a renewal is sent, renewed every 200 ms (each bounded
/// by 200 ms), expiring 1 s after the database wrote it.
fn short() -> ClaimTiming {
    ClaimTiming::for_term(Duration::from_secs(1))
}

fn layer() -> FencingLayer {
    FencingLayer::new().drain_timeout(BOUND)
}

/// The flood's timing: valid 2.7 s after a renewal is sent, renewed every
/// 600 ms, each renewal bounded by 600 ms (a renewal slower than that reopens
/// the session). Room for a machine that other work loads too (two cores
/// here); the attack's flood left renewals waiting for seconds.
fn flood_timing() -> ClaimTiming {
    ClaimTiming::for_term(Duration::from_secs(3))
}

/// How long the forgers flood: longer than a claim is valid without a renewal.
const FLOOD: Duration = Duration::from_secs(5);

/// The token of the requests held inside through a whole test.
const LONG: u64 = 1_000_000;

/// How often a waiting raise claims again when it hears nothing (the layer's poll).
const POLL: Duration = Duration::from_millis(100);

/// Three sessions of a role with no privilege on the tables send forged
/// raises for the keys the replicas hold, as fast as they can (at least
/// 50,000 a second, or the test proves nothing), for 5 s, while two replicas
/// hold claims (a request held inside on each for the whole flood, longer
/// than a claim is valid unless renewed) and hand key 1 over between them,
/// token by token. No claim is lost (no 503), and every handover (from the
/// holder's exit to the next token's entry) completes within the bound the
/// docs give a raise nobody hears of: the holder's keeper finds the raise
/// with the next renewal that carries its claim (at most two renewal periods
/// and a renewal's bound away), and the raise claims again within its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_notify_flood_loses_no_claim_and_stalls_no_handover() {
    let Some(pg) = OwnPg::start() else { return };
    let probe = Probe::default();
    let one = Arc::new(Replica::build(&probe, layer(), Setup::new(pg.config(), flood_timing())).await);
    let two = Arc::new(Replica::build(&probe, layer(), Setup::new(pg.config(), flood_timing())).await);
    let forger = Forger::create(&pg.config()).await;
    probe.hold(LONG);
    let long = [one.spawn_post(2, LONG), two.spawn_post(3, LONG)];
    probe.wait_inside(2, LONG, 1).await;
    probe.wait_inside(3, LONG, 1).await;
    probe.hold(1);
    let mut holder = one.spawn_post(1, 1);
    probe.wait_inside(1, 1, 1).await;

    let flood = forger.flood(3, FLOOD);
    let renewals = Renewals::watch([one.claims().clone(), two.claims().clone()]);
    let started = Instant::now();
    let mut handovers = Vec::new();
    let mut token = 1;
    while started.elapsed() < FLOOD {
        let next = token + 1;
        let to = if next % 2 == 0 { &two } else { &one };
        probe.hold(next);
        let mut raise = to.spawn_post(1, next);
        // Long enough for the raise to commit its mark and wait for the holder.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let left = Instant::now();
        probe.release(token);
        handovers.push(entered(&probe, next, &mut raise).await - left);
        let (status, problem) = holder.await.unwrap();
        assert_eq!(status, 200, "the holder of {token} during the flood: {problem}");
        (holder, token) = (raise, next);
    }
    let sent = flood.await.unwrap();
    let backlog = forger.queue_usage().await;
    let slowest_renewal = renewals.stop().await;
    probe.release(token);
    assert_eq!(holder.await.unwrap().0, 200);
    probe.release(LONG);
    for held in long {
        let (status, problem) = held.await.unwrap();
        assert_eq!(status, 200, "a claim held through the flood was lost: {problem}");
    }
    probe.assert_invariants();

    let rate = sent as f64 / FLOOD.as_secs_f64();
    handovers.sort();
    let timing = flood_timing();
    let bound = timing.renew_every * 2 + timing.renew_timeout + POLL;
    eprintln!(
        "flood: {sent} forged notifications in {FLOOD:?} ({rate:.0}/s); {} handovers, median {:?}, \
         slowest {:?} (bound {bound:?}); slowest renewal seen {slowest_renewal:?}; the server's \
         notification queue {:.4} % full at the end",
        handovers.len(),
        handovers[handovers.len() / 2],
        handovers.last().unwrap(),
        backlog * 100.0,
    );
    assert!(rate > 50_000.0, "the flood sent only {rate:.0} notifications a second: it proves nothing");
    assert!(handovers.len() >= 3, "only {} handovers in the flood", handovers.len());
    let slowest = *handovers.last().unwrap();
    assert!(slowest <= bound, "a handover took {slowest:?} during the flood, past {bound:?}");
    forger.drop_role().await;
}

/// When the raise to `token` on key 1 entered (a panic naming its answer if it got one instead).
async fn entered(probe: &Probe, token: u64, raise: &mut JoinHandle<(u16, serde_json::Value)>) -> Instant {
    let entered = async {
        while probe.inside(1, token) == 0 {
            if raise.is_finished() {
                let (status, problem) = raise.await.unwrap();
                panic!("the raise to {token} was answered {status} without entering: {problem}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Instant::now()
    };
    tokio::time::timeout(BOUND, entered)
        .await
        .unwrap_or_else(|_| panic!("the raise to {token} never entered"))
}

/// A role made for one test, with no privilege on any table, that floods the
/// claims channel. Roles are cluster-wide: the name is unique, and the role is
/// dropped at the end.
struct Forger {
    admin: Client,
    role: String,
    config: Config,
}

impl Forger {
    async fn create(config: &Config) -> Self {
        let admin = crate::common::connect_to(config).await;
        let role = format!("fencing_forger_{}", std::process::id());
        admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN")).await.unwrap();
        let mut as_role = config.clone();
        as_role.user(&role);
        let forger = crate::common::connect_to(&as_role).await;
        let denied = forger.query("SELECT * FROM fencing_marks_claims", &[]).await;
        assert!(denied.is_err(), "the forger can read the claims: the test proves nothing");
        Self { admin, role, config: as_role }
    }

    /// `sessions` sessions of the role send forged raises (tokens far above
    /// any held, for keys 1 to 3) as fast as they can for `how_long`: how many.
    fn flood(&self, sessions: usize, how_long: Duration) -> JoinHandle<u64> {
        let channel = PgFence::new().claims_channel().to_owned();
        let floods: Vec<_> = (0..sessions)
            .map(|_| {
                let (config, channel) = (self.config.clone(), channel.clone());
                tokio::spawn(async move {
                    let forger = crate::common::connect_to(&config).await;
                    // Distinct payloads: identical ones in one transaction are sent once.
                    let sql =
                        "SELECT count(pg_notify($1, 'r ' || (1000000000 + i)::text || ' /r/' || (i % 3 + 1)))
                               FROM generate_series(1, 2000) i";
                    let (until, mut sent) = (Instant::now() + how_long, 0_u64);
                    while Instant::now() < until {
                        // The server goes with a test that failed first: stop quietly then.
                        let Ok(row) = forger.query_one(sql, &[&channel]).await else { break };
                        sent += row.get::<_, i64>(0) as u64;
                    }
                    sent
                })
            })
            .collect();
        tokio::spawn(async move {
            let mut sent = 0;
            for flood in floods {
                sent += flood.await.unwrap();
            }
            sent
        })
    }

    /// How full the server's notification queue is (0 to 1): what listeners have not read yet.
    async fn queue_usage(&self) -> f64 {
        self.admin.query_one("SELECT pg_notification_queue_usage()", &[]).await.unwrap().get(0)
    }

    async fn drop_role(self) {
        let role = &self.role;
        self.admin
            .batch_execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}';
                 DROP ROLE {role}"
            ))
            .await
            .unwrap();
    }
}

/// The slowest renewal replicas report while they are watched (sampled every 10 ms).
struct Renewals {
    stop: tokio::sync::oneshot::Sender<()>,
    slowest: JoinHandle<Duration>,
}

impl Renewals {
    fn watch(stores: [ClaimStore; 2]) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let slowest = tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            while stopped.try_recv().is_err() {
                for store in &stores {
                    slowest = slowest.max(store.last_renewal().map_or(Duration::ZERO, |report| report.took));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            slowest
        });
        Self { stop, slowest }
    }

    async fn stop(self) -> Duration {
        let _ = self.stop.send(());
        self.slowest.await.unwrap()
    }
}

/// How long a reader holds its locks: three terms, about 15 renewals.
const READER_HOLDS: Duration = Duration::from_secs(3);

/// A reader holds `ACCESS SHARE` locks on the tables for three terms (what
/// `pg_dump` does) while a new replica starts and migrates, on a database
/// from before the claims table's trigger, and while a mark table from
/// before the `way` column is migrated. The new replica's migration adds the
/// trigger (its lock does not conflict with a reader's) without waiting on
/// the reader; a second one reads the catalog and does nothing; the old
/// table's, which needs the reader's table, fails within its lock timeout
/// with an error that names the table, and changes nothing. The requests held
/// inside on the two running replicas through it all keep their claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_reader_holds_up_no_renewal_while_a_replica_migrates() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::default();
    let one = Arc::new(Replica::build(&probe, layer(), Setup::new(db.config(), short())).await);
    let two = Arc::new(Replica::build(&probe, layer(), Setup::new(db.config(), short())).await);
    let admin = db.connect().await;
    admin
        .batch_execute(
            "DROP TRIGGER fencing_claims_released ON fencing_marks_claims;
             CREATE TABLE legacy_marks (
                 key TEXT COLLATE \"C\" PRIMARY KEY, mark NUMERIC(20,0) NOT NULL, previous NUMERIC(20,0) NOT NULL
             )",
        )
        .await
        .unwrap();
    probe.hold(LONG);
    let held = [one.spawn_post(1, LONG), two.spawn_post(2, LONG)];
    probe.wait_inside(1, LONG, 1).await;
    probe.wait_inside(2, LONG, 1).await;

    let mut reader = db.connect().await;
    let (locked, mut unlocked) = tokio::sync::oneshot::channel();
    let reading = tokio::spawn(async move {
        let tx = reader.transaction().await.unwrap();
        tx.batch_execute("LOCK TABLE fencing_marks, fencing_marks_claims, legacy_marks IN ACCESS SHARE MODE")
            .await
            .unwrap();
        locked.send(()).unwrap();
        tokio::time::sleep(READER_HOLDS).await;
        tx.commit().await.unwrap();
    });
    (&mut unlocked).await.unwrap();
    let reading_since = Instant::now();

    let started = Instant::now();
    let three = Replica::build(&probe, layer(), Setup::new(db.config(), short())).await;
    let migrated = started.elapsed();
    assert!(
        migrated < Duration::from_secs(1),
        "the new replica took {migrated:?} to start behind the reader"
    );
    assert!(has_release_trigger(&admin).await, "the migration did not add the trigger");
    let current = Instant::now();
    PgFence::new().migrate(&admin).await.expect("a current schema");
    let looked = current.elapsed();

    let legacy = PgFence::new().table("legacy_marks").unwrap();
    let refused = Instant::now();
    let error = legacy.migrate(&admin).await.expect_err("legacy_marks was altered behind a reader");
    let failed_after = refused.elapsed();
    assert!(
        matches!(&error, FenceError::MigrationBlocked { table, .. } if table == "legacy_marks"),
        "{error:?}"
    );
    let message = error.to_string();
    for words in ["could not be migrated now", "lock on table legacy_marks", "try again later"] {
        assert!(message.contains(words), "{message}");
    }
    assert!(error.is_retryable());
    assert!(failed_after < Duration::from_secs(1), "the refused migration took {failed_after:?}");
    let way: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'legacy_marks'::regclass AND attname = 'way'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(way, 0, "a refused migration changed the table");
    assert!(reading_since.elapsed() < READER_HOLDS, "the reader was gone before the checks ended");

    assert_eq!(three.post(3, 1).await.0, 200, "the new replica does not serve");
    reading.await.unwrap();
    probe.release(LONG);
    for held in held {
        let (status, problem) = held.await.unwrap();
        assert_eq!(status, 200, "a claim was lost while the reader held its locks: {problem}");
    }
    legacy.migrate(&admin).await.expect("the old table, once the reader is gone");
    probe.assert_invariants();
    eprintln!(
        "behind the reader: the new replica started in {migrated:?}; a current schema looked in {looked:?}; \
         the blocked migration failed after {failed_after:?}"
    );
}

async fn has_release_trigger(admin: &Client) -> bool {
    let sql = "SELECT count(*) FROM pg_trigger
               WHERE tgrelid = 'fencing_marks_claims'::regclass AND tgname = 'fencing_claims_released'";
    admin.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) == 1
}

/// Half a renewal period of the default timing: without the delete heard, the
/// next renewal carrying the claim is about two periods away.
const STOPPED_WITHIN: Duration = Duration::from_millis(500);

/// A claim row deleted by hand while a request is inside under it, right after
/// a renewal carried it, in three rounds (default timing: renewals every
/// second). The delete is announced (the claims table's trigger), the keeper
/// renews that claim at once, finds it gone and stops the request: 503
/// claim-lost within half a renewal period, not at the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_row_deleted_by_hand_stops_its_requests_at_once() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::default();
    let one =
        Arc::new(Replica::build(&probe, layer(), Setup::new(db.config(), ClaimTiming::default())).await);
    let admin = db.connect().await;
    let mut stops = Vec::new();
    for round in 1..=3 {
        probe.hold(round);
        let inside = one.spawn_post(round, round);
        probe.wait_inside(round, round, 1).await;
        next_renewal(one.claims()).await;
        let deleted = admin.execute("DELETE FROM fencing_marks_claims WHERE key = $1", &[&key(round)]).await;
        assert_eq!(deleted.unwrap(), 1, "round {round}: no claim row to delete");
        let since = Instant::now();
        let (status, problem) = inside.await.unwrap();
        let stopped = since.elapsed();
        assert_eq!(status, 503, "round {round}: {problem}");
        assert_eq!(problem["type"], "urn:fencing:problem:claim-lost");
        stops.push(stopped);
        probe.release(round);
    }
    eprintln!("a claim row deleted by hand: its request stopped after {stops:?}");
    for stopped in stops {
        assert!(stopped < STOPPED_WITHIN, "a request ran on {stopped:?} after its claim row was deleted");
    }
}

/// Waits for the next renewal that carries a claim.
async fn next_renewal(claims: &ClaimStore) {
    let before = claims.last_renewal();
    let renewed = async {
        while claims.last_renewal() == before || claims.last_renewal().is_none_or(|report| report.claims == 0)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(BOUND, renewed).await.expect("no renewal carried the claim");
}
