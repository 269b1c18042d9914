//! Why the layer refused a request.
//!
//! Every refusal is a response, never a service error. The typed [`Rejection`]
//! is also put into the response's extensions, so outer layers and tests can
//! tell a fencing 409 from one the handler returned.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use http::StatusCode;

use crate::layer::Config;
use crate::store::{SharedRefusal, StoreError};
use crate::token::TokenError;

/// A request the fencing layer refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// A fenced request carried no token (428).
    MissingToken,
    /// The token header was repeated, empty or not a canonical decimal `u64` (400).
    InvalidToken(TokenError),
    /// The key extractor found no resource key in the request, or the shared
    /// store cannot hold the one it found (400).
    MissingKey {
        /// What was missing, from [`KeyExtractor::missing`](crate::KeyExtractor::missing).
        why: Cow<'static, str>,
    },
    /// The resource key is new and longer than the store takes (400).
    KeyTooLong {
        /// The longest key the store takes, in bytes.
        limit: usize,
    },
    /// The token is lower than the highest seen for the key (409): either on
    /// arrival, or because a higher token arrived while this request waited.
    Stale {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// The highest token seen for the key.
        highest: u64,
    },
    /// The request was inside the inner service when a higher token arrived, and
    /// the cancel policy dropped its work (409).
    Cancelled {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// The highest token seen for the key.
        highest: u64,
    },
    /// Lower-token requests were still inside the inner service when the drain
    /// bound ran out (503). The mark stays raised; retry after `retry_after`.
    DrainTimeout {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// How long the client should wait before retrying.
        retry_after: Duration,
    },
    /// The token would have raised the key's mark, and the layer's
    /// [`TokenVerifier`](crate::TokenVerifier) refused it (403). The mark is unchanged.
    Unverified {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// Why the verifier refused it.
        reason: String,
    },
    /// The token would have raised the key's mark, and the verifier could not
    /// answer, or not within the verify bound (503). The mark is unchanged.
    VerifierUnavailable {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// What went wrong.
        reason: String,
        /// How long the client should wait before retrying.
        retry_after: Duration,
    },
    /// A new key arrived while the key table was full (503). Marks are never
    /// evicted: forgetting one would readmit its stale holders.
    KeyTableFull {
        /// The table's capacity.
        limit: usize,
    },
    /// The request was inside the inner service under this replica's claim on
    /// its token, and the claim could not be renewed in time (the database was
    /// unreachable, or a higher token's raise found it expired): its work was
    /// dropped before the claim could lapse (503). Retry after `retry_after`.
    ClaimLost {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// How long the client should wait before retrying.
        retry_after: Duration,
    },
    /// The durable store could not record a raise (503), or did not confirm it
    /// within the write bound, whichever request was writing it; nothing was admitted.
    StoreUnavailable {
        /// The resource key.
        key: String,
        /// The token the request carried.
        presented: u64,
        /// What the store reported.
        error: StoreError,
        /// How long the client should wait before retrying.
        retry_after: Duration,
    },
}

