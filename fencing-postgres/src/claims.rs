//! `PgClaims`: the claim backend on PostgreSQL (the protocol and its proof are
//! in [`fencing_layer::claims`]; this file is only how PostgreSQL keeps it).
//!
//! Two tables: the marks (`fencing_marks`, shared with [`PgFence::fence`]) and
//! `<marks>_claims`, one row per key and replica: `(token, grant_id,
//! expires_at)`, the expiry on the database's clock (`clock_timestamp()`).
//!
//! - **Claim**: one transaction, pipelined (one round trip), READ COMMITTED
//!   whatever the database's default: raise the mark if lower (and `NOTIFY` the
//!   raise, delivered at commit); lock the mark row; lock every lower claim row
//!   (waiting for a renewal in flight on it); delete the expired ones; grant
//!   if the mark equals the token and no lower claim is left. Each statement
//!   takes a fresh snapshot after the locks before it, so it sees every claim
//!   committed by a grant that held the mark row before; and no claim below the
//!   mark can be granted while this transaction holds it.
//! - **Renew**: on the replica's own session, two statements. The first
//!   extends only rows still live (`expires_at > clock_timestamp()`), locking
//!   them `FOR UPDATE SKIP LOCKED`: a row another transaction holds (a grant
//!   looking at it, an operator) is skipped, never waited on, and one bad row
//!   costs one claim, not all. It answers one small row, so nothing large is
//!   sent while its locks are held: a connection that stalls after it holds up
//!   no raise. The second reads, without locks, which asked-for claims are
//!   live, which were extended (an expiry at or past the first statement's
//!   start plus the term) and which keys' marks are above the claim.
//! - **Release**: one statement deleting the row of one grant, within
//!   `lock_timeout` and a bounded wait for a pooled connection. A trigger on
//!   the claims table (`migrate.rs`) announces every deleted claim row
//!   (`l <token> <key>`, at commit): a release, an expired row deleted, a row
//!   deleted by hand. A replica holding the claim hears of it at once, and
//!   its keeper renews that claim then (finding it gone, it stops the
//!   claim's requests), not a renewal period later.
//! - **Read marks**: a raise heard (`NOTIFY` is a hint: any role that can
//!   connect can send one on the channel, no privilege needed) is checked by
//!   reading the key's mark on the session.
//! - **Sweep**: now and then, up to 10,000 expired claims (any replica's) are
//!   deleted, skipping rows that are locked.
//! - **Session**: two connections of its own (outside the pool). One runs the
//!   renewals, reads and sweeps, each statement bounded by
//!   `statement_timeout` (5 s), and never `LISTEN`s; the keeper's runtime
//!   drives it. The other `LISTEN`s for raises and releases, driven by a
//!   thread and runtime of its own (`hints.rs`), which parses what it hears
//!   into the session's bounded channel. So a flood of forged notifications
//!   (hundreds of thousands a second) never queues ahead of a renewal's reply
//!   and never takes the keeper's thread: it costs hints (raises fall back
//!   to their 100 ms poll and the renewals' reports), never renewals or
//!   grants. When either connection ends, the hint thread ends, the channel
//!   closes, and the keeper opens a new session.
//!
//! Every wait on a lock is bounded by `lock_timeout` (1 s); running out means
//! "look again later", never "held". Nothing stays open between statements, so
//! a client that goes away leaves no session behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_layer::claims::{
    BoxFuture, ClaimBackend, ClaimEvent, ClaimRenewer, ClaimReply, ClaimRequest, ClaimSession, Renewal,
};
use fencing_layer::store::StoreError;
use tokio::sync::oneshot;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use crate::connect::{PgConnect, store_error};
use crate::fence::{MAX_KEY_BYTES, PgFence, WAY_TRANSACTION, from_wire, to_wire};
use crate::hints;

/// How long any claim statement waits for a row lock.
const LOCK_TIMEOUT: &str = "1s";

/// How long a claim transaction may sit idle (a replica paused in the middle
/// of its one round trip) before the server ends it and frees its rows.
const IDLE_IN_TRANSACTION: &str = "5s";

/// How long a statement on the background session may run, at most.
const STATEMENT_TIMEOUT: &str = "5s";

/// How long a release waits for a pooled connection.
const RELEASE_POOL_WAIT: Duration = Duration::from_secs(1);

type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// The claim backend: marks and claims in `fence`'s tables, through `pool`; the
/// replica's session opened from `config`.
#[derive(Clone)]
pub(crate) struct PgClaims {
    pool: Pool,
    config: PgConnect,
    fence: PgFence,
    hints: Arc<HintsHeard>,
}

