//! axum integration: [`FencingToken`] as an extractor, [`MissingFencingToken`]
//! its rejection, [`Problem`] as an `IntoResponse`, and (in [`key`](crate::key))
//! [`PathParamKey`].
//!
//! ```
//! use axum::{Router, routing::{get, put}};
//! use fencing_layer::key::PathParamKey;
//! use fencing_layer::{FencingLayer, FencingToken};
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
//!
//! [`PathParamKey`]: crate::key::PathParamKey

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use crate::respond::Problem;
use crate::token::FencingToken;

impl<S: Send + Sync> FromRequestParts<S> for FencingToken {
    type Rejection = MissingFencingToken;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        admitted(parts).ok_or(MissingFencingToken)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for FencingToken {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(admitted(parts))
    }
}

/// The token the layer admitted this request with: the one it set for the
/// inner future it is polling ([`FencingToken::current`]), or, for a handler
/// run outside that poll, the one it put in the extensions
/// ([`token_extension(true)`](crate::FencingLayer::token_extension)).
fn admitted(parts: &Parts) -> Option<FencingToken> {
    FencingToken::current().or_else(|| parts.extensions.get::<FencingToken>().copied())
}

/// The handler asked for a [`FencingToken`] but no [`FencingLayer`](crate::FencingLayer)
/// admitted the request: the layer is missing from the route, the handler runs
/// outside the layer's inner future (on a task of its own: pass the token along),
/// or the request was not fenced (a GET, or a tokenless request under `allow_unfenced`). A server
/// configuration error, answered 500; take `Option<FencingToken>` where
/// unfenced requests are expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingFencingToken;

impl std::fmt::Display for MissingFencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the handler needs a fencing token, but no FencingLayer admitted this request: \
             add the layer to this route, or extract Option<FencingToken>",
        )
    }
}

impl std::error::Error for MissingFencingToken {}

impl IntoResponse for MissingFencingToken {
    fn into_response(self) -> Response {
        Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "missing-layer", "Fencing layer missing")
            .detail(self.to_string())
            .response()
    }
}

/// A handler or an extractor can answer with a [`Problem`] as the layer answers.
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.response()
    }
}
