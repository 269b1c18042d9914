//! [`ResponseFuture`]: the inner call, or the wait before it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tokio::time::Sleep;
use tower_service::Service;

use crate::grpc::is_grpc;
use crate::layer::{Config, Shared};
use crate::metrics::{InsideCount, Stopwatch};
use crate::rejection::Rejection;
use crate::respond::RejectionResponder;
use crate::store::admission::{Admission, InsideGuard, KeyState, RecordDuty, WaitFor};
use crate::store::sync::OwnedNotified;
use crate::store::{SharedAdmission, SharedPermit, SharedRefusal, StoreError};
use crate::token::FencingToken;
use crate::verify::{Raise, Verification, VerifyError};
use tokio::time::Instant;

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
        // Admitted (or unfenced): the inner future, and the place it holds.
        Inside {
            #[pin]
            future: S::Future,
            place: Option<Place>,
        },
        // Admitted under the cancel policy: dropped as soon as a higher token arrives.
        // Field order matters: the inner future is dropped before the guard (in
        // `watch`) lets the next holder in. Boxed, like the waiting state, so that
        // the default policy's future stays the size of the inner one.
        Watched {
            #[pin]
            future: S::Future,
            watch: Pin<Box<Watch<E, R>>>,
        },
        // Waiting for lower tokens to drain, or for the log to record a raise. Boxed,
        // so that the common case does not carry (and move) the waiting state around.
        Admitting {
            waiting: Pin<Box<Waiting<S, B, E, R>>>,
        },
        // Waiting for a shared store's decision.
        SharedAdmitting {
            waiting: Pin<Box<SharedWaiting<S, B, E, R>>>,
        },
        // Admitted by a shared store: the inner future, and the permit that holds
        // its place. Field order matters: the inner future is dropped before the
        // permit lets the next holder in.
        // The place is boxed, like the waiting states, so that the common case's
        // future stays the size of the inner one.
        SharedInside {
            #[pin]
            future: S::Future,
            place: Box<SharedPlace<E, R>>,
        },
        // Answered in `call`; the response is built when first polled.
        Rejected {
            rejection: Option<Rejection>,
            grpc: bool,
            shared: Arc<Shared<E, R>>,
        },
        Finished,
    }
}

pin_project! {
    /// A request that is not inside yet: what it waits for, its bound, and itself.
    /// The bound is the write bound while a raise is being recorded (by this
    /// request or another), and the drain bound from then on.
    struct Waiting<S, B, E, R> {
        #[pin]
        wake: Wake,
        #[pin]
        deadline: Sleep,
        state: Arc<KeyState>,
        // Taken when the request enters.
        pending: Option<Pending<S, B, E, R>>,
        // How long this request waited for lower tokens to leave, and for its own durable write.
        drain: Stopwatch,
        record: Stopwatch,
    }
}

pin_project! {
    /// A request waiting for a shared store: the verifier's answer first where
    /// its token is new here, then the store's decision, the layer's bound on
    /// whichever it waits for, and itself.
    struct SharedWaiting<S, B, E, R> {
        verification: Option<Verification>,
        admission: Option<SharedAdmission>,
        #[pin]
        deadline: Sleep,
        pending: Option<Pending<S, B, E, R>>,
    }
}

pin_project! {
    #[project = WakeProj]
    enum Wake {
        Notified { #[pin] notified: OwnedNotified, waiting_for: WaitFor },
        Recorded { reply: oneshot::Receiver<Result<(), StoreError>> },
        Verifying { verification: Verification },
    }
}

impl Wake {
    /// Which bound applies while waiting for this.
    fn bound(&self) -> WaitFor {
        match self {
            Self::Notified { waiting_for, .. } => *waiting_for,
            Self::Recorded { .. } => WaitFor::Write,
            Self::Verifying { .. } => WaitFor::Verify,
        }
    }
}

/// `bound` from now. Any `Duration`, up to `Duration::MAX`, is a valid bound:
/// past what `Instant` can hold it means "as good as never", as with tokio's `sleep`.
fn deadline_after(bound: Duration) -> Instant {
    const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);
    let now = Instant::now();
    now.checked_add(bound).unwrap_or_else(|| now + FAR_FUTURE)
}

