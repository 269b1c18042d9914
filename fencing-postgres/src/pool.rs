//! A deadpool pool whose every wait is bounded.

use std::time::Duration;

use deadpool_postgres::{BuildError, Manager, Pool, Runtime};

use crate::connect::PgConnect;
use crate::durability::durability_hook;

/// Bounds for [`pool`]. Every wait a fenced request can meet has one, so a
/// request ends in a 503 rather than hanging, and nothing stays locked for long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Most connections open at once.
    pub max_size: usize,
    /// How long `pool.get()` waits for a free connection (then
    /// [`FenceError::Pool`](crate::FenceError::Pool): the pool is exhausted),
    /// and how long a new connection may take to open.
    pub wait: Duration,
    /// How long a statement waits for a row lock (the session's `lock_timeout`):
    /// the bound on a higher token waiting for a lower-token transaction, like
    /// the layer's drain bound. Running out is [`FenceError::Retry`](crate::FenceError::Retry).
    pub lock_timeout: Duration,
    /// How long a transaction may sit idle before the server ends its session,
    /// rolls it back and frees its rows (`idle_in_transaction_session_timeout`):
    /// a paused or hung replica cannot keep a key locked for longer.
    /// For both timeouts, zero (or under a millisecond) turns it off, as in PostgreSQL.
    pub idle_in_transaction: Duration,
    /// Opens connections to a server that could lose an acknowledged commit
    /// (an asynchronous standby, `synchronous_commit = off`: see
    /// [`durability`](crate::durability)). Default `false`: each new connection
    /// is checked, and a refused server is `PoolError::PostCreateHook`.
    pub accept_volatile_commits: bool,
}

impl Default for PoolLimits {
    /// 16 connections; wait 5 s for one, 5 s for a lock (the layer's drain
    /// bound); end a session idle in a transaction for 30 s.
    fn default() -> Self {
        Self {
            max_size: 16,
            wait: Duration::from_secs(5),
            lock_timeout: fencing_layer::FencingLayer::DEFAULT_DRAIN_TIMEOUT,
            idle_in_transaction: Duration::from_secs(30),
            accept_volatile_commits: false,
        }
    }
}

impl PoolLimits {
    /// With `true`, connects to a server set up to lose acknowledged commits
    /// in a crash or a failover (see [`durability`](crate::durability)); after
    /// such a loss a mark can go back and a stale token get in again.
    #[must_use]
    pub fn accept_volatile_commits(mut self, accept: bool) -> Self {
        self.accept_volatile_commits = accept;
        self
    }
}

/// A pool of connections to `config` (a [`PgConnect`], or a `tokio_postgres::Config`: TLS as
/// its `sslmode` and `sslrootcert` say), within `limits`.
/// The session settings go in the connection's startup options, after any
/// `config` has. Connections are opened on first use, so a database that is
/// down shows up as [`FenceError::Unavailable`](crate::FenceError::Unavailable) then,
/// and one that could lose an acknowledged commit (see [`durability`](crate::durability))
/// as [`FenceError::Pool`](crate::FenceError::Pool), unless `limits` accept it.
pub fn pool(config: impl Into<PgConnect>, limits: PoolLimits) -> Result<Pool, BuildError> {
    let (mut config, tls) = config.into().into_parts();
    let settings = format!(
        "-c lock_timeout={} -c idle_in_transaction_session_timeout={}",
        limits.lock_timeout.as_millis(),
        limits.idle_in_transaction.as_millis()
    );
    let options = match config.get_options() {
        Some(given) if !given.is_empty() => format!("{given} {settings}"),
        _ => settings,
    };
    config.options(options);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(limits.wait);
    }
    let mut builder = Pool::builder(Manager::new(config, tls));
    if !limits.accept_volatile_commits {
        builder = builder.post_create(durability_hook());
    }
    builder
        .max_size(limits.max_size)
        .wait_timeout(Some(limits.wait))
        .create_timeout(Some(limits.wait))
        .recycle_timeout(Some(limits.wait))
        .runtime(Runtime::Tokio1)
        .build()
}
