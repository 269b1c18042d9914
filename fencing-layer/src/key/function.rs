//! Key functions: closures that key a request without naming its body type.
//!
//! A closure over `&Request<B>` needs its `B` spelled out, because the layer
//! does not know the body type until it wraps a service. A key function sees
//! the request through [`KeyRequest`] instead (everything but the body), so
//! its types are inferred, and [`key_fn`](crate::FencingLayer::key_fn) lets it
//! return a key borrowed from the request: no allocation per request.

use std::borrow::Cow;
use std::cell::RefCell;

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

use super::{KeyExtractor, full_path, header_problem, single_header};

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
    /// non-empty visible ASCII, as [`HeaderKey`](crate::key::HeaderKey) takes it.
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

    fn missing(&self, request: &Request<B>) -> Cow<'static, str> {
        let watched = Watched::new(request);
        let _ = (self.0)(&watched);
        watched.problem()
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

    fn missing(&self, request: &Request<B>) -> Cow<'static, str> {
        let watched = Watched::new(request);
        let _ = (self.0)(&watched);
        watched.problem()
    }
}

/// A request as a key function sees it, noting each header it asked for and
/// did not get: run again after the function found no key, so that the 400's
/// detail names them (`header x-tenant is missing`), as [`HeaderKey`](crate::key::HeaderKey)'s does.
struct Watched<'r> {
    request: &'r dyn KeyRequest,
    problems: RefCell<Vec<String>>,
}

impl<'r> Watched<'r> {
    fn new(request: &'r dyn KeyRequest) -> Self {
        Self { request, problems: RefCell::default() }
    }

    /// The headers the function lacked, or that it found no key.
    fn problem(self) -> Cow<'static, str> {
        let problems = self.problems.into_inner();
        if problems.is_empty() { Cow::Borrowed(NOT_FOUND) } else { problems.join(", and ").into() }
    }
}

impl KeyRequest for Watched<'_> {
    fn method(&self) -> &Method {
        self.request.method()
    }
    fn uri(&self) -> &Uri {
        self.request.uri()
    }
    fn version(&self) -> Version {
        self.request.version()
    }
    fn headers(&self) -> &HeaderMap {
        self.request.headers()
    }
    fn extensions(&self) -> &Extensions {
        self.request.extensions()
    }
    fn path(&self) -> &str {
        self.request.path()
    }
    fn header(&self, name: &str) -> Option<&str> {
        let value = self.request.header(name);
        if value.is_none() {
            let problem = header_problem(self.request.headers(), name);
            let mut problems = self.problems.borrow_mut();
            if !problems.contains(&problem) {
                problems.push(problem);
            }
        }
        value
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request<()> {
        let mut request = Request::post("/docs/1");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap()
    }

    /// As `FencingLayer::key_fn` takes it (the bound makes the closure's lifetimes higher-ranked).
    fn key_fn<F: Fn(&dyn KeyRequest) -> Option<&str>>(key: F) -> KeyFn<F> {
        KeyFn(key)
    }

    fn missing<E: KeyExtractor<()>>(extractor: &E, request: &Request<()>) -> String {
        assert!(extractor.extract(request).is_none());
        extractor.missing(request).into_owned()
    }

    #[test]
    fn the_detail_names_the_headers_a_key_function_lacked() {
        let by_tenant = key_fn(|request| request.header("x-tenant"));
        assert_eq!(missing(&by_tenant, &request(&[])), "header x-tenant is missing");
        assert_eq!(
            missing(&by_tenant, &request(&[("x-tenant", "a"), ("x-tenant", "b")])),
            "header x-tenant appears more than once"
        );
        let both = OwnedKeyFn(|request: &dyn KeyRequest| {
            Some(format!("{}/{}", request.header("x-tenant")?, request.header("x-doc")?))
        });
        assert_eq!(missing(&both, &request(&[("x-doc", "1")])), "header x-tenant is missing");
        assert_eq!(missing(&both, &request(&[("x-tenant", "acme")])), "header x-doc is missing");
        // Both looked up, both missing: both named.
        let either = key_fn(|request| request.header("x-a").or(request.header("x-b")));
        assert_eq!(missing(&either, &request(&[])), "header x-a is missing, and header x-b is missing");
        // A function that read no header: the general message.
        let none = key_fn(|request| request.path().strip_prefix("/nothing/"));
        assert_eq!(missing(&none, &request(&[])), NOT_FOUND);
    }
}
