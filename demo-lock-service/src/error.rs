//! Why an operation failed: acquiring, opening the store, releasing.

use std::fmt;
use std::time::Duration;

/// Why an acquisition failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The request is invalid (empty or too long name/holder, bad TTL, ...).
    Invalid(String),
    /// Another holder has a live lease on the lock.
    Held {
        /// The current holder.
        holder: String,
        /// Time left on its lease.
        expires_in: Duration,
    },
    /// [`Config::max_leases`](crate::Config::max_leases) leases are held and none has expired; nothing was granted.
    Full {
        /// The bound.
        max_leases: usize,
        /// When to try again: until the earliest live lease expires, at most a minute.
        retry_after: Duration,
    },
    /// The durable store failed or the token counter is exhausted; nothing was granted.
    Unavailable(String),
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Invalid(d) => write!(f, "invalid request: {d}"),
            AcquireError::Held { holder, expires_in } => {
                write!(f, "held by {holder:?} for another {expires_in:?}")
            }
            AcquireError::Full { max_leases, .. } => {
                write!(f, "{max_leases} leases are held, the most this service keeps")
            }
            AcquireError::Unavailable(d) => write!(f, "unavailable: {d}"),
        }
    }
}

impl std::error::Error for AcquireError {}

/// Why [`LockService::open`](crate::LockService::open) failed.
#[derive(Debug)]
pub struct OpenError(pub(crate) String);

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot open the lock service store: {}", self.0)
    }
}

impl std::error::Error for OpenError {}

/// A storage failure while releasing; the lease may or may not still be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageError(pub(crate) String);

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "storage error: {}", self.0)
    }
}

impl std::error::Error for StorageError {}
