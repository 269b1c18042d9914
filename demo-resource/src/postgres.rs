//! The data in PostgreSQL (`serve --postgres URL`): every process started with
//! the same URL is a replica of one resource, serving the same logs and
//! key-value pairs.
//!
//! Each write is one transaction, fenced in it by fencing-postgres:
//!
//! ```text
//! BEGIN                                     -- round trip 1
//!   fence(resource, token)                  -- 2: locks the key's mark row; lower token: 409, roll back
//!   ?delay_ms                               -- a stalled write holds the row, as a real one would
//!   INSERT … / UPDATE … / DELETE …          -- 2 as well without a delay (sent behind the fence), else 3
//!   (a raise or a first use: the mark)      -- one more, after the write
//! COMMIT                                    -- data and mark together; the row unlocks
//! ```
//!
//! The fence key is the resource path (`/logs/billing`, `/kv/k`), the layer's
//! key, so each path keeps one mark. A writer with a higher token waits at the
//! fence for the lower-token transaction holding the row, on any replica, for
//! at most the pool's `lock_timeout` (then 503). Without the fence
//! (`--local-marks`, `--no-fencing`) a write is the same transaction, three
//! round trips, and only the per-process layer stands between a stale token
//! and the data.
//!
//! A log's next index comes from its row in `demo_log_heads`, locked by the
//! append until commit: indexes follow commit order, with or without the fence.
//! Values are `BYTEA` (any UTF-8 body, NUL included); names are `TEXT`, which
//! cannot hold NUL: writing to such a name is a 400, reading it a 404.

use std::future::Future;

use deadpool_postgres::Pool;
use fencing_layer::claims::ClaimTiming;
use fencing_postgres::{FenceError, PgFence, PoolLimits, Pooling};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use crate::data::Entry;

/// The data tables; idempotent, and an advisory lock orders replicas starting
/// at once (concurrent `CREATE TABLE IF NOT EXISTS` can fail). Run as one simple
/// query, hence one transaction holding the lock to the end. Tokens are `u64`,
/// kept as `NUMERIC(20,0)` like the marks: readable, and ordered in SQL.
const MIGRATE: &str = r#"
SELECT pg_advisory_xact_lock(hashtext('demo-resource migrate'));
CREATE TABLE IF NOT EXISTS demo_logs (
    name TEXT COLLATE "C" NOT NULL,
    index BIGINT NOT NULL,
    token NUMERIC(20,0),
    value BYTEA NOT NULL,
    PRIMARY KEY (name, index)
);
CREATE TABLE IF NOT EXISTS demo_log_heads (
    name TEXT COLLATE "C" PRIMARY KEY,
    next BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS demo_kv (
    key TEXT COLLATE "C" PRIMARY KEY,
    token NUMERIC(20,0),
    value BYTEA NOT NULL
);
"#;

// On the wire a token is an `int8` holding `token − 2⁶³` (no PostgreSQL integer
// holds a u64; the offset keeps the order); the statements add the offset back.

/// Takes the log's next index (locking its head row until commit) and appends.
const APPEND: &str = "WITH head AS (
    INSERT INTO demo_log_heads AS h (name, next) VALUES ($1, 1)
    ON CONFLICT (name) DO UPDATE SET next = h.next + 1
    RETURNING next - 1 AS index
)
INSERT INTO demo_logs (name, index, token, value)
SELECT $1, index, $2 + 9223372036854775808, $3 FROM head
RETURNING index";
const READ_LOG: &str = "SELECT (token - 9223372036854775808)::int8, value FROM demo_logs
WHERE name = $1 ORDER BY index";
/// `xmax = 0` only on a row this statement inserted (an update sets it).
const PUT: &str = "INSERT INTO demo_kv AS kv (key, token, value) VALUES ($1, $2 + 9223372036854775808, $3)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value
RETURNING xmax = 0";
const GET: &str = "SELECT (token - 9223372036854775808)::int8, value FROM demo_kv WHERE key = $1";
const DELETE: &str = "DELETE FROM demo_kv WHERE key = $1 RETURNING true";

