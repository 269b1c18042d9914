//! Marks shared by every replica of a resource: the [`SharedStore`] trait.
//!
//! A [`MarkStore`](super::MarkStore) keeps marks in one process, which is
//! enough while one process owns a key. When several replicas serve one
//! resource, a stale holder's request can reach a replica that never saw the
//! newer token; the marks, and the "who is inside" bookkeeping that keeps a
//! higher token out until lower ones have left, must then live where every
//! replica checks them. A `SharedStore` is that place (the `fencing-postgres`
//! crate provides one on PostgreSQL), and [`FencingLayer::shared_store`]
//! makes the layer ask it about every fenced request instead of its own table:
//!
//! ```
//! use std::time::Duration;
//! use fencing_layer::{FencingLayer, store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore}};
//!
//! /// A stand-in that admits everything (a real one asks a database).
//! struct AdmitAll;
//!
//! impl SharedStore for AdmitAll {
//!     fn admit(&self, _key: &str, _token: u64, _drain: Duration) -> SharedAdmission {
//!         Box::pin(async { Ok::<_, SharedRefusal>(SharedPermit::new(())) })
//!     }
//! }
//!
//! let layer = FencingLayer::new().shared_store(AdmitAll);
//! # let _ = layer;
//! ```
//!
//! The contract is the layer's, kept by all replicas together: a token below
//! the key's mark is refused; a token equal to it is admitted, concurrently
//! with others carrying it; a higher token raises the mark at once (later
//! lower tokens are refused on every replica) and is admitted once no
//! lower-token request for the key is inside on any replica, or refused with
//! [`SharedRefusal::DrainTimeout`] after `drain`. Being inside is holding the
//! [`SharedPermit`]: the layer keeps it until the inner service's response
//! future completes or is dropped, then drops it, which must let the next
//! holder in (and must also happen when the process dies: a database lock held
//! by the connection does this by itself).
//!
//! [`FencingLayer::shared_store`]: crate::FencingLayer::shared_store

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::StoreError;

/// What [`SharedStore::admit`] returns: a boxed future, because admission
/// through a shared store is a network round trip or more, next to which the
/// allocation does not count.
pub type SharedAdmission = Pin<Box<dyn Future<Output = Result<SharedPermit, SharedRefusal>> + Send>>;

/// Marks and in-flight bookkeeping shared by every replica of a resource.
pub trait SharedStore: Send + Sync + 'static {
    /// Decides on a request carrying `token` for `key` in memory, without I/O,
    /// when the store can: `Some` admits or refuses it at once, `None` sends it
    /// to [`admit`](Self::admit). Called on every fenced request, so it must be
    /// cheap. The default decides nothing.
    ///
    /// [`ClaimStore`](crate::claims::ClaimStore) admits here every request
    /// whose token this replica holds a valid claim on, and refuses tokens
    /// below a mark it knows.
    fn try_admit(&self, key: &str, token: u64) -> Option<Result<SharedPermit, SharedRefusal>> {
        let _ = (key, token);
        None
    }

    /// Decides on a request carrying `token` for `key`: a place inside, held
    /// until the permit is dropped, or a refusal. A raise may wait up to
    /// `drain` for lower-token requests to leave, on any replica.
    ///
    /// Dropping the returned future before it completes must leave nothing
    /// held (the layer drops it when the client goes away).
    fn admit(&self, key: &str, token: u64, drain: Duration) -> SharedAdmission;
}

/// A request's place inside the inner service, in a [`SharedStore`]: whatever
/// the store needs to hold (a transaction, a lock, a claim), released when
/// dropped. A permit may be *revocable*: when its signal fires, the layer drops
/// the request's inner future (then the permit) and answers 503
/// [`Rejection::ClaimLost`](crate::Rejection::ClaimLost).
pub struct SharedPermit {
    place: Place,
    raised: bool,
    drained: Option<Duration>,
}