pin_project! {
    /// What a watched request waits on, holds, and needs to describe its own cancellation.
    struct Watch<E, R> {
        #[pin]
        overtaken: OwnedNotified,
        guard: InsideGuard,
        _counted: InsideCount,
        key: String,
        token: FencingToken,
        grpc: bool,
        shared: Arc<Shared<E, R>>,
    }
}

/// A request a shared store admitted: its permit, its count in the metrics,
/// and what a revocation's 503 needs (the key, unless the permit knows it).
struct SharedPlace<E, R> {
    permit: SharedPermit,
    _counted: InsideCount,
    key: Option<String>,
    token: FencingToken,
    grpc: bool,
    shared: Arc<Shared<E, R>>,
}

/// An admitted request's place inside: the key's guard, and its count in the
/// metrics (nothing without the `metrics` feature).
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

/// Why a waiting request's wake-up refused it.
enum Refused {
    Store(StoreError),
    Verifier(VerifyError),
}

/// A request that is not inside yet, with the readied service that will take it.
struct Pending<S, B, E, R> {
    inner: S,
    request: Request<B>,
    token: FencingToken,
    key: String,
    shared: Arc<Shared<E, R>>,
    /// The verifier has accepted this request's raise.
    verified: bool,
}

impl<S, B, E, R, ResBody> ResponseFuture<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    pub(crate) fn unfenced(future: S::Future) -> Self {
        Self::from(Kind::Inside { future, place: None })
    }

    /// An admitted request's inner future.
    #[inline(always)]
    pub(crate) fn inside(future: S::Future, place: Place) -> Self {
        Self { kind: Kind::Inside { future, place: Some(place) } }
    }

    /// Answers `rejection` to the request with `headers`.
    #[cold]
    pub(crate) fn rejected(shared: &Arc<Shared<E, R>>, rejection: Rejection, headers: &HeaderMap) -> Self {
        let grpc = is_grpc(headers);
        Self::from(Kind::Rejected { rejection: Some(rejection), grpc, shared: Arc::clone(shared) })
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
        shared: &Arc<Shared<E, R>>,
    ) -> Self {
        Self::from(Kind::enter(inner, request, token, key, guard, shared))
    }

    /// Waits as `admission` (a wait or a record) says, then tries again.
    #[cold]
    pub(crate) fn admitting(
        admission: Admission,
        inner: S,
        request: Request<B>,
        token: FencingToken,
        key: String,
        state: Arc<KeyState>,
        shared: &Arc<Shared<E, R>>,
    ) -> Self {
        let pending = Pending { inner, request, token, key, shared: Arc::clone(shared), verified: false };
        let (mut drain, mut record) = (Stopwatch::new(), Stopwatch::new());
        let wake = match admission {
            Admission::Wait(notified, waiting_for) => {
                if waiting_for == WaitFor::Drain {
                    drain.start();
                }
                Wake::Notified { notified, waiting_for }
            }
            Admission::Record(duty) => {
                record.start();
                pending.record(duty)
            }
            Admission::Verify { mark } => Wake::Verifying { verification: pending.verify(mark) },
            Admission::Enter(_) | Admission::Stale { .. } => {
                unreachable!("enter and stale are answered in `call`")
            }
        };
        let deadline = tokio::time::sleep_until(deadline_after(shared.config.bound(wake.bound())));
        let waiting = Box::pin(Waiting { wake, deadline, state, pending: Some(pending), drain, record });
        Self::from(Kind::Admitting { waiting })
    }

    /// Waits for a shared store's decision on the request, then calls `inner` or
    /// refuses. With a verifier, a token above the highest this process has
    /// verified for the key is verified first (see [`Pending::shared_floor`]).
    #[inline(never)]
    pub(crate) fn shared(
        inner: S,
        request: Request<B>,
        token: FencingToken,
        key: String,
        shared: &Arc<Shared<E, R>>,
    ) -> Self {
        let pending = Pending { inner, request, token, key, shared: Arc::clone(shared), verified: false };
        let config = &shared.config;
        let (verification, admission, bound) = match pending.shared_floor() {
            Some(floor) if token.get() > floor => (Some(pending.verify(floor)), None, config.verify_timeout),
            _ => (None, Some(pending.admit_shared()), config.shared_store_bound()),
        };
        // The store bounds its own waits; this bounds the store.
        let deadline = tokio::time::sleep_until(deadline_after(bound));
        let waiting = Box::pin(SharedWaiting { verification, admission, deadline, pending: Some(pending) });
        Self::from(Kind::SharedAdmitting { waiting })
    }
}

