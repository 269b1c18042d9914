//! [`HeldPlace`]: an admitted request's place inside, handed to the inner
//! service for work that outlives its response future.

use std::fmt;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use crate::config::Config;
use crate::metrics::InsideCount;
use crate::store::SharedPermit;
use crate::token::FencingToken;

use super::Place;

/// An admitted request's place inside, in its extensions when the layer hands
/// places over. Clones share the one place: the request counts as inside until
/// the last clone is dropped.
///
/// The layer keeps a request inside until the inner service's response future
/// completes or is dropped. Some work outlives that future: a reverse proxy's
/// upstream exchange goes on after the client has gone (hyper drops the
/// service future then) and until the upstream's response has been read to
/// the end. With [`FencingLayer::hand_over_places`](crate::FencingLayer::hand_over_places)
/// the layer puts the place into the request's extensions instead of keeping
/// it, and the next holder is let in once every clone of it has been dropped,
/// whenever that is:
///
/// ```
/// use std::convert::Infallible;
/// use fencing_layer::{FencingLayer, future::HeldPlace};
/// use http::{Request, Response};
/// use tower::{Service, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = FencingLayer::new().hand_over_places(true);
/// let store = layer.mark_store().clone();
/// let mut service = tower::ServiceBuilder::new().layer(layer).service(service_fn(
///     |request: Request<String>| async move {
///         let place = request.extensions().get::<HeldPlace>().cloned();
///         // The write goes on in a task of its own, which keeps the place.
///         tokio::spawn(async move {
///             let _place = place;
///             tokio::task::yield_now().await;
///         });
///         Ok::<_, Infallible>(Response::new(String::new()))
///     },
/// ));
/// let request = Request::post("/logs/a").header("fencing-token", "7").body(String::new()).unwrap();
/// let response = service.ready().await.unwrap().call(request).await.unwrap();
/// assert_eq!(response.status(), 200);
/// assert_eq!(store.mark("/logs/a"), Some(7));
/// # }
/// ```
///
/// Whoever holds a clone answers for the request's work from then on: it must
/// keep the place until that work has ended, and stop the work when a shared
/// store takes the place back ([`HeldPlace::revoked`]). The cancel policy does
/// not apply to a handed-over place: the layer no longer holds the work.
#[derive(Clone)]
pub struct HeldPlace(Arc<Held>);

struct Held {
    token: FencingToken,
    // A mutex only because a shared store's permit is `Send` but not `Sync`,
    // and extensions must be both; it is locked to poll a revocation, never on
    // the way in.
    place: Mutex<Slot>,
}

struct Slot {
    kind: Kind,
    // Remembered: the store's signal is polled to completion once.
    revoked: bool,
}

enum Kind {
    Local(#[allow(dead_code)] Place),
    Shared(SharedPermit, #[allow(dead_code)] InsideCount),
}

impl Slot {
    fn poll_revoked(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.revoked {
            return Poll::Ready(());
        }
        let Kind::Shared(permit, _) = &mut self.kind else { return Poll::Pending };
        ready!(permit.poll_revoked(cx));
        self.revoked = true;
        Poll::Ready(())
    }
}

impl HeldPlace {
    /// A place in this process's mark store.
    pub(crate) fn local(place: Place, token: FencingToken) -> Self {
        Self::new(Kind::Local(place), token)
    }

    /// A place a shared store gave (a replica's claim, say).
    pub(crate) fn shared(permit: SharedPermit, token: FencingToken, config: &Config) -> Self {
        Self::new(Kind::Shared(permit, config.metrics.admitted()), token)
    }

    fn new(kind: Kind, token: FencingToken) -> Self {
        Self(Arc::new(Held { token, place: Mutex::new(Slot { kind, revoked: false }) }))
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.0.place.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token the request was admitted with.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.0.token
    }

    /// Ready once the store takes the place back (a replica losing its claim):
    /// the work must stop at once. Pending for as long as the work may go on,
    /// which for a place in a [`MarkStore`](crate::MarkStore) is forever.
    pub fn poll_revoked(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.slot().poll_revoked(cx)
    }

    /// Completes once the store takes the place back; see [`poll_revoked`](Self::poll_revoked).
    pub async fn revoked(&self) {
        poll_fn(|cx| self.poll_revoked(cx)).await
    }

    /// Whether the place still covers the request's work now: not revoked,
    /// and, for a replica's claim, not past the claim's deadline. Work that
    /// finished while this was false must not be reported as a success.
    #[must_use]
    pub fn is_held(&self) -> bool {
        let mut slot = self.slot();
        if slot.poll_revoked(&mut Context::from_waker(Waker::noop())).is_ready() {
            return false;
        }
        match &slot.kind {
            Kind::Local(_) => true,
            Kind::Shared(permit, _) => permit.claim_held(),
        }
    }
}

impl fmt::Debug for HeldPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldPlace").field("token", &self.0.token).finish_non_exhaustive()
    }
}
