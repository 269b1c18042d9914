//! A deadpool pool whose every wait is bounded.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{BuildError, Hook, HookError, Manager, Pool, Runtime};

use crate::connect::PgConnect;
use crate::durability::check_durability;
use crate::pooling::{Bounds, Pooling, Verdict, probe};

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
    /// What stands between this process and PostgreSQL: a direct connection
    /// or a session pooler (the default), or a pooler in transaction mode
    /// (see [`pooling`](crate::pooling)). The pool's first connection checks
    /// that the bounds hold under it, and the pool refuses every connection
    /// (`PoolError::PostCreateHook`, naming the setting and the pooler) if not.
    pub pooling: Pooling,
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
            pooling: Pooling::Session,
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

    /// Connections go through `pooling` (see [`pooling`](crate::pooling)).
    /// With [`Pooling::Transaction`], give the same limits to
    /// [`PgFence::for_pool`](crate::PgFence::for_pool), so that each fenced
    /// transaction sets the bounds itself.
    #[must_use]
    pub fn pooling(mut self, pooling: Pooling) -> Self {
        self.pooling = pooling;
        self
    }

    /// Under [`Pooling::Transaction`], the statement that sets both bounds
    /// for one transaction (`SET LOCAL …`), for a transaction of your own
    /// that is not fenced ([`PgFence::fence`](crate::PgFence::fence) sends it
    /// itself); `None` under [`Pooling::Session`], where every connection of
    /// the pool has them already.
    #[must_use]
    pub fn set_local(&self) -> Option<String> {
        (self.pooling == Pooling::Transaction).then(|| self.bounds().sql(true))
    }

    pub(crate) fn bounds(&self) -> Bounds {
        Bounds { lock_timeout: self.lock_timeout, idle_in_transaction: self.idle_in_transaction }
    }
}

/// A pool of connections to `config` (a [`PgConnect`], or a `tokio_postgres::Config`: TLS as
/// its `sslmode` and `sslrootcert` say), within `limits`.
/// Connections are opened on first use, so a database that is down shows up
/// as [`FenceError::Unavailable`](crate::FenceError::Unavailable) then.
///
/// Nothing goes in the startup packet (a stock PgBouncer refuses `options`):
/// under [`Pooling::Session`] each new connection sets the bounds with `SET`;
/// under [`Pooling::Transaction`] the fenced transactions set them. The first
/// connection checks that they hold ([`pooling`](crate::pooling)), and every
/// new one that the server could not lose an acknowledged commit
/// ([`durability`](crate::durability)) unless `limits` accept it; a refusal
/// is [`FenceError::Pool`](crate::FenceError::Pool) with the reason.
pub fn pool(config: impl Into<PgConnect>, limits: PoolLimits) -> Result<Pool, BuildError> {
    let mut target = config.into();
    let config = target.config_mut();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(limits.wait);
    }
    let verdict = Arc::new(Verdict::default());
    let second = target.clone();
    let (config, tls) = target.into_parts();
    let checks = Hook::async_fn(move |client, _| {
        let (verdict, second) = (Arc::clone(&verdict), second.clone());
        Box::pin(async move {
            let other = || async move {
                let (client, connection) = second.connect().await?;
                tokio::spawn(connection);
                Ok(client)
            };
            probe(client, other, limits.pooling, limits.bounds(), &verdict)
                .await
                .map_err(HookError::message)?;
            if !limits.accept_volatile_commits {
                match check_durability(client).await {
                    Ok(None) => {}
                    Ok(Some(refused)) => return Err(HookError::message(refused.to_string())),
                    Err(error) => return Err(HookError::Backend(error)),
                }
            }
            Ok(())
        })
    });
    Pool::builder(Manager::new(config, tls))
        .post_create(checks)
        .max_size(limits.max_size)
        .wait_timeout(Some(limits.wait))
        .create_timeout(Some(limits.wait))
        .recycle_timeout(Some(limits.wait))
        .runtime(Runtime::Tokio1)
        .build()
}
