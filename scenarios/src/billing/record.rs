//! The billing runs' record in PostgreSQL: per run, the highest lock token it
//! has seen; per (run, customer), whether the charge is under way or done.
//!
//! The fenced operations are compare-and-set on the run's token, each in one
//! transaction that locks the run's row: a lower token than the run's is
//! refused, a higher one raises it. The unfenced ones are the naive job's: read
//! what is done, write what was done, no token anywhere.

use fencing_postgres::PgConnect;
use fencing_postgres::connect::describe_error;
use tokio_postgres::Client;

use crate::failure::Failure;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS billing_runs (
    run   text PRIMARY KEY,
    token bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS billing_charges (
    run       text NOT NULL,
    customer  text NOT NULL,
    state     text NOT NULL CHECK (state IN ('charging', 'charged')),
    token     bigint,
    charge_id text,
    PRIMARY KEY (run, customer)
);";

/// What a fenced mark did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MarkReply {
    /// The customer is marked as being charged under this token.
    Marked,
    /// Already charged in this run: nothing to do.
    AlreadyCharged,
    /// The run has seen a higher token: this holder is stale.
    Refused {
        /// The run's token.
        highest: u64,
    },
}

fn db(context: &str, error: tokio_postgres::Error) -> Failure {
    Failure(format!("run record ({context}): {}", describe_error(&error)))
}

/// One connection to the record (each instance has its own, as separate processes would).
pub(super) struct Record {
    client: Client,
}

impl Record {
    /// Connects to the database at `config` and creates the tables if missing.
    pub(super) async fn connect(config: &PgConnect) -> Result<Self, Failure> {
        let (client, connection) = config.connect().await.map_err(|e| db("connect", e))?;
        tokio::spawn(connection);
        client.batch_execute(SCHEMA).await.map_err(|e| db("create tables", e))?;
        Ok(Self { client })
    }

    /// Fenced: marks `customer` of `run` as being charged by the holder of `token`.
    pub(super) async fn mark(&mut self, run: &str, customer: &str, token: u64) -> Result<MarkReply, Failure> {
        let token = as_i64(token)?;
        let tx = self.client.transaction().await.map_err(|e| db("begin", e))?;
        if let Some(highest) = fence(&tx, run, token).await? {
            return Ok(MarkReply::Refused { highest });
        }
        let state = tx
            .query_opt(
                "SELECT state FROM billing_charges WHERE run = $1 AND customer = $2",
                &[&run, &customer],
            )
            .await
            .map_err(|e| db("read", e))?;
        if state.is_some_and(|row| row.get::<_, &str>(0) == "charged") {
            tx.commit().await.map_err(|e| db("commit", e))?;
            return Ok(MarkReply::AlreadyCharged);
        }
        tx.execute(
            "INSERT INTO billing_charges (run, customer, state, token) VALUES ($1, $2, 'charging', $3)
             ON CONFLICT (run, customer) DO UPDATE SET state = 'charging', token = EXCLUDED.token",
            &[&run, &customer, &token],
        )
        .await
        .map_err(|e| db("mark", e))?;
        tx.commit().await.map_err(|e| db("commit", e))?;
        Ok(MarkReply::Marked)
    }

    /// Fenced: records `customer`'s charge `charge_id`; `Some(highest)` when refused.
    pub(super) async fn complete(
        &mut self,
        run: &str,
        customer: &str,
        token: u64,
        charge_id: &str,
    ) -> Result<Option<u64>, Failure> {
        let token = as_i64(token)?;
        let tx = self.client.transaction().await.map_err(|e| db("begin", e))?;
        if let Some(highest) = fence(&tx, run, token).await? {
            return Ok(Some(highest));
        }
        tx.execute(
            "UPDATE billing_charges SET state = 'charged', token = $3, charge_id = $4
             WHERE run = $1 AND customer = $2",
            &[&run, &customer, &token, &charge_id],
        )
        .await
        .map_err(|e| db("complete", e))?;
        tx.commit().await.map_err(|e| db("commit", e))?;
        Ok(None)
    }

    /// Unfenced: which of `customers` are not charged yet in `run`.
    pub(super) async fn uncharged(&self, run: &str, customers: &[String]) -> Result<Vec<String>, Failure> {
        let rows = self
            .client
            .query("SELECT customer FROM billing_charges WHERE run = $1 AND state = 'charged'", &[&run])
            .await
            .map_err(|e| db("read", e))?;
        let charged: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
        Ok(customers.iter().filter(|c| !charged.contains(c)).cloned().collect())
    }