/// Whether the hint connection hears the channel: its own test notification
/// came back (or not) when the session opened.
#[derive(Debug, Default)]
pub(crate) struct HintsHeard {
    /// 0: not known yet; 1: heard; 2: not heard.
    state: AtomicU8,
    /// The warning is logged once per store, not once per session.
    warned: AtomicBool,
}

impl HintsHeard {
    /// `Some(true)` once the last session heard its test notification,
    /// `Some(false)` if it did not within [`ECHO_WAIT`].
    pub(crate) fn arrive(&self) -> Option<bool> {
        match self.state.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    fn record(&self, heard: bool) {
        self.state.store(if heard { 1 } else { 2 }, Ordering::Relaxed);
        if !heard && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                waited_ms = ECHO_WAIT.as_millis() as u64,
                "claims: this replica's hint connection does not hear the claims channel (LISTEN through a \
                 pooler in transaction mode, such as PgBouncer with pool_mode = transaction, hears \
                 nothing); raises and releases elsewhere are learnt from the renewals and the 100 ms \
                 poll instead, so a raise may wait up to one renewal period plus its timeout longer \
                 (never past the term); give the claims session a direct or session-pooled connection \
                 (the config of PgSharedStore::new; demo-resource serve --claims-url)"
            );
        }
    }
}

/// How long a new session waits for its test notification to come back.
const ECHO_WAIT: Duration = Duration::from_secs(2);

impl PgClaims {
    pub(crate) fn new(pool: Pool, config: PgConnect, fence: PgFence) -> Self {
        Self { pool, config, fence, hints: Arc::default() }
    }

    pub(crate) fn hints(&self) -> Arc<HintsHeard> {
        Arc::clone(&self.hints)
    }

