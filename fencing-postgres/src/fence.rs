//! `PgFence`: the mark table, its migration, and the fence statement.

use std::sync::Arc;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use crate::error::FenceError;
use crate::table::{InvalidTableName, quote};

/// The mark table's name unless [`PgFence::table`] sets another.
pub const DEFAULT_TABLE: &str = "fencing_marks";

/// The longest resource key taken, in bytes: the layer's default. A B-tree
/// index entry must fit a third of a page, so keys cannot be much longer.
pub const MAX_KEY_BYTES: usize = fencing_layer::DEFAULT_MAX_KEY_BYTES;

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
}

#[derive(Debug)]
struct Statements {
    table: String,
    migrate: String,
    fence: String,
    enter: String,
    open: String,
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

impl Default for PgFence {
    fn default() -> Self {
        Self::table(Self { sql: Arc::new(Statements::empty()) }, DEFAULT_TABLE)
            .expect("the default name is valid")
    }
}

impl Statements {
    fn empty() -> Self {
        let none = String::new;
        Self { table: none(), migrate: none(), fence: none(), enter: none(), open: none() }
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
        // The shared store's second table, `<name>_inside`, must be a valid name too.
        let inside = quote(&format!("{name}_inside"))?;
        Ok(Self::build(name.to_owned(), quote(name)?, inside))
    }

    /// The mark table's name, as given.
    #[must_use]
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    fn build(table: String, quoted: String, inside: String) -> Self {
        // `previous` is how the statement returns the mark it found: PostgreSQL
        // before 18 returns only the new row from an upsert. Keys compare as
        // bytes (collation "C"), as the layer's do.
        let migrate = format!(
            "SELECT pg_advisory_xact_lock(hashtext('fencing-postgres migrate'));
             CREATE TABLE IF NOT EXISTS {quoted} (
                 key TEXT COLLATE \"C\" PRIMARY KEY,
                 mark NUMERIC(20,0) NOT NULL CHECK (mark BETWEEN 0 AND 18446744073709551615),
                 previous NUMERIC(20,0) NOT NULL
             );
             CREATE TABLE IF NOT EXISTS {inside} (
                 key TEXT COLLATE \"C\" NOT NULL,
                 token NUMERIC(20,0) NOT NULL,
                 PRIMARY KEY (key, token)
             )"
        );
        let fence = format!(
            "INSERT INTO {quoted} AS m (key, mark, previous) VALUES ($1, $2::numeric + {OFFSET}, 0)
             ON CONFLICT (key) DO UPDATE SET mark = GREATEST(m.mark, EXCLUDED.mark), previous = m.mark
             RETURNING (previous - {OFFSET})::int8, (mark - {OFFSET})::int8"
        );
        // The shared store's statements (`shared.rs` says why they are these).
        let enter = format!(
            "SELECT (m.mark - {OFFSET})::int8, i.token IS NOT NULL
             FROM {quoted} m LEFT JOIN LATERAL (
                 SELECT token FROM {inside} WHERE key = $1 AND token = $2::numeric + {OFFSET} FOR KEY SHARE
             ) i ON true
             WHERE m.key = $1"
        );
        let open = format!(
            "WITH drained AS (DELETE FROM {inside} WHERE key = $1 AND token < $2::numeric + {OFFSET})
             INSERT INTO {inside} (key, token) VALUES ($1, $2::numeric + {OFFSET}) ON CONFLICT DO NOTHING"
        );
        Self { sql: Arc::new(Statements { table, migrate, fence, enter, open }) }
    }

    /// The fence statement: `($1 key, $2 token)` → `(previous, mark)`, wire form.
    pub(crate) fn fence_sql(&self) -> &str {
        &self.sql.fence
    }

    /// `($1 key, $2 token)` → `(mark, whether the token is open and now KEY SHARE locked)`.
    pub(crate) fn enter_sql(&self) -> &str {
        &self.sql.enter
    }

    /// `($1 key, $2 token)`: waits for and removes lower tokens' rows, opens this one.
    pub(crate) fn open_sql(&self) -> &str {
        &self.sql.open
    }

    /// Creates the mark table if it does not exist. Idempotent, and safe when
    /// several replicas start at once (an advisory lock orders them: concurrent
    /// `CREATE TABLE IF NOT EXISTS` can otherwise fail). A schema in the name
    /// must exist already. A deadpool `Object` derefs to the `Client` taken here.
    pub async fn migrate(&self, client: &Client) -> Result<(), FenceError> {
        // Several statements in one simple query run as one transaction, which
        // holds the advisory lock to the end.
        client.batch_execute(&self.sql.migrate).await?;
        Ok(())
    }

    /// Fences `key` with `token` inside `tx`, the transaction that then makes
    /// the writes: locks the key's mark row (creating it on first use), refuses
    /// a token lower than the mark with [`FenceError::Stale`], and raises the
    /// mark to a higher one. One statement, one round trip.
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
    /// returned as [`FenceError::Retry`]. Bound the wait with
    /// `SET LOCAL lock_timeout = '…'` before fencing; running out is `Retry` too.
    ///
    /// Taking a `Transaction`, not any client, is the point: on an autocommit
    /// connection the mark would commit, and unlock, before the write.
    /// A deadpool `Transaction` derefs to this one.
    pub async fn fence(&self, tx: &Transaction<'_>, key: &str, token: u64) -> Result<Fenced, FenceError> {
        if key.len() > MAX_KEY_BYTES {
            return Err(FenceError::KeyTooLong { limit: MAX_KEY_BYTES });
        }
        if key.contains('\0') {
            return Err(FenceError::KeyHasNul);
        }
        // Typed parameters: parse, bind and execute go in one message batch,
        // with no prepare round trip first.
        let row =
            tx.query_typed_one(&self.sql.fence, &[(&key, Type::TEXT), (&to_wire(token), Type::INT8)]).await?;
        let previous = from_wire(row.try_get(0)?);
        let mark = from_wire(row.try_get(1)?);
        if mark > token {
            return Err(FenceError::Stale { key: key.to_owned(), presented: token, highest: mark });
        }
        if token > previous {
            tracing::debug!(key, previous, token, "fencing mark raised");
        }
        Ok(Fenced { token, previous })
    }
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
