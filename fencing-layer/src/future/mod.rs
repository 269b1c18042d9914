//! [`ResponseFuture`]: the inner call, or the wait before it.
//!
//! `Fencing::call` decides most requests on the spot and builds the future in
//! the state that follows; the future then moves between states until it
//! answers. Each state has its own step (a file of this module), and
//! [`ResponseFuture::poll`] only dispatches to it:
//!
//! ```text
//! Fencing::call ─┬─► Inside ───────────────────────────────────────────────┐
//!                ├─► Watched (cancel policy) ─────────── 409 cancelled ────┤
//!                ├─► Admitting ─┬─► Inside, or Watched ────────────────────┤
//!                │              └─► 409 stale, 503 bound ran out ──────────┤
//!                ├─► SharedAdmitting ─┬─► SharedInside ── 503 claim lost ──┤
//!                │                    └─► 409, 503, 400 ───────────────────┤
//!                ├─► SharedInside (admitted in memory) ────────────────────┤
//!                └─► Rejected ─────────────────────────────────────────────┤
//!                                                                          ▼
//!                                                                      Finished
//! ```
//!
//! - **Inside** (`Place` held): the inner future, polled straight into the
//!   return slot. The hot path; nothing else is on it.
//! - **Watched** (the cancel policy): the same, and a higher token for the
//!   key drops the inner future and answers 409 `cancelled` (`watched.rs`).
//! - **Admitting**: waiting for lower tokens to drain, for a raise to be
//!   recorded, or for the verifier; each wake-up asks the admission rule
//!   again, until it says enter or refuse, or the bound runs out (`admitting.rs`).
//! - **SharedAdmitting** / **SharedInside**: the same for a
//!   [`SharedStore`](crate::store::SharedStore), whose permit can be revoked when
//!   the replica's claim is lost: the inner future is dropped, 503 (`claimed.rs`).
//! - **Rejected**: the answer is built when first polled.
//!
//! Every place inside (a guard, a permit) is dropped after the inner future:
//! the next holder is let in only once this request's work is gone.

mod admitting;
mod claimed;
mod deadline;
mod held;
mod pending;
mod watched;