impl<S, B, E, R, ResBody> ResponseFuture<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    /// A request a shared store admitted in memory (`try_admit`).
    #[inline]
    pub(crate) fn shared_inside(
        future: S::Future,
        permit: SharedPermit,
        key: Option<String>,
        token: FencingToken,
        grpc: bool,
        shared: &Arc<Shared<E, R>>,
    ) -> Self {
        Self::from(Kind::shared_inside(future, permit, key, token, grpc, shared))
    }

    /// A request a shared store refused in memory (`try_admit`).
    #[cold]
    pub(crate) fn shared_refused(
        shared: &Arc<Shared<E, R>>,
        refusal: SharedRefusal,
        key: String,
        token: FencingToken,
        headers: &HeaderMap,
    ) -> Self {
        let config = &shared.config;
        let (presented, retry_after) = (token.get(), config.retry_after);
        let rejection = match refusal {
            SharedRefusal::Stale { highest } => Rejection::Stale { key, presented, highest },
            SharedRefusal::DrainTimeout => Rejection::DrainTimeout { key, presented, retry_after },
            SharedRefusal::KeyTooLong { limit } => Rejection::KeyTooLong { limit },
            SharedRefusal::InvalidKey(why) => {
                Rejection::MissingKey { why: format!("the shared store cannot hold this key: {why}").into() }
            }
            SharedRefusal::Unavailable(error) => {
                Rejection::StoreUnavailable { key, presented, error, retry_after }
            }
        };
        Self::rejected(shared, rejection, headers)
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
    /// given when the cancel policy is on.
    fn enter(
        inner: &mut S,
        mut request: Request<B>,
        token: FencingToken,
        key: Option<String>,
        guard: InsideGuard,
        shared: &Arc<Shared<E, R>>,
    ) -> Self {
        shared.config.hand_over(&mut request, token);
        match key {
            None => {
                Self::Inside { future: inner.call(request), place: Some(Place::new(guard, &shared.config)) }
            }
            Some(key) => Self::watched(inner, request, token, key, guard, shared),
        }
    }

    fn shared_inside(
        future: S::Future,
        permit: SharedPermit,
        key: Option<String>,
        token: FencingToken,
        grpc: bool,
        shared: &Arc<Shared<E, R>>,
    ) -> Self {
        let counted = shared.config.metrics.admitted();
        let place = SharedPlace { permit, _counted: counted, key, token, grpc, shared: Arc::clone(shared) };
        Self::SharedInside { future, place: Box::new(place) }
    }

    /// Calls `inner` with a request admitted under the cancel policy, unless
    /// its token was overtaken in the meantime.
    fn watched(
        inner: &mut S,
        request: Request<B>,
        token: FencingToken,
        key: String,
        guard: InsideGuard,
        shared: &Arc<Shared<E, R>>,
    ) -> Self {
        let grpc = is_grpc(request.headers());
        match guard.state().watch(token.get()) {
            Ok(overtaken) => {
                let _counted = shared.config.metrics.admitted();
                let watch =
                    Watch { overtaken, guard, _counted, key, token, grpc, shared: Arc::clone(shared) };
                Self::Watched { future: inner.call(request), watch: Box::pin(watch) }
            }
            // Overtaken between admission and now: it never reached the inner service.
            Err(highest) => {
                drop(guard);
                let rejection = Rejection::Stale { key, presented: token.get(), highest };
                Self::Rejected { rejection: Some(rejection), grpc, shared: Arc::clone(shared) }
            }
        }
    }
}

impl<S, B, E, R> Pending<S, B, E, R> {
    /// The response to this request for `rejection`.
    fn answer<ResBody>(&self, rejection: Rejection) -> Response<ResBody>
    where
        R: RejectionResponder<ResBody>,
    {
        self.shared.answer(rejection, is_grpc(self.request.headers()))
    }

