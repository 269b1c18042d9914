//! `PgLockClient` and `Lease` against a real PostgreSQL, with a real fenced resource
//! (axum behind `FencingLayer`) taking the writes.
//!
//! Most tests use the local PostgreSQL (127.0.0.1:5432, user postgres, trust auth), each
//! in a database of its own, dropped at the end. The restart test starts a server of its
//! own (test-support's `OwnPg`: initdb in a temporary directory, an ephemeral port) so that
//! it can kill -9 it.
//! Without PostgreSQL these tests print SKIPPED and pass, unless `CI=true`.

use std::time::Duration;

use fencing_client::{
    Grant, LeaseOptions, LockBackend, LockBackendExt, LockError, LossReason, PgLockClient,
    backend::LockStatus,
};
use test_support::{OwnPg, Proxy, TestDb};
use tokio::time::sleep;

use crate::common::{cancelled_at, fenced_resource, lost_by_its_deadline, write_doc};
use crate::conformance::{Backend, Restartable};
use crate::fault_tools::{FAKETIME_SEEN_WITHIN, FakeClock};

/// A migrated client of the test's database.
async fn client(db: &TestDb) -> PgLockClient {
    let client = PgLockClient::connect(&db.url()).unwrap();
    client.migrate().await.unwrap();
    client
}

/// A plain connection, to look at and change the tables behind the client's back.
async fn raw(db: &TestDb) -> tokio_postgres::Client {
    db.connect().await
}

// ---------- the backend, for the conformance suite ----------

impl Backend for TestDb {
    type Locks = PgLockClient;
    async fn start() -> Option<Self> {
        TestDb::create().await
    }
    async fn locks(&self) -> PgLockClient {
        client(self).await
    }
    async fn status(locks: &PgLockClient, name: &str) -> Option<LockStatus> {
        locks.lock_status(name).await.unwrap()
    }
    // Not `CONSECUTIVE_TOKENS`: racing acquires of a free lock may spend a value.
    const PAUSED: (Duration, Duration) = (Duration::from_millis(800), Duration::from_millis(700));
    async fn after_race(&self, locks: &PgLockClient, last: &Grant) {
        assert_eq!(last.lease_id, last.token.to_string());
        // Tokens come from one counter: another lock's token is higher still, and failed
        // attempts on a held lock spend no counter values.
        let other = locks.acquire("other", "a", Duration::from_secs(30)).await.unwrap();
        assert!(other.token > last.token);
        for _ in 0..5 {
            assert!(matches!(
                locks.acquire("other", "b", Duration::from_secs(30)).await,
                Err(LockError::Held { .. })
            ));
        }
        locks.release(&other).await.unwrap();
        let next = locks.acquire("other", "b", Duration::from_secs(30)).await.unwrap();
        assert_eq!(next.token, other.token + 1);
    }
}

impl Restartable for OwnPg {
    type Locks = PgLockClient;
    const NAME: &'static str = "PostgreSQL";
    async fn start() -> Option<Self> {
        OwnPg::start()
    }
    async fn locks(&self) -> PgLockClient {
        let locks = PgLockClient::connect_with(self.config()).unwrap();
        locks.migrate().await.unwrap();
        locks
    }
    async fn kill_9_and_restart(&mut self) {
        self.kill_9_and_start_again();
    }
    /// The pool reconnects after the restart.
    const NEW_CLIENT_PER_LIFE: bool = false;
}

