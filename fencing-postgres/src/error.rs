//! Why a fenced transaction cannot go on, and which of those a retry may cure.

use std::fmt;
use std::io;

use deadpool_postgres::PoolError;
use fencing_layer::Rejection;
use tokio_postgres::error::SqlState;

use crate::connect::{TlsHandshakeError, describe_error};

/// Why [`PgFence::fence`](crate::PgFence::fence) (or the handler's transaction
/// around it) failed. Every variant means: roll back, write nothing.
///
/// `From<tokio_postgres::Error>` and `From<PoolError>` sort driver errors into
/// the variants below, so a handler can use `?` on its own statements too.
#[derive(Debug)]
#[non_exhaustive]
pub enum FenceError {
    /// The token is lower than the key's mark (409, the layer's body).
    Stale {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// The key's mark: the highest token fenced for it.
        highest: u64,
    },
    /// The key is longer than [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) (400, the layer's body).
    KeyTooLong {
        /// The longest key taken, in bytes.
        limit: usize,
    },
    /// The key holds a NUL character, which PostgreSQL text cannot store (400).
    KeyHasNul,
    /// The key is fenced through the shared store ([`PgSharedStore`](crate::PgSharedStore)'s
    /// claims) by another writer. The two ways of fencing do not exclude each
    /// other's requests, so a key is fenced one way only (409).
    FencedByClaims {
        /// The resource key.
        key: String,
    },
    /// A concurrent transaction got in the way: a serialization failure (40001,
    /// under REPEATABLE READ or SERIALIZABLE), a deadlock (40P01), or the
    /// transaction's `lock_timeout` (55P03). Roll back and run the whole
    /// transaction again (503 with `Retry-After`).
    Retry(tokio_postgres::Error),
    /// The connection is lost or was refused, or the server is shutting down
    /// (503 with `Retry-After`). The server rolls back what was in flight.
    Unavailable(tokio_postgres::Error),
    /// The pool gave no connection: none was free in time (the pool is
    /// exhausted), or a new one could not be opened (503 with `Retry-After`).
    Pool(PoolError),
    /// Any other database error, such as a mistake in the handler's SQL (500).
    Database(tokio_postgres::Error),
    /// [`PgFence::migrate`](crate::PgFence::migrate) found the schema out of
    /// date and could not change it now: another session holds a lock on
    /// `table` (a long transaction, `pg_dump`), and waiting for it would have
    /// held up every replica's renewals behind the wait. Nothing was changed;
    /// try again later.
    MigrationBlocked {
        /// The table whose lock was not free.
        table: String,
        /// The database's error (a lock timeout).
        error: tokio_postgres::Error,
    },
}

impl FenceError {
    /// The layer's rejection for the same refusal, so it can be answered with
    /// the same body ([`fencing_layer::respond::ProblemJson::body`]). `None` for
    /// database failures, which the layer has no equivalent of.
    #[must_use]
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            Self::Stale { key, presented, highest } => {
                Some(Rejection::Stale { key: key.clone(), presented: *presented, highest: *highest })
            }
            Self::KeyTooLong { limit } => Some(Rejection::KeyTooLong { limit: *limit }),
            _ => None,
        }
    }

    /// Whether running the same transaction again later may succeed: a
    /// conflict, a lost or refused connection, an exhausted pool.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Retry(_) | Self::Unavailable(_) | Self::MigrationBlocked { .. } => true,
            Self::Pool(error) => pool_unavailable(error),
            _ => false,
        }
    }
}

impl From<tokio_postgres::Error> for FenceError {
    fn from(error: tokio_postgres::Error) -> Self {
        let code = error.code();
        if code.is_some_and(|code| {
            [
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::LOCK_NOT_AVAILABLE,
            ]
            .contains(code)
        }) {
            Self::Retry(error)
        } else if unavailable(&error) {
            Self::Unavailable(error)
        } else {
            Self::Database(error)
        }
    }
}

