//! The admitted token of the request being served on this thread: set while
//! the layer polls an admitted request's inner future, and read by
//! [`FencingToken::current`] (and so by the axum extractor).
//!
//! Why a thread-local and not the request extensions: an entry in
//! `http::Extensions` allocates, and in an axum router (which already holds
//! three) it rehashes the map, about half of what the layer cost per request.
//! The value here is the token the layer admitted, set by the layer itself
//! around the inner future's poll, so nothing between the layer and the
//! handler can make the two disagree. The inner future is polled only inside
//! [`poll_with`], which puts back what was there before, even on a panic; so
//! nested layers see their own token, and code outside any fenced poll sees
//! none.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::token::FencingToken;

thread_local! {
    static CURRENT: Cell<Option<FencingToken>> = const { Cell::new(None) };
}

/// The admitted token whose inner future is being polled on this thread, if any.
#[inline]
pub(crate) fn current() -> Option<FencingToken> {
    CURRENT.try_with(Cell::get).ok().flatten()
}

// Here rather than in `token`, which the thread-local's type comes from.
impl FencingToken {
    /// The token the layer admitted the request with, while the inner
    /// service's future for it is polled: `None` outside one (an unfenced
    /// request, or code not run from a fenced service's future).
    ///
    /// The layer sets it on this thread around each poll of the inner future,
    /// so it is exactly what the layer checked, and nothing the layers between
    /// do to the request can change it. Read it in the handler's future (an
    /// `async` handler's body, axum's extractors): a `Service::call` that reads
    /// it before returning its future finds `None`, and a task the handler
    /// spawns takes the value along.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::convert::Infallible;
    /// use fencing_layer::{FencingLayer, FencingToken};
    /// use http::{Request, Response};
    /// use tower::{Layer, ServiceExt, service_fn};
    ///
    /// let handler = service_fn(|_request: Request<String>| async {
    ///     Ok::<_, Infallible>(Response::new(format!("{:?}", FencingToken::current())))
    /// });
    /// let service = FencingLayer::new().layer(handler);
    /// let request = Request::put("/doc").header("fencing-token", "42").body(String::new()).unwrap();
    /// let response = service.oneshot(request).await.unwrap();
    /// assert_eq!(response.body(), "Some(FencingToken(42))");
    /// assert_eq!(FencingToken::current(), None);
    /// # }
    /// ```
    #[must_use]
    #[inline]
    pub fn current() -> Option<Self> {
        current()
    }
}

/// Polls `future` with `token` as [`current`] (the token admitted for it), then
/// puts back the one before. With `None` (an unfenced request) it changes
/// nothing: a layer further out may have admitted the request.
#[inline(always)]
pub(crate) fn poll_with<F: Future>(
    token: Option<FencingToken>,
    future: Pin<&mut F>,
    cx: &mut Context<'_>,
) -> Poll<F::Output> {
    let Some(token) = token else {
        return future.poll(cx);
    };
    // `try_with`: no panic path to inline (the value has no destructor, so the
    // slot outlives every poll on this thread). The guard restores after the
    // poll, so its output goes straight to the caller.
    let before = CURRENT.try_with(|current| current.replace(Some(token))).ok().flatten();
    let _restore = Restore(before);
    future.poll(cx)
}

/// Puts the token back when the poll ends, however it ends.
struct Restore(Option<FencingToken>);

impl Drop for Restore {
    #[inline(always)]
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|current| current.set(self.0));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::future::poll_fn;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::pin::pin;
    use std::task::Waker;

    use super::*;

    fn poll_once<F: Future>(token: Option<FencingToken>, future: F) -> Poll<F::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        poll_with(token, pin!(future), &mut cx)
    }

    #[test]
    fn the_token_is_current_only_while_its_future_is_polled() {
        assert_eq!(current(), None);
        let seen = poll_once(Some(FencingToken::new(7)), poll_fn(|_| Poll::Ready(current())));
        assert_eq!(seen, Poll::Ready(Some(FencingToken::new(7))));
        assert_eq!(current(), None, "left behind after the poll");
    }

    #[test]
    fn an_inner_layer_sees_its_own_token_and_an_unfenced_one_the_outer() {
        let outer = poll_once(
            Some(FencingToken::new(3)),
            poll_fn(|_| {
                let inner = poll_once(Some(FencingToken::new(9)), poll_fn(|_| Poll::Ready(current())));
                let unfenced = poll_once(None, poll_fn(|_| Poll::Ready(current())));
                Poll::Ready((inner, unfenced, current()))
            }),
        );
        let t = |v| Poll::Ready(Some(FencingToken::new(v)));
        assert_eq!(outer, Poll::Ready((t(9), t(3), Some(FencingToken::new(3)))));
    }

    #[test]
    fn a_panicking_poll_puts_the_token_back() {
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            poll_once(Some(FencingToken::new(5)), poll_fn(|_| -> Poll<()> { panic!("handler panicked") }))
        }));
        assert!(panicked.is_err());
        assert_eq!(current(), None);
    }
}
