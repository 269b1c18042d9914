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
