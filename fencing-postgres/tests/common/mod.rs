//! Throwaway databases on the local PostgreSQL (127.0.0.1:5432, user postgres,
//! trust auth): one per test, dropped when the test ends, panics included.

#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub mod own_pg;
pub mod replicas;
pub mod stall;

use deadpool_postgres::Pool;
use fencing_postgres::{PgFence, PoolLimits};
use tokio_postgres::{Client, Config, NoTls};

const SERVER: &str = "host=127.0.0.1 port=5432 user=postgres connect_timeout=3";

/// Every await on the database in a test is bounded by this, so a hang fails the test.
pub const BOUND: Duration = Duration::from_secs(20);

/// A database of its own for one test; dropped (connections and all) on drop.
pub struct TestDb {
    name: String,
}

impl TestDb {
    /// A fresh, empty database. `None` after a loud SKIPPED line when
    /// PostgreSQL is not reachable, unless `CI=true`: then the test fails.
    pub async fn create() -> Option<TestDb> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let admin = match connect(&admin_config()).await {
            Ok(client) => client,
            Err(error) => {
                let message = format!("PostgreSQL not reachable at 127.0.0.1:5432 as postgres: {error}");
                assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true and {message}");
                // Straight to stderr: the test harness captures `eprintln!` of passing tests.
                let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {message} ***\n");
                return None;
            }
        };
        let name = format!("fencing_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        // A leftover of an earlier run with the same pid goes first.
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        Some(TestDb { name })
    }

    /// The connection settings of this database.
    pub fn config(&self) -> Config {
        let mut config = admin_config();
        config.dbname(&self.name);
        config
    }

    /// A new connection to this database, its connection task spawned.
    pub async fn connect(&self) -> Client {
        connect(&self.config()).await.unwrap()
    }

    /// A pool on this database within `limits`.
    pub fn pool(&self, limits: PoolLimits) -> Pool {
        fencing_postgres::pool(self.config(), limits).unwrap()
    }

    /// The default mark table, migrated.
    pub async fn fence(&self) -> PgFence {
        let fence = PgFence::new();
        fence.migrate(&self.connect().await).await.unwrap();
        fence
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop cannot await, and may run inside the test's runtime: a thread
        // with a runtime of its own does the work.
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            runtime.map_err(|e| e.to_string())?.block_on(async {
                let admin = connect(&admin_config()).await.map_err(|e| e.to_string())?;
                let dropped = tokio::time::timeout(BOUND, admin.batch_execute(&sql)).await;
                dropped.map_err(|_| "timed out".to_owned())?.map_err(|e| e.to_string())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}

fn admin_config() -> Config {
    let mut config: Config = SERVER.parse().unwrap();
    config.dbname("postgres");
    config
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

/// A small deterministic generator (splitmix64), seeded from the clock; the
/// seed is printed so a failing run can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn from_clock() -> Self {
        let seed = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        let seed = std::env::var("FENCING_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(seed);
        eprintln!("FENCING_SEED={seed}");
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A generator of its own, for another task.
    pub fn fork(&mut self) -> Self {
        Rng(self.next())
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
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
