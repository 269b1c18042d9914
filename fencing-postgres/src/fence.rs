//! `PgFence`: the mark table, its migration, and the fence's two statements.
//!
//! The fence runs inside the caller's transaction, under READ COMMITTED, as one
//! of two statements. A token this process fenced the key with last (`known.rs`:
//! every write of a holder but its first) sends the *plain lock*: the key's mark
//! row read `FOR NO KEY UPDATE`. Any other token sends the *full statement*,
//! which locks the row the same way and inserts or raises it when needed. What
//! the fence promises, and why:
//!
//! 1. **Data and mark commit together.** The mark is read, locked and changed
//!    in the transaction that makes the writes; both commit or neither does.
//! 2. **A lower token never writes after a higher one, and a raise waits for
//!    every writer still inside with the lower token.** A write with token `t`
//!    comes after `fence(t)` returned, so its transaction `T` holds the row's
//!    `FOR NO KEY UPDATE` lock until it ends. A raise to `t' > t` in another
//!    transaction `R` must lock the row before it changes it (`cur`'s lock, or
//!    the upsert's conflict lock: both conflict with `T`'s), so it waits until
//!    `T` has committed or rolled back. The other way round, if `R` committed
//!    first, `T`'s statement decides on `t'`, not on an older mark: a row
//!    locked after a wait, or changed since the statement's snapshot, is read
//!    again at its newest committed version before the lock is granted
//!    (PostgreSQL's re-check of an updated row under READ COMMITTED), so `T`
//!    finds `t' > t` and is refused as stale.
//! 3. **The lock is taken in the statement that reads the mark.** That is what
//!    ties the mark decided on to the lock held. A read followed by a lock, or
//!    a lock that is not the row's (an advisory lock in the same statement),
//!    could decide on a mark read before the lock was granted: a raise that
//!    committed in between would be missed. `FENCING_MUTANT=unlocked-fence`
//!    leaves the plain lock's `FOR NO KEY UPDATE` out, and the in-transaction
//!    tests must fail (`fence-mutants.sh` in this crate).
//!
//! The plain lock is the shortest statement that does this: one index lookup
//! and one row lock, which writes the tuple's header and one 54-byte WAL
//! record, and takes no transaction id of its own. Equal tokens on one key run
//! one after another (the lock conflicts with itself), more than invariant 2
//! needs. A shared advisory lock would let them run side by side and write no
//! WAL, but it needs the mark read in a later statement (3.): measured, that
//! second statement, or a plpgsql function that holds both, costs the server
//! more than the row lock saves (BENCHMARKS.md §13, issue 39).

use std::sync::Arc;

use tokio_postgres::Client;

use crate::error::FenceError;
use crate::known::KnownMarks;
use crate::migrate::{Migration, Names};
use crate::table::{InvalidTableName, quote};
use crate::transaction::FenceTransaction;

/// The mark table's name unless [`PgFence::table`] sets another.
pub const DEFAULT_TABLE: &str = "fencing_marks";

/// The longest resource key taken, in bytes: the layer's default. A B-tree
/// index entry must fit a third of a page, so keys cannot be much longer.
pub const MAX_KEY_BYTES: usize = fencing_layer::store::DEFAULT_MAX_KEY_BYTES;

/// Tokens are `u64`, which no PostgreSQL integer holds: the table keeps the
/// token itself in a `NUMERIC(20,0)` (readable, and an operator's reset is
/// plain SQL), and the wire carries it as an `int8`, `token − 2⁶³`, which
/// keeps the order. The statements convert with this offset.
const OFFSET: &str = "9223372036854775808";

/// Fencing inside the handler's own transaction, with marks in one table that
/// every replica shares. Cheap to clone: the statements are built once.
#[derive(Debug, Clone)]
pub struct PgFence {
    sql: Arc<Statements>,
    known: Arc<KnownMarks>,
    /// Under a transaction pooler: the bounds, set in each fenced transaction.
    set_local: Option<Arc<str>>,
}

#[derive(Debug)]
struct Statements {
    table: String,
    migrate: Migration,
    /// `($1 key, $2 token)` → `(mark, way)`: locks the key's mark row, if any.
    /// The whole fence for a token this process fenced the key with last.
    lock: String,
    /// `($1 key, $2 token)` → `(previous, mark, way)`: locks, inserts or raises.
    fence: String,
    claims: ClaimStatements,
}

/// Most expired claims one sweep deletes.
const SWEEP_ROWS: u32 = 10_000;

