//! axum integration: [`FencingToken`] as an extractor, and [`PathParamKey`].
//!
//! ```
//! use axum::{Router, routing::{get, put}};
//! use fencing_layer::{FencingLayer, FencingToken, PathParamKey};
//!
//! // Fenced routes: the layer admitted the request, so the token is there.
//! async fn put_doc(token: FencingToken, body: String) -> String {
//!     format!("stored {} bytes under token {token}", body.len())
//! }
//!
//! // Unfenced methods pass through without a token.
//! async fn get_doc(token: Option<FencingToken>) -> String {
//!     format!("{token:?}")
//! }
//!
//! let app: Router = Router::new()
//!     .route("/tenants/{tenant}/docs/{doc}", put(put_doc).get(get_doc))
//!     // One mark per document id, whichever tenant path reaches it.
//!     .route_layer(FencingLayer::new().key_extractor(PathParamKey::new("doc")));
//! # let _ = app;
//! ```

use std::borrow::Cow;
use std::convert::Infallible;

use axum::extract::{FromRequestParts, MatchedPath, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderValue, Request, StatusCode, header};
use percent_encoding::percent_decode_str;

use crate::key::{KeyExtractor, full_path};
use crate::respond::Problem;
use crate::token::FencingToken;

impl<S: Send + Sync> FromRequestParts<S> for FencingToken {
    type Rejection = MissingFencingToken;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Self>().copied().ok_or(MissingFencingToken)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for FencingToken {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().copied())
    }
}

/// The handler asked for a [`FencingToken`] but no [`FencingLayer`](crate::FencingLayer)
/// admitted the request: the layer is missing from the route, it was built with
/// [`token_extension(false)`](crate::FencingLayer::token_extension), or the request was
/// not fenced (a GET, or a tokenless request under `allow_unfenced`). A server
/// configuration error, answered 500; take `Option<FencingToken>` where
/// unfenced requests are expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingFencingToken;

impl std::fmt::Display for MissingFencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the handler needs a fencing token, but no FencingLayer admitted this request \
             with its token in the extensions: add the layer to this route (without \
             token_extension(false)), or extract Option<FencingToken>",
        )
    }
}

impl std::error::Error for MissingFencingToken {}

impl IntoResponse for MissingFencingToken {
    fn into_response(self) -> Response {
        let body = Problem::plain("missing-layer", "Fencing layer missing", 500, self.to_string()).to_bytes();
        let mut response = (StatusCode::INTERNAL_SERVER_ERROR, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        response
    }
}

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