impl From<PoolError> for FenceError {
    fn from(error: PoolError) -> Self {
        match error {
            // A connection that could not be opened: the same error as a lost one.
            PoolError::Backend(error) => error.into(),
            other => Self::Pool(other),
        }
    }
}

/// The server is away: no answer (I/O, closed socket, connect timeout, the
/// connection lost during a TLS handshake), or it said so (connection
/// exceptions, too many connections, shutting down). A TLS handshake that was
/// refused (a certificate, a name) is not: it fails the same way next time.
fn unavailable(error: &tokio_postgres::Error) -> bool {
    if let Some(code) = error.code() {
        let code = code.code();
        return code.starts_with("08") || code.starts_with("57P") || code == "53300";
    }
    error.is_closed()
        || std::error::Error::source(error).is_some_and(|source| {
            source.is::<io::Error>()
                || source.downcast_ref::<TlsHandshakeError>().is_some_and(TlsHandshakeError::is_io)
        })
}

fn pool_unavailable(error: &PoolError) -> bool {
    matches!(error, PoolError::Timeout(_) | PoolError::Closed | PoolError::Backend(_))
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(rejection) = self.rejection() {
            return rejection.fmt(f);
        }
        match self {
            Self::KeyHasNul => f.write_str("the resource key contains a NUL character"),
            Self::FencedByClaims { key } => write!(
                f,
                "{key} is fenced through the shared store (replica claims); \
                 a key is fenced one way only, not also in the transaction"
            ),
            // tokio-postgres's and deadpool's messages with their causes ("db error" alone says nothing).
            Self::Retry(error) => {
                write!(f, "the transaction conflicted with a concurrent one: {}", describe(error))
            }
            Self::Unavailable(error) => write!(f, "the database is unavailable: {}", describe(error)),
            Self::Pool(PoolError::Backend(error)) => write!(f, "no database connection: {}", describe(error)),
            Self::Pool(error) => write!(f, "no database connection: {}", describe_error(error)),
            Self::Database(error) => write!(f, "database error: {}", describe(error)),
            Self::MigrationBlocked { table, .. } => write!(
                f,
                "the fencing schema could not be migrated now: another session holds a lock on table \
                 {table} (a long transaction or pg_dump, say), and waiting for it would hold up every \
                 replica's renewals; nothing was changed, try again later"
            ),
            Self::Stale { .. } | Self::KeyTooLong { .. } => Ok(()),
        }
    }
}

impl std::error::Error for FenceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Retry(error)
            | Self::Unavailable(error)
            | Self::Database(error)
            | Self::MigrationBlocked { error, .. } => Some(error),
            Self::Pool(error) => Some(error),
            _ => None,
        }
    }
}

/// The driver's error with what it keeps apart: the server's own message
/// (tokio-postgres shows a server's refusal as a bare "db error"), the cause
/// behind an I/O or TLS failure, and what a pooler's refusal means.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    let Some(db) = error.as_db_error() else {
        // The causes: an I/O error, a TLS refusal (`describe_error` walks them).
        return describe_error(error);
    };
    let mut text = format!("{error}: {} {}: {}", db.severity(), db.code().code(), db.message());
    if let Some(detail) = db.detail() {
        text.push_str(&format!(" ({detail})"));
    }
    if let Some(hint) = pooler_hint(db.message()) {
        text.push_str("; ");
        text.push_str(hint);
    }
    text
}

/// What PgBouncer's refusals mean for a replica, by their message.
fn pooler_hint(message: &str) -> Option<&'static str> {
    if message.starts_with("unsupported startup parameter") {
        Some(
            "a pooler (PgBouncer) refused a startup parameter: remove `options` from the connection \
             string (the bounds are set after connecting; see fencing_postgres::pooling)",
        )
    } else if message.contains("statement pooling mode") {
        Some("a pooler in statement mode allows no transaction: use pool_mode = transaction or session")
    } else if message.contains("prepared statement") {
        Some(
            "a pooler in transaction mode does not keep prepared statements between transactions: \
             build the pool with PoolLimits::pooling(Pooling::Transaction)",
        )
    } else {
        None
    }
}