    fn record(&self, duty: RecordDuty) -> Wake {
        Wake::Recorded { reply: self.shared.config.store.record(&self.key, duty) }
    }

    /// Asks the verifier about raising the mark from `mark` to this request's token.
    fn verify(&self, mark: u64) -> Verification {
        let raise = Raise::new(&self.key, self.token.get(), mark, self.request.headers());
        match &self.shared.config.verifier {
            Some(verifier) => verifier.0.verify(&raise),
            None => Verification::unavailable("no verifier is configured"),
        }
    }

    /// With a shared store and a verifier: the highest token verified for the
    /// key by this process, which the local mark store keeps. A token at or
    /// below it goes to the shared store unverified; that is safe because the
    /// verified token's lock holder, and every later one, holds a token at
    /// least as high, so such a raise can lock no honest holder out.
    fn shared_floor(&self) -> Option<u64> {
        let config = &self.shared.config;
        config.verifier.as_ref().map(|_| config.store.mark(&self.key).unwrap_or(0))
    }

    fn admit_shared(&self) -> SharedAdmission {
        let config = &self.shared.config;
        let Some(store) = &config.shared_store else { unreachable!("only called with a shared store") };
        store.0.admit(&self.key, self.token.get(), config.drain_timeout)
    }

    fn unverified(&self, error: VerifyError) -> Rejection {
        let (key, presented) = (self.key.clone(), self.token.get());
        match error {
            VerifyError::Refused(reason) => {
                Rejection::Unverified { key, presented, reason: reason.into_owned() }
            }
            VerifyError::Unavailable(reason) => Rejection::VerifierUnavailable {
                key,
                presented,
                reason: reason.into_owned(),
                retry_after: self.shared.config.retry_after,
            },
        }
    }

    fn stale(&self, highest: u64) -> Rejection {
        Rejection::Stale { key: self.key.clone(), presented: self.token.get(), highest }
    }

    fn drain_timeout(&self) -> Rejection {
        Rejection::DrainTimeout {
            key: self.key.clone(),
            presented: self.token.get(),
            retry_after: self.shared.config.retry_after,
        }
    }

    fn store_unavailable(&self, error: StoreError) -> Rejection {
        Rejection::StoreUnavailable {
            key: self.key.clone(),
            presented: self.token.get(),
            error,
            retry_after: self.shared.config.retry_after,
        }
    }
}

