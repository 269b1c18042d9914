//! [`PgSharedStore`]: the fencing layer's marks in PostgreSQL, shared by every
//! replica, for effects that are not in the database.
//!
//! # How the contract maps onto PostgreSQL
//!
//! Two tables: the marks (`fencing_marks`, the one [`PgFence::fence`] uses, so
//! both ways of fencing agree on one mark per key) and `fencing_marks_inside`,
//! one row per key and *open* token: a token whose lower-token requests have
//! all left. A request is inside while its transaction holds `FOR KEY SHARE`
//! on its token's row; any number of requests with that token can, at once.
//!
//! A request with token `t` for key `k`:
//!
//! 1. **Enter** (`BEGIN` and one statement, sent together): read the mark and
//!    lock `(k, t)` `FOR KEY SHARE` if the row exists. Mark above `t`: stale
//!    (409). Mark equal to `t` and the row locked: inside, holding the lock
//!    until the permit is dropped (then `ROLLBACK`). This is every request of
//!    the current holder: one round trip, no write.
//! 2. Otherwise **raise** (autocommit): the fence statement sets the mark to
//!    `max(mark, t)` and commits at once, so every replica refuses lower tokens
//!    from here on. A returned mark above `t` is stale.
//! 3. **Open** (a transaction of its own, `lock_timeout` = the drain bound):
//!    delete the rows of lower tokens — a `DELETE` waits for every `KEY SHARE`
//!    on them, that is, for every lower-token request still inside, on any
//!    replica — and insert `(k, t)`. Running out of time is a drain timeout
//!    (503); the mark stays raised. Then enter (1) again.
//!
//! Why no lower token gets in after a higher one, and none is inside with it:
//! entering needs the mark equal to the token *and* the token's row, both
//! read by one statement. A raise commits the higher mark (2) before it
//! deletes the lower rows (3), and its `DELETE` waits for whoever holds them.
//! So a lower-token request either locked its row first — and the raise waits
//! for it to leave — or reads the higher mark and is refused. A row created by
//! a lower raise that the `DELETE`'s snapshot missed was committed after the
//! higher mark, so whoever finds it also finds that mark.
//!
//! If anything goes wrong in between — an error, the future dropped (the
//! client went away), the process killed — the connection is closed rather
//! than returned to the pool, and PostgreSQL rolls its transaction back: no
//! lock outlives the request that took it.

use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use fencing_layer::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore, StoreError};
use tokio_postgres::types::{ToSql, Type};

use crate::error::FenceError;
use crate::fence::{MAX_KEY_BYTES, PgFence, from_wire, to_wire};

/// The layer's marks in PostgreSQL: give it to
/// [`FencingLayer::shared_store`](fencing_layer::FencingLayer::shared_store)
/// on every replica, with the same database and table.
///
/// Each request inside holds a pooled connection, so the pool's size bounds
/// how many fenced requests a replica runs at once; past it, requests wait
/// for a connection up to the pool's wait bound, then get 503.
#[derive(Debug, Clone)]
pub struct PgSharedStore {
    pool: Pool,
    fence: PgFence,
}

impl PgSharedStore {
    /// Marks in `fence`'s table (and `<table>_inside`), through `pool`.
    #[must_use]
    pub fn new(pool: Pool, fence: PgFence) -> Self {
        Self { pool, fence }
    }

    /// Creates both tables if they do not exist ([`PgFence::migrate`]).
    ///
    /// # Errors
    ///
    /// No connection, or the tables could not be created.
    pub async fn migrate(&self) -> Result<(), FenceError> {
        let client = self.pool.get().await?;
        self.fence.migrate(&client).await
    }

    async fn admit(self, key: String, token: u64, drain: Duration) -> Result<SharedPermit, SharedRefusal> {
        if key.len() > MAX_KEY_BYTES {
            return Err(SharedRefusal::KeyTooLong { limit: MAX_KEY_BYTES });
        }
        if key.contains('\0') {
            return Err(SharedRefusal::InvalidKey("the key contains a NUL character"));
        }
        let mut conn = Conn { client: Some(self.pool.get().await.map_err(refusal)?), busy: false };
        // Enter, or raise, open and enter again: a second miss means a higher
        // token opened meanwhile, which the second enter reports as stale.
        for _ in 0..2 {
            match conn.enter(&self.fence, &key, token).await? {
                Entered::Inside => return Ok(SharedPermit::new(conn)),
                Entered::Stale(highest) => return Err(conn.refuse(SharedRefusal::Stale { highest }).await),
                Entered::NotOpen => conn.raise_and_open(&self.fence, &key, token, drain).await?,
            }
        }
        Err(conn.refuse(unavailable("the token's row vanished twice")).await)
    }
}

