//! Resource keys: which mark a request is checked against.
//!
//! Each key has its own highest-seen token. The default, [`PathKey`], gives every
//! path its own mark; [`HeaderKey`] and [`GlobalKey`] cover the other common
//! layouts, [`KeyExtractorExt`] combines them, and a closure is an extractor
//! too. A request whose key cannot be extracted is answered 400, with a detail
//! that says what was missing.
//!
//! A closure given to [`key_fn`](crate::FencingLayer::key_fn) sees the request
//! as a [`KeyRequest`] (everything but the body), so it needs no type
//! annotations, and may return a key borrowed from the request:
//!
//! ```
//! use fencing_layer::FencingLayer;
//! use fencing_layer::key::{HeaderKey, KeyExtractorExt, PathKey};
//!
//! // Key by a tenant header: no allocation per request.
//! let by_tenant = FencingLayer::new().key_fn(|request| request.header("x-tenant"));
//!
//! // Key by tenant and the last path segment, built per request.
//! let by_document = FencingLayer::new().key_fn_owned(|request| {
//!     let tenant = request.header("x-tenant")?;
//!     let document = request.path().rsplit('/').next()?;
//!     Some(format!("{tenant}/{document}"))
//! });
//!
//! // The same from ready-made parts: `acme|/docs/42`.
//! let by_tenant_and_path = FencingLayer::new().key_extractor(HeaderKey::new("x-tenant").and(PathKey));
//! # let _ = (by_tenant, by_document, by_tenant_and_path);
//! ```
//!
//! Any `Fn(&Request<B>) -> Option<K>` is an extractor as well, with `B` spelled out.

use std::borrow::Cow;
use std::fmt;

use http::{HeaderMap, HeaderName, Request};
use percent_encoding::percent_decode_str;

mod combine;
mod function;
mod namespace;
#[cfg(feature = "axum")]
mod path_param;

pub use combine::{And, KeyExtractorExt, Or};
pub use function::{KeyFn, KeyRequest, OwnedKeyFn};
pub use namespace::{NAMESPACE_SEPARATOR, Namespaced};
#[cfg(feature = "axum")]
pub use path_param::PathParamKey;

/// Extracts the resource key of a request.
///
/// The key borrows from the request where it can, so a hit in the key table
/// costs no allocation.
pub trait KeyExtractor<B> {
    /// The request's resource key, or `None` when it has none (answered 400).
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>>;

    /// What the request lacks, for the 400's detail; asked only after
    /// [`extract`](Self::extract) found no key, so it may take its time.
    fn missing(&self, request: &Request<B>) -> Cow<'static, str> {
        let _ = request;
        Cow::Borrowed("the key extractor found no key in the request")
    }
}

impl<B, F, K> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<K>,
    K: Into<Cow<'static, str>>,
{
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        self(request).map(Into::into)
    }
}

/// Keys by the request path, percent-decoded, without the query (the default).
///
/// Decoding makes `/logs/a%62` and `/logs/ab` one key, as they are one resource
/// to axum's `Path` extractor; otherwise a stale holder could dodge its mark by
/// spelling the path differently. A path that does not decode to UTF-8 has no key.
/// With the `axum` feature, inside a nested router the key is the whole original
/// path, not the part the nested router sees.
#[derive(Debug, Clone, Copy, Default)]
pub struct PathKey;

impl<B> KeyExtractor<B> for PathKey {
    #[inline(always)]
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        let path = full_path(request);
        // Most paths have no escapes: borrow them as they are (a URI path is already UTF-8).
        if !has_percent(path.as_bytes()) {
            return Some(Cow::Borrowed(path));
        }
        percent_decode_str(path).decode_utf8().ok()
    }

    fn missing(&self, _request: &Request<B>) -> Cow<'static, str> {
        Cow::Borrowed("the path does not percent-decode to UTF-8")
    }
}

/// Whether `bytes` holds a `%`, eight bytes at a time where `contains` would
/// compare byte by byte: the first eight, the last eight (overlapping them for a
/// path shorter than 16) and the whole words between. Every fenced request asks it
/// of its path.
#[inline(always)]
fn has_percent(bytes: &[u8]) -> bool {
    let (Some(first), Some(last)) = (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) else {
        return bytes.contains(&b'%');
    };
    // After the first word, whatever the whole words leave over is within the last one.
    has_percent_word(first)
        || has_percent_word(last)
        || bytes[8..].as_chunks::<8>().0.iter().any(has_percent_word)
}