/// The shared store's statements (`claims.rs` says why they are these).
#[derive(Debug, Default)]
pub(crate) struct ClaimStatements {
    /// The notification channel: short, and the same on every replica.
    pub(crate) channel: String,
    /// `($1 key, $2 token)`: raises the mark if lower, marks the key as fenced by
    /// claims, and announces a raise (`r <token> <key>`, at commit).
    pub(crate) raise: String,
    /// `($1 key)` → `(mark, way)`: locks the mark row, for the rest of the transaction.
    pub(crate) lock_mark: String,
    /// `($1 key, $2 token)`: locks every claim row below the token.
    pub(crate) lock_lower: String,
    /// `($1 key, $2 token)`: deletes the expired ones.
    pub(crate) drop_expired: String,
    /// `($1 key, $2 token, $3 replica, $4 grant, $5 term seconds)` →
    /// `(mark, way, live lower claims, ms to the soonest one's expiry, granted)`.
    pub(crate) grant: String,
    /// `($1 key, $2 replica, $3 grant)`: deletes the claim (the table's trigger
    /// announces every deleted claim, `l <token> <key>`).
    pub(crate) release: String,
    /// `($1 replica, $2 keys, $3 grants, $4 term seconds)` → `(renewed, threshold)`:
    /// extends the live claims whose rows are free; a row extended by it
    /// expires at or after `threshold` (seconds since the epoch).
    pub(crate) renew: String,
    /// `($1 replica, $2 keys, $3 grants, $4 threshold)` → `(grant, extended, mark
    /// if above the token)` of every claim asked for that is still live. Locks nothing.
    pub(crate) renewed: String,
    /// `($1 keys)` → `(key, mark)`: the marks of those keys that have one. Locks nothing.
    pub(crate) read_marks: String,
    /// Deletes up to [`SWEEP_ROWS`] expired claims, any replica's → `(how many)`.
    pub(crate) sweep: String,
}

/// What a successful [`PgFence::fence`] found: the mark now equals `token`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced {
    /// The token fenced, now the key's mark.
    pub token: u64,
    /// The key's mark before this call (0 for a key never fenced).
    pub previous: u64,
}

impl Fenced {
    /// Whether this call raised the mark (the transaction, once committed, is
    /// the first of a newer holder).
    #[must_use]
    pub fn raised(&self) -> bool {
        self.token > self.previous
    }
}

/// What fenced a key's mark row first: its way, kept so that the two ways never mix silently.
pub(crate) const WAY_TRANSACTION: &str = "tx";

/// Above this share of the server's notification queue in use, raises and
/// releases announce nothing: notifications are hints, and a queue filled by
/// a flood of forged ones (nobody reads them fast enough) would otherwise
/// make every transaction that notifies fail at commit, grants included.
/// Replicas then learn of raises by their renewals and waiting raises poll.
pub(crate) const NOTIFY_QUEUE_LIMIT: &str = "0.5";
pub(crate) const WAY_CLAIMS: &str = "claims";

impl Default for PgFence {
    fn default() -> Self {
        Self::table(
            Self { sql: Arc::new(Statements::empty()), known: Arc::default(), set_local: None },
            DEFAULT_TABLE,
        )
        .expect("the default name is valid")
    }
}

impl Statements {
    fn empty() -> Self {
        let none = String::new;
        Self {
            table: none(),
            migrate: Migration::default(),
            lock: none(),
            fence: none(),
            claims: ClaimStatements::default(),
        }
    }
}

impl PgFence {
    /// Marks in [`DEFAULT_TABLE`] (`fencing_marks`), on the connection's `search_path`.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks in `name`: `table` or `schema.table`, made of ASCII letters,
    /// digits and underscores, not starting with a digit. The name is quoted,
    /// so its case is kept. Anything else is refused here, before it can reach SQL.
    pub fn table(self, name: &str) -> Result<Self, InvalidTableName> {
        // The shared store's second table, `<name>_claims`, must be a valid name too.
        let claims = quote(&format!("{name}_claims"))?;
        Ok(Self { set_local: self.set_local, ..Self::build(name.to_owned(), quote(name)?, claims) })
    }