impl SharedStore for PgSharedStore {
    fn admit(&self, key: &str, token: u64, drain: Duration) -> SharedAdmission {
        Box::pin(self.clone().admit(key.to_owned(), token, drain))
    }
}

enum Entered {
    Inside,
    Stale(u64),
    NotOpen,
}

/// A pooled connection that goes back to the pool only from a known state:
/// idle, or idle in the request's transaction (then rolled back first, which
/// frees its `KEY SHARE`: that is how the permit leaves). Dropped while
/// `busy` — mid-statement, or after an error — it is closed instead, and the
/// server rolls back whatever it was doing at once.
struct Conn {
    client: Option<Object>,
    busy: bool,
}

impl Conn {
    fn client(&self) -> &Object {
        self.client.as_ref().expect("taken only on drop")
    }

    async fn enter(&mut self, fence: &PgFence, key: &str, token: u64) -> Result<Entered, SharedRefusal> {
        self.busy = true;
        let client = self.client();
        let begin = client.batch_execute("BEGIN");
        let wire = to_wire(token);
        let params: &[(&(dyn ToSql + Sync), Type)] = &[(&key, Type::TEXT), (&wire, Type::INT8)];
        let read = client.query_typed(fence.enter_sql(), params);
        // Sent back to back: one round trip.
        let (begun, rows) = tokio::join!(begin, read);
        begun.map_err(refusal)?;
        let row = rows.map_err(refusal)?.into_iter().next();
        let (mark, open) = match row {
            Some(row) => (from_wire(row.try_get(0).map_err(refusal)?), row.try_get(1).map_err(refusal)?),
            None => (0, false),
        };
        if mark > token {
            self.busy = false;
            return Ok(Entered::Stale(mark));
        }
        if mark == token && open {
            self.busy = false;
            return Ok(Entered::Inside);
        }
        client.batch_execute("ROLLBACK").await.map_err(refusal)?;
        self.busy = false;
        Ok(Entered::NotOpen)
    }

    async fn raise_and_open(
        &mut self,
        fence: &PgFence,
        key: &str,
        token: u64,
        drain: Duration,
    ) -> Result<(), SharedRefusal> {
        self.busy = true;
        let client = self.client();
        let wire = to_wire(token);
        let params: &[(&(dyn ToSql + Sync), Type)] = &[(&key, Type::TEXT), (&wire, Type::INT8)];
        // Autocommit: the higher mark is visible to every replica before anything waits.
        let row = client.query_typed_one(fence.fence_sql(), params).await.map_err(refusal)?;
        let mark = from_wire(row.try_get(1).map_err(refusal)?);
        if mark > token {
            return Err(SharedRefusal::Stale { highest: mark });
        }
        let lock_timeout = drain.as_millis().clamp(1, i32::MAX as u128).to_string();
        let begin = client.batch_execute("BEGIN");
        let timeout_param: &[(&(dyn ToSql + Sync), Type)] = &[(&lock_timeout, Type::TEXT)];
        let bound = client.query_typed("SELECT set_config('lock_timeout', $1, true)", timeout_param);
        let open = client.query_typed(fence.open_sql(), params);
        let (begun, bound, opened) = tokio::join!(begin, bound, open);
        let outcome = begun.and(bound.map(drop)).and(opened.map(drop));
        let ended = match &outcome {
            Ok(()) => client.batch_execute("COMMIT").await,
            Err(_) => client.batch_execute("ROLLBACK").await,
        };
        ended.map_err(refusal)?;
        self.busy = false;
        outcome.map_err(|error| match error.code() {
            Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => SharedRefusal::DrainTimeout,
            _ => refusal(error),
        })
    }

    /// Ends the transaction (if that fails, drop closes the connection) and returns `refusal`.
    async fn refuse(&mut self, refusal: SharedRefusal) -> SharedRefusal {
        self.busy = true;
        if self.client().batch_execute("ROLLBACK").await.is_ok() {
            self.busy = false;
        }
        refusal
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        if self.busy {
            drop(Object::take(client));
            return;
        }
        // Rolling back needs a round trip; without a runtime, closing does it too.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(Object::take(client));
            return;
        };
        runtime.spawn(async move {
            if client.batch_execute("ROLLBACK").await.is_err() {
                drop(Object::take(client));
            }
        });
    }
}

fn refusal(error: impl Into<FenceError>) -> SharedRefusal {
    SharedRefusal::Unavailable(StoreError::log(error.into()))
}

fn unavailable(why: &'static str) -> SharedRefusal {
    SharedRefusal::Unavailable(StoreError::log(std::io::Error::other(why)))
}
