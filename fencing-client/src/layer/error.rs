//! [`FencedClientError`]: the lease was lost, the resource refused it, or the inner client failed.

use std::error::Error;
use std::fmt;

use crate::Lost;

/// The error of a [`FencedClient`](crate::FencedClient) call.
///
/// It is an [`Error`] + `Send` + `Sync` whenever the inner client's error is, so it
/// converts into tower's and tonic's `BoxError`: a tonic client reports it as a
/// `Status` (code `Unknown` for a lost lease) whose [`source`](Error::source) is this
/// error.
#[derive(Debug)]
#[non_exhaustive]
pub enum FencedClientError<E> {
    /// The lease was already lost when the request was made: it was never sent, so it
    /// had no effect anywhere.
    NotSent(Lost),
    /// The lease was lost while the request was in flight: the inner client's future
    /// was dropped. The server may or may not have seen the request (its fencing layer
    /// decides by token, as for any other request).
    Cancelled(Lost),
    /// The resource answered the request as stale: its fencing layer has seen a newer
    /// token for the key ([`LossReason::Superseded`](crate::LossReason::Superseded)).
    /// The request had no effect there, and this layer sends nothing more with the lease.
    Refused(Lost),
    /// The inner client failed (connection refused, protocol error, ...).
    Inner(E),
}

impl<E> FencedClientError<E> {
    /// Why the lease was lost, if that is what stopped the request.
    pub fn lost(&self) -> Option<&Lost> {
        match self {
            FencedClientError::NotSent(lost)
            | FencedClientError::Cancelled(lost)
            | FencedClientError::Refused(lost) => Some(lost),
            FencedClientError::Inner(_) => None,
        }
    }

    /// The inner client's error, if that is what stopped the request.
    pub fn inner(&self) -> Option<&E> {
        match self {
            FencedClientError::Inner(error) => Some(error),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for FencedClientError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FencedClientError::NotSent(lost) => write!(f, "request not sent: {lost}"),
            FencedClientError::Cancelled(lost) => write!(f, "request cancelled in flight: {lost}"),
            FencedClientError::Refused(lost) => write!(f, "request refused as stale: {lost}"),
            // The inner error's own words, so that a tonic `Status` built from it reads
            // as it would without the layer.
            FencedClientError::Inner(error) => error.fmt(f),
        }
    }
}

impl<E: Error + 'static> Error for FencedClientError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            // Not transparent: tonic looks for its own error types (a connect error
            // becomes `Unavailable`) from the source chain's first link on.
            FencedClientError::Inner(error) => Some(error),
            _ => None,
        }
    }
}
