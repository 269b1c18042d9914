//! The shared-store conformance suite's engine on PostgreSQL: straight to the
//! shared server, or through a PgBouncer of the test's own in either mode.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use fencing_layer::claims::{ClaimStore, ClaimTiming};
use fencing_postgres::{PgSharedStore, PoolLimits, Pooling};
use test_support::shared_store_suite::Engine;
use test_support::{PgBouncer, PoolMode};
use tokio_postgres::Client;

use super::replicas::{claims_of, ready_store};
use super::{TestDb, port_of, with_port};

/// How the replicas reach the database.
pub trait Route: Send + Sync + 'static {
    /// The engine's name in messages.
    const NAME: &'static str;
    /// Through a PgBouncer in this mode; straight to PostgreSQL if `None`.
    const BOUNCER: Option<PoolMode>;
}

/// Straight to the shared server.
pub struct Direct;
impl Route for Direct {
    const NAME: &'static str = "PostgreSQL";
    const BOUNCER: Option<PoolMode> = None;
}

/// Through PgBouncer, `pool_mode = session`.
pub struct SessionPooler;
impl Route for SessionPooler {
    const NAME: &'static str = "PostgreSQL through PgBouncer (session pooling)";
    const BOUNCER: Option<PoolMode> = Some(PoolMode::Session);
}

/// Through PgBouncer, `pool_mode = transaction`.
pub struct TransactionPooler;
impl Route for TransactionPooler {
    const NAME: &'static str = "PostgreSQL through PgBouncer (transaction pooling)";
    const BOUNCER: Option<PoolMode> = Some(PoolMode::Transaction);
}

/// A throwaway database, and a connection to it that reads what the replicas wrote.
pub struct Pg<R: Route> {
    db: TestDb,
    admin: Client,
    bouncer: Option<PgBouncer>,
    route: PhantomData<R>,
}

/// Each replica's pool: at most 4 sessions (the raise storm counts them), a
/// connection within 500 ms or 503 (a stalled route fails fast).
fn limits(mode: Option<PoolMode>) -> PoolLimits {
    let pooling = if mode == Some(PoolMode::Transaction) { Pooling::Transaction } else { Pooling::Session };
    PoolLimits { max_size: POOL, wait: Duration::from_millis(500), ..PoolLimits::default() }.pooling(pooling)
}

/// Sessions in each replica's pool.
const POOL: usize = 4;

impl<R: Route> Engine for Pg<R> {
    const NAME: &'static str = R::NAME;
    /// Expiry is compared on the database's clock as each claim is made, so
    /// short terms are honest: 1 s keeps the suite short.
    const TERM: Duration = Duration::from_secs(1);
    const EXPIRY_SLACK: Duration = Duration::ZERO;
    type Store = PgSharedStore;

    async fn start() -> Option<Self> {
        let db = TestDb::create().await?;
        let admin = db.connect().await;
        let bouncer = match R::BOUNCER {
            Some(mode) => Some(PgBouncer::start(port_of(&db.config()), mode).await?),
            None => None,
        };
        Some(Pg { db, admin, bouncer, route: PhantomData })
    }

    fn addr(&self) -> SocketAddr {
        let port = self.bouncer.as_ref().map_or_else(|| port_of(&self.db.config()), |bouncer| bouncer.port);
        ([127, 0, 0, 1], port).into()
    }

    async fn store(&self, addr: SocketAddr, name: &str, timing: ClaimTiming) -> PgSharedStore {
        let config = with_port(&self.db.config(), addr.port(), name);
        ready_store(config.clone(), config, limits(R::BOUNCER), timing).await
    }

    fn claims(store: &PgSharedStore) -> &ClaimStore {
        claims_of(store)
    }

    async fn mark(&self, key: &str) -> Option<u64> {
        super::mark(&self.admin, key).await.map(|mark| mark.parse().unwrap())
    }

    async fn claims_on(&self, key: &str) -> usize {
        let sql = "SELECT count(*) FROM fencing_marks_claims WHERE key = $1";
        let rows: i64 = self.admin.query_one(sql, &[&key]).await.unwrap().get(0);
        rows as usize
    }

    async fn all_claims(&self) -> usize {
        let rows: i64 =
            self.admin.query_one("SELECT count(*) FROM fencing_marks_claims", &[]).await.unwrap().get(0);
        rows as usize
    }

    /// No more sessions of the replica than its pool and its two background
    /// connections (renewals, hints), and none waiting on a lock for a client
    /// that left. Within a term: a session the keeper just gave up (a renewal
    /// timed out on a loaded machine) closes once its last reply is read.
    async fn after_storm(&self, name: &str) {
        if self.bouncer.is_some() {
            // Server sessions are the pooler's, not the replica's, and keep the
            // last client's name: only the locks left waiting say something.
            return self.no_lock_waiters().await;
        }
        let sql = "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock'),
                          string_agg(pid || ' ' || state || ' since ' || backend_start::time || ': ' || left(query, 40), '; ')
                   FROM pg_stat_activity WHERE application_name = $1";
        let until = tokio::time::Instant::now() + Self::TERM;
        let (sessions, waiting, which) = loop {
            let row = self.admin.query_one(sql, &[&name]).await.unwrap();
            let (sessions, waiting, which): (i64, i64, Option<String>) = (row.get(0), row.get(1), row.get(2));
            if (sessions <= POOL as i64 + 2 && waiting == 0) || tokio::time::Instant::now() >= until {
                break (sessions, waiting, which);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            sessions <= POOL as i64 + 2,
            "{sessions} sessions of a replica with a pool of {POOL} a term after the storm: {which:?}"
        );
        assert_eq!(waiting, 0, "sessions still wait on locks for clients that left");
    }
}

impl<R: Route> Pg<R> {
    async fn no_lock_waiters(&self) {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
        let until = tokio::time::Instant::now() + <Self as Engine>::TERM;
        loop {
            let waiting: i64 = self.admin.query_one(sql, &[]).await.unwrap().get(0);
            if waiting == 0 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "{waiting} sessions still wait on locks for clients that left"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
