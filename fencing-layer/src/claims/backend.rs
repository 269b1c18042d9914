//! What a database (or any engine with expiring records and notifications)
//! provides for claims: [`ClaimBackend`]. The rules it must keep are stated on
//! each method; [`ClaimStore`](super::ClaimStore) builds the layer's contract
//! on them and nothing else.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::store::StoreError;

/// A boxed, sendable future: the backend's calls are network round trips,
/// next to which the allocation does not count.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One claim request: `replica` asks for `(key, token)`, to last `term` on the
/// backend's clock from when the backend writes it.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// Who claims: unique per [`ClaimStore`](super::ClaimStore) instance.
    pub replica: &'a str,
    /// The resource key.
    pub key: &'a str,
    /// The token claimed.
    pub token: u64,
    /// How long the claim lasts unless renewed, on the backend's clock.
    pub term: Duration,
    /// This grant's number, unique within the replica: renewals and releases
    /// name the claim by it, so a late release never deletes a newer grant.
    pub grant: u64,
}

/// The backend's answer to a [`ClaimRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimReply {
    /// The key's mark equals the token and no lower claim was live: the
    /// replica's claim on `(key, token)` is written, expiring `term` after the
    /// write by the backend's clock.
    Granted {
        /// This call raised the mark (and announced it).
        raised: bool,
    },
    /// The key's mark is above the token.
    Stale {
        /// The key's mark.
        mark: u64,
    },
    /// The backend will not fence this key with claims, for the reason given
    /// (a key fenced another way, say): a 400 naming the reason.
    Refused(&'static str),
    /// The mark equals the token (raised by this call, announced, if it was
    /// lower), but a claim on a lower token is live: nothing was claimed.
    Wait {
        /// This call raised the mark.
        raised: bool,
        /// When the soonest live lower claim expires unless renewed, if known.
        soonest: Option<Duration>,
    },
}

/// A claim the backend still holds after a renewal, with the key's mark then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    /// The resource key.
    pub key: String,
    /// The grant renewed.
    pub grant: u64,
    /// The claimed token.
    pub token: u64,
    /// The key's mark when the renewal ran: above `token` means a raise is waiting.
    pub mark: u64,
}

/// Raises and releases announced by any replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimEvent {
    /// `key`'s mark rose to `token`: claims below it should be released as soon as empty.
    Raised {
        /// The resource key.
        key: String,
        /// The new mark.
        token: u64,
    },
    /// A claim on `key` was released: a raise waiting for it may go on.
    Released {
        /// The resource key.
        key: String,
        /// The released claim's token.
        token: u64,
    },
}

/// A replica's background connection: it renews the replica's claims and
/// delivers events. When it breaks, `events` closes and the store opens another.
pub struct ClaimSession {
    /// Renews claims over this session.
    pub renewer: Box<dyn ClaimRenewer>,
    /// Events from every replica, in the order the backend delivers them.
    pub events: mpsc::UnboundedReceiver<ClaimEvent>,
}

impl std::fmt::Debug for ClaimSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimSession").finish_non_exhaustive()
    }
}

/// Renews claims, over a [`ClaimSession`].
pub trait ClaimRenewer: Send + Sync + 'static {
    /// Extends every claim of `replica` in `held` (key, grant) that is still live by the
    /// backend's clock to `term` from now (the backend's now), and returns those.
    /// A claim that has expired must not be renewed: a raise may already have
    /// gone past it.
    ///
    /// Must exclude [`ClaimBackend::claim`]: a renewal that began while the
    /// claim was live and a grant that judged it expired cannot both succeed
    /// (PostgreSQL: both lock the claim's row).
    fn renew(
        &self,
        replica: &str,
        held: Vec<(String, u64)>,
        term: Duration,
    ) -> BoxFuture<'static, Result<Vec<Renewed>, StoreError>>;
}

/// Marks and claims shared by every replica: the engine under a
/// [`ClaimStore`](super::ClaimStore).
pub trait ClaimBackend: Send + Sync + 'static {
    /// In one atomic step: raise the key's mark to the token if it is lower
    /// (announcing [`ClaimEvent::Raised`]), then, if the mark equals the token
    /// and no claim on a lower token is live, write the replica's claim. A
    /// replica holds at most one claim per key; a new one replaces its old.
    fn claim(&self, request: ClaimRequest<'_>) -> BoxFuture<'static, Result<ClaimReply, StoreError>>;

    /// Deletes `replica`'s claim on `key` if it is still `grant`'s, and
    /// announces [`ClaimEvent::Released`].
    fn release(&self, replica: &str, key: &str, grant: u64) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Opens the background session.
    fn open_session(&self) -> BoxFuture<'static, Result<ClaimSession, StoreError>>;
}
