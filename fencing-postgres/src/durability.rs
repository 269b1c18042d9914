//! Refusing a server that could take an acknowledged mark back.
//!
//! A raised mark only protects the resource if no later primary can forget
//! it: after a crash, or after a standby is promoted. PostgreSQL keeps a
//! commit through both only when the commit waited for the WAL to be flushed
//! where the next primary comes from. [`check_durability`] asks the server,
//! in one round trip, and refuses:
//!
//! * `synchronous_commit = off` in the session: a crash loses the last commits.
//! * `synchronous_commit = local` while a standby streams: commits do not wait
//!   for any standby, so a promoted one can lack them.
//! * A physical standby streaming asynchronously (`sync_state = 'async'` in
//!   `pg_stat_replication`: not named in `synchronous_standby_names`). Promoted,
//!   it lacks the commits it had not received yet, and a lower token gets in
//!   again. `tests/failover.rs` shows exactly that.
//! * Standbys whose state the role may not read (it needs `pg_monitor` or
//!   `pg_read_all_stats`), since then nothing can be said.
//!
//! A standby named in `synchronous_standby_names` but not the synchronous one
//! now (`potential`) is accepted: the failover tooling must promote only a
//! synchronous standby. Cascaded standbys (standbys of a standby) are not
//! visible from the primary. `fsync = off` is the operator's own choice and is
//! not checked. The check runs when a connection opens; a server reconfigured
//! later is seen by the connections opened after.
//!
//! [`pool`](crate::pool) installs [`durability_hook`] unless
//! [`PoolLimits::accept_volatile_commits`](crate::PoolLimits::accept_volatile_commits)
//! says otherwise; a pool of your own can install it too:
//!
//! ```no_run
//! use deadpool_postgres::{Manager, Pool};
//! use tokio_postgres::NoTls;
//!
//! let config: tokio_postgres::Config = "host=127.0.0.1 user=postgres".parse()?;
//! let pool = Pool::builder(Manager::new(config, NoTls))
//!     .post_create(fencing_postgres::durability_hook())
//!     .build()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use deadpool_postgres::{Hook, HookError};
use tokio_postgres::Client;

/// The session's `synchronous_commit`, whether the server is a standby, and
/// its physical standbys (walsenders without a database): how many, how many
/// unreadable, and the names of the asynchronous ones.
const ASK: &str = "SELECT current_setting('synchronous_commit'), pg_is_in_recovery(),
        count(w.pid), count(w.pid) FILTER (WHERE w.sync_state IS NULL),
        string_agg(coalesce(w.application_name, '?'), ', ' ORDER BY w.application_name)
            FILTER (WHERE w.sync_state = 'async')
    FROM (SELECT r.pid, r.sync_state, r.application_name
          FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
          WHERE a.datname IS NULL) w";

/// Why a server is refused: it could lose a commit it acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotDurable {
    reason: String,
}

impl NotDurable {
    /// What the server is set up to lose, and how to fix it.
    #[must_use]
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for NotDurable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; fencing marks could go back after a crash or failover (accept the risk with \
             PoolLimits::accept_volatile_commits(true))",
            self.reason
        )
    }
}

impl std::error::Error for NotDurable {}

/// Why the server `client` is connected to could lose a commit it
/// acknowledged (see the [module](self)), or `None` if it could not. A standby
/// (in recovery) is not refused here: it takes no writes.
///
/// # Errors
///
/// The driver's error if the question itself failed.
pub async fn check_durability(client: &Client) -> Result<Option<NotDurable>, tokio_postgres::Error> {
    let row = client.query_one(ASK, &[]).await?;
    let synchronous_commit: String = row.try_get(0)?;
    let in_recovery: bool = row.try_get(1)?;
    let standbys: i64 = row.try_get(2)?;
    let unreadable: i64 = row.try_get(3)?;
    let asynchronous: Option<String> = row.try_get(4)?;
    let refuse = |reason: String| Ok(Some(NotDurable { reason }));
    if in_recovery {
        return Ok(None);
    }
    if synchronous_commit == "off" {
        return refuse("synchronous_commit is off in this session: a crash loses the last commits".into());
    }
    if standbys == 0 {
        return Ok(None);
    }
    if unreadable > 0 {
        return refuse(format!(
            "{unreadable} standby(s) stream from this server and this role cannot read their \
             sync_state in pg_stat_replication (grant it pg_monitor)"
        ));
    }
    if let Some(names) = asynchronous {
        return refuse(format!(
            "standby {names} streams asynchronously (not in synchronous_standby_names): promoted, \
             it would lack commits this server acknowledged"
        ));
    }
    if synchronous_commit == "local" {
        return refuse(
            "synchronous_commit is local in this session while standbys stream: commits do not \
             wait for them"
                .into(),
        );
    }
    Ok(None)
}

/// A deadpool `post_create` hook running [`check_durability`] on every new
/// connection: a refused server is a `PoolError::PostCreateHook` whose message
/// is the [`NotDurable`] reason.
#[must_use]
pub fn durability_hook() -> Hook {
    Hook::async_fn(|client, _| {
        Box::pin(async move {
            match check_durability(client).await {
                Ok(None) => Ok(()),
                Ok(Some(refused)) => Err(HookError::message(refused.to_string())),
                Err(error) => Err(HookError::Backend(error)),
            }
        })
    })
}
