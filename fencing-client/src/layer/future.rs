//! [`ResponseFuture`]: the inner call, raced against the lease's loss, and its answer
//! read for a resource's proof that the lease is over.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::FencedClientError;
use super::layer::Fence;
use super::stale::{ResponseHead, superseded};
use crate::lease::Shared;
use crate::{LossReason, Lost};

pin_project! {
    /// Response future of [`FencedClient`](crate::FencedClient).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        // Sent: the inner call, until it ends or the lease is lost.
        Sent {
            #[pin]
            inner: F,
            #[pin]
            cancelled: WaitForCancellationFutureOwned,
            // The keeper cancels at the deadline too; this covers a keeper that has
            // not been scheduled yet (as `Lease::run` does).
            #[pin]
            deadline: Sleep,
            fence: Arc<Fence>,
        },
        // Refused or cancelled: the inner future is gone.
        Stopped {
            error: Option<Stopped>,
        },
    }
}

#[derive(Debug)]
enum Stopped {
    NotSent(Lost),
    Cancelled(Lost),
}

impl<E> From<Stopped> for FencedClientError<E> {
    fn from(stopped: Stopped) -> Self {
        match stopped {
            Stopped::NotSent(lost) => FencedClientError::NotSent(lost),
            Stopped::Cancelled(lost) => FencedClientError::Cancelled(lost),
        }
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn not_sent(lost: Lost) -> Self {
        ResponseFuture { kind: Kind::Stopped { error: Some(Stopped::NotSent(lost)) } }
    }

    pub(crate) fn sent(inner: F, fence: &Arc<Fence>) -> Self {
        let lease = &fence.lease;
        ResponseFuture {
            kind: Kind::Sent {
                inner,
                cancelled: lease.cancel().clone().cancelled_owned(),
                deadline: sleep_until(lease.deadline()),
                fence: Arc::clone(fence),
            },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    T: ResponseHead,
{
    type Output = Result<T, FencedClientError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        if let KindProj::Sent { inner, cancelled, mut deadline, fence } = kind.as_mut().project() {
            let lease = &fence.lease;
            // Loss first, as in `Lease::run`: a response that arrives with the loss is
            // not handed over.
            let lost = if cancelled.poll(cx).is_ready() {
                Some(lease.lost())
            } else if deadline_passed(deadline.as_mut(), lease, cx) {
                lease.lose(LossReason::DeadlinePassed);
                Some(lease.lost())
            } else {
                None
            };
            match lost {
                // Drops the inner future here, which cancels the request.
                Some(lost) => kind.set(Kind::Stopped { error: Some(Stopped::Cancelled(lost)) }),
                None => {
                    let response = ready!(inner.poll(cx)).map_err(FencedClientError::Inner)?;
                    return Poll::Ready(match superseded(&response) {
                        Some(highest) => Err(FencedClientError::Refused(fence.supersede(highest))),
                        None => Ok(response),
                    });
                }
            }
        }
        match kind.project() {
            KindProj::Stopped { error } => {
                Poll::Ready(Err(error.take().expect("polled after completion").into()))
            }
            KindProj::Sent { .. } => unreachable!("a sent request returned above"),
        }
    }
}

/// True once the lease's deadline (which renewals move forward) has passed.
fn deadline_passed(mut sleep: Pin<&mut Sleep>, lease: &Shared, cx: &mut Context<'_>) -> bool {
    while sleep.as_mut().poll(cx).is_ready() {
        let deadline = lease.deadline();
        if Instant::now() >= deadline {
            return true;
        }
        sleep.as_mut().reset(deadline);
    }
    false
}