/// The pool, and the fence unless writes are fenced by the layer only.
#[derive(Debug, Clone)]
pub(crate) struct PgData {
    pool: Pool,
    fence: Option<PgFence>,
    /// Through a transaction pooler: the bounds, set in each unfenced write's transaction.
    set_local: Option<String>,
}

impl PgData {
    /// Connects to `url` (`postgres://…` or `host=… dbname=…`; TLS as its
    /// `sslmode` and `sslrootcert` say) and creates the mark table and the data
    /// tables if missing.
    pub(crate) async fn connect(
        url: &str,
        fence_in_transaction: bool,
        accept_volatile_commits: bool,
        transaction_pooling: bool,
    ) -> Result<Self, String> {
        let config: fencing_postgres::PgConnect = url.parse().map_err(|e| format!("bad URL: {e}"))?;
        // fencing-postgres's defaults: 16 connections, 5 s to get one or to wait
        // for a row lock (the layer's drain bound), sessions idle in a transaction
        // for 30 s ended (longer than the longest `delay_ms`), and a server that
        // could lose an acknowledged commit refused.
        // Through a pooler in transaction mode, each transaction sets the bounds itself.
        let pooling = if transaction_pooling { Pooling::Transaction } else { Pooling::Session };
        let limits = PoolLimits::default().accept_volatile_commits(accept_volatile_commits).pooling(pooling);
        let pool = fencing_postgres::pool(config, limits).map_err(|e| e.to_string())?;
        let fence = PgFence::new().for_pool(&limits);
        migrate(&pool, &fence).await.map_err(|e| match e.to_string().trim_end().to_owned() {
            // The library names its own switches; a person at the CLI has flags.
            refused if refused.contains("accept_volatile_commits") => {
                format!("{refused}; from the command line: --accept-volatile-commits")
            }
            refused if refused.contains("Pooling::Transaction") => {
                format!("{refused}; from the command line: --pg-pooling transaction")
            }
            other => other,
        })?;
        Ok(Self { pool, fence: fence_in_transaction.then_some(fence), set_local: limits.set_local() })
    }

    /// The layer's marks shared by every replica on this database (`--shared-marks`),
    /// the replica's background session opened from `url`.
    pub(crate) fn shared_store(
        &self,
        url: &str,
        timing: ClaimTiming,
    ) -> Result<fencing_postgres::PgSharedStore, String> {
        let config: fencing_postgres::PgConnect = url.parse().map_err(|e| format!("bad URL: {e}"))?;
        fencing_postgres::PgSharedStore::with_timing(self.pool.clone(), config, PgFence::new(), timing)
            .map_err(|e| e.to_string())
    }