    /// Unfenced: notes `customer` as charged with `charge_id`, whoever asks.
    pub(super) async fn note_charged(
        &self,
        run: &str,
        customer: &str,
        charge_id: &str,
    ) -> Result<(), Failure> {
        self.client
            .execute(
                "INSERT INTO billing_charges (run, customer, state, charge_id) VALUES ($1, $2, 'charged', $3)
                 ON CONFLICT (run, customer) DO UPDATE SET state = 'charged', charge_id = EXCLUDED.charge_id",
                &[&run, &customer, &charge_id],
            )
            .await
            .map_err(|e| db("note", e))?;
        Ok(())
    }
}

/// The compare-and-set, inside `tx`: locks the run's row (created at `token` if
/// new); a lower token than the run's is refused (`Some(run's token)`, and the
/// transaction rolls back when dropped); a higher one raises it.
async fn fence(tx: &tokio_postgres::Transaction<'_>, run: &str, token: i64) -> Result<Option<u64>, Failure> {
    tx.execute(
        "INSERT INTO billing_runs (run, token) VALUES ($1, $2) ON CONFLICT (run) DO NOTHING",
        &[&run, &token],
    )
    .await
    .map_err(|e| db("fence", e))?;
    let row = tx
        .query_one("SELECT token FROM billing_runs WHERE run = $1 FOR UPDATE", &[&run])
        .await
        .map_err(|e| db("fence", e))?;
    let highest: i64 = row.get(0);
    if token < highest {
        return Ok(Some(highest.unsigned_abs()));
    }
    if token > highest {
        tx.execute("UPDATE billing_runs SET token = $2 WHERE run = $1", &[&run, &token])
            .await
            .map_err(|e| db("fence", e))?;
    }
    Ok(None)
}

fn as_i64(token: u64) -> Result<i64, Failure> {
    i64::try_from(token).map_err(|_| Failure(format!("token {token} does not fit PostgreSQL's bigint")))
}

/// A database of the scenario's own on the server at `admin`: created by
/// [`TempDb::create`], dropped by [`TempDb::drop_now`], or, if that never ran (a
/// panic), on drop.
pub(super) struct TempDb {
    admin_config: PgConnect,
    name: String,
    dropped: bool,
    /// The new database's connection settings.
    pub(super) config: PgConnect,
}

impl TempDb {
    pub(super) async fn create(admin_url: &str, name: &str) -> Result<Self, Failure> {
        let admin_config: PgConnect =
            admin_url.parse().map_err(|e| Failure(format!("PostgreSQL URL {admin_url:?}: {e}")))?;
        let admin = admin(&admin_config).await.map_err(|e| {
            Failure(format!(
                "PostgreSQL at {admin_url} (the run's record lives there): {}",
                describe_error(&e)
            ))
        })?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .map_err(|e| db("drop", e))?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(|e| db("create database", e))?;
        let mut config = admin_config.clone();
        config.config_mut().dbname(name);
        Ok(Self { admin_config, name: name.to_owned(), dropped: false, config })
    }

    /// Drops the database, closing the connections still open to it.
    pub(super) async fn drop_now(mut self) -> Result<(), Failure> {
        self.dropped = true;
        let admin = admin(&self.admin_config).await.map_err(|e| db("connect", e))?;
        admin.batch_execute(&self.drop_sql()).await.map_err(|e| db("drop database", e))
    }

    fn drop_sql(&self) -> String {
        format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Drop cannot await, and may run inside a runtime: a thread with a runtime of
        // its own does the work, bounded.
        let (config, sql) = (self.admin_config.clone(), self.drop_sql());
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            runtime.map_err(|e| e.to_string())?.block_on(async {
                let work = async { admin(&config).await?.batch_execute(&sql).await };
                let done = tokio::time::timeout(std::time::Duration::from_secs(20), work).await;
                done.map_err(|_| "timed out".to_owned())?.map_err(|e| e.to_string())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            tracing::warn!(database = self.name, ?dropped, "could not drop the scenario's database");
        }
    }
}

async fn admin(config: &PgConnect) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect().await?;
    tokio::spawn(connection);
    Ok(client)
}
