//! The backend-agnostic side: what a lock backend must do, and its errors.
//!
//! A backend writes only its protocol, as a [`LockProtocol`]; the blanket impl
//! makes it an object-safe [`LockBackend`] (what [`Lease`] keeps alive), and
//! [`LockBackendExt`] gives every cloneable backend `lease` and `lease_with`, as
//! tower's `ServiceExt` does for every `Service`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::lease::{Lease, LeaseOptions};

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

/// A backend's own protocol: the three calls, as plain `async` methods.
///
/// Implement this (not [`LockBackend`]) for a new backend: the blanket impl boxes
/// the futures for `Arc<dyn LockBackend>`, and [`LockBackendExt::lease`] comes
/// with it. The same rules apply: no internal retries, every error is loss to the
/// keeper.
///
/// ```
/// use std::time::Duration;
/// use fencing_client::{Grant, LockBackendExt, LockError, backend::LockProtocol};
///
/// /// Grants everything, token 1: a protocol in a dozen lines.
/// #[derive(Clone)]
/// struct Always;
///
/// impl LockProtocol for Always {
///     async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
///         let (lease_id, name, holder) = ("1".into(), name.into(), holder.into());
///         Ok(Grant { lease_id, name, holder, token: 1, ttl, proof: None })
///     }
///     async fn keepalive(&self, _: &Grant) -> Result<(), LockError> { Ok(()) }
///     async fn release(&self, _: &Grant) -> Result<(), LockError> { Ok(()) }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let lease = Always.lease("report", "worker-1", Duration::from_secs(10)).await?;
/// assert_eq!(lease.token(), 1);
/// lease.release().await?;
/// # Ok::<(), LockError>(()) }).unwrap();
/// ```
pub trait LockProtocol: Send + Sync + 'static {
    /// Acquires lock `name` for `holder` for `ttl` (see [`LockBackend::acquire`]).
    fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Grant, LockError>> + Send;

    /// Renews `grant` (see [`LockBackend::keepalive`]).
    fn keepalive(&self, grant: &Grant) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Releases `grant` (see [`LockBackend::release`]).
    fn release(&self, grant: &Grant) -> impl Future<Output = Result<(), LockError>> + Send;
}

impl<P: LockProtocol> LockBackend for P {
    fn acquire<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Grant, LockError>> {
        Box::pin(LockProtocol::acquire(self, name, holder, ttl))
    }

    fn keepalive<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(LockProtocol::keepalive(self, grant))
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(LockProtocol::release(self, grant))
    }
}

/// `lease` and `lease_with` for every cloneable [`LockBackend`] (each lease keeps
/// its own clone, a cheap handle on the backend's connection).
pub trait LockBackendExt: LockBackend + Clone {
    /// Acquires `name` and keeps the lease alive in the background (default options).
    fn lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease, LockError>> + Send {
        self.lease_with(name, holder, ttl, LeaseOptions::default())
    }

    /// Like [`LockBackendExt::lease`], with explicit keeper options.
    fn lease_with(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
        options: LeaseOptions,
    ) -> impl Future<Output = Result<Lease, LockError>> + Send {
        Lease::acquire_with(Arc::new(self.clone()), name, holder, ttl, options)
    }
}

impl<B: LockBackend + Clone> LockBackendExt for B {}

/// The argument check of backends that keep names and holders verbatim: neither
/// may be empty. (The demo service checks its own and answers 400.)
#[cfg(any(feature = "etcd", feature = "postgres", feature = "redis", feature = "zookeeper"))]
pub(crate) fn check_name_and_holder(name: &str, holder: &str) -> Result<(), LockError> {
    if name.is_empty() {
        return Err(LockError::InvalidArgument("lock name must not be empty".into()));
    }
    if holder.is_empty() {
        return Err(LockError::InvalidArgument("holder must not be empty".into()));
    }
    Ok(())
}

/// The public state of a held lock, as every backend's `lock_status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    /// The lock's name.
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// The token of the current grant.
    pub token: u64,
    /// Time left on the current lease (zero where the backend cannot tell).
    pub expires_in: Duration,
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
