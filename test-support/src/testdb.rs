//! A throwaway database on the shared PostgreSQL.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::{Client, Config, NoTls};

use crate::BOUND;

/// The shared server: 127.0.0.1:5432, user postgres, trust auth. Plain TCP
/// (`sslmode=disable`): TLS has tests of its own, on servers that require it
/// (`OwnPg::start_tls`); here a handshake per connection (rustls, in a debug
/// build) would only slow the timing-sensitive tests.
const SERVER: &str = "host=127.0.0.1 port=5432 user=postgres connect_timeout=3 sslmode=disable";

/// A database of its own for one test on the shared PostgreSQL, dropped
/// (connections and all, `WITH (FORCE)`) when the handle drops, panics included.
/// Nothing else on the shared server is touched.
pub struct TestDb {
    name: String,
}

impl TestDb {
    /// A fresh, empty database. `None` after a loud SKIPPED line when PostgreSQL
    /// is not reachable, unless `CI=true`: then the test fails.
    pub async fn create() -> Option<TestDb> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let admin = match connect(&admin_config()).await {
            Ok(client) => client,
            Err(e) => {
                return crate::skip(&format!("PostgreSQL not reachable at 127.0.0.1:5432 as postgres: {e}"));
            }
        };
        let name = format!("fencing_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        // A leftover of an earlier run with the same pid goes first.
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        Some(TestDb { name })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The connection settings of this database.
    pub fn config(&self) -> Config {
        let mut config = admin_config();
        config.dbname(&self.name);
        config
    }

    /// The database as a `postgres://` URL.
    pub fn url(&self) -> String {
        self.url_via(5432)
    }

    /// The database as a `postgres://` URL through 127.0.0.1:`port` (a proxy's).
    pub fn url_via(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{}?connect_timeout=3&sslmode=disable", self.name)
    }

    /// A new connection to this database, its connection task spawned.
    pub async fn connect(&self) -> Client {
        connect(&self.config()).await.unwrap()
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

async fn connect(config: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}