impl Rejection {
    /// The HTTP status this rejection is answered with.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            Self::InvalidToken(_) | Self::MissingKey { .. } | Self::KeyTooLong { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::Stale { .. } | Self::Cancelled { .. } => StatusCode::CONFLICT,
            Self::Unverified { .. } => StatusCode::FORBIDDEN,
            Self::DrainTimeout { .. }
            | Self::ClaimLost { .. }
            | Self::KeyTableFull { .. }
            | Self::StoreUnavailable { .. }
            | Self::VerifierUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A stable identifier of the kind of rejection, used as the last segment of
    /// the problem `type` URI.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::MissingToken => "missing-token",
            Self::InvalidToken(_) => "invalid-token",
            Self::MissingKey { .. } => "missing-key",
            Self::KeyTooLong { .. } => "key-too-long",
            Self::Stale { .. } => "stale-token",
            Self::Cancelled { .. } => "cancelled",
            Self::Unverified { .. } => "unverified-token",
            Self::VerifierUnavailable { .. } => "verifier-unavailable",
            Self::DrainTimeout { .. } => "drain-timeout",
            Self::ClaimLost { .. } => "claim-lost",
            Self::KeyTableFull { .. } => "key-table-full",
            Self::StoreUnavailable { .. } => "store-unavailable",
        }
    }

    /// The resource key, where the rejection concerns one.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Stale { key, .. }
            | Self::Cancelled { key, .. }
            | Self::DrainTimeout { key, .. }
            | Self::ClaimLost { key, .. }
            | Self::StoreUnavailable { key, .. }
            | Self::Unverified { key, .. }
            | Self::VerifierUnavailable { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The token the request presented, where it had a valid one.
    #[must_use]
    pub fn presented(&self) -> Option<u64> {
        match self {
            Self::Stale { presented, .. }
            | Self::Cancelled { presented, .. }
            | Self::DrainTimeout { presented, .. }
            | Self::ClaimLost { presented, .. }
            | Self::StoreUnavailable { presented, .. }
            | Self::Unverified { presented, .. }
            | Self::VerifierUnavailable { presented, .. } => Some(*presented),
            _ => None,
        }
    }

    /// The highest token seen for the key, for stale and cancelled requests.
    #[must_use]
    pub fn highest(&self) -> Option<u64> {
        match self {
            Self::Stale { highest, .. } | Self::Cancelled { highest, .. } => Some(*highest),
            _ => None,
        }
    }

    /// The seconds a client should wait before retrying, for the `Retry-After` header.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::DrainTimeout { retry_after, .. }
            | Self::ClaimLost { retry_after, .. }
            | Self::StoreUnavailable { retry_after, .. }
            | Self::VerifierUnavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingToken => f.write_str("this request must carry a fencing token"),
            Self::InvalidToken(error) => error.fmt(f),
            Self::MissingKey { why } => write!(f, "no resource key in the request: {why}"),
            Self::KeyTooLong { limit } => write!(f, "the resource key is longer than {limit} bytes"),
            Self::Stale { key, presented, highest } => {
                write!(f, "fencing token {presented} is stale for {key}: the highest seen is {highest}")
            }
            Self::Cancelled { key, presented, highest } => write!(
                f,
                "the request with fencing token {presented} for {key} was cancelled: token {highest} arrived"
            ),
            Self::DrainTimeout { key, presented, .. } => write!(
                f,
                "token {presented} for {key} was not admitted in time: \
                 requests with lower tokens, or the write of the raise, were still in progress"
            ),
            Self::ClaimLost { key, presented, .. } => write!(
                f,
                "the request with fencing token {presented} for {key} was stopped: \
                 this replica could not renew its claim on the token in time"
            ),
            Self::Unverified { key, presented, reason } => {
                write!(f, "fencing token {presented} may not raise the mark of {key}: {reason}")
            }
            Self::VerifierUnavailable { key, presented, reason, .. } => {
                write!(f, "fencing token {presented} for {key} could not be verified: {reason}")
            }
            Self::KeyTableFull { limit } => {
                write!(f, "the fencing key table is full ({limit} keys)")
            }
            Self::StoreUnavailable { key, presented, error, .. } => {
                write!(f, "the raise to {presented} for {key} could not be recorded: {error}")
            }
        }
    }
}

impl std::error::Error for Rejection {}

/// Where the layer's refusals come from: each kind of error maps to its
/// rejection here, once.
impl Rejection {
    /// A mark store's `error` for `presented` on `key`: a full key table and a
    /// key too long are the request's (400, 503 without a key); anything else
    /// is the store being unavailable (503 with `Retry-After`).
    pub(crate) fn from_store_error(error: StoreError, key: String, presented: u64, config: &Config) -> Self {
        match error {
            StoreError::KeyTableFull { limit } => Self::KeyTableFull { limit },
            StoreError::KeyTooLong { limit } => Self::KeyTooLong { limit },
            error => Self::StoreUnavailable { key, presented, error, retry_after: config.retry_after },
        }
    }

    /// A shared store's `refusal` of `presented` on `key`.
    pub(crate) fn from_shared_refusal(
        refusal: SharedRefusal,
        key: String,
        presented: u64,
        config: &Config,
    ) -> Self {
        let retry_after = config.retry_after;
        match refusal {
            SharedRefusal::Stale { highest } => Self::Stale { key, presented, highest },
            SharedRefusal::DrainTimeout => Self::DrainTimeout { key, presented, retry_after },
            SharedRefusal::KeyTooLong { limit } => Self::KeyTooLong { limit },
            SharedRefusal::InvalidKey(why) => {
                Self::MissingKey { why: format!("the shared store cannot hold this key: {why}").into() }
            }
            SharedRefusal::Unavailable(error) => Self::from_store_error(error, key, presented, config),
        }
    }
}
