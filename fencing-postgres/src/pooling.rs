//! Where the bounds live when a pooler stands between the replicas and
//! PostgreSQL, and how a pool finds out that they would not hold.
//!
//! Two settings keep the fence's promises in time: `lock_timeout` (a higher
//! token waits at most this long for a lower-token transaction holding the
//! key's row, then 503) and `idle_in_transaction_session_timeout` (a paused
//! replica cannot keep a key locked for longer). Nothing here goes in the
//! connection's startup packet: a stock PgBouncer refuses the `options`
//! parameter ("unsupported startup parameter"), and the usual work-around,
//! `ignore_startup_parameters = options`, drops the settings without a word.
//!
//! * [`Pooling::Session`] (the default): a direct connection, or a pooler in
//!   session mode (PgBouncer `pool_mode = session`), where a client's
//!   connection is one server session until it closes. Each new connection
//!   sets the bounds once (`SET`), and the fence's statement is prepared once
//!   per connection.
//! * [`Pooling::Transaction`]: a pooler in transaction mode (PgBouncer
//!   `pool_mode = transaction`), where each transaction may run on another
//!   server session. A session setting would land on whichever server session
//!   ran it, and stay there for other clients; a named prepared statement
//!   would be missing on the next one, or clash with another client's of the
//!   same name. So each fenced transaction sets the bounds itself (`SET LOCAL`,
//!   sent with the fence: no extra round trip), and every statement the crate
//!   sends is unnamed.
//!
//! **Checked, not assumed.** The first connection a pool opens runs
//! a probe: in session mode it sets the bounds and a marker on that
//! connection, opens a second one, and looks whether the second sees the
//! marker or the first lost its bounds (both mean server sessions are shared
//! between clients: a transaction pooler, so the bounds would not hold); in
//! transaction mode it sets them with `SET LOCAL` in a transaction and reads
//! them back in it (a pooler in statement mode refuses the transaction).
//! A refusal names the setting and the pooler, and every later connection of
//! that pool is refused with the same words: a replica does not start with a
//! bound it cannot keep.

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio_postgres::Client;

/// What stands between this process and PostgreSQL: where the bounds are set
/// and whether statements may be prepared once per connection (see the
/// [module](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// A connection is one server session until it closes: a direct
    /// connection, or a pooler in session mode.
    #[default]
    Session,
    /// Transactions of one connection may run on different server sessions:
    /// a pooler in transaction mode (PgBouncer `pool_mode = transaction`).
    Transaction,
}

impl Pooling {
    /// `session` or `transaction`, as PgBouncer's `pool_mode` names them.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

impl fmt::Display for Pooling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "session" => Ok(Self::Session),
            "transaction" => Ok(Self::Transaction),
            other => Err(format!("unknown pooling mode {other:?}: session or transaction")),
        }
    }
}

/// The two bounds, as milliseconds PostgreSQL reads (0 turns one off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) lock_timeout: Duration,
    pub(crate) idle_in_transaction: Duration,
}

impl Bounds {
    /// `SET` (or `SET LOCAL`) of both bounds, one simple query.
    pub(crate) fn sql(self, local: bool) -> String {
        let scope = if local { "SET LOCAL" } else { "SET" };
        format!(
            "{scope} lock_timeout = {}; {scope} idle_in_transaction_session_timeout = {}",
            self.lock_timeout.as_millis(),
            self.idle_in_transaction.as_millis()
        )
    }

    /// What `current_setting('lock_timeout')` reads once the bound is set.
    fn lock_timeout_reads(self) -> String {
        // PostgreSQL shows whole seconds as `5s`, other values as `1500ms`, 0 as `0`.
        let ms = self.lock_timeout.as_millis();
        match ms {
            0 => "0".to_owned(),
            ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
            ms => format!("{ms}ms"),
        }
    }
}

/// The verdict of a pool's first connection, kept for every later one.
#[derive(Debug, Default)]
pub(crate) struct Verdict(OnceLock<Result<(), String>>);

