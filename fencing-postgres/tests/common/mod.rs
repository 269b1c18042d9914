//! Throwaway databases on the local PostgreSQL (127.0.0.1:5432, user postgres,
//! trust auth): one per test, dropped when the test ends, panics included.

#![allow(dead_code, unreachable_pub, unused_imports, async_fn_in_trait)]

use std::time::Duration;

pub mod engine;
pub mod replicas;

/// The proxy that can stall (test-support's).
pub mod stall {
    #[allow(unused_imports)]
    pub use test_support::StallProxy;
}

use deadpool_postgres::Pool;
use fencing_postgres::{PgFence, PoolLimits};
use tokio_postgres::{Client, Config, NoTls};

pub use test_support::replicas::Rng;
pub use test_support::{BOUND, TestDb};

/// What these tests add to test-support's [`TestDb`]: fencing-postgres's pool and fence on it.
pub trait TestDbExt {
    /// A pool on this database within `limits`.
    fn pool(&self, limits: PoolLimits) -> Pool;
    /// The default mark table, migrated.
    async fn fence(&self) -> PgFence;
}

impl TestDbExt for TestDb {
    fn pool(&self, limits: PoolLimits) -> Pool {
        fencing_postgres::pool(self.config(), limits).unwrap()
    }

    async fn fence(&self) -> PgFence {
        let fence = PgFence::new();
        fence.migrate(&self.connect().await).await.unwrap();
        fence
    }
}

/// `config`'s database reached through 127.0.0.1:`port` only (a proxy, say),
/// its sessions named `name` in `pg_stat_activity`.
pub fn with_port(config: &Config, port: u16, name: &str) -> Config {
    let mut named = Config::new();
    named.host("127.0.0.1").port(port).user(config.get_user().unwrap_or("postgres"));
    named.dbname(config.get_dbname().unwrap_or("postgres")).application_name(name);
    named.connect_timeout(Duration::from_secs(3));
    named.ssl_mode(config.get_ssl_mode());
    named
}

/// The port `config` connects to.
pub fn port_of(config: &Config) -> u16 {
    config.get_ports().first().copied().unwrap_or(5432)
}

/// A new connection to the database `config` names, its connection task spawned.
pub async fn connect_to(config: &Config) -> Client {
    connect(config).await.unwrap()
}

async fn connect(config: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The key's mark as committed, as text (`None` before its first fence).
pub async fn mark(client: &Client, key: &str) -> Option<String> {
    let row = client.query_opt("SELECT mark::text FROM fencing_marks WHERE key = $1", &[&key]).await.unwrap();
    row.map(|row| row.get(0))
}

/// Whether a session of this database is waiting for a lock now.
pub async fn blocked_on_lock(client: &Client) -> bool {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) > 0
}

/// Waits until `n` sessions of this database are blocked on a lock (a fence
/// waiting for a row another transaction holds).
pub async fn lock_waiters(client: &Client, n: i64) {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let waited = tokio::time::timeout(BOUND, async {
        while client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    waited.await.unwrap_or_else(|_| panic!("{n} sessions never blocked on a lock"));
}