pub use self::held::HeldPlace;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{HeaderMap, Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::config::{Config, Settings};
use crate::grpc::is_grpc;
use crate::metrics::InsideCount;
use crate::rejection::Rejection;
use crate::respond::RejectionResponder;
use crate::scope;
use crate::store::admission::{Admission, InsideGuard, KeyState};
use crate::store::{SharedPermit, SharedRefusal};
use crate::token::FencingToken;

use self::admitting::Waiting;
use self::claimed::{SharedPlace, SharedWaiting};
use self::pending::Pending;
use self::watched::Watch;

pin_project! {
    /// Response future of [`Fencing`](crate::Fencing).
    pub struct ResponseFuture<S, B, E, R>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        kind: Kind<S, B, E, R>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, B, E, R>
    where
        S: Service<Request<B>>,
    {
        // Admitted (or unfenced): the inner future, the place it holds, and the
        // token it was admitted with (current while it is polled).
        Inside {
            #[pin]
            future: S::Future,
            place: Option<Place>,
            token: Option<FencingToken>,
        },
        // Admitted under the cancel policy. Field order matters: the inner future
        // is dropped before the guard (in `watch`) lets the next holder in. Boxed,
        // like every state but `Inside`, so that the common case's future stays
        // the size of the inner one.
        Watched {
            #[pin]
            future: S::Future,
            watch: Pin<Box<Watch<E, R>>>,
        },
        // Waiting for lower tokens to drain, for the log to record a raise, or for the verifier.
        Admitting {
            waiting: Pin<Box<Waiting<S, B, E, R>>>,
        },
        // Waiting for a shared store's decision.
        SharedAdmitting {
            waiting: Pin<Box<SharedWaiting<S, B, E, R>>>,
        },
        // Admitted by a shared store. Field order matters: the inner future is
        // dropped before the permit lets the next holder in.
        SharedInside {
            #[pin]
            future: S::Future,
            place: Box<SharedPlace<E, R>>,
        },
        // Answered in `call`; the response is built when first polled.
        Rejected {
            rejection: Option<Rejection>,
            grpc: bool,
            settings: Arc<Settings<E, R>>,
        },
        Finished,
    }
}

/// What one poll of a state decided, when it decided something.
enum Step<S, B, E, R>
where
    S: Service<Request<B>>,
{
    /// Go on in this state (entered, or admitted after a wait).
    Next(Kind<S, B, E, R>),
    /// Finished: the inner service's output or a refusal's response.
    Done(Result<S::Response, S::Error>),
}

/// An admitted request's place inside: the key's guard, which keeps it counted
/// among those inside (a higher token waits until the count is zero), and its
/// count in the metrics (nothing without the `metrics` feature). Dropped when
/// the request leaves.
pub(crate) struct Place {
    _guard: InsideGuard,
    _counted: InsideCount,
}

impl Place {
    #[inline(always)]
    pub(crate) fn new(guard: InsideGuard, config: &Config) -> Self {
        Self { _guard: guard, _counted: config.metrics.admitted() }
    }
}

impl<S, B, E, R, ResBody> ResponseFuture<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    pub(crate) fn unfenced(future: S::Future) -> Self {
        Self::from(Kind::Inside { future, place: None, token: None })
    }

    /// An admitted request's inner future.
    #[inline(always)]
    pub(crate) fn inside(future: S::Future, place: Place, token: FencingToken) -> Self {
        Self { kind: Kind::Inside { future, place: Some(place), token: Some(token) } }
    }

    /// Answers `rejection` to the request with `headers`.
    #[cold]
    pub(crate) fn rejected(
        settings: &Arc<Settings<E, R>>,
        rejection: Rejection,
        headers: &HeaderMap,
    ) -> Self {
        let grpc = is_grpc(headers);
        Self::from(Kind::Rejected { rejection: Some(rejection), grpc, settings: Arc::clone(settings) })
    }

    /// Calls `inner` with a request that [`Admission::Enter`] let in. `key` is
    /// given when the cancel policy is on. (The fast path builds its future in
    /// `Fencing::call`, with [`inside`](Self::inside), so the request moves once.)
    pub(crate) fn enter(
        inner: &mut S,
        request: Request<B>,
        token: FencingToken,
        key: Option<String>,
        guard: InsideGuard,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        Self::from(Kind::enter(inner, request, token, key, guard, settings))
    }

    /// Waits as `admission` (a wait, a record, a verification) says, then tries again.
    #[cold]
    pub(crate) fn admitting(
        admission: Admission,
        inner: S,
        request: Request<B>,
        token: FencingToken,
        key: String,
        state: Arc<KeyState>,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        let pending = Pending::new(inner, request, token, key, settings);
        Self::from(Kind::Admitting { waiting: Waiting::start(admission, state, pending) })
    }

    /// Waits for a shared store's decision on the request, then calls `inner` or
    /// refuses (verifying the token first where [`Pending::shared_floor`] says so).
    #[inline(never)]
    pub(crate) fn shared(
        inner: S,
        request: Request<B>,
        token: FencingToken,
        key: String,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        let pending = Pending::new(inner, request, token, key, settings);
        Self::from(Kind::SharedAdmitting { waiting: SharedWaiting::start(pending) })
    }

    /// A request a shared store admitted in memory (`try_admit`).
    #[inline]
    pub(crate) fn shared_inside(
        inner: &mut S,
        request: Request<B>,
        permit: SharedPermit,
        token: FencingToken,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        // No key kept: a claim's permit knows its key, for the rare 503.
        Self::from(Kind::shared_inside(inner, request, permit, None, token, settings))
    }

    /// A request a shared store refused in memory (`try_admit`).
    #[cold]
    pub(crate) fn shared_refused(
        settings: &Arc<Settings<E, R>>,
        refusal: SharedRefusal,
        key: String,
        token: FencingToken,
        headers: &HeaderMap,
    ) -> Self {
        let rejection =
            Rejection::from_shared_refusal(refusal, key, token.get(), settings.config.retry_after);
        Self::rejected(settings, rejection, headers)
    }
}

impl<S, B, E, R> From<Kind<S, B, E, R>> for ResponseFuture<S, B, E, R>
where
    S: Service<Request<B>>,
{
    fn from(kind: Kind<S, B, E, R>) -> Self {
        Self { kind }
    }
}