    /// Fences transactions of a pool built with `limits`
    /// ([`pool()`](crate::pool())). Under [`Pooling::Transaction`](crate::Pooling)
    /// each fence then sets the pool's bounds in its transaction (`SET LOCAL`
    /// of `lock_timeout` and `idle_in_transaction_session_timeout`, sent with
    /// the fence: no extra round trip) and sends its statement unnamed; under
    /// session pooling (the default) the pool's connections have the bounds
    /// already, and this changes nothing.
    #[must_use]
    pub fn for_pool(mut self, limits: &crate::PoolLimits) -> Self {
        self.set_local = limits.set_local().map(Arc::from);
        self
    }

    /// The mark table's name, as given.
    #[must_use]
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    fn build(table: String, quoted: String, claims: String) -> Self {
        // A token equal to the mark, every write of a holder but its first,
        // only needs the key's row locked: a lower-token transaction holding it
        // is waited for (under READ COMMITTED the wait ends on the latest
        // committed row), and nothing is rewritten. `$2` is unused; both
        // statements take the same parameters.
        let lock =
            format!("SELECT (mark - {OFFSET})::int8, way FROM {quoted} WHERE key = $1 FOR NO KEY UPDATE");
        // Otherwise lock first, write only when needed. `cur` locks the key's
        // row. An equal or higher mark is the answer as it stands: the row is
        // locked, not rewritten. A missing row or a lower mark goes to the
        // upsert, which inserts or raises (a row another transaction inserted
        // meanwhile is raised with GREATEST). A key owned by the shared store
        // is never changed: the upsert skips it and `cur` reports its way.
        let fence = format!(
            "WITH cur AS (
                 SELECT mark, way FROM {quoted} WHERE key = $1 FOR NO KEY UPDATE
             ), up AS (
                 INSERT INTO {quoted} AS m (key, mark, previous, way)
                 SELECT $1, $2::numeric + {OFFSET}, 0, '{WAY_TRANSACTION}'
                 WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.mark >= $2::numeric + {OFFSET})
                 ON CONFLICT (key) DO UPDATE
                     SET mark = GREATEST(m.mark, EXCLUDED.mark), previous = m.mark, way = COALESCE(m.way, EXCLUDED.way)
                     WHERE m.way IS DISTINCT FROM '{WAY_CLAIMS}'
                 RETURNING previous, mark, way
             )
             SELECT (previous - {OFFSET})::int8, (mark - {OFFSET})::int8, way FROM up
             UNION ALL
             SELECT (mark - {OFFSET})::int8, (mark - {OFFSET})::int8, way FROM cur WHERE NOT EXISTS (SELECT 1 FROM up)"
        );
        let channel = format!("fencing_claims_{:016x}", fnv1a(table.as_bytes()));
        let schema = table.split_once('.').map(|(schema, _)| format!("\"{schema}\""));
        let migrate = Migration::new(&Names {
            marks: &quoted,
            claims: &claims,
            schema: schema.as_deref(),
            channel: &channel,
            claims_name: &format!("{table}_claims"),
            marks_name: &table,
        });
        let claims_sql = ClaimStatements {
            raise: format!(
                "WITH raised AS (
                     INSERT INTO {quoted} AS m (key, mark, previous, way)
                     VALUES ($1, $2::numeric + {OFFSET}, 0, '{WAY_CLAIMS}')
                     ON CONFLICT (key) DO UPDATE SET mark = EXCLUDED.mark, previous = m.mark, way = EXCLUDED.way
                     WHERE m.mark < EXCLUDED.mark AND m.way IS DISTINCT FROM '{WAY_TRANSACTION}'
                     RETURNING key
                 )
                 SELECT pg_notify('{channel}', 'r ' || ($2::numeric + {OFFSET})::text || ' ' || $1) FROM raised
                 WHERE pg_notification_queue_usage() < {NOTIFY_QUEUE_LIMIT}"
            ),
            lock_mark: format!("SELECT (mark - {OFFSET})::int8, way FROM {quoted} WHERE key = $1 FOR NO KEY UPDATE"),
            lock_lower: format!(
                "SELECT 1 FROM {claims} WHERE key = $1 AND token < $2::numeric + {OFFSET} ORDER BY replica FOR UPDATE"
            ),
            drop_expired: format!(
                "DELETE FROM {claims}
                 WHERE key = $1 AND token < $2::numeric + {OFFSET} AND expires_at <= clock_timestamp()"
            ),
            grant: format!(
                "WITH m AS (SELECT mark, way FROM {quoted} WHERE key = $1),
                 lower AS (
                     SELECT count(*) AS live, min(expires_at) - clock_timestamp() AS soonest
                     FROM {claims} WHERE key = $1 AND token < $2::numeric + {OFFSET}
                 ),
                 granted AS (
                     INSERT INTO {claims} AS c (key, replica, token, grant_id, expires_at)
                     SELECT $1, $3, m.mark, $4, clock_timestamp() + make_interval(secs => $5)
                     FROM m, lower
                     WHERE m.mark = $2::numeric + {OFFSET} AND lower.live = 0 AND m.way IS DISTINCT FROM '{WAY_TRANSACTION}'
                     ON CONFLICT (key, replica) DO UPDATE
                         SET token = EXCLUDED.token, grant_id = EXCLUDED.grant_id, expires_at = EXCLUDED.expires_at
                     RETURNING 1
                 )
                 SELECT (m.mark - {OFFSET})::int8, m.way, lower.live,
                        (EXTRACT(EPOCH FROM lower.soonest) * 1000)::float8, EXISTS (SELECT 1 FROM granted)
                 FROM m, lower"
            ),
            // The claims table's trigger announces the deletion (`migrate.rs`).
            release: format!("DELETE FROM {claims} WHERE key = $1 AND replica = $2 AND grant_id = $3"),
            // Locks only rows nobody else holds (SKIP LOCKED: a busy row waits
            // for the next renewal, it never fails the others), and returns one
            // small row: nothing large is sent while the locks are held, so a
            // connection that stalls after the statement holds up no raise.
            renew: format!(
                "WITH held AS (SELECT * FROM unnest($2::text[], $3::int8[]) AS h(key, grant_id)),
                 locked AS (
                     SELECT c.key FROM {claims} c JOIN held h ON c.key = h.key AND c.grant_id = h.grant_id
                     WHERE c.replica = $1 AND c.expires_at > clock_timestamp()
                     FOR UPDATE OF c SKIP LOCKED
                 ),
                 renewed AS (
                     UPDATE {claims} c SET expires_at = clock_timestamp() + make_interval(secs => $4)
                     FROM locked l
                     WHERE c.key = l.key AND c.replica = $1 AND c.expires_at > clock_timestamp()
                     RETURNING 1
                 )
                 SELECT count(*)::int8,
                        EXTRACT(EPOCH FROM statement_timestamp() + make_interval(secs => $4))::float8
                 FROM renewed"
            ),
            renewed: format!(
                "WITH held AS (SELECT * FROM unnest($2::text[], $3::int8[]) AS h(key, grant_id))
                 SELECT c.grant_id, c.expires_at >= to_timestamp($4),
                        CASE WHEN m.mark > c.token THEN (m.mark - {OFFSET})::int8 END
                 FROM held h JOIN {claims} c ON c.key = h.key AND c.replica = $1 AND c.grant_id = h.grant_id
                 LEFT JOIN {quoted} m ON m.key = c.key
                 WHERE c.expires_at > clock_timestamp()"
            ),
            read_marks: format!("SELECT key, (mark - {OFFSET})::int8 FROM {quoted} WHERE key = ANY($1::text[])"),
            sweep: format!(
                "WITH swept AS (
                     DELETE FROM {claims} WHERE ctid = ANY(ARRAY(
                         SELECT ctid FROM {claims} WHERE expires_at <= clock_timestamp()
                         LIMIT {SWEEP_ROWS} FOR UPDATE SKIP LOCKED))
                     RETURNING 1
                 )
                 SELECT count(*)::int8 FROM swept"
            ),
            channel,
        };
        #[cfg(feature = "mutants")]
        let (migrate, claims_sql) = mutant::session_claims(migrate, claims_sql, &claims);
        #[cfg(feature = "mutants")]
        let lock = mutant::unlocked_fence(lock);
        Self {
            sql: Arc::new(Statements { table, migrate, lock, fence, claims: claims_sql }),
            known: Arc::default(),
            set_local: None,
        }
    }

    /// The channel on which the shared store's replicas announce raises and
    /// releases (`NOTIFY`). It needs no privilege: any role that can connect
    /// to the database can send on it, so replicas take what they hear as a
    /// hint and read the mark from the table before acting on it.
    #[must_use]
    pub fn claims_channel(&self) -> &str {
        &self.sql.claims.channel
    }

    /// The shared store's statements.
    pub(crate) fn claims_sql(&self) -> &ClaimStatements {
        &self.sql.claims
    }

    /// Creates the mark table, the shared store's claims table and its
    /// trigger, or brings them up to date. It never holds up the replicas
    /// already running: it first reads the catalog (no lock on the tables)
    /// and does nothing when the schema is current; a change waits at most
    /// 100 ms for its table lock, so a queued request never stands long in
    /// front of the replicas' renewals (`migrate.rs` in the source says why).
    /// Idempotent, and safe when several replicas start at once (an advisory
    /// lock orders them). A schema in the name must exist already. A deadpool
    /// `Object` derefs to the `Client` taken here.
    ///
    /// # Errors
    ///
    /// [`FenceError::MigrationBlocked`] when a change was needed and another
    /// session held a lock on the table it needed (a long transaction,
    /// `pg_dump`): nothing was changed, try again later. Other database
    /// errors as [`FenceError`] sorts them.
    pub async fn migrate(&self, client: &Client) -> Result<(), FenceError> {
        self.sql.migrate.run(client).await
    }

    /// Fences `key` with `token` inside `tx`, the transaction that then makes
    /// the writes: locks the key's mark row (creating it on first use), refuses
    /// a token lower than the mark with [`FenceError::Stale`], and raises the
    /// mark to a higher one. One statement, one round trip: for a token this
    /// `PgFence` (or a clone) fenced the key with last, every write of a
    /// holder but its first, a plain lock of the row that writes nothing;
    /// otherwise the statement that creates or raises the row.
    ///
    /// The row stays locked until `tx` commits or rolls back, so fenced
    /// transactions on one key run one after another, across every replica:
    /// a higher token waits here until the lower-token transaction holding the
    /// row has finished. On an error, roll back (dropping `tx` does): after
    /// `Stale` the row is locked, though unchanged, until the transaction ends.
    ///
    /// Under READ COMMITTED (PostgreSQL's default) the wait ends with the
    /// latest committed mark. Under REPEATABLE READ or SERIALIZABLE, a mark
    /// changed since the transaction's snapshot is a serialization failure,
    /// returned as [`FenceError::Retry`]. The wait is bounded by the pool's
    /// `lock_timeout` ([`PoolLimits`](crate::PoolLimits), set on each connection,
    /// or here with [`for_pool`](Self::for_pool) under a transaction pooler); on a
    /// connection of your own, `SET LOCAL lock_timeout = '…'` before fencing.
    /// Running out is `Retry` too.
    ///
    /// Taking a transaction, not any client, is the point: on an autocommit
    /// connection the mark would commit, and unlock, before the write. A
    /// pooled (`deadpool_postgres`) transaction prepares the statement once per
    /// connection; a plain `tokio_postgres` one sends it unprepared each time
    /// ([`FenceTransaction`]); after [`for_pool`](Self::for_pool) with
    /// [`Pooling::Transaction`](crate::Pooling), both send `SET LOCAL` of the
    /// bounds and the statement unnamed. Either way the statement goes out on this
    /// future's first poll, so a write polled after it (`try_join!(biased;
    /// fence, write)`: the same round trip) runs after the key's row is locked or
    /// created (`known.rs` in the source says why that order matters).
    pub async fn fence<T: FenceTransaction + ?Sized>(
        &self,
        tx: &T,
        key: &str,
        token: u64,
    ) -> Result<Fenced, FenceError> {
        if key.len() > MAX_KEY_BYTES {
            return Err(FenceError::KeyTooLong { limit: MAX_KEY_BYTES });
        }
        if key.contains('\0') {
            return Err(FenceError::KeyHasNul);
        }
        let wire = to_wire(token);
        if self.known.is(key, token) {
            // The row is in place (`known.rs`): lock it and read its mark.
            if let Some(row) =
                tx.fence_query(&self.sql.lock, key, wire, self.set_local.as_deref()).await?.first()
            {
                let mark = from_wire(row.try_get(0)?);
                admits(key, token, mark, row.try_get(1)?)?;
                if mark == token {
                    return Ok(Fenced { token, previous: mark });
                }
            }
            // Gone or lower behind this process's back: create or raise it below.
        }
        let rows = tx.fence_query(&self.sql.fence, key, wire, self.set_local.as_deref()).await?;
        // No row: neither `cur` nor `up` had one. Only a race on a key's first
        // use does that: the row was inserted after this statement's snapshot
        // and belongs to the shared store (the upsert left it alone).
        let Some(row) = rows.into_iter().next() else {
            return Err(FenceError::FencedByClaims { key: key.to_owned() });
        };
        let previous = from_wire(row.try_get(0)?);
        let mark = from_wire(row.try_get(1)?);
        admits(key, token, mark, row.try_get(2)?)?;
        if token > previous {
            tracing::debug!(key, previous, token, "fencing mark raised");
        }
        self.known.remember(key, token);
        Ok(Fenced { token, previous })
    }
}