conformance!(TestDb);
restart_conformance!(OwnPg);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_nobody_took_over_cannot_be_renewed() {
    let Some(db) = TestDb::create().await else { return };
    let a = client(&db).await;
    let c = a.acquire("idle", "client-c", Duration::from_millis(100)).await.unwrap();
    sleep(Duration::from_millis(300)).await;
    assert_eq!(a.keepalive(&c).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.lock_status("idle").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lease_row_cancels_the_handle_before_its_deadline() {
    let Some(db) = TestDb::create().await else { return };
    let a = client(&db).await;
    let lease = a.lease("job", "client-a", Duration::from_secs(6)).await.unwrap();
    let token = lease.cancellation_token();
    let deleted = raw(&db).await.execute("DELETE FROM fencing_leases WHERE name = 'job'", &[]).await.unwrap();
    assert_eq!(deleted, 1);
    // The next renewal (within TTL/3 = 2 s) finds no row, well before the 5.4 s deadline.
    let at = cancelled_at(&lease, Duration::from_secs(6)).await;
    assert!(token.is_cancelled() && !lease.is_valid());
    assert!(at < lease.deadline(), "cancelled at the deadline, not on the renewal");
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));
    let next = a.acquire("job", "client-b", Duration::from_secs(6)).await.unwrap();
    assert!(next.token > lease.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_cancels_the_handle_by_its_deadline() {
    let Some(db) = TestDb::create().await else { return };
    client(&db).await; // migrated
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=1",
        proxy.addr.port(),
        db.name()
    );
    let a = PgLockClient::connect(&url).unwrap();
    let options = LeaseOptions::default().request_timeout(Duration::from_millis(500));
    let lease = a.lease_with("job", "client-a", Duration::from_secs(3), options).await.unwrap();
    assert!(lease.is_valid());
    proxy.blackhole();
    lost_by_its_deadline(&lease).await;
}

/// A session that commits without waiting for its WAL (`synchronous_commit = off`): a crash
/// could take grants back, so tokens could repeat.
fn volatile_url(db: &TestDb) -> String {
    format!("{}&options=-c%20synchronous_commit%3Doff", db.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_could_lose_grants_is_refused_with_the_way_out() {
    let Some(db) = TestDb::create().await else { return };
    let locks = PgLockClient::connect(&volatile_url(&db)).unwrap();
    for refused in [locks.check_durability().await, locks.migrate().await] {
        match refused {
            Err(LockError::NotDurable(e)) => assert!(
                e.contains("synchronous_commit is off") && e.contains("accept_volatile_counter(true)"),
                "{e}"
            ),
            other => panic!("expected NotDurable, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_volatile_counter_takes_a_server_that_could_lose_grants() {
    let Some(db) = TestDb::create().await else { return };
    let locks = PgLockClient::connect(&volatile_url(&db)).unwrap().accept_volatile_counter(true);
    locks.migrate().await.unwrap();
    let grant = locks.acquire("report", "a", Duration::from_secs(5)).await.unwrap();
    assert_eq!(grant.token, 1);
    // Asked directly, the server is still what it is.
    assert!(matches!(locks.check_durability().await, Err(LockError::NotDurable(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_a_missing_table_are_clear_errors() {
    let Some(db) = TestDb::create().await else { return };
    let unmigrated = PgLockClient::connect(&db.url()).unwrap();
    match unmigrated.acquire("x", "a", Duration::from_secs(1)).await {
        Err(LockError::Rejected { detail, .. }) => assert!(detail.contains("migrate"), "{detail}"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    let locks = client(&db).await;
    locks.migrate().await.unwrap(); // idempotent
    for (name, holder, ttl) in [
        ("", "a", Duration::from_secs(1)),
        ("x", "", Duration::from_secs(1)),
        ("x", "a", Duration::ZERO),
        ("x\0y", "a", Duration::from_secs(1)),
        ("x", "a", Duration::MAX),
    ] {
        let result = locks.acquire(name, holder, ttl).await;
        assert!(
            matches!(result, Err(LockError::InvalidArgument(_))),
            "{name:?} {holder:?} {ttl:?}: {result:?}"
        );
    }
    let forged = Grant {
        lease_id: "1".into(),
        name: "x".into(),
        holder: "a".into(),
        token: u64::MAX,
        ttl: Duration::from_secs(1),
        proof: None,
    };
    assert!(matches!(locks.keepalive(&forged).await, Err(LockError::InvalidArgument(_))));
    assert!(matches!(locks.release(&forged).await, Err(LockError::InvalidArgument(_))));
    // Names are kept byte for byte, whatever they hold.
    let odd = locks.acquire("it's \"odd\"; DROP TABLE x; ✓", "h'", Duration::from_secs(5)).await.unwrap();
    assert_eq!(locks.lock_status("it's \"odd\"; DROP TABLE x; ✓").await.unwrap().unwrap().holder, "h'");
    locks.release(&odd).await.unwrap();
    // Another table, in another schema.
    raw(&db).await.batch_execute("CREATE SCHEMA ops").await.unwrap();
    let ops = PgLockClient::connect(&db.url()).unwrap().with_table("ops.locks").unwrap();
    ops.migrate().await.unwrap();
    let g = ops.acquire("x", "a", Duration::from_secs(5)).await.unwrap();
    assert_eq!(g.token, 1, "a table of its own has a counter of its own");
    assert_eq!(locks.lock_status("x").await.unwrap(), None);
}

/// The boundary of `PgLockClient`'s clock: expiry is decided by the database
/// server's wall clock (`clock_timestamp()`), never by a client's. A PostgreSQL of
/// the test's own under libfaketime (wall clock only), the clock moved while leases
/// are held (RELIABILITY.md §29):
/// * **+1 h**: a 60 s lease ends at once on the server although its holder still
///   trusts it; the next holder gets a higher token, the old holder's write is
///   refused (409) and its keeper is cancelled at its next renewal.
/// * **−1 h**: a 1 s lease lives an hour longer: nobody else gets the lock after
///   its TTL (the cost of trusting one clock; a released lease is free at once).
/// * Tokens keep increasing through both moves and a `kill -9` restart an hour back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_clock_decides_expiry_and_tokens_ignore_it() {
    // The spec file in the server's directory: the server's user must read it.
    let mut fake = None;
    let Some(pg) = OwnPg::start_with_env(|dir| {
        let clock = FakeClock::new(dir);
        let env = clock.as_ref().map(|clock| clock.env(true)).unwrap_or_default();
        fake = clock;
        env
    }) else {
        return;
    };
    let Some(clock) = fake else { return };
    let locks = PgLockClient::connect_with(pg.config()).unwrap();
    locks.migrate().await.unwrap();
    let (resource, _docs) = fenced_resource().await;

    // Forward an hour: the server ends a 60 s lease at once.
    let options = LeaseOptions::default().renew_every(Duration::from_millis(300));
    let a = locks.lease_with("job", "client-a", Duration::from_secs(60), options).await.unwrap();
    assert_eq!(write_doc(&resource, "job", a.token(), "a").await, 200);
    clock.set("+1h");
    sleep(FAKETIME_SEEN_WITHIN).await;
    let b = locks
        .acquire("job", "client-b", Duration::from_secs(60))
        .await
        .expect("granted at once: a's lease ended");
    assert!(b.token > a.token(), "{} after {}", b.token, a.token());
    assert_eq!(write_doc(&resource, "job", b.token, "b").await, 200);
    assert_eq!(write_doc(&resource, "job", a.token(), "a, late").await, 409, "the old holder fenced");
    cancelled_at(&a, Duration::from_secs(3)).await;
    assert_eq!(a.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));
    locks.release(&b).await.unwrap();

    // Back an hour: a 1 s lease granted before the step lives an hour longer.
    clock.set("+0");
    sleep(FAKETIME_SEEN_WITHIN).await;
    let c = locks.acquire("job", "client-c", Duration::from_secs(1)).await.unwrap();
    assert!(c.token > b.token);
    clock.set("-1h");
    sleep(Duration::from_millis(1500)).await; // past its TTL in real time
    let held = locks.acquire("job", "client-d", Duration::from_secs(1)).await;
    assert!(matches!(held, Err(LockError::Held { .. })), "{held:?}");
    let status = locks.lock_status("job").await.unwrap().expect("c still holds it on the server");
    assert!(status.expires_in > Duration::from_secs(3_500), "{status:?}");
    locks.release(&c).await.unwrap();
    let d = locks.acquire("job", "client-d", Duration::from_secs(1)).await.unwrap();
    assert!(d.token > c.token);

    // kill -9 and a restart with the server's clock still an hour back.
    pg.kill_9_and_start_again();
    let e = locks.acquire("after-restart", "client-e", Duration::from_secs(1)).await.unwrap();
    assert!(e.token > d.token, "{} after {}", e.token, d.token);
    eprintln!(
        "PgLockClient, server clock +1h: a 60 s lease ended at once (token {} fenced by {}); -1h: a 1 s lease \
         had {:?} left after 1.5 s; tokens {} < {} < {} < {} < {} across the moves and a kill -9 restart",
        a.token(),
        b.token,
        status.expires_in,
        a.token(),
        b.token,
        c.token,
        d.token,
        e.token
    );
}

/// Through a PgBouncer in transaction mode (a stock configuration of the
/// test's own), where a named prepared statement would be missing on the next
/// server session or clash with another client's: 8 holders take, renew and
/// release one lock 20 times each, concurrently. Every call answers, tokens
/// are all different and rise, and nothing fails but `Held`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_through_a_transaction_pooler() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = test_support::PgBouncer::start(5432, test_support::PoolMode::Transaction).await
    else {
        return;
    };
    let locks = PgLockClient::connect(&bouncer.url(db.name())).unwrap();
    locks.migrate().await.unwrap();
    let holders = (0..8).map(|n| {
        let locks = locks.clone();
        tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..20 {
                match locks.acquire("pooled", &format!("holder-{n}"), Duration::from_secs(5)).await {
                    Ok(grant) => {
                        locks.keepalive(&grant).await.expect("keepalive through the pooler");
                        tokens.push(grant.token);
                        locks.release(&grant).await.expect("release through the pooler");
                    }
                    Err(LockError::Held { .. }) => {}
                    Err(other) => panic!("a lock call through the pooler failed: {other}"),
                }
            }
            tokens
        })
    });
    let mut tokens = Vec::new();
    for holder in holders.collect::<Vec<_>>() {
        tokens.extend(holder.await.unwrap());
    }
    let granted = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert!(granted > 0);
    assert_eq!(tokens.len(), granted, "a token was handed out twice");
}