impl<S, B, E, R, ResBody> Future for ResponseFuture<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            match kind.as_mut().project() {
                KindProj::Inside { future, .. } => {
                    // Polled straight into the return slot: the response is not copied around.
                    let poll = future.poll(cx);
                    if poll.is_ready() {
                        // Leave the inner service as soon as it is done, not when this future is dropped.
                        kind.set(Kind::Finished);
                    }
                    return poll;
                }
                KindProj::SharedInside { future, place } => {
                    if place.permit.poll_revoked(cx).is_ready() {
                        let key = place.key.take().or_else(|| place.permit.key().map(str::to_owned));
                        let rejection = Rejection::ClaimLost {
                            key: key.unwrap_or_default(),
                            presented: place.token.get(),
                            retry_after: place.shared.config.retry_after,
                        };
                        let response = place.shared.answer(rejection, place.grpc);
                        // Drops the inner future, then the permit.
                        kind.set(Kind::Finished);
                        return Poll::Ready(Ok(response));
                    }
                    let poll = future.poll(cx);
                    if poll.is_ready() {
                        kind.set(Kind::Finished);
                    }
                    return poll;
                }
                KindProj::Watched { future, watch } => {
                    let mut watching = watch.as_mut().project();
                    while watching.overtaken.as_mut().poll(cx).is_ready() {
                        match watching.guard.state().watch(watching.token.get()) {
                            Ok(next) => watching.overtaken.set(next),
                            Err(highest) => {
                                let rejection = Rejection::Cancelled {
                                    key: std::mem::take(watching.key),
                                    presented: watching.token.get(),
                                    highest,
                                };
                                let response = watching.shared.answer(rejection, *watching.grpc);
                                // Drops the inner future, then the guard.
                                kind.set(Kind::Finished);
                                return Poll::Ready(Ok(response));
                            }
                        }
                    }
                    let output = ready!(future.poll(cx));
                    kind.set(Kind::Finished);
                    return Poll::Ready(output);
                }
                KindProj::Admitting { waiting } => {
                    let waiting = waiting.as_mut().project();
                    let (mut wake, deadline, slot) = (waiting.wake, waiting.deadline, waiting.pending);
                    let (drain, record) = (waiting.drain, waiting.record);
                    let state = &*waiting.state;
                    let Some(pending) = slot.as_mut() else { unreachable!("taken only on entering") };
                    let waited_for = wake.bound();
                    let woken = match wake.as_mut().project() {
                        WakeProj::Notified { notified, .. } => notified.poll(cx).map(Ok),
                        WakeProj::Recorded { reply } => Pin::new(reply)
                            .poll(cx)
                            .map(|reply| reply.unwrap_or(Err(StoreError::Closed)).map_err(Refused::Store)),
                        WakeProj::Verifying { verification } => {
                            Pin::new(verification).poll(cx).map(|answer| {
                                pending.verified = answer.is_ok();
                                answer.map_err(Refused::Verifier)
                            })
                        }
                    };
                    let config = &pending.shared.config;
                    if woken.is_ready() && waited_for == WaitFor::Write {
                        // This request's own write, if it was one, is done either way.
                        config.metrics.recorded(record);
                    }
                    let rejection = match woken {
                        Poll::Pending => {
                            ready!(deadline.poll(cx));
                            config.metrics.recorded(record);
                            match waited_for {
                                WaitFor::Write => pending
                                    .store_unavailable(StoreError::Timeout(config.store.write_timeout())),
                                WaitFor::Drain => pending.drain_timeout(),
                                WaitFor::Verify => pending.unverified(VerifyError::Unavailable(
                                    format!("no answer within {:?}", config.verify_timeout).into(),
                                )),
                            }
                        }
                        Poll::Ready(Err(Refused::Verifier(error))) => pending.unverified(error),
                        Poll::Ready(Err(Refused::Store(error))) => match state.mark() {
                            // Overtaken while writing: stale is the truer answer.
                            highest if highest > pending.token.get() => pending.stale(highest),
                            _ => pending.store_unavailable(error),
                        },
                        Poll::Ready(Ok(())) => {
                            let rules = config.rules(pending.verified);
                            let (admission, raised) =
                                state.admit_raising(&pending.key, pending.token.get(), rules);
                            if raised {
                                config.metrics.raised(&config.store);
                            }
                            match admission {
                                Admission::Wait(notified, waiting_for) => {
                                    if waiting_for == WaitFor::Drain {
                                        drain.start();
                                    }
                                    // A new bound when the wait changes kind (the write is
                                    // done, the drain begins); the same bound otherwise.
                                    if waiting_for != waited_for {
                                        deadline.reset(deadline_after(config.bound(waiting_for)));
                                    }
                                    wake.set(Wake::Notified { notified, waiting_for });
                                    continue;
                                }
                                Admission::Record(duty) => {
                                    // The previous write failed: this request writes, with its own bound.
                                    record.start();
                                    deadline.reset(deadline_after(config.store.write_timeout()));
                                    wake.set(pending.record(duty));
                                    continue;
                                }
                                Admission::Verify { mark } => {
                                    // An operator reset the mark below this token while it waited.
                                    deadline.reset(deadline_after(config.verify_timeout));
                                    wake.set(Wake::Verifying { verification: pending.verify(mark) });
                                    continue;
                                }
                                Admission::Enter(guard) => {
                                    config.metrics.drain_waited(drain);
                                    let Some(pending) = slot.take() else { unreachable!("checked above") };
                                    let Pending { mut inner, request, token, key, shared, .. } = pending;
                                    tracing::debug!(
                                        key = ?key,
                                        token = token.get(),
                                        "fenced request admitted after waiting"
                                    );
                                    let key = shared.config.watches_in_flight().then_some(key);
                                    kind.set(Kind::enter(&mut inner, request, token, key, guard, &shared));
                                    continue;
                                }
                                Admission::Stale { highest } => pending.stale(highest),
                            }
                        }
                    };
                    pending.shared.config.metrics.drain_waited(drain);
                    let response = pending.answer(rejection);
                    kind.set(Kind::Finished);
                    return Poll::Ready(Ok(response));
                }
                KindProj::SharedAdmitting { waiting } => {
                    let mut waiting = waiting.as_mut().project();
                    let Some(pending) = waiting.pending.as_ref() else {
                        unreachable!("taken only on entering")
                    };
                    let config = &pending.shared.config;
                    if let Some(verification) = waiting.verification.as_mut() {
                        let rejection = match Pin::new(verification).poll(cx) {
                            Poll::Pending => {
                                ready!(waiting.deadline.as_mut().poll(cx));
                                let reason = format!("no answer within {:?}", config.verify_timeout);
                                pending.unverified(VerifyError::Unavailable(reason.into()))
                            }
                            Poll::Ready(Err(error)) => pending.unverified(error),
                            // Remember the verified token here, so that the holder's
                            // next requests go straight to the store.
                            Poll::Ready(Ok(())) => match config.store.seed(&pending.key, pending.token.get())
                            {
                                Ok(_) => {
                                    *waiting.verification = None;
                                    *waiting.admission = Some(pending.admit_shared());
                                    let bound = config.shared_store_bound();
                                    waiting.deadline.as_mut().reset(deadline_after(bound));
                                    continue;
                                }
                                Err(StoreError::KeyTableFull { limit }) => Rejection::KeyTableFull { limit },
                                Err(StoreError::KeyTooLong { limit }) => Rejection::KeyTooLong { limit },
                                Err(error) => pending.store_unavailable(error),
                            },
                        };
                        let response = pending.answer(rejection);
                        kind.set(Kind::Finished);
                        return Poll::Ready(Ok(response));
                    }
                    let Some(admission) = waiting.admission.as_mut() else {
                        unreachable!("set after verifying")
                    };
                    let rejection = match admission.as_mut().poll(cx) {
                        Poll::Pending => {
                            ready!(waiting.deadline.poll(cx));
                            let bound = pending.shared.config.shared_store_bound();
                            pending.store_unavailable(StoreError::Timeout(bound))
                        }
                        Poll::Ready(Ok(permit)) => {
                            let Some(pending) = waiting.pending.take() else { unreachable!("checked above") };
                            let Pending { mut inner, mut request, token, key, shared, .. } = pending;
                            tracing::debug!(key = ?key, token = token.get(), "fenced request admitted by the shared store");
                            shared.config.metrics.shared_admission(permit.raised(), permit.drained());
                            shared.config.hand_over(&mut request, token);
                            let grpc = is_grpc(request.headers());
                            let future = inner.call(request);
                            kind.set(Kind::shared_inside(future, permit, Some(key), token, grpc, &shared));
                            continue;
                        }
                        Poll::Ready(Err(SharedRefusal::DrainTimeout)) => {
                            let bound = pending.shared.config.drain_timeout;
                            pending.shared.config.metrics.shared_drain_timed_out(bound);
                            pending.drain_timeout()
                        }
                        Poll::Ready(Err(SharedRefusal::Stale { highest })) => pending.stale(highest),
                        Poll::Ready(Err(SharedRefusal::KeyTooLong { limit })) => {
                            Rejection::KeyTooLong { limit }
                        }
                        Poll::Ready(Err(SharedRefusal::InvalidKey(why))) => {
                            tracing::debug!(key = ?pending.key, why, "the shared store refused the key");
                            Rejection::MissingKey {
                                why: format!("the shared store cannot hold this key: {why}").into(),
                            }
                        }
                        Poll::Ready(Err(SharedRefusal::Unavailable(error))) => {
                            pending.store_unavailable(error)
                        }
                    };
                    let response = pending.answer(rejection);
                    kind.set(Kind::Finished);
                    return Poll::Ready(Ok(response));
                }
                KindProj::Rejected { rejection, grpc, shared } => {
                    let rejection = rejection.take().expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(shared.answer(rejection, *grpc)));
                }
                KindProj::Finished => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
