//! Key functions: closures that key a request without naming its body type.
//!
//! A closure over `&Request<B>` needs its `B` spelled out, because the layer
//! does not know the body type until it wraps a service. A key function sees
//! the request through [`KeyRequest`] instead (everything but the body), so
//! its types are inferred, and [`key_fn`](crate::FencingLayer::key_fn) lets it
//! return a key borrowed from the request: no allocation per request.

use std::borrow::Cow;

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

use super::{KeyExtractor, full_path, single_header};

/// What a key function sees of a request: everything but the body.
///
/// Implemented for every [`http::Request`].
pub trait KeyRequest {
    /// The request method.
    fn method(&self) -> &Method;
    /// The request URI (inside a nested axum router, without the nest's prefix).
    fn uri(&self) -> &Uri;
    /// The HTTP version.
    fn version(&self) -> Version;
    /// All request headers.
    fn headers(&self) -> &HeaderMap;
    /// The request extensions (axum's `MatchedPath` and the like).
    fn extensions(&self) -> &Extensions;
    /// The path as the client sent it, not percent-decoded: with the `axum`
    /// feature, the whole original path even inside a nested router.
    fn path(&self) -> &str;
    /// The value of header `name` when it appears exactly once and is
    /// non-empty visible ASCII, as [`HeaderKey`](crate::HeaderKey) takes it.
    fn header(&self, name: &str) -> Option<&str>;
}

impl<B> KeyRequest for Request<B> {
    fn method(&self) -> &Method {
        self.method()
    }
    fn uri(&self) -> &Uri {
        self.uri()
    }
    fn version(&self) -> Version {
        self.version()
    }
    fn headers(&self) -> &HeaderMap {
        self.headers()
    }
    fn extensions(&self) -> &Extensions {
        self.extensions()
    }
    fn path(&self) -> &str {
        full_path(self)
    }
    fn header(&self, name: &str) -> Option<&str> {
        single_header(self.headers(), name)
    }
}

/// A key function whose key borrows from the request; made by
/// [`FencingLayer::key_fn`](crate::FencingLayer::key_fn).
#[derive(Clone, Copy)]
pub struct KeyFn<F>(pub(crate) F);

/// A key function that builds its key; made by
/// [`FencingLayer::key_fn_owned`](crate::FencingLayer::key_fn_owned).
#[derive(Clone, Copy)]
pub struct OwnedKeyFn<F>(pub(crate) F);

const NOT_FOUND: &str = "the key function found no key in the request";

impl<B, F> KeyExtractor<B> for KeyFn<F>
where
    F: Fn(&dyn KeyRequest) -> Option<&str>,
{
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        (self.0)(request).map(Cow::Borrowed)
    }

    fn missing(&self, _request: &Request<B>) -> Cow<'static, str> {
        Cow::Borrowed(NOT_FOUND)
    }
}

impl<B, F, K> KeyExtractor<B> for OwnedKeyFn<F>
where
    F: Fn(&dyn KeyRequest) -> Option<K>,
    K: Into<Cow<'static, str>>,
{
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        (self.0)(request).map(Into::into)
    }

    fn missing(&self, _request: &Request<B>) -> Cow<'static, str> {
        Cow::Borrowed(NOT_FOUND)
    }
}

impl<F> std::fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyFn")
    }
}

impl<F> std::fmt::Debug for OwnedKeyFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnedKeyFn")
    }
}
