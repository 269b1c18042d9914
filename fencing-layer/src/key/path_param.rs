//! [`PathParamKey`]: keying by one parameter of the matched axum route (feature `axum`).

use std::borrow::Cow;

use axum::extract::MatchedPath;
use http::Request;
use percent_encoding::percent_decode_str;

use super::{KeyExtractor, full_path};

/// Keys by one parameter of the matched axum route, percent-decoded as axum's
/// `Path` extractor would decode it.
///
/// For `/logs/{name}`, `PathParamKey::new("name")` keys `/logs/billing` by
/// `billing`; a catch-all `{*rest}` keys by everything it matches. It reads
/// axum's `MatchedPath`, so apply the layer with `route_layer` (or to routes);
/// requests that matched no route, or a route without the parameter, have no
/// key (400). Parameters must fill a whole path segment.
#[derive(Debug, Clone)]
pub struct PathParamKey {
    name: Cow<'static, str>,
}

impl PathParamKey {
    /// Keys by the parameter `name` (without braces).
    #[must_use]
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self { name: name.into() }
    }

    fn find<'p>(&self, template: &str, path: &'p str) -> Option<&'p str> {
        let mut rest = path;
        for pattern in template.split('/') {
            let (segment, after) = rest.split_once('/').unwrap_or((rest, ""));
            let param = pattern.strip_prefix('{').and_then(|p| p.strip_suffix('}'));
            match param {
                Some(p) if p.strip_prefix('*') == Some(&self.name) => return Some(rest),
                Some(p) if p == self.name => return Some(segment),
                _ => rest = after,
            }
        }
        None
    }
}

impl<B> KeyExtractor<B> for PathParamKey {
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        let template = request.extensions().get::<MatchedPath>()?.as_str();
        // Inside a nested router the URI has lost its prefix; the matched path has not.
        let raw = self.find(template, full_path(request))?;
        percent_decode_str(raw).decode_utf8().ok().filter(|key| !key.is_empty())
    }

    fn missing(&self, request: &Request<B>) -> Cow<'static, str> {
        let name = &self.name;
        match request.extensions().get::<MatchedPath>() {
            None => "no matched axum route (apply the layer with route_layer)".into(),
            Some(template) if self.find(template.as_str(), full_path(request)).is_none() => {
                format!("the route {} has no path parameter {name}", template.as_str()).into()
            }
            Some(_) => format!("path parameter {name} is empty or does not percent-decode to UTF-8").into(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn finds_params_and_catch_alls() {
        let key = PathParamKey::new("doc");
        assert_eq!(key.find("/t/{tenant}/docs/{doc}", "/t/acme/docs/42"), Some("42"));
        assert_eq!(key.find("/t/{tenant}/docs/{doc}/x", "/t/acme/docs/42/x"), Some("42"));
        assert_eq!(key.find("/files/{*doc}", "/files/a/b/c"), Some("a/b/c"));
        assert_eq!(key.find("/t/{tenant}", "/t/acme"), None);
        assert_eq!(
            PathParamKey::new("tenant").find("/t/{tenant}/docs/{doc}", "/t/acme/docs/42"),
            Some("acme")
        );
    }
}
