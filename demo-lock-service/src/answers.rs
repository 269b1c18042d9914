//! What the service answers: a grant, a renewal, a lock's holder, a token check.

use std::time::Duration;

/// A successful acquisition, and a held lock's public view (no `lease_id`: that is the
/// holder's capability): the types fencing-client's backends report, so the service and
/// its clients share one definition. The service's `proof` is
/// [`ProofSigner::sign`](crate::ProofSigner::sign) of (`name`, `token`) when it has a key.
pub use fencing_client::{Grant, backend::LockStatus};

/// A successful keepalive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The lease renewed.
    pub lease_id: String,
    /// Its token (unchanged by renewals).
    pub token: u64,
    /// Its TTL; the lease now expires this long after the renewal was handled.
    pub ttl: Duration,
}

/// The answer of [`LockService::check_token`](crate::LockService::check_token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenCheck {
    /// The lock is held right now, unexpired, under exactly this token.
    Live {
        /// Time left on the lease unless renewed.
        expires_in: Duration,
    },
    /// The lock is not held: never acquired, released, or its lease expired.
    Free,
    /// The lock is held under another token (higher or lower).
    OtherToken,
}

impl TokenCheck {
    /// Whether the token is the lock's current, live grant.
    pub fn is_valid(&self) -> bool {
        matches!(self, TokenCheck::Live { .. })
    }
}