    /// Runs `statement` in a transaction of its own: begin, fence `resource`
    /// with `token` (when fencing here and the request has one), `wait`, the
    /// statement, commit. An error (or a dropped future) rolls everything back.
    async fn write(
        &self,
        resource: &str,
        token: Option<u64>,
        wait: impl Future<Output = ()>,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, FenceError> {
        if resource.contains('\0') {
            return Err(FenceError::KeyHasNul);
        }
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        if let Some(bounds) = &self.set_local
            && !(self.fence.is_some() && token.is_some())
        {
            // Not fenced here (the fence sets them itself): the bounds for this transaction.
            tx.batch_execute(bounds).await?;
        }
        let mut wait = std::pin::pin!(wait);
        // No `delay_ms`: the write goes out right behind the fence, in the same
        // round trip (the fence is sent on its first poll, and `biased` polls it
        // first). The server runs them in order, and a refused fence aborts the
        // transaction, so the write never applies without the fence.
        let no_delay =
            std::future::poll_fn(|cx| std::task::Poll::Ready(wait.as_mut().poll(cx).is_ready())).await;
        let rows = match (&self.fence, token) {
            (Some(fence), Some(token)) if no_delay => {
                let (_, rows) = tokio::try_join!(biased; async { fence.fence(&tx, resource, token).await }, async {
                    tx.query_typed(statement, params).await.map_err(FenceError::from)
                },)?;
                rows
            }
            (Some(fence), Some(token)) => {
                fence.fence(&tx, resource, token).await?;
                wait.await; // not ready above, so not finished yet
                tx.query_typed(statement, params).await?
            }
            _ => {
                if !no_delay {
                    wait.await;
                }
                tx.query_typed(statement, params).await?
            }
        };
        tx.commit().await?;
        Ok(rows)
    }

    /// Reads with a connection of the pool; a name holding NUL was never written.
    async fn read(&self, name: &str, statement: &str) -> Result<Vec<Row>, FenceError> {
        if name.contains('\0') {
            return Ok(Vec::new());
        }
        let client = self.pool.get().await?;
        Ok(client.query_typed(statement, &[(&name, Type::TEXT)]).await?)
    }

    pub(crate) async fn append(
        &self,
        resource: &str,
        name: &str,
        token: Option<u64>,
        value: &str,
        wait: impl Future<Output = ()>,
    ) -> Result<u64, FenceError> {
        let params: [(&(dyn ToSql + Sync), Type); 3] =
            [(&name, Type::TEXT), (&to_wire(token), Type::INT8), (&value.as_bytes(), Type::BYTEA)];
        let rows = self.write(resource, token, wait, APPEND, &params).await?;
        let index: i64 = rows[0].try_get(0)?;
        Ok(index as u64)
    }

    pub(crate) async fn log(&self, name: &str) -> Result<Option<Vec<Entry>>, FenceError> {
        let entries = self.read(name, READ_LOG).await?.iter().map(entry).collect::<Result<Vec<_>, _>>()?;
        Ok((!entries.is_empty()).then_some(entries))
    }

    pub(crate) async fn put(
        &self,
        resource: &str,
        key: &str,
        token: Option<u64>,
        value: &str,
        wait: impl Future<Output = ()>,
    ) -> Result<bool, FenceError> {
        let params: [(&(dyn ToSql + Sync), Type); 3] =
            [(&key, Type::TEXT), (&to_wire(token), Type::INT8), (&value.as_bytes(), Type::BYTEA)];
        let rows = self.write(resource, token, wait, PUT, &params).await?;
        Ok(rows[0].try_get(0)?)
    }

    pub(crate) async fn get(&self, key: &str) -> Result<Option<Entry>, FenceError> {
        Ok(self.read(key, GET).await?.first().map(entry).transpose()?)
    }

    pub(crate) async fn delete(
        &self,
        resource: &str,
        key: &str,
        token: Option<u64>,
        wait: impl Future<Output = ()>,
    ) -> Result<bool, FenceError> {
        let rows = self.write(resource, token, wait, DELETE, &[(&key, Type::TEXT)]).await?;
        Ok(!rows.is_empty())
    }
}

/// Creates the mark table and the data tables if missing.
async fn migrate(pool: &Pool, fence: &PgFence) -> Result<(), FenceError> {
    let client = pool.get().await?;
    // Without "relation … already exists, skipping" notices on every start.
    client.batch_execute("SET client_min_messages = warning").await?;
    fence.migrate(&client).await?;
    client.batch_execute(MIGRATE).await?;
    client.batch_execute("RESET client_min_messages").await?;
    Ok(())
}

/// A token on the wire: `token − 2⁶³` as an `int8`.
fn to_wire(token: Option<u64>) -> Option<i64> {
    token.map(|token| (token ^ (1 << 63)) as i64)
}

/// A `(token on the wire, value)` row. Values were written from `&str`, so are UTF-8.
fn entry(row: &Row) -> Result<Entry, tokio_postgres::Error> {
    let token: Option<i64> = row.try_get(0)?;
    let value: Vec<u8> = row.try_get(1)?;
    Ok(Entry {
        token: token.map(|wire| (wire as u64) ^ (1 << 63)),
        value: String::from_utf8_lossy(&value).into_owned(),
    })
}
