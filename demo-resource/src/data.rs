//! What the data is, and how an operation on it fails, whichever backend holds
//! it (redb: [`store`](crate::store); PostgreSQL: the `postgres` module): the
//! leaf that the backends and the routes share.

use std::fmt;

use fencing_layer::store::StorageFault;
#[cfg(feature = "postgres")]
use fencing_postgres::FenceError;
use serde::Serialize;

/// One log entry or key-value pair: the text and the token it was written with
/// (`null` in JSON when the write was unfenced).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Entry {
    /// The fencing token of the write, `None` when it carried none.
    pub token: Option<u64>,
    /// The text written.
    pub value: String,
}

/// Why a data operation failed.
#[derive(Debug)]
pub(crate) enum DataError {
    /// redb: the token is below the highest one already written for the resource.
    Stale { presented: u64, highest: u64 },
    /// redb failed, or its file is closed after an I/O failure (being reopened).
    Storage(StorageFault),
    /// The blocking task running a redb operation panicked.
    Task(tokio::task::JoinError),
    /// PostgreSQL refused (a stale token) or failed; answered as fencing-postgres does.
    #[cfg(feature = "postgres")]
    Postgres(FenceError),
}

#[cfg(feature = "postgres")]
impl From<FenceError> for DataError {
    fn from(error: FenceError) -> Self {
        Self::Postgres(error)
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stale { presented, highest } => {
                write!(f, "fencing token {presented} is below {highest}, already written here")
            }
            Self::Storage(error) => write!(f, "storage failed: {error}"),
            Self::Task(error) => write!(f, "storage task failed: {error}"),
            #[cfg(feature = "postgres")]
            Self::Postgres(error) => error.fmt(f),
        }
    }
}
