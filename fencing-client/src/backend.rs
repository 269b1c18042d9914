//! The backend-agnostic side: what a lock backend must do, and its errors.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed, `Send` future: what [`LockBackend`] methods return, so the trait stays
/// object-safe (`Arc<dyn LockBackend>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A granted lease, as the backend reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The backend's handle for the lease (for the demo service: a secret capability).
    pub lease_id: String,
    /// The lock's name.
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// The fencing token of this grant; higher than every earlier grant's.
    pub token: u64,
    /// The lease's time to live, as granted.
    pub ttl: Duration,
    /// The lock service's signature over (`name`, `token`), when it signs grants (the
    /// demo lock service with `--signing-key`); sent as `Fencing-Proof` beside the
    /// token by [`crate::Lease::fence`]. `None` for backends that do not sign (etcd).
    pub proof: Option<String>,
}

/// A lock service that grants leases with fencing tokens.
///
/// Implement this for another backend (etcd, ...) and [`crate::Lease`] keeps its
/// leases alive the same way. Implementations should not retry internally: the
/// lease keeper bounds every call with a timeout and treats any error as loss.
pub trait LockBackend: Send + Sync + 'static {
    /// Acquires lock `name` for `holder` for `ttl`.
    fn acquire<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Grant, LockError>>;

    /// Renews `grant` for another TTL. Must fail (typically with
    /// [`LockError::LeaseNotFound`]) if the lease is gone, and must not change the token.
    fn keepalive<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), LockError>>;

    /// Releases `grant`, freeing the lock at once.
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), LockError>>;
}

/// Why a lock operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// Another holder has the lock.
    Held {
        /// The current holder.
        holder: String,
        /// Time left on its lease, as the service reported it.
        expires_in: Duration,
        /// The service's suggested wait before retrying (`Retry-After`), if any.
        retry_after: Option<Duration>,
    },
    /// The lease is expired, released or unknown to the service.
    LeaseNotFound,
    /// The service refused the request (bad input, unavailable, ...).
    Rejected {
        /// HTTP status (or the backend's equivalent).
        status: u16,
        /// The service's explanation.
        detail: String,
    },
    /// The request did not complete in time.
    Timeout,
    /// The service could not be reached or the connection failed.
    Transport(String),
    /// The service answered something this client does not understand.
    Protocol(String),
    /// The caller passed invalid arguments (e.g. a safety margin not below the TTL).
    InvalidArgument(String),
    /// The backend cannot keep its token counter across a crash (e.g. a Redis without
    /// `appendonly yes` and `appendfsync always`), so its tokens could repeat or go
    /// back; refused unless the caller explicitly accepts that risk.
    NotDurable(String),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Held { holder, expires_in, .. } => {
                write!(f, "lock held by {holder:?} for another {expires_in:?}")
            }
            LockError::LeaseNotFound => f.write_str("lease expired, released or unknown"),
            LockError::Rejected { status, detail } => write!(f, "rejected ({status}): {detail}"),
            LockError::Timeout => f.write_str("request timed out"),
            LockError::Transport(e) => write!(f, "transport error: {e}"),
            LockError::Protocol(e) => write!(f, "protocol error: {e}"),
            LockError::InvalidArgument(e) => write!(f, "invalid argument: {e}"),
            LockError::NotDurable(e) => write!(f, "tokens would not be durable: {e}"),
        }
    }
}

impl std::error::Error for LockError {}
