//! test-support's shared-store conformance suite on PostgreSQL: every scenario
//! against `PgSharedStore`, each on a throwaway database of the shared server.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::replicas::{claims_of, ready_store};
use common::{TestDb, port_of, with_port};
use fencing_layer::claims::{ClaimStore, ClaimTiming};
use fencing_postgres::{PgSharedStore, PoolLimits};
use test_support::shared_store_conformance;
use test_support::shared_store_suite::Engine;
use tokio_postgres::Client;

/// A throwaway database, and a connection to it that reads what the replicas wrote.
struct Pg {
    db: TestDb,
    admin: Client,
}

/// Each replica's pool: at most 4 sessions (the raise storm counts them), a
/// connection within 500 ms or 503 (a stalled route fails fast).
fn limits() -> PoolLimits {
    PoolLimits { max_size: POOL, wait: Duration::from_millis(500), ..PoolLimits::default() }
}

/// Sessions in each replica's pool.
const POOL: usize = 4;

impl Engine for Pg {
    const NAME: &'static str = "PostgreSQL";
    /// Expiry is compared on the database's clock as each claim is made, so
    /// short terms are honest: 1 s keeps the suite short.
    const TERM: Duration = Duration::from_secs(1);
    const EXPIRY_SLACK: Duration = Duration::ZERO;
    type Store = PgSharedStore;

    async fn start() -> Option<Self> {
        let db = TestDb::create().await?;
        let admin = db.connect().await;
        Some(Pg { db, admin })
    }

    fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], port_of(&self.db.config())).into()
    }

    async fn store(&self, addr: SocketAddr, name: &str, timing: ClaimTiming) -> PgSharedStore {
        let config = with_port(&self.db.config(), addr.port(), name);
        ready_store(config.clone(), config, limits(), timing).await
    }

    fn claims(store: &PgSharedStore) -> &ClaimStore {
        claims_of(store)
    }

    async fn mark(&self, key: &str) -> Option<u64> {
        common::mark(&self.admin, key).await.map(|mark| mark.parse().unwrap())
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

shared_store_conformance!(Pg);