    async fn claim(
        self,
        key: String,
        replica: String,
        token: u64,
        grant: u64,
        term: Duration,
    ) -> Result<ClaimReply, StoreError> {
        let client = self.pool.get().await.map_err(StoreError::log)?;
        let sql = self.fence.claims_sql();
        let wire = to_wire(token);
        let grant = i64::try_from(grant).map_err(StoreError::log)?;
        let seconds = term.as_secs_f64();
        let key_token: Params<'_> = &[(&key, Type::TEXT), (&wire, Type::INT8)];
        let key_only: Params<'_> = &[(&key, Type::TEXT)];
        let bound = bounds();
        let grant_params: Params<'_> = &[
            (&key, Type::TEXT),
            (&wire, Type::INT8),
            (&replica, Type::TEXT),
            (&grant, Type::INT8),
            (&seconds, Type::FLOAT8),
        ];
        // Sent back to back: one round trip. A failed statement aborts the
        // transaction, and COMMIT then rolls it back.
        let (begun, bounded, raised, locked, lower, expired, granted, committed) = tokio::join!(
            client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
            client.batch_execute(&bound),
            client.query_typed(&sql.raise, key_token),
            client.query_typed(&sql.lock_mark, key_only),
            client.query_typed(&sql.lock_lower, key_token),
            client.query_typed(&sql.drop_expired, key_token),
            client.query_typed(&sql.grant, grant_params),
            client.batch_execute("COMMIT"),
        );
        let outcome = (|| {
            begun?;
            bounded?;
            let raised = raised?.len() == 1;
            locked?;
            lower?;
            expired?;
            let rows = granted?;
            committed?;
            Ok((raised, rows))
        })();
        let (raised, rows) = match outcome {
            Ok(outcome) => outcome,
            // A lock that stayed taken, a deadlock, a conflict: look again later.
            Err(error) if is_transient(&error) => {
                return Ok(ClaimReply::Wait { raised: false, soonest: None });
            }
            Err(error) => return Err(StoreError::log(error)),
        };
        let Some(row) = rows.into_iter().next() else {
            return Err(StoreError::log(std::io::Error::other("the mark row vanished during a claim")));
        };
        let mark = from_wire(row.try_get(0).map_err(StoreError::log)?);
        let way: Option<String> = row.try_get(1).map_err(StoreError::log)?;
        let live: i64 = row.try_get(2).map_err(StoreError::log)?;
        let soonest_ms: Option<f64> = row.try_get(3).map_err(StoreError::log)?;
        let granted: bool = row.try_get(4).map_err(StoreError::log)?;
        if way.as_deref() == Some(WAY_TRANSACTION) {
            return Ok(ClaimReply::Refused(
                "the key is fenced in-transaction (PgFence::fence) by another writer; fence each key one way",
            ));
        }
        Ok(if mark > token {
            ClaimReply::Stale { mark }
        } else if granted {
            ClaimReply::Granted { raised }
        } else if live > 0 && mark == token {
            let soonest = soonest_ms.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0));
            ClaimReply::Wait { raised, soonest }
        } else {
            ClaimReply::Wait { raised, soonest: None }
        })
    }

    async fn release(self, key: String, replica: String, grant: u64) -> Result<(), StoreError> {
        // The pool's own wait may be longer than a release is worth.
        let client = tokio::time::timeout(RELEASE_POOL_WAIT, self.pool.get())
            .await
            .map_err(|_| StoreError::Timeout(RELEASE_POOL_WAIT))?
            .map_err(StoreError::log)?;
        let grant = i64::try_from(grant).map_err(StoreError::log)?;
        let params: Params<'_> = &[(&key, Type::TEXT), (&replica, Type::TEXT), (&grant, Type::INT8)];
        let bound = bounds();
        let (begun, bounded, released, committed) = tokio::join!(
            client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
            client.batch_execute(&bound),
            client.query_typed(&self.fence.claims_sql().release, params),
            client.batch_execute("COMMIT"),
        );
        begun.and(bounded).and(released.map(drop)).and(committed).map_err(StoreError::log)
    }

    /// The session: renewals, reads and sweeps on a connection that does not
    /// listen, driven by the keeper's runtime (this future's); hints on
    /// another, driven by a thread of its own (`hints.rs`). When either
    /// connection ends, the hint thread ends, `events` closes and the keeper
    /// opens another session.
    async fn open(self) -> Result<ClaimSession, StoreError> {
        let (renewals_up, renewals_gone) = oneshot::channel::<()>();
        let channel = self.fence.claims_sql().channel.clone();
        let payload = format!("p {:x}", crate::pooling::nonce());
        let (echo, echoed) = hints::Echo::new(payload.clone());
        let hints = hints::listen(self.config.clone(), channel.clone(), renewals_gone, echo);
        let renewals = async {
            let (client, connection) = self.config.connect().await.map_err(store_error)?;
            tokio::spawn(async move {
                // Dropped when the connection ends: the hint thread ends with it.
                let _up = renewals_up;
                if let Err(error) = connection.await {
                    tracing::warn!(%error, "claims: the background session's connection ended");
                }
            });
            client
                .batch_execute(&format!(
                    "SET default_transaction_isolation = 'read committed';
                     SET lock_timeout = '{LOCK_TIMEOUT}';
                     SET statement_timeout = '{STATEMENT_TIMEOUT}'"
                ))
                .await
                .map_err(StoreError::log)?;
            Ok(client)
        };
        let (events, client) = tokio::try_join!(hints, renewals)?;
        let client = Arc::new(client);
        // Sent from the renewals' connection, heard (or not) on the hint one.
        let (sender, heard) = (Arc::clone(&client), self.hints());
        tokio::spawn(async move {
            let notify = "SELECT pg_notify($1, $2)";
            let sent = sender.query_typed(notify, &[(&channel, Type::TEXT), (&payload, Type::TEXT)]).await;
            if sent.is_ok() {
                heard.record(tokio::time::timeout(ECHO_WAIT, echoed).await.is_ok_and(|echo| echo.is_ok()));
            }
        });
        let renewer = Renewer { client, fence: self.fence.clone() };
        Ok(ClaimSession { renewer: Box::new(renewer), events })
    }
}

impl ClaimBackend for PgClaims {
    fn claim(&self, request: ClaimRequest<'_>) -> BoxFuture<'static, Result<ClaimReply, StoreError>> {
        let ClaimRequest { replica, key, token, term, grant } = request;
        Box::pin(self.clone().claim(key.to_owned(), replica.to_owned(), token, grant, term))
    }

    fn release(&self, replica: &str, key: &str, grant: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(self.clone().release(key.to_owned(), replica.to_owned(), grant))
    }

    fn open_session(&self) -> BoxFuture<'static, Result<ClaimSession, StoreError>> {
        Box::pin(self.clone().open())
    }
}

struct Renewer {
    client: Arc<Client>,
    fence: PgFence,
}

