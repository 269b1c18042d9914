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
//! [`pool()`](crate::pool()) installs [`durability_hook`] unless
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
    // Unnamed (`query_typed`): no prepared statement outlives the question,
    // which a pooler in transaction mode could not keep.
    let rows = client.query_typed(ASK, &[]).await?;
    let Some(row) = rows.first() else { return Ok(None) };
    let seen = Seen {
        synchronous_commit: row.try_get(0)?,
        in_recovery: row.try_get(1)?,
        standbys: row.try_get(2)?,
        unreadable: row.try_get(3)?,
        asynchronous: row.try_get(4)?,
    };
    Ok(seen.refusal().map(|reason| NotDurable { reason }))
}

/// What [`ASK`] answered, in its order.
struct Seen {
    synchronous_commit: String,
    in_recovery: bool,
    standbys: i64,
    unreadable: i64,
    asynchronous: Option<String>,
}

impl Seen {
    fn refusal(self) -> Option<String> {
        if self.in_recovery {
            return None;
        }
        if self.synchronous_commit == "off" {
            return Some("synchronous_commit is off in this session: a crash loses the last commits".into());
        }
        if self.standbys == 0 {
            return None;
        }
        if self.unreadable > 0 {
            return Some(format!(
                "{} standby(s) stream from this server and this role cannot read their sync_state in \
                 pg_stat_replication (grant it pg_monitor)",
                self.unreadable
            ));
        }
        if let Some(names) = self.asynchronous {
            return Some(format!(
                "standby {names} streams asynchronously (not in synchronous_standby_names): promoted, \
                 it would lack commits this server acknowledged"
            ));
        }
        (self.synchronous_commit == "local").then(|| {
            "synchronous_commit is local in this session while standbys stream: commits do not wait \
             for them"
                .into()
        })
    }
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

#[cfg(test)]
mod tests {
    use super::Seen;

    fn seen(synchronous_commit: &str, standbys: i64, unreadable: i64, asynchronous: Option<&str>) -> Seen {
        Seen {
            synchronous_commit: synchronous_commit.into(),
            in_recovery: false,
            standbys,
            unreadable,
            asynchronous: asynchronous.map(Into::into),
        }
    }

    fn refused(seen: Seen) -> String {
        seen.refusal().expect("refused")
    }

    #[test]
    fn without_standbys_only_synchronous_commit_off_is_refused() {
        assert!(refused(seen("off", 0, 0, None)).contains("synchronous_commit is off"));
        for accepted in ["on", "local", "remote_write", "remote_apply"] {
            assert_eq!(seen(accepted, 0, 0, None).refusal(), None, "{accepted}");
        }
    }

    #[test]
    fn standbys_must_be_synchronous_readable_and_waited_for() {
        // Synchronous, quorum or potential standbys only: nothing is named asynchronous.
        assert_eq!(seen("on", 2, 0, None).refusal(), None);
        assert_eq!(seen("remote_apply", 1, 0, None).refusal(), None);
        assert!(refused(seen("on", 2, 0, Some("s2"))).contains("standby s2 streams asynchronously"));
        assert!(refused(seen("on", 1, 1, None)).contains("cannot read their sync_state"));
        assert!(refused(seen("local", 1, 0, None)).contains("synchronous_commit is local"));
        assert!(refused(seen("off", 1, 0, None)).contains("synchronous_commit is off"));
    }

    #[test]
    fn a_standby_takes_no_writes_and_is_not_refused() {
        let standby = Seen { in_recovery: true, ..seen("off", 1, 1, Some("s1")) };
        assert_eq!(standby.refusal(), None);
    }
}