enum Place {
    Held(#[allow(dead_code)] Box<dyn Any + Send>),
    Revocable(#[allow(dead_code)] Box<dyn Any + Send>, Pin<Box<dyn Future<Output = ()> + Send>>),
    Claim(Pin<Box<dyn ClaimedPlace>>),
}

/// A place inside that its store takes back when it must, and that knows its
/// key: a replica's claim (`claims::Entered`). A trait, so that this module
/// needs nothing from the stores built on it.
pub(crate) trait ClaimedPlace: Send {
    /// The key the request is inside for.
    fn key(&self) -> &str;
    /// Whether the place still covers the request now.
    fn held(&self) -> bool;
    /// Ready once the request must be stopped.
    fn poll_revoked(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()>;
}

impl SharedPermit {
    /// A permit that holds `place` until dropped.
    pub fn new(place: impl Any + Send) -> Self {
        Self::from_place(Place::Held(Box::new(place)))
    }

    /// A permit that holds `place` until dropped, and whose request is stopped
    /// (its inner future dropped, 503 answered) as soon as `revoked` completes.
    pub fn revocable(place: impl Any + Send, revoked: impl Future<Output = ()> + Send + 'static) -> Self {
        Self::from_place(Place::Revocable(Box::new(place), Box::pin(revoked)))
    }

    pub(crate) fn claim(place: Pin<Box<dyn ClaimedPlace>>) -> Self {
        Self::from_place(Place::Claim(place))
    }

    fn from_place(place: Place) -> Self {
        Self { place, raised: false, drained: None }
    }

    /// Notes, for the layer's metrics, that this admission raised the key's
    /// mark, and how long it waited for lower-token requests to leave.
    #[must_use]
    pub fn with_raise(mut self, raised: bool, drained: Option<Duration>) -> Self {
        self.raised = raised;
        self.drained = drained;
        self
    }

    /// Whether this admission raised the key's mark.
    pub(crate) fn raised(&self) -> bool {
        self.raised
    }

    /// How long this admission waited for lower-token requests, if it waited.
    pub(crate) fn drained(&self) -> Option<Duration> {
        self.drained
    }

    /// The key, where the permit knows it.
    pub(crate) fn key(&self) -> Option<&str> {
        match &self.place {
            Place::Claim(entered) => Some(entered.key()),
            _ => None,
        }
    }

    /// Whether the request may still answer with what its inner service
    /// produced: not revoked, and (for a claim) not past its deadline. A
    /// handler that never yielded while its claim lapsed finishes anyway; its
    /// answer is then 503, never a success.
    pub(crate) fn still_held(&mut self, cx: &mut Context<'_>) -> bool {
        self.poll_revoked(cx).is_pending() && self.claim_held()
    }

    /// Whether a claim's place is still within its deadline (any other place is).
    pub(crate) fn claim_held(&self) -> bool {
        match &self.place {
            Place::Claim(entered) => entered.held(),
            _ => true,
        }
    }

    /// Ready once the request must be stopped; pending for as long as it may run.
    pub(crate) fn poll_revoked(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.place {
            Place::Held(_) => Poll::Pending,
            Place::Revocable(_, revoked) => revoked.as_mut().poll(cx),
            Place::Claim(entered) => entered.as_mut().poll_revoked(cx),
        }
    }
}

impl fmt::Debug for SharedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedPermit").field("raised", &self.raised).finish_non_exhaustive()
    }
}

/// Why a [`SharedStore`] did not admit a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SharedRefusal {
    /// The token is below the key's mark (409).
    Stale {
        /// The key's mark.
        highest: u64,
    },
    /// Lower-token requests were still inside when the drain bound ran out
    /// (503 with `Retry-After`). The mark stays raised.
    DrainTimeout,
    /// The key is longer than the store takes (400).
    KeyTooLong {
        /// The longest key the store takes, in bytes.
        limit: usize,
    },
    /// The store cannot keep this key, for the reason given (400, as a missing key).
    InvalidKey(&'static str),
    /// The store could not decide: database down, pool exhausted, a timeout
    /// (503 with `Retry-After`). Nothing was admitted, nothing stays held.
    Unavailable(StoreError),
}