/// Checks that `client` (a new connection of a pool) keeps `bounds` under
/// `pooling`, setting them on it in session mode; `other` opens a second
/// connection to the same place, when the check needs one. The first call
/// decides for the pool; later calls only set their connection's bounds
/// (session mode) and repeat a refusal.
pub(crate) async fn probe<F>(
    client: &Client,
    other: impl FnOnce() -> F,
    pooling: Pooling,
    bounds: Bounds,
    verdict: &Verdict,
) -> Result<(), String>
where
    F: Future<Output = Result<Client, tokio_postgres::Error>>,
{
    if let Some(decided) = verdict.0.get() {
        if decided.is_ok() && pooling == Pooling::Session {
            client.batch_execute(&bounds.sql(false)).await.map_err(|e| crate::error::describe(&e))?;
        }
        return decided.clone();
    }
    let decided = match pooling {
        Pooling::Session => session_keeps(client, other, bounds).await,
        Pooling::Transaction => transaction_keeps(client, bounds).await,
    };
    // Another connection may have decided meanwhile: the first verdict stands
    // for the connections after; this one goes by its own.
    let _ = verdict.0.set(decided.clone());
    decided
}

/// The marker a session-mode probe sets, a placeholder setting any role may set.
const MARKER: &str = "fencing.pool_probe";

async fn session_keeps<F>(client: &Client, other: impl FnOnce() -> F, bounds: Bounds) -> Result<(), String>
where
    F: Future<Output = Result<Client, tokio_postgres::Error>>,
{
    let nonce = format!("{:x}", nonce());
    let set = format!("{}; SET {MARKER} = '{nonce}'", bounds.sql(false));
    client.batch_execute(&set).await.map_err(|e| crate::error::describe(&e))?;
    // A second client, as another replica would be: does it land on the session just set?
    let other = other().await.map_err(|e| crate::error::describe(&e))?;
    let seen_there = read(&other, &format!("current_setting('{MARKER}', true)")).await;
    drop(other);
    let kept_here = read(client, "current_setting('lock_timeout')").await?;
    let seen_there = seen_there?;
    let _ = client.batch_execute(&format!("RESET {MARKER}")).await;
    if seen_there.as_deref() == Some(nonce.as_str())
        || kept_here.as_deref() != Some(&bounds.lock_timeout_reads())
    {
        return Err(format!(
            "lock_timeout cannot be kept: a setting made on one connection {}, so server sessions are \
             shared between clients: a pooler in transaction mode (PgBouncer pool_mode = transaction) \
             stands between this process and PostgreSQL, and the {} ms lock bound would not hold; build the \
             pool with PoolLimits::pooling(Pooling::Transaction)",
            if kept_here.as_deref() == Some(&bounds.lock_timeout_reads()) {
                "showed up on another"
            } else {
                "was gone on its next statement"
            },
            bounds.lock_timeout.as_millis()
        ));
    }
    Ok(())
}

async fn transaction_keeps(client: &Client, bounds: Bounds) -> Result<(), String> {
    let set_local = bounds.sql(true);
    let (begun, set, read, ended) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.batch_execute(&set_local),
        read(client, "current_setting('lock_timeout')"),
        client.batch_execute("COMMIT"),
    );
    if let Err(error) = begun.and(set) {
        let why = crate::error::describe(&error);
        let pooler = if why.contains("statement pooling") {
            "a pooler in statement mode (PgBouncer pool_mode = statement) allows no transaction, and the \
             fence needs one: use pool_mode = transaction or session"
        } else {
            "the bounds could not be set in a transaction"
        };
        return Err(format!("lock_timeout cannot be kept: {pooler} ({why})"));
    }
    ended.map_err(|e| crate::error::describe(&e))?;
    match read? {
        Some(value) if value == bounds.lock_timeout_reads() => Ok(()),
        other => Err(format!(
            "lock_timeout cannot be kept: set with SET LOCAL to {} ms, it read {other:?} in the same \
             transaction",
            bounds.lock_timeout.as_millis()
        )),
    }
}

/// One text value, `SELECT {expression}`, sent unnamed.
async fn read(client: &Client, expression: &str) -> Result<Option<String>, String> {
    let rows = client
        .query_typed(&format!("SELECT {expression}"), &[])
        .await
        .map_err(|e| crate::error::describe(&e))?;
    let value: Option<String> =
        rows.first().map(|row| row.try_get(0)).transpose().map_err(|e| e.to_string())?.flatten();
    Ok(value)
}

/// A value unlike any other process's or call's: a marker or a test notification.
pub(crate) fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}
