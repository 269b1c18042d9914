//! The `SharedAdmitting` and `SharedInside` states: a request decided by a
//! [`SharedStore`](crate::store::SharedStore) (marks shared by replicas).
//!
//! Waiting: with a verifier, a token above the highest this process has
//! verified for the key is verified first; then the store decides, within
//! the layer's bound on it (the store bounds its own waits; this bounds the
//! store). Inside: the permit can be revoked (the replica's claim lapsed or
//! was lost); the inner future is then dropped, before the permit, and the
//! request answers 503 `claim-lost`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::config::Settings;
use crate::metrics::InsideCount;
use crate::rejection::Rejection;
use crate::respond::RejectionResponder;
use crate::scope;
use crate::store::{SharedAdmission, SharedPermit, SharedRefusal, StoreError};
use crate::token::FencingToken;
use crate::verify::Verification;

use super::deadline::Deadline;
use super::pending::Pending;
use super::{Kind, Step};

pin_project! {
    /// A request waiting for a shared store: the verifier's answer first where
    /// its token is new here, then the store's decision, the layer's bound on
    /// whichever it waits for, and itself.
    pub(super) struct SharedWaiting<S, B, E, R> {
        verification: Option<Verification>,
        admission: Option<SharedAdmission>,
        #[pin]
        deadline: Deadline,
        pending: Option<Pending<S, B, E, R>>,
    }
}

/// A request a shared store admitted: its permit, its count in the metrics,
/// and what a revocation's 503 needs (the key, unless the permit knows it).
pub(super) struct SharedPlace<E, R> {
    permit: SharedPermit,
    _counted: InsideCount,
    key: Option<String>,
    token: FencingToken,
    grpc: bool,
    settings: Arc<Settings<E, R>>,
}

impl<E, R> SharedPlace<E, R> {
    pub(super) fn new(
        permit: SharedPermit,
        key: Option<String>,
        token: FencingToken,
        grpc: bool,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        let _counted = settings.config.metrics.admitted();
        Self { permit, _counted, key, token, grpc, settings: Arc::clone(settings) }
    }
}

impl<S, B, E, R> SharedWaiting<S, B, E, R> {
    /// Verifies first or asks the store at once, as [`Pending::shared_floor`] says.
    pub(super) fn start(pending: Pending<S, B, E, R>) -> Pin<Box<Self>> {
        let config = &pending.settings.config;
        let token = pending.token.get();
        let (verification, admission, bound) = match pending.shared_floor() {
            Some(floor) if token > floor => (Some(pending.verify(floor)), None, config.verify_timeout),
            _ => (None, Some(pending.admit_shared()), config.shared_store_bound()),
        };
        let deadline = Deadline::after(bound);
        Box::pin(Self { verification, admission, deadline, pending: Some(pending) })
    }
}

/// One step of a request admitted by a shared store: its output, or its revocation.
#[inline]
pub(super) fn poll_inside<S, B, E, R, ResBody>(
    future: Pin<&mut S::Future>,
    place: &mut SharedPlace<E, R>,
    cx: &mut Context<'_>,
) -> Poll<Step<S, B, E, R>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    if place.permit.poll_revoked(cx).is_ready() {
        return Poll::Ready(Step::Done(Ok(claim_lost(place))));
    }
    let output = ready!(scope::poll_with(Some(place.token), future, cx));
    // The handler may have run past its claim without yielding (a blocked
    // thread cannot be dropped): what it made is not a success.
    if output.is_ok() && !place.permit.still_held(cx) {
        return Poll::Ready(Step::Done(Ok(claim_lost(place))));
    }
    Poll::Ready(Step::Done(output))
}

/// The 503 `claim-lost` answer of a request whose claim lapsed or was revoked.
fn claim_lost<E, R, ResBody>(place: &mut SharedPlace<E, R>) -> Response<ResBody>
where
    R: RejectionResponder<ResBody>,
{
    let key = place.key.take().or_else(|| place.permit.key().map(str::to_owned));
    let rejection = Rejection::ClaimLost {
        key: key.unwrap_or_default(),
        presented: place.token.get(),
        retry_after: place.settings.config.retry_after,
    };
    place.settings.answer(rejection, place.grpc)
}

/// One step of a request waiting for a shared store: wait, enter, or a refusal.
pub(super) fn poll_admitting<S, B, E, R, ResBody>(
    waiting: Pin<&mut SharedWaiting<S, B, E, R>>,
    cx: &mut Context<'_>,
) -> Poll<Step<S, B, E, R>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    let mut waiting = waiting.project();
    loop {
        let Some(pending) = waiting.pending.as_ref() else { unreachable!("taken only on entering") };
        let config = &pending.settings.config;
        if let Some(verification) = waiting.verification.as_mut() {
            let rejection = match Pin::new(verification).poll(cx) {
                Poll::Pending => {
                    ready!(waiting.deadline.as_mut().poll(cx));
                    pending.verifier_silent()
                }
                Poll::Ready(Err(error)) => pending.unverified(error),
                // Remember the verified token here, so that the holder's next
                // requests go straight to the store.
                Poll::Ready(Ok(())) => match config.store.seed(&pending.key, pending.token.get()) {
                    Ok(_) => {
                        *waiting.verification = None;
                        *waiting.admission = Some(pending.admit_shared());
                        waiting.deadline.as_mut().reset(config.shared_store_bound());
                        continue;
                    }
                    Err(error) => pending.store_error(error),
                },
            };
            return Poll::Ready(Step::Done(Ok(pending.answer(rejection))));
        }
        let Some(admission) = waiting.admission.as_mut() else { unreachable!("set after verifying") };
        let rejection = match admission.as_mut().poll(cx) {
            Poll::Pending => {
                ready!(waiting.deadline.as_mut().poll(cx));
                pending.store_error(StoreError::Timeout(config.shared_store_bound()))
            }
            Poll::Ready(Ok(permit)) => {
                let Some(pending) = waiting.pending.take() else { unreachable!("checked above") };
                let Pending { mut inner, request, token, key, settings, .. } = pending;
                tracing::debug!(key = ?key, token = token.get(), "fenced request admitted by the shared store");
                settings.config.metrics.shared_admission(permit.raised(), permit.drained());
                let next = Kind::shared_inside(&mut inner, request, permit, Some(key), token, &settings);
                return Poll::Ready(Step::Next(next));
            }
            Poll::Ready(Err(refusal)) => {
                match &refusal {
                    SharedRefusal::DrainTimeout => {
                        config.metrics.shared_drain_timed_out(config.drain_timeout)
                    }
                    SharedRefusal::InvalidKey(why) => {
                        tracing::debug!(key = ?pending.key, why, "the shared store refused the key");
                    }
                    _ => {}
                }
                Rejection::from_shared_refusal(
                    refusal,
                    pending.key.clone(),
                    pending.token.get(),
                    config.retry_after,
                )
            }
        };
        return Poll::Ready(Step::Done(Ok(pending.answer(rejection))));
    }
}
