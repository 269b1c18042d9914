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
//! The question and its judgement are fencing-postgres's
//! ([`check_durability`](fencing_postgres::check_durability)), which runs the same check for
//! its marks: one query for both crates; only the way out differs.

use deadpool_postgres::{Hook, HookError};
use tokio_postgres::Client;

/// How to get past a refusal, appended to every reason.
const OPT_OUT: &str = "tokens could repeat after a crash or failover (accept the risk with \
                       PgLockClient::accept_volatile_counter(true))";

/// Why the server could lose an acknowledged grant, or `None`.
pub(crate) async fn refusal(client: &Client) -> Result<Option<String>, tokio_postgres::Error> {
    let refused = fencing_postgres::check_durability(client).await?;
    Ok(refused.map(|refused| format!("{}; {OPT_OUT}", refused.reason())))
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