/// Whether one of the eight bytes is a `%`: XOR turns a `%` into a zero byte, and
/// `(x - 0x01…) & !x & 0x80…` is non-zero exactly when `x` has a zero byte.
#[inline(always)]
fn has_percent_word(word: &[u8; 8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    const PERCENTS: u64 = u64::from_ne_bytes([b'%'; 8]);
    let x = u64::from_ne_bytes(*word) ^ PERCENTS;
    x.wrapping_sub(ONES) & !x & HIGH != 0
}

/// The request's path as the client sent it: axum's nested routers strip their
/// prefix from the URI and keep the original in `OriginalUri`.
#[inline(always)]
pub(crate) fn full_path<B>(request: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = request.extensions().get() {
        return uri.path();
    }
    request.uri().path()
}

/// Keys by the value of one request header (a tenant or resource id header, say).
///
/// The header must appear exactly once with a non-empty, visible-ASCII value.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name`: a [`HeaderName`], or a `&str` / `String` as
    /// `PathParamKey::new` (feature `axum`) and [`KeyRequest::header`] take
    /// (any case; header names are case-insensitive).
    ///
    /// # Panics
    ///
    /// When `name` is a string that is not a valid header name (empty, or with
    /// spaces or other characters RFC 9110 does not allow), as
    /// [`HeaderName::from_static`] would: it is the program's constant.
    #[must_use]
    #[track_caller]
    pub fn new<N>(name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Debug,
    {
        match name.try_into() {
            Ok(name) => Self { name },
            Err(error) => panic!("HeaderKey::new: not a valid header name: {error:?}"),
        }
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        single_header(request.headers(), &self.name).map(Cow::Borrowed)
    }

    fn missing(&self, request: &Request<B>) -> Cow<'static, str> {
        header_problem(request.headers(), &self.name).into()
    }
}

/// Why header `name` gives no key: `header x-tenant is missing`, say.
pub(crate) fn header_problem<K: http::header::AsHeaderName + fmt::Display + Copy>(
    headers: &HeaderMap,
    name: K,
) -> String {
    let why = match headers.get_all(name).iter().count() {
        0 => "is missing",
        1 => "is empty or not visible ASCII",
        _ => "appears more than once",
    };
    format!("header {name} {why}")
}

/// The value of header `name` when it appears exactly once, non-empty and visible ASCII.
pub(crate) fn single_header<K: http::header::AsHeaderName>(headers: &HeaderMap, name: K) -> Option<&str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok().filter(|v| !v.is_empty())
}

/// One mark for everything behind the layer: the whole service is one resource.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl GlobalKey {
    /// The single key every request maps to.
    pub const KEY: &'static str = "*";
}

impl<B> KeyExtractor<B> for GlobalKey {
    fn extract<'r>(&self, _request: &'r Request<B>) -> Option<Cow<'r, str>> {
        Some(Cow::Borrowed(Self::KEY))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn request(uri: &str) -> Request<()> {
        Request::post(uri).body(()).unwrap()
    }

    #[test]
    fn path_key_ignores_the_query_and_decodes() {
        assert_eq!(PathKey.extract(&request("/logs/ab?x=1")).as_deref(), Some("/logs/ab"));
        assert_eq!(PathKey.extract(&request("/logs/a%62")).as_deref(), Some("/logs/ab"));
        assert!(matches!(PathKey.extract(&request("/logs/ab")), Some(Cow::Borrowed(_))));
        assert_eq!(PathKey.extract(&request("/logs/%ff")), None);
    }

    #[test]
    fn has_percent_finds_it_at_every_place_in_paths_of_every_length() {
        for len in 0..40 {
            let plain = vec![b'a'; len];
            assert!(!has_percent(&plain), "length {len}");
            // Bytes next to `%` in value, which a sloppy zero-byte test could take for it.
            let near: Vec<u8> = (0..len).map(|i| [b'$', b'&', 0xa5, b'e'][i % 4]).collect();
            assert!(!has_percent(&near), "length {len}");
            for at in 0..len {
                let mut with = plain.clone();
                with[at] = b'%';
                assert!(has_percent(&with), "length {len}, at {at}");
            }
        }
    }

    #[test]
    fn header_key_needs_exactly_one_visible_value() {
        let key = HeaderKey::new(HeaderName::from_static("x-resource"));
        let mut req = request("/");
        assert_eq!(key.extract(&req), None);
        req.headers_mut().append("x-resource", "".parse().unwrap());
        assert_eq!(key.extract(&req), None);
        req.headers_mut().insert("x-resource", "orders".parse().unwrap());
        assert_eq!(key.extract(&req).as_deref(), Some("orders"));
        req.headers_mut().append("x-resource", "other".parse().unwrap());
        assert_eq!(key.extract(&req), None);
        assert_eq!(key.missing(&req), "header x-resource appears more than once");
        assert_eq!(key.missing(&request("/")), "header x-resource is missing");
    }

    #[test]
    fn header_key_takes_a_name_or_a_string() {
        let mut req = request("/");
        req.headers_mut().insert("x-tenant", "acme".parse().unwrap());
        for key in [
            HeaderKey::new(HeaderName::from_static("x-tenant")),
            HeaderKey::new("x-tenant"),
            HeaderKey::new("X-Tenant"),
            HeaderKey::new(String::from("x-tenant")),
        ] {
            assert_eq!(key.extract(&req).as_deref(), Some("acme"));
        }
        let bad = std::panic::catch_unwind(|| HeaderKey::new("x tenant"));
        assert!(bad.is_err(), "a name with a space is refused");
    }

    #[test]
    fn closures_and_global_keys() {
        let by_method = |r: &Request<()>| Some(r.method().as_str().to_owned());
        assert_eq!(by_method.extract(&request("/x")).as_deref(), Some("POST"));
        let never = |_: &Request<()>| None::<&'static str>;
        assert_eq!(never.extract(&request("/x")), None);
        assert_eq!(never.missing(&request("/x")), "the key extractor found no key in the request");
        assert_eq!(GlobalKey.extract(&request("/x")).as_deref(), Some("*"));
    }
}