/// What a locked mark row says of `token`: refused if the shared store owns the
/// key or the mark is higher; otherwise the fence goes on.
fn admits(key: &str, token: u64, mark: u64, way: Option<&str>) -> Result<(), FenceError> {
    if way == Some(WAY_CLAIMS) {
        return Err(FenceError::FencedByClaims { key: key.to_owned() });
    }
    if mark > token {
        return Err(FenceError::Stale { key: key.to_owned(), presented: token, highest: mark });
    }
    Ok(())
}

/// FNV-1a: a hash that is the same in every process, for the channel's name.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// `token − 2⁶³` as an `i64`: the order of `u64`s kept in a signed integer.
pub(crate) fn to_wire(token: u64) -> i64 {
    (token ^ (1 << 63)) as i64
}

pub(crate) fn from_wire(wire: i64) -> u64 {
    (wire as u64) ^ (1 << 63)
}

#[cfg(test)]
mod tests {
    use super::{from_wire, to_wire};

    #[test]
    fn wire_form_keeps_order_and_round_trips() {
        let tokens = [0, 1, (1 << 63) - 1, 1 << 63, u64::MAX];
        for pair in tokens.windows(2) {
            assert!(to_wire(pair[0]) < to_wire(pair[1]), "{pair:?}");
        }
        for token in tokens {
            assert_eq!(from_wire(to_wire(token)), token);
        }
        assert_eq!(to_wire(0), i64::MIN);
        assert_eq!(to_wire(u64::MAX), i64::MAX);
    }
}

