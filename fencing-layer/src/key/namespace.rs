//! Key namespaces: several fenced routers sharing one store without sharing keys.
//!
//! A durable store locks its file, so an app with several fenced routers shares
//! one [`MarkStore`](crate::MarkStore) between them; a tenant header `acme` on
//! one router and a path parameter `acme` on another would then meet the same
//! mark. [`FencingLayer::key_namespace`](crate::FencingLayer::key_namespace)
//! puts each layer's keys under a prefix of their own: `tenants:acme`,
//! `accounts:acme`.

use std::borrow::Cow;
use std::sync::Arc;

use http::Request;

use super::KeyExtractor;

/// What separates a namespace from the key; a namespace never contains it, so
/// two namespaced layers never produce the same key.
pub const NAMESPACE_SEPARATOR: char = ':';

/// The keys of `E`, each prefixed with `{namespace}:`. Made by
/// [`FencingLayer::key_namespace`](crate::FencingLayer::key_namespace).
#[derive(Debug, Clone)]
pub struct Namespaced<E> {
    prefix: Arc<str>,
    inner: E,
}

impl<E> Namespaced<E> {
    /// `inner`'s keys under `namespace`.
    ///
    /// # Panics
    ///
    /// When `namespace` is empty or contains [`NAMESPACE_SEPARATOR`]: it is
    /// the program's constant, and with it two namespaces could overlap.
    #[must_use]
    #[track_caller]
    pub fn new(namespace: &str, inner: E) -> Self {
        assert!(
            !namespace.is_empty() && !namespace.contains(NAMESPACE_SEPARATOR),
            "a key namespace is non-empty and has no {NAMESPACE_SEPARATOR:?}: {namespace:?}"
        );
        Self { prefix: format!("{namespace}{NAMESPACE_SEPARATOR}").into(), inner }
    }
}

impl<B, E: KeyExtractor<B>> KeyExtractor<B> for Namespaced<E> {
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        let key = self.inner.extract(request)?;
        let mut namespaced = String::with_capacity(self.prefix.len() + key.len());
        namespaced.push_str(&self.prefix);
        namespaced.push_str(&key);
        Some(Cow::Owned(namespaced))
    }

    fn missing(&self, request: &Request<B>) -> Cow<'static, str> {
        self.inner.missing(request)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::key::{GlobalKey, HeaderKey, PathKey};

    #[test]
    fn keys_get_their_namespace_and_misses_say_what_the_inner_lacked() {
        let request = Request::post("/docs/1").header("x-tenant", "acme").body(()).unwrap();
        let tenants = Namespaced::new("tenants", HeaderKey::new("x-tenant"));
        assert_eq!(tenants.extract(&request).as_deref(), Some("tenants:acme"));
        assert_eq!(Namespaced::new("docs", PathKey).extract(&request).as_deref(), Some("docs:/docs/1"));
        assert_eq!(Namespaced::new("all", GlobalKey).extract(&request).as_deref(), Some("all:*"));
        let bare = Request::post("/").body(()).unwrap();
        assert_eq!(tenants.extract(&bare), None);
        assert_eq!(tenants.missing(&bare), "header x-tenant is missing");
    }

    #[test]
    fn a_namespace_with_the_separator_is_refused() {
        assert!(std::panic::catch_unwind(|| Namespaced::new("a:b", PathKey)).is_err());
        assert!(std::panic::catch_unwind(|| Namespaced::new("", PathKey)).is_err());
    }
}
