//! Why the layer refused a request.
//!
//! Every refusal is a response, never a service error. The typed [`Rejection`]
//! is also put into the response's extensions, so outer layers and tests can
//! tell a fencing 409 from one the handler returned.
//!
//! Each variant is declared once, in `define_rejection!`, with what every
//! refusal of its kind shares: its HTTP status, its problem type, its title and
//! its metric outcome. Adding a kind of refusal is one entry there (and its
//! message in `Display`, which the compiler asks for).

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use http::StatusCode;

use crate::store::{SharedRefusal, StoreError};
use crate::token::TokenError;

/// What every refusal of one kind shares: one row per [`Rejection`] variant.
#[derive(Debug)]
pub(crate) struct KindRow {
    /// The HTTP status it is answered with.
    pub(crate) status: StatusCode,
    /// The last segment of its problem `type` URI.
    pub(crate) problem: &'static str,
    /// The problem's `title`.
    pub(crate) title: &'static str,
    /// Its `outcome` label in `fencing_requests_total`.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) outcome: &'static str,
}

/// Declares [`Rejection`] and, from the same list, [`Rejection::KINDS`] (the
/// variants' rows, in declaration order) and [`Rejection::index`] (a variant's
/// row), as axum-core's `define_rejection!` declares a rejection with its
/// status and body in one place.
macro_rules! define_rejection {
    (
        $(#[$meta:meta])*
        pub enum Rejection {
            $(
                $(#[$doc:meta])*
                [$status:ident, $problem:literal, $title:literal, outcome $outcome:literal]
                $variant:ident
                $( ( $($tuple:ty),* ) )?
                $( { $( $(#[$field_doc:meta])* $field:ident : $field_ty:ty ),* $(,)? } )?,
            )*
        }
    ) => {
        $(#[$meta])*
        pub enum Rejection {
            $(
                $(#[$doc])*
                $variant
                $( ( $($tuple),* ) )?
                $( { $( $(#[$field_doc])* $field : $field_ty ),* } )?,
            )*
        }

        impl Rejection {
            /// Every variant's row, in declaration order.
            pub(crate) const KINDS: &[KindRow] = &[
                $( KindRow { status: StatusCode::$status, problem: $problem, title: $title, outcome: $outcome }, )*
            ];

            /// This rejection's position in [`KINDS`](Self::KINDS).
            #[inline]
            pub(crate) fn index(&self) -> usize {
                enum Index {
                    $( $variant, )*
                }
                match self {
                    $( Self::$variant { .. } => Index::$variant as usize, )*
                }
            }
        }
    };
}

define_rejection! {
    /// A request the fencing layer refused, and why.
    #[derive(Debug, Clone, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum Rejection {
        /// A fenced request carried no token (428).
        [PRECONDITION_REQUIRED, "missing-token", "Fencing token required", outcome "missing"]
        MissingToken,
        /// The token header was repeated, empty or not a canonical decimal `u64` (400).
        [BAD_REQUEST, "invalid-token", "Invalid fencing token", outcome "invalid"]
        InvalidToken(TokenError),
        /// The key extractor found no resource key in the request, or the shared
        /// store cannot hold the one it found (400).
        [BAD_REQUEST, "missing-key", "No resource key", outcome "invalid"]
        MissingKey {
            /// What was missing, from [`KeyExtractor::missing`](crate::key::KeyExtractor::missing).
            why: Cow<'static, str>,
        },
        /// The resource key is new and longer than the store takes (400).
        [BAD_REQUEST, "key-too-long", "Resource key too long", outcome "invalid"]
        KeyTooLong {
            /// The longest key the store takes, in bytes.
            limit: usize,
        },
        /// The token is lower than the highest seen for the key (409): either on
        /// arrival, or because a higher token arrived while this request waited.
        [CONFLICT, "stale-token", "Stale fencing token", outcome "stale"]
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
        [CONFLICT, "cancelled", "Cancelled by a newer fencing token", outcome "stale"]
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
        [SERVICE_UNAVAILABLE, "drain-timeout", "Older requests still in flight", outcome "drain-timeout"]
        DrainTimeout {
            /// The resource key.
            key: String,
            /// The token the request carried.
            presented: u64,
            /// How long the client should wait before retrying.
            retry_after: Duration,
        },
        /// The token would have raised the key's mark, and the layer's
        /// [`TokenVerifier`](crate::verify::TokenVerifier) refused it (403). The mark is unchanged.
        [FORBIDDEN, "unverified-token", "Unverified fencing token", outcome "unverified"]
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
        [SERVICE_UNAVAILABLE, "verifier-unavailable", "Fencing token verifier unavailable", outcome "verifier-unavailable"]
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
        [SERVICE_UNAVAILABLE, "key-table-full", "Fencing key table full", outcome "key-table-full"]
        KeyTableFull {
            /// The table's capacity.
            limit: usize,
        },
        /// The request was inside the inner service under this replica's claim on
        /// its token, and the claim could not be renewed in time (the database was
        /// unreachable, or a higher token's raise found it expired): its work was
        /// dropped before the claim could lapse (503). Retry after `retry_after`.
        [SERVICE_UNAVAILABLE, "claim-lost", "Replica claim lost", outcome "claim-lost"]
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
        [SERVICE_UNAVAILABLE, "store-unavailable", "Fencing store unavailable", outcome "store-unavailable"]
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
}

impl Rejection {
    /// This rejection's kind's row.
    fn row(&self) -> &'static KindRow {
        &Self::KINDS[self.index()]
    }

    /// The HTTP status this rejection is answered with.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.row().status
    }

    /// A stable identifier of the kind of rejection, used as the last segment of
    /// the problem `type` URI.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        self.row().problem
    }

    /// A short, human-readable summary of the kind of rejection: the problem's `title`.
    #[must_use]
    pub fn title(&self) -> &'static str {
        self.row().title
    }

    /// The resource key and the token presented, where the rejection concerns
    /// a request with a valid token and a key.
    fn request(&self) -> Option<(&str, u64)> {
        match self {
            Self::Stale { key, presented, .. }
            | Self::Cancelled { key, presented, .. }
            | Self::DrainTimeout { key, presented, .. }
            | Self::ClaimLost { key, presented, .. }
            | Self::StoreUnavailable { key, presented, .. }
            | Self::Unverified { key, presented, .. }
            | Self::VerifierUnavailable { key, presented, .. } => Some((key, *presented)),
            _ => None,
        }
    }

    /// The resource key, where the rejection concerns one.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        self.request().map(|(key, _)| key)
    }

    /// The token the request presented, where it had a valid one.
    #[must_use]
    pub fn presented(&self) -> Option<u64> {
        self.request().map(|(_, presented)| presented)
    }

    /// The highest token seen for the key, for stale and cancelled requests.
    #[must_use]
    pub fn highest(&self) -> Option<u64> {
        match self {
            Self::Stale { highest, .. } | Self::Cancelled { highest, .. } => Some(*highest),
            _ => None,
        }
    }

    /// The limit a request ran into: the key table's capacity, or the longest key taken.
    #[must_use]
    pub fn key_limit(&self) -> Option<usize> {
        match self {
            Self::KeyTableFull { limit } | Self::KeyTooLong { limit } => Some(*limit),
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
    pub(crate) fn from_store_error(
        error: StoreError,
        key: String,
        presented: u64,
        retry_after: Duration,
    ) -> Self {
        match error {
            StoreError::KeyTableFull { limit } => Self::KeyTableFull { limit },
            StoreError::KeyTooLong { limit } => Self::KeyTooLong { limit },
            error => Self::StoreUnavailable { key, presented, error, retry_after },
        }
    }

    /// A shared store's `refusal` of `presented` on `key`.
    pub(crate) fn from_shared_refusal(
        refusal: SharedRefusal,
        key: String,
        presented: u64,
        retry_after: Duration,
    ) -> Self {
        match refusal {
            SharedRefusal::Stale { highest } => Self::Stale { key, presented, highest },
            SharedRefusal::DrainTimeout => Self::DrainTimeout { key, presented, retry_after },
            SharedRefusal::KeyTooLong { limit } => Self::KeyTooLong { limit },
            SharedRefusal::InvalidKey(why) => {
                Self::MissingKey { why: format!("the shared store cannot hold this key: {why}").into() }
            }
            SharedRefusal::Unavailable(error) => Self::from_store_error(error, key, presented, retry_after),
        }
    }
}
