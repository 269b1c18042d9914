//! Turning a [`Rejection`] into a response.
//!
//! The default, [`ProblemJson`], answers with an RFC 9457
//! `application/problem+json` body. Any `Fn(&Rejection) -> Response<B>` can
//! replace it:
//!
//! ```
//! use axum::body::Body;
//! use fencing_layer::{FencingLayer, Rejection};
//! use http::Response;
//!
//! let layer = FencingLayer::new().on_rejection(|rejection: &Rejection| {
//!     Response::builder()
//!         .status(rejection.status())
//!         .body(Body::from(rejection.to_string()))
//!         .unwrap()
//! });
//! # let _ = layer;
//! ```
//!
//! Whichever responder is used, the layer adds the `Retry-After` header where the
//! rejection has one, and puts the [`Rejection`] into the response extensions.

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use serde_json::{Map, Value, json};

use crate::rejection::Rejection;

/// Builds the response for a rejected request.
pub trait RejectionResponder<B> {
    /// The response to send for `rejection`. Its status should be `rejection.status()`.
    fn respond(&self, rejection: &Rejection) -> Response<B>;
}

impl<B, F> RejectionResponder<B> for F
where
    F: Fn(&Rejection) -> Response<B>,
{
    fn respond(&self, rejection: &Rejection) -> Response<B> {
        self(rejection)
    }
}

/// The default responder: an RFC 9457 problem details body.
///
/// ```json
/// {"type":"urn:fencing:problem:stale-token","title":"Stale fencing token","status":409,
///  "detail":"fencing token 1 is stale for /logs/x: the highest seen is 2",
///  "key":"/logs/x","presented_token":1,"highest_token":2}
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

/// The prefix of every problem `type` URI this crate emits.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:fencing:problem:";

impl ProblemJson {
    /// The problem details object for `rejection`.
    #[must_use]
    pub fn body(rejection: &Rejection) -> Value {
        let mut body = Map::new();
        body.insert("type".into(), format!("{PROBLEM_TYPE_PREFIX}{}", rejection.kind()).into());
        body.insert("title".into(), title(rejection).into());
        body.insert("status".into(), rejection.status().as_u16().into());
        body.insert("detail".into(), rejection.to_string().into());
        match rejection {
            Rejection::Stale { key, presented, highest }
            | Rejection::Cancelled { key, presented, highest } => {
                body.insert("key".into(), key.as_str().into());
                body.insert("presented_token".into(), (*presented).into());
                body.insert("highest_token".into(), (*highest).into());
            }
            Rejection::DrainTimeout { key, presented, .. }
            | Rejection::StoreUnavailable { key, presented, .. } => {
                body.insert("key".into(), key.as_str().into());
                body.insert("presented_token".into(), (*presented).into());
            }
            Rejection::KeyTableFull { limit } => {
                body.insert("key_limit".into(), json!(limit));
            }
            _ => {}
        }
        Value::Object(body)
    }
}

fn title(rejection: &Rejection) -> &'static str {
    match rejection {
        Rejection::MissingToken => "Fencing token required",
        Rejection::InvalidToken(_) => "Invalid fencing token",
        Rejection::MissingKey => "No resource key",
        Rejection::Stale { .. } => "Stale fencing token",
        Rejection::Cancelled { .. } => "Cancelled by a newer fencing token",
        Rejection::DrainTimeout { .. } => "Older requests still in flight",
        Rejection::KeyTableFull { .. } => "Fencing key table full",
        Rejection::StoreUnavailable { .. } => "Fencing store unavailable",
    }
}

impl<B: From<Bytes>> RejectionResponder<B> for ProblemJson {
    fn respond(&self, rejection: &Rejection) -> Response<B> {
        let body = Bytes::from(Self::body(rejection).to_string());
        let mut response = Response::new(B::from(body));
        *response.status_mut() = rejection.status();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        response
    }
}
