//! What a database (or any engine with expiring records and notifications)
//! provides for claims: [`ClaimBackend`]. The rules it must keep are stated on
//! each method; [`ClaimStore`](super::ClaimStore) builds the layer's contract
//! on them and nothing else.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::store::{SharedRefusal, StoreError};

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

/// What a renewal found, by grant (a grant names one claim of the replica).
/// Every grant asked for and in none of these lists is gone: the replica
/// stops its requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Renewal {
    /// Extended to `term` from the backend's now.
    pub extended: Vec<u64>,
    /// Still live but not extended this time, because its record was busy
    /// (locked by another transaction): it keeps the expiry it had, and the
    /// next renewal tries again. One busy record never fails the others.
    pub busy: Vec<u64>,
    /// `(grant, mark)` where the key's mark is above the claimed token: a
    /// raise is waiting for this claim.
    pub raised: Vec<(u64, u64)>,
}

impl Renewal {
    /// What a renewal found: the grants extended, the ones busy, and the
    /// marks above the claimed token.
    #[must_use]
    pub fn new(extended: Vec<u64>, busy: Vec<u64>, raised: Vec<(u64, u64)>) -> Self {
        Self { extended, busy, raised }
    }
}

/// Raises and releases announced by any replica: hints, never facts. Anyone
/// who can reach the channel can send one (in PostgreSQL, any role that can
/// connect can `NOTIFY`), so a replica only reads the mark again on a raise
/// and looks again on a release; what it reads decides.
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
    /// Events from every replica, in the order the backend delivers them, in
    /// a bounded channel ([`EVENTS`] of them): a flood only makes the replica
    /// lag, which it answers by reading every claimed key's mark.
    pub events: broadcast::Receiver<ClaimEvent>,
}

/// How many events a session's channel holds before the oldest are dropped
/// (and the keeper reads every claimed key's mark instead).
pub const EVENTS: usize = 256;

impl std::fmt::Debug for ClaimSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimSession").finish_non_exhaustive()
    }
}

/// Renews claims, over a [`ClaimSession`].
pub trait ClaimRenewer: Send + Sync + 'static {
    /// Extends every claim of `replica` in `held` (key, grant) that is still
    /// live by the backend's clock to `term` from now (the backend's now),
    /// and says what it found ([`Renewal`]). A claim that has expired must not
    /// be renewed: a raise may already have gone past it.
    ///
    /// Must exclude [`ClaimBackend::claim`]: a renewal that began while the
    /// claim was live and a grant that judged it expired cannot both succeed
    /// (PostgreSQL: both lock the claim's row). Must hold no lock past its own
    /// statement (a stalled connection must not hold up raises), and must not
    /// wait on a record another transaction holds: report it busy instead.
    fn renew(
        &self,
        replica: &str,
        held: Vec<(String, u64)>,
        term: Duration,
    ) -> BoxFuture<'static, Result<Renewal, StoreError>>;

    /// The current marks of `keys` (those that have one), read from the
    /// backend: how a replica checks what a notification claims.
    fn read_marks(&self, keys: Vec<String>) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>>;

    /// Deletes claims (any replica's) that have expired, some at a time, and
    /// says how many. A replica that died leaves its claims behind; every
    /// replica sweeps now and then.
    fn sweep(&self) -> BoxFuture<'static, Result<u64, StoreError>>;
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

/// Checks a key before any round trip, for a backend that keeps keys as text
/// of at most `limit` bytes: a longer one is [`SharedRefusal::KeyTooLong`], one
/// holding NUL (which PostgreSQL's text cannot store, and which etcd's layout
/// uses as a separator) [`SharedRefusal::InvalidKey`]; both answer 400.
///
/// ```
/// use fencing_layer::claims::check_text_key;
/// use fencing_layer::store::SharedRefusal;
///
/// assert_eq!(check_text_key("/docs/7", 1024), Ok(()));
/// assert_eq!(check_text_key(&"k".repeat(1025), 1024), Err(SharedRefusal::KeyTooLong { limit: 1024 }));
/// assert!(matches!(check_text_key("a\0b", 1024), Err(SharedRefusal::InvalidKey(_))));
/// ```
pub fn check_text_key(key: &str, limit: usize) -> Result<(), SharedRefusal> {
    if key.len() > limit {
        return Err(SharedRefusal::KeyTooLong { limit });
    }
    if key.contains('\0') {
        return Err(SharedRefusal::InvalidKey("the key contains a NUL character"));
    }
    Ok(())
}
