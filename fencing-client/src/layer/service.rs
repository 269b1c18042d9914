//! [`FencedClient`]: fences each request, refuses it once the lease is lost.

use std::task::{Context, Poll};

use http::HeaderMap;
use tower::Service;

use super::future::ResponseFuture;
use super::{FencedClientError, FencedClientLayer, ResponseHead};
use crate::Lease;

/// A client (any tower service over HTTP requests) whose requests carry a lease's
/// fencing headers, made by [`FencedClientLayer`].
///
/// Implemented for `http::Request<B>` (a tonic `Channel`, hyper-util's legacy
/// `Client`, any tower HTTP client) and for `reqwest::Request` (reqwest's `Client` is a
/// tower service too), for inner clients whose responses are a [`ResponseHead`].
#[derive(Debug, Clone)]
pub struct FencedClient<S> {
    inner: S,
    layer: FencedClientLayer,
}

impl<S> FencedClient<S> {
    /// Wraps `inner`, fencing its requests with `lease`.
    pub fn new(inner: S, lease: &Lease) -> Self {
        Self::from_layer(inner, FencedClientLayer::new(lease))
    }

    pub(crate) fn from_layer(inner: S, layer: FencedClientLayer) -> Self {
        FencedClient { inner, layer }
    }

    /// The inner client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner client, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Refused before it reaches the inner client if the lease is no longer valid (even
    /// if it was when `poll_ready` answered); otherwise fenced and called.
    fn fenced_call<R>(
        &mut self,
        mut request: R,
        headers: fn(&mut R) -> &mut HeaderMap,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<R>,
    {
        let fence = &self.layer.fence;
        match fence.admit(headers(&mut request)) {
            Ok(()) => ResponseFuture::sent(self.inner.call(request), fence),
            Err(lost) => ResponseFuture::not_sent(lost),
        }
    }
}

impl<S, B> Service<http::Request<B>> for FencedClient<S>
where
    S: Service<http::Request<B>>,
    S::Response: ResponseHead,
{
    type Response = S::Response;
    type Error = FencedClientError<S::Error>;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(FencedClientError::Inner)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.fenced_call(request, http::Request::headers_mut)
    }
}

impl<S> Service<reqwest::Request> for FencedClient<S>
where
    S: Service<reqwest::Request>,
    S::Response: ResponseHead,
{
    type Response = S::Response;
    type Error = FencedClientError<S::Error>;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(FencedClientError::Inner)
    }

    fn call(&mut self, request: reqwest::Request) -> Self::Future {
        self.fenced_call(request, reqwest::Request::headers_mut)
    }
}