impl ClaimRenewer for Renewer {
    fn renew(
        &self,
        replica: &str,
        held: Vec<(String, u64)>,
        term: Duration,
    ) -> BoxFuture<'static, Result<Renewal, StoreError>> {
        let (client, fence, replica) = (Arc::clone(&self.client), self.fence.clone(), replica.to_owned());
        Box::pin(async move {
            let (keys, grants): (Vec<String>, Vec<i64>) =
                held.into_iter().map(|(key, grant)| (key, i64::try_from(grant).unwrap_or(i64::MAX))).unzip();
            let seconds = term.as_secs_f64();
            let sql = fence.claims_sql();
            let asked: Params<'_> = &[
                (&replica, Type::TEXT),
                (&keys, Type::TEXT_ARRAY),
                (&grants, Type::INT8_ARRAY),
                (&seconds, Type::FLOAT8),
            ];
            // First extend (it commits before anything else is sent back), then
            // read what stands, without locks.
            let row = client.query_typed(&sql.renew, asked).await.map_err(StoreError::log)?;
            let threshold: f64 =
                row.first().map(|row| row.try_get(1)).transpose().map_err(StoreError::log)?.unwrap_or(0.0);
            let read: Params<'_> = &[
                (&replica, Type::TEXT),
                (&keys, Type::TEXT_ARRAY),
                (&grants, Type::INT8_ARRAY),
                (&threshold, Type::FLOAT8),
            ];
            let rows = client.query_typed(&sql.renewed, read).await.map_err(StoreError::log)?;
            let mut renewal = Renewal::default();
            for row in rows {
                // A row that does not read is left out: that one claim lapses, no other.
                let Ok((grant, extended, mark)) = (|| {
                    Ok::<_, tokio_postgres::Error>((
                        row.try_get::<_, i64>(0)?,
                        row.try_get::<_, bool>(1)?,
                        row.try_get::<_, Option<i64>>(2)?,
                    ))
                })() else {
                    continue;
                };
                let grant = u64::try_from(grant).unwrap_or(0);
                if extended {
                    renewal.extended.push(grant)
                } else {
                    renewal.busy.push(grant)
                }
                if let Some(mark) = mark {
                    renewal.raised.push((grant, from_wire(mark)));
                }
            }
            Ok(renewal)
        })
    }

    fn read_marks(&self, keys: Vec<String>) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        let (client, fence) = (Arc::clone(&self.client), self.fence.clone());
        Box::pin(async move {
            let params: Params<'_> = &[(&keys, Type::TEXT_ARRAY)];
            let rows =
                client.query_typed(&fence.claims_sql().read_marks, params).await.map_err(StoreError::log)?;
            rows.into_iter()
                .map(|row| Ok((row.try_get(0)?, from_wire(row.try_get(1)?))))
                .collect::<Result<_, tokio_postgres::Error>>()
                .map_err(StoreError::log)
        })
    }

    fn sweep(&self) -> BoxFuture<'static, Result<u64, StoreError>> {
        let (client, fence) = (Arc::clone(&self.client), self.fence.clone());
        Box::pin(async move {
            // Unnamed, as every statement here: a transaction pooler keeps no prepared statement.
            let rows = client.query_typed(&fence.claims_sql().sweep, &[]).await.map_err(StoreError::log)?;
            let swept: Option<i64> =
                rows.first().map(|row| row.try_get(0)).transpose().map_err(StoreError::log)?;
            Ok(swept.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
        })
    }
}

/// `r <token> <key>` (a raise) or `l <token> <key>` (a release). A key longer
/// than any claim's is nobody's: dropped, so a forged flood costs no memory.
pub(crate) fn parse(payload: &str) -> Option<ClaimEvent> {
    let (kind, rest) = payload.split_once(' ')?;
    let (token, key) = rest.split_once(' ')?;
    if key.len() > MAX_KEY_BYTES {
        return None;
    }
    let (key, token) = (key.to_owned(), token.parse().ok()?);
    match kind {
        "r" => Some(ClaimEvent::Raised { key, token }),
        "l" => Some(ClaimEvent::Released { key, token }),
        _ => None,
    }
}

/// The bounds of a claim or release transaction, set in it: they hold through
/// a pooler in transaction mode too.
fn bounds() -> String {
    format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; \
         SET LOCAL idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'"
    )
}

/// Errors that mean "someone else holds it right now".
fn is_transient(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        [SqlState::LOCK_NOT_AVAILABLE, SqlState::T_R_DEADLOCK_DETECTED, SqlState::T_R_SERIALIZATION_FAILURE]
            .contains(code)
    })
}

#[cfg(test)]
mod tests {
    use super::parse;
    use fencing_layer::claims::ClaimEvent;

    #[test]
    fn notifications_parse_with_spaces_in_the_key() {
        assert_eq!(parse("r 7 /a b"), Some(ClaimEvent::Raised { key: "/a b".into(), token: 7 }));
        assert_eq!(
            parse("l 18446744073709551615 k"),
            Some(ClaimEvent::Released { key: "k".into(), token: u64::MAX })
        );
        assert_eq!(parse("x 1 k"), None);
        assert_eq!(parse("r -1 k"), None);
        assert_eq!(parse("r 1"), None);
        assert_eq!(parse(&format!("r 1 {}", "k".repeat(1025))), None);
        assert!(parse(&format!("r 1 {}", "k".repeat(1024))).is_some());
    }
}
