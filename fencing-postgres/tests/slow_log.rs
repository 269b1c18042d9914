//! 10,000 claims expiring together while the log output takes 1 ms a line.
//!
//! The keeper revokes every claim whose deadline passed before it logs
//! anything, logs one line for them all, and hands its lines to a thread of
//! its own: a slow sink costs it nothing. (It used to write one line per claim
//! *before* revoking that claim: at 1 ms a line, the last of 10,000 claims
//! was revoked 10 s after its deadline, long after its row had expired.)
//!
//! The slow sink is the process's global subscriber, as an application's is
//! (so this binary holds this one test).
//!
//! The replica holds a place inside each claim (its permits, kept), so only
//! the keeper stops them: the requests' own deadline timers are tested in
//! fencing-layer's `claim_stops`.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::stall::StallProxy;
use common::{BOUND, TestDb, port_of, with_port};
use fencing_layer::claims::ClaimTiming;
use fencing_layer::store::SharedStore;
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};

const CLAIMS: usize = 10_000;

/// A log output that takes 1 ms for every write.
struct Slow;

impl Write for Slow {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        std::thread::sleep(Duration::from_millis(1));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_claims_expiring_together_are_revoked_on_time_with_a_1ms_log_sink() {
    let Some(db) = TestDb::create().await else { return };
    let proxy = StallProxy::start(([127, 0, 0, 1], port_of(&db.config())).into()).await;
    let session = with_port(&db.config(), proxy.addr.port(), "slow-log-session");
    let pool = fencing_postgres::pool(db.config(), PoolLimits::default()).unwrap();
    // The default 5 s term (valid 4.5 s after sending, renewals bounded by 1 s):
    // renewing thousands of claims must not time out on a loaded 2-core machine.
    let timing = ClaimTiming::for_term(Duration::from_secs(5));
    let store = PgSharedStore::with_timing(pool, session, PgFence::new(), timing).unwrap();
    store.migrate().await.unwrap();
    // The application's subscriber, as an application installs it: for the
    // whole process (this binary holds this one test for that reason).
    let sink = tracing_subscriber::fmt().with_writer(|| Slow).with_max_level(tracing::Level::WARN).finish();
    tracing::subscriber::set_global_default(sink).expect("the only subscriber of this binary");
    store.ready().await.unwrap();
    let started = Instant::now();
    let mut inside = Vec::with_capacity(CLAIMS);
    for batch in (0..CLAIMS).collect::<Vec<_>>().chunks(50) {
        let mut admits = tokio::task::JoinSet::new();
        batch.iter().for_each(|n| drop(admits.spawn(store.admit(&format!("/slow/{n}"), 1, BOUND))));
        while let Some(permit) = admits.join_next().await {
            inside.push(permit.unwrap().expect("a claim"));
        }
    }
    let last = store.claims().last_renewal();
    eprintln!("{CLAIMS} claims taken in {:?}; the last renewal: {last:?}", started.elapsed());
    assert_eq!(store.claims().claims(), CLAIMS);
    assert_eq!(store.claims().revocations().at_deadline, 0, "claims lapsed while they were taken");

    // No renewal gets through from now on: every deadline passes within one validity.
    proxy.stall();
    let stalled = Instant::now();
    let all_revoked = async {
        while store.claims().revocations().at_deadline < CLAIMS as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(timing.valid_for() + Duration::from_secs(5), all_revoked)
        .await
        .unwrap_or_else(|_| panic!("not every claim was revoked: {:?}", store.claims().revocations()));
    let revocations = store.claims().revocations();
    eprintln!("all revoked {:?} after the stall: {revocations:?}", stalled.elapsed());
    assert!(stalled.elapsed() <= timing.valid_for() + Duration::from_millis(500), "revoked late");
    // Each pass revoked its claims within half the margin of its soonest
    // deadline: well before their rows can expire (the margin after it).
    assert!(revocations.latest_late <= timing.margin / 2, "{revocations:?}");
    drop(inside);
}
