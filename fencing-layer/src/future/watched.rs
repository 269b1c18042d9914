//! The `Watched` state: an admitted request under the cancel policy
//! ([`InFlightPolicy::Cancel`](crate::InFlightPolicy::Cancel)).
//!
//! It runs like `Inside`, and also waits on the key's notification: when a
//! higher token arrives, its inner future is dropped (before its guard, so
//! the higher token finds it gone) and it answers 409 `cancelled`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::config::Settings;
use crate::grpc::is_grpc;
use crate::metrics::InsideCount;
use crate::rejection::Rejection;
use crate::respond::RejectionResponder;
use crate::scope;
use crate::store::admission::InsideGuard;
use crate::store::sync::OwnedNotified;
use crate::token::FencingToken;

use super::{Kind, Step};

pin_project! {
    /// What a watched request waits on, holds, and needs to describe its own cancellation.
    pub(super) struct Watch<E, R> {
        #[pin]
        overtaken: OwnedNotified,
        guard: InsideGuard,
        _counted: InsideCount,
        key: String,
        token: FencingToken,
        grpc: bool,
        settings: Arc<Settings<E, R>>,
    }
}

/// Calls `inner` with a request admitted under the cancel policy, unless its
/// token was overtaken in the meantime.
pub(super) fn enter<S, B, E, R, ResBody>(
    inner: &mut S,
    request: Request<B>,
    token: FencingToken,
    key: String,
    guard: InsideGuard,
    settings: &Arc<Settings<E, R>>,
) -> Kind<S, B, E, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    let grpc = is_grpc(request.headers());
    let settings = Arc::clone(settings);
    match guard.state().watch(token.get()) {
        Ok(overtaken) => {
            let _counted = settings.config.metrics.admitted();
            let watch = Watch { overtaken, guard, _counted, key, token, grpc, settings };
            Kind::Watched { future: inner.call(request), watch: Box::pin(watch) }
        }
        // Overtaken between admission and now: it never reached the inner service.
        Err(highest) => {
            drop(guard);
            let rejection = Rejection::Stale { key, presented: token.get(), highest };
            Kind::Rejected { rejection: Some(rejection), grpc, settings }
        }
    }
}

/// One step of a watched request: its inner future's output, or its cancellation.
pub(super) fn poll<S, B, E, R, ResBody>(
    future: Pin<&mut S::Future>,
    watch: Pin<&mut Watch<E, R>>,
    cx: &mut Context<'_>,
) -> Poll<Step<S, B, E, R>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    R: RejectionResponder<ResBody>,
{
    let mut watching = watch.project();
    // A wake-up is a raise of the key, not necessarily above this token: watch again until it is.
    while watching.overtaken.as_mut().poll(cx).is_ready() {
        match watching.guard.state().watch(watching.token.get()) {
            Ok(next) => watching.overtaken.set(next),
            Err(highest) => {
                let rejection = Rejection::Cancelled {
                    key: std::mem::take(watching.key),
                    presented: watching.token.get(),
                    highest,
                };
                return Poll::Ready(Step::Done(Ok(watching.settings.answer(rejection, *watching.grpc))));
            }
        }
    }
    Poll::Ready(Step::Done(ready!(scope::poll_with(Some(*watching.token), future, cx))))
}