/// The mutant switch of the `mutants` feature (tests only; see Cargo.toml).
#[cfg(feature = "mutants")]
mod mutant {
    use super::{ClaimStatements, Migration, OFFSET};

    /// `FENCING_MUTANT=unlocked-fence`: the plain lock (a token fenced with
    /// last) reads the mark without locking its row, so a raise no longer waits
    /// for the writer still inside. Otherwise returns the statement unchanged.
    pub(super) fn unlocked_fence(lock: String) -> String {
        if std::env::var("FENCING_MUTANT").as_deref() != Ok("unlocked-fence") {
            return lock;
        }
        tracing::error!("MUTANT unlocked-fence: the equal-token fence does not lock the mark row");
        lock.strip_suffix(" FOR NO KEY UPDATE").expect("the plain lock ends with its lock").to_owned()
    }

    /// `FENCING_MUTANT=session-claims`: a claim is freed when its replica's
    /// background session ends, as if it were a session-level lock. Each
    /// renewal records the session's `pg_backend_pid()` for the replica; a
    /// grant deletes the lower claims of every replica whose recorded session
    /// is gone from `pg_stat_activity`, live or not. (The real protocol frees
    /// a claim only by its release or its expiry.) Otherwise returns the
    /// statements unchanged.
    pub(super) fn session_claims(
        mut migrate: Migration,
        mut sql: ClaimStatements,
        claims: &str,
    ) -> (Migration, ClaimStatements) {
        if std::env::var("FENCING_MUTANT").as_deref() != Ok("session-claims") {
            return (migrate, sql);
        }
        tracing::error!("MUTANT session-claims: a replica's claims are freed when its session ends");
        let sessions = "fencing_mutant_sessions";
        migrate.look = format!("{} AND to_regclass('{sessions}') IS NOT NULL", migrate.look);
        migrate.change = format!(
            "{}; CREATE TABLE IF NOT EXISTS {sessions} (replica TEXT PRIMARY KEY, pid INT NOT NULL)",
            migrate.change
        );
        sql.drop_expired = format!(
            "DELETE FROM {claims} c
             WHERE c.key = $1 AND c.token < $2::numeric + {OFFSET}
               AND (c.expires_at <= clock_timestamp() OR EXISTS (
                   SELECT 1 FROM {sessions} s WHERE s.replica = c.replica
                   AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid)))"
        );
        let renew = sql.renew.strip_prefix("WITH ").expect("the renewal is a WITH query");
        sql.renew = format!(
            "WITH session AS (
                 INSERT INTO {sessions} (replica, pid) VALUES ($1, pg_backend_pid())
                 ON CONFLICT (replica) DO UPDATE SET pid = EXCLUDED.pid
             ),
             {renew}"
        );
        (migrate, sql)
    }
}
