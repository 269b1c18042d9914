//! Combining key extractors: a key made of two parts, or a fallback.

use std::borrow::Cow;

use http::Request;

use super::KeyExtractor;

/// Combinators for every key extractor: `a.and(b)` keys by both parts,
/// `a.or(b)` by the first that finds a key.
///
/// ```
/// use fencing_layer::{FencingLayer, key::{HeaderKey, KeyExtractorExt, PathKey}};
///
/// // One mark per tenant and path.
/// let layer = FencingLayer::new()
///     .key_extractor(HeaderKey::new("x-tenant").and(PathKey));
/// # let _ = layer;
/// ```
pub trait KeyExtractorExt: Sized {
    /// Keys by this extractor's key and then `other`'s, joined by `|`; the
    /// request has no key unless both find theirs. A `|` or `\` in the first
    /// part is escaped with `\`, so two different pairs never make one key.
    fn and<O>(self, other: O) -> And<Self, O> {
        And { first: self, second: other }
    }

    /// Keys by this extractor's key, or `other`'s where this one finds none.
    fn or<O>(self, other: O) -> Or<Self, O> {
        Or { first: self, second: other }
    }
}

impl<T> KeyExtractorExt for T {}

/// Two key parts, both required; see [`KeyExtractorExt::and`].
#[derive(Debug, Clone, Copy)]
pub struct And<A, B> {
    first: A,
    second: B,
}

/// A key, or a fallback; see [`KeyExtractorExt::or`].
#[derive(Debug, Clone, Copy)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<Body, A, B> KeyExtractor<Body> for And<A, B>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
{
    fn extract<'r>(&self, request: &'r Request<Body>) -> Option<Cow<'r, str>> {
        let first = self.first.extract(request)?;
        let second = self.second.extract(request)?;
        let mut key = String::with_capacity(first.len() + second.len() + 1);
        for c in first.chars() {
            if c == '|' || c == '\\' {
                key.push('\\');
            }
            key.push(c);
        }
        key.push('|');
        key.push_str(&second);
        Some(Cow::Owned(key))
    }

    fn missing(&self, request: &Request<Body>) -> Cow<'static, str> {
        match self.first.extract(request) {
            None => self.first.missing(request),
            Some(_) => self.second.missing(request),
        }
    }
}

impl<Body, A, B> KeyExtractor<Body> for Or<A, B>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
{
    fn extract<'r>(&self, request: &'r Request<Body>) -> Option<Cow<'r, str>> {
        self.first.extract(request).or_else(|| self.second.extract(request))
    }

    fn missing(&self, request: &Request<Body>) -> Cow<'static, str> {
        format!("{}, and {}", self.first.missing(request), self.second.missing(request)).into()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use http::HeaderName;

    use super::*;
    use crate::key::{GlobalKey, HeaderKey, PathKey};

    fn request(uri: &str, tenant: Option<&str>) -> Request<()> {
        let mut builder = Request::post(uri);
        if let Some(tenant) = tenant {
            builder = builder.header("x-tenant", tenant);
        }
        builder.body(()).unwrap()
    }

    fn tenant() -> HeaderKey {
        HeaderKey::new(HeaderName::from_static("x-tenant"))
    }

    #[test]
    fn and_joins_both_parts_and_escapes_the_first() {
        let key = tenant().and(PathKey);
        assert_eq!(key.extract(&request("/docs/1", Some("acme"))).as_deref(), Some("acme|/docs/1"));
        // Without escaping, ("a|b", "/c") and ("a", "b|/c") would share a mark.
        assert_eq!(key.extract(&request("/c", Some("a|b"))).as_deref(), Some(r"a\|b|/c"));
        assert_eq!(key.extract(&request("/c", Some(r"a\"))).as_deref(), Some(r"a\\|/c"));
        assert_eq!(key.extract(&request("/docs/1", None)), None);
        assert_eq!(key.missing(&request("/docs/1", None)), "header x-tenant is missing");
        assert_eq!(key.missing(&request("/%ff", Some("acme"))), "the path does not percent-decode to UTF-8");
    }

    #[test]
    fn or_falls_back_and_says_what_both_missed() {
        let key = tenant().or(GlobalKey);
        assert_eq!(key.extract(&request("/x", Some("acme"))).as_deref(), Some("acme"));
        assert_eq!(key.extract(&request("/x", None)).as_deref(), Some("*"));
        let key = tenant().or(PathKey);
        assert_eq!(
            key.missing(&request("/%ff", None)),
            "header x-tenant is missing, and the path does not percent-decode to UTF-8"
        );
    }
}
