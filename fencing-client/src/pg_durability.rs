//! Refusing a PostgreSQL that could hand a token out twice: the check
//! [`PgLockClient`](crate::PgLockClient)'s pool runs on each connection it opens.
//!
//! The token counter only goes forward across a crash or a failover if each
//! grant's commit waited for its WAL to be flushed where the next primary comes
//! from. Refused: `synchronous_commit = off` in the session (a crash loses the
//! last commits); a physical standby streaming asynchronously (not named in
//! `synchronous_standby_names`: promoted, it lacks the grants it had not
//! received); `synchronous_commit = local` while standbys stream; standbys whose
//! `sync_state` the role may not read (it needs `pg_monitor`). A standby listed
//! in `synchronous_standby_names` but not synchronous now (`potential`) is
//! accepted: the failover tooling must promote only a synchronous one.
//! fencing-postgres runs the same check for its marks (`fencing_postgres::durability`);
//! the crates do not depend on each other, so each states it.

use deadpool_postgres::{Hook, HookError};
use tokio_postgres::Client;

/// One round trip: the session's `synchronous_commit`, whether the server is a
/// standby, its physical standbys (walsenders with no database), how many are
/// unreadable, and the names of the asynchronous ones.
const ASK: &str = "SELECT current_setting('synchronous_commit'), pg_is_in_recovery(),
        count(w.pid), count(w.pid) FILTER (WHERE w.sync_state IS NULL),
        string_agg(coalesce(w.application_name, '?'), ', ' ORDER BY w.application_name)
            FILTER (WHERE w.sync_state = 'async')
    FROM (SELECT r.pid, r.sync_state, r.application_name
          FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
          WHERE a.datname IS NULL) w";

/// How to get past a refusal, appended to every reason.
const OPT_OUT: &str = "tokens could repeat after a crash or failover (accept the risk with \
                       PgLockClient::accept_volatile_counter(true))";

/// Why the server could lose an acknowledged grant, or `None`.
pub(crate) async fn refusal(client: &Client) -> Result<Option<String>, tokio_postgres::Error> {
    let row = client.query_one(ASK, &[]).await?;
    let reason = judge(row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?, row.try_get(4)?);
    Ok(reason.map(|reason| format!("{reason}; {OPT_OUT}")))
}

/// The answer to [`ASK`], column by column, judged.
fn judge(
    synchronous_commit: String,
    in_recovery: bool,
    standbys: i64,
    unreadable: i64,
    asynchronous: Option<String>,
) -> Option<String> {
    if in_recovery {
        // A standby takes no grants: nothing to refuse.
        None
    } else if synchronous_commit == "off" {
        Some("synchronous_commit is off in this session: a crash loses the last commits".to_owned())
    } else if standbys == 0 {
        None
    } else if unreadable > 0 {
        Some(format!(
            "{unreadable} standby(s) stream from this server and this role cannot read their \
             sync_state in pg_stat_replication (grant it pg_monitor)"
        ))
    } else if let Some(names) = asynchronous {
        Some(format!(
            "standby {names} streams asynchronously (not in synchronous_standby_names): promoted, \
             it would lack grants this server acknowledged"
        ))
    } else if synchronous_commit == "local" {
        Some("synchronous_commit is local in this session while standbys stream".to_owned())
    } else {
        None
    }
}

/// The pool's `post_create` hook: a refused server fails the new connection
/// with the reason as its message (`LockError::NotDurable` once mapped).
pub(crate) fn hook(accept: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Hook {
    Hook::async_fn(move |client, _| {
        let accept = accept.load(std::sync::atomic::Ordering::Relaxed);
        Box::pin(async move {
            if accept {
                return Ok(());
            }
            match refusal(client).await {
                Ok(None) => Ok(()),
                Ok(Some(reason)) => Err(HookError::message(reason)),
                Err(error) => Err(HookError::Backend(error)),
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::judge;

    fn refused(
        synchronous_commit: &str,
        standbys: i64,
        unreadable: i64,
        asynchronous: Option<&str>,
    ) -> String {
        let reason =
            judge(synchronous_commit.into(), false, standbys, unreadable, asynchronous.map(Into::into));
        reason.unwrap_or_default()
    }

    #[test]
    fn what_is_refused() {
        assert!(refused("off", 0, 0, None).contains("synchronous_commit is off"));
        assert!(refused("on", 2, 0, Some("s2")).contains("standby s2 streams asynchronously"));
        assert!(refused("on", 1, 1, None).contains("cannot read their sync_state"));
        assert!(refused("local", 1, 0, None).contains("synchronous_commit is local"));
    }

    #[test]
    fn what_is_accepted() {
        for accepted in ["on", "local", "remote_write", "remote_apply"] {
            assert_eq!(refused(accepted, 0, 0, None), "", "{accepted} without standbys");
        }
        // Synchronous, quorum or potential standbys: none is named asynchronous.
        assert_eq!(refused("on", 2, 0, None), "");
        // A standby (in recovery) takes no grants.
        assert_eq!(judge("off".into(), true, 1, 1, Some("s1".into())), None);
    }
}