impl<S, B, E, R, ResBody> Kind<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    /// Calls `inner` with a request that [`Admission::Enter`] let in. `key` is
    /// given when the cancel policy is on or places are handed over.
    fn enter(
        inner: &mut S,
        mut request: Request<B>,
        token: FencingToken,
        key: Option<String>,
        guard: InsideGuard,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        let config = &settings.config;
        config.insert_token_extension(&mut request, token);
        match key {
            None => Self::Inside {
                future: inner.call(request),
                place: Some(Place::new(guard, config)),
                token: Some(token),
            },
            Some(_) if config.hand_over => {
                let held = HeldPlace::local(Place::new(guard, config), token);
                request.extensions_mut().insert(held);
                Self::Inside { future: inner.call(request), place: None, token: Some(token) }
            }
            Some(key) => watched::enter(inner, request, token, key, guard, settings),
        }
    }

    /// Calls `inner` with a request a shared store admitted, holding `permit`
    /// while its future runs, or handing it over in the request.
    #[inline]
    fn shared_inside(
        inner: &mut S,
        mut request: Request<B>,
        permit: SharedPermit,
        key: Option<String>,
        token: FencingToken,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        let config = &settings.config;
        config.insert_token_extension(&mut request, token);
        if config.hand_over {
            request.extensions_mut().insert(HeldPlace::shared(permit, token, config));
            return Self::Inside { future: inner.call(request), place: None, token: Some(token) };
        }
        let grpc = is_grpc(request.headers());
        let future = inner.call(request);
        let place = SharedPlace::new(permit, key, token, grpc, settings);
        Self::SharedInside { future, place: Box::new(place) }
    }
}

impl<S, B, E, R, ResBody> Future for ResponseFuture<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    // Inlined into the caller's poll (axum's `Map`), like `Fencing::call` into its caller's call.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        // The hot path, in a frame of its own: the other states' steps, out of line,
        // would give it their stack frame and saved registers on every poll.
        if let KindProj::Inside { future, token, .. } = kind.as_mut().project() {
            return leave_when_ready(scope::poll_with(*token, future, cx), kind);
        }
        poll_states(kind, cx)
    }
}

/// The `Inside` state's inner future, polled straight into the return slot: when
/// it is done, the request leaves the inner service at once, not when this future
/// is dropped.
#[inline(always)]
fn leave_when_ready<S, B, E, R, T>(poll: Poll<T>, mut kind: Pin<&mut Kind<S, B, E, R>>) -> Poll<T>
where
    S: Service<Request<B>>,
{
    if poll.is_ready() {
        kind.set(Kind::Finished);
    }
    poll
}

/// The steps of a future polled in any state but `Inside` (which it may reach
/// here, after a wait), until one answers or has to wait.
#[inline(never)]
fn poll_states<S, B, E, R, ResBody>(
    mut kind: Pin<&mut Kind<S, B, E, R>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<ResBody>, S::Error>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    loop {
        let step = match kind.as_mut().project() {
            KindProj::Inside { future, token, .. } => {
                return leave_when_ready(scope::poll_with(*token, future, cx), kind);
            }
            KindProj::SharedInside { future, place } => ready!(claimed::poll_inside(future, place, cx)),
            KindProj::Watched { future, watch } => ready!(watched::poll(future, watch.as_mut(), cx)),
            KindProj::Admitting { waiting } => ready!(admitting::poll(waiting.as_mut(), cx)),
            KindProj::SharedAdmitting { waiting } => {
                ready!(claimed::poll_admitting(waiting.as_mut(), cx))
            }
            KindProj::Rejected { rejection, grpc, settings } => {
                let rejection = rejection.take().expect("ResponseFuture polled after completion");
                Step::Done(Ok(settings.answer(rejection, *grpc)))
            }
            KindProj::Finished => panic!("ResponseFuture polled after completion"),
        };
        match step {
            Step::Next(next) => kind.set(next),
            Step::Done(output) => {
                // Drops the inner future, if any, before the place it held.
                kind.set(Kind::Finished);
                return Poll::Ready(output);
            }
        }
    }
}
