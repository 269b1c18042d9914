//! The `Admitting` state: a request waits, then asks the admission rule again.
//!
//! It waits for one thing at a time ([`Wake`]): lower tokens to drain, its
//! raise to be recorded (by itself or by the request with the duty), or the
//! verifier's answer. Each wake-up goes back to [`KeyState::admit_raising`],
//! the one place that decides, which says enter, refuse, or wait again (for
//! the same thing or the next one). The bound is per kind of wait: a new
//! deadline when the kind changes, the same one otherwise.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tower_service::Service;

use crate::metrics::Stopwatch;
use crate::respond::RejectionResponder;
use crate::store::StoreError;
use crate::store::admission::{Admission, InsideGuard, KeyState, WaitFor};
use crate::store::sync::OwnedNotified;
use crate::verify::{Verification, VerifyError};

use super::deadline::Deadline;
use super::pending::Pending;
use super::{Kind, Step};

pin_project! {
    /// A request that is not inside yet: what it waits for, its bound, and itself.
    /// The bound is the write bound while a raise is being recorded (by this
    /// request or another), and the drain bound from then on.
    pub(super) struct Waiting<S, B, E, R> {
        #[pin]
        wake: Wake,
        #[pin]
        deadline: Deadline,
        state: Arc<KeyState>,
        // Taken when the request enters.
        pending: Option<Pending<S, B, E, R>>,
        // How long this request waited for lower tokens to leave, and for its own durable write.
        drain: Stopwatch,
        record: Stopwatch,
    }
}

pin_project! {
    /// What a waiting request is waiting for.
    #[project = WakeProj]
    pub(super) enum Wake {
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

    /// What `admission` has the request wait for next (lower tokens, a write, the
    /// verifier), its stopwatch started; an admission that ends the wait, back.
    fn next<S, B, E, R>(
        admission: Admission,
        pending: &Pending<S, B, E, R>,
        drain: &mut Stopwatch,
        record: &mut Stopwatch,
    ) -> Result<Self, Admission> {
        match admission {
            Admission::Wait(notified, waiting_for) => {
                if waiting_for == WaitFor::Drain {
                    drain.start();
                }
                Ok(Self::Notified { notified, waiting_for })
            }
            Admission::Record(duty) => {
                record.start();
                Ok(Self::Recorded { reply: pending.record(duty) })
            }
            Admission::Verify { mark } => Ok(Self::Verifying { verification: pending.verify(mark) }),
            ends => Err(ends),
        }
    }

    /// Ready with what the wake-up said: go and ask again, or the refusal it brought.
    fn poll_woken<S, B, E, R>(
        self: Pin<&mut Self>,
        pending: &mut Pending<S, B, E, R>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Refused>> {
        match self.project() {
            WakeProj::Notified { notified, .. } => notified.poll(cx).map(Ok),
            WakeProj::Recorded { reply } => Pin::new(reply)
                .poll(cx)
                .map(|reply| reply.unwrap_or(Err(StoreError::Closed)).map_err(Refused::Store)),
            WakeProj::Verifying { verification } => Pin::new(verification).poll(cx).map(|answer| {
                pending.verified = answer.is_ok();
                answer.map_err(Refused::Verifier)
            }),
        }
    }
}

/// Why a waiting request's wake-up refused it.
enum Refused {
    Store(StoreError),
    Verifier(VerifyError),
}

impl<S, B, E, R> Waiting<S, B, E, R> {
    /// Starts waiting as `admission` (a wait, a record, a verification) says.
    pub(super) fn start(
        admission: Admission,
        state: Arc<KeyState>,
        pending: Pending<S, B, E, R>,
    ) -> Pin<Box<Self>> {
        let (mut drain, mut record) = (Stopwatch::new(), Stopwatch::new());
        let Ok(wake) = Wake::next(admission, &pending, &mut drain, &mut record) else {
            unreachable!("enter and stale are answered in `call`")
        };
        let deadline = Deadline::after(pending.settings.config.bound(wake.bound()));
        Box::pin(Self { wake, deadline, state, pending: Some(pending), drain, record })
    }
}

/// One step of a waiting request: wait, enter (the next state), or a refusal.
pub(super) fn poll<S, B, E, R, ResBody>(
    waiting: Pin<&mut Waiting<S, B, E, R>>,
    cx: &mut Context<'_>,
) -> Poll<Step<S, B, E, R>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    let waiting = waiting.project();
    let (mut wake, mut deadline, slot) = (waiting.wake, waiting.deadline, waiting.pending);
    let Some(pending) = slot.as_mut() else { unreachable!("taken only on entering") };
    loop {
        let waited_for = wake.bound();
        let woken = wake.as_mut().poll_woken(pending, cx);
        let config = &pending.settings.config;
        if woken.is_ready() && waited_for == WaitFor::Write {
            // This request's own write, if it was one, is done either way.
            config.metrics.recorded(waiting.record);
        }
        let rejection = match woken {
            Poll::Pending => {
                ready!(deadline.as_mut().poll(cx));
                config.metrics.recorded(waiting.record);
                match waited_for {
                    WaitFor::Write => pending.store_error(StoreError::Timeout(config.store.write_timeout())),
                    WaitFor::Drain => pending.drain_timeout(),
                    WaitFor::Verify => pending.verifier_silent(),
                }
            }
            Poll::Ready(Err(Refused::Verifier(error))) => pending.unverified(error),
            Poll::Ready(Err(Refused::Store(error))) => match waiting.state.mark() {
                // Overtaken while writing: stale is the truer answer.
                highest if highest > pending.token.get() => pending.stale(highest),
                _ => pending.store_error(error),
            },
            Poll::Ready(Ok(())) => {
                let rules = config.rules(pending.verified);
                let (admission, raised) =
                    waiting.state.admit_raising(&pending.key, pending.token.get(), rules);
                if raised {
                    config.metrics.raised(&config.store);
                }
                match Wake::next(admission, pending, waiting.drain, waiting.record) {
                    Ok(next) => {
                        // A new bound when the wait changes kind (the write is done, the
                        // drain begins) or starts afresh (this request's own write after a
                        // failed one, a verification); the same bound otherwise.
                        if next.bound() != waited_for || !matches!(next, Wake::Notified { .. }) {
                            deadline.as_mut().reset(config.bound(next.bound()));
                        }
                        wake.set(next);
                        continue;
                    }
                    Err(Admission::Enter(guard)) => {
                        config.metrics.drain_waited(waiting.drain);
                        let Some(pending) = slot.take() else { unreachable!("checked above") };
                        return Poll::Ready(Step::Next(enter(pending, guard)));
                    }
                    Err(Admission::Stale { highest }) => pending.stale(highest),
                    Err(_) => unreachable!("every wait is taken by `Wake::next`"),
                }
            }
        };
        config.metrics.drain_waited(waiting.drain);
        return Poll::Ready(Step::Done(Ok(pending.answer(rejection))));
    }
}

/// The request, admitted after its wait: inside (or watched), as from `call`.
fn enter<S, B, E, R, ResBody>(pending: Pending<S, B, E, R>, guard: InsideGuard) -> Kind<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    let Pending { mut inner, request, token, key, settings, .. } = pending;
    tracing::debug!(key = ?key, token = token.get(), "fenced request admitted after waiting");
    let key = settings.config.enters_slowly().then_some(key);
    Kind::enter(&mut inner, request, token, key, guard, &settings)
}
