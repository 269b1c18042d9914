//! Turning a [`Rejection`] into a response.
//!
//! The default, [`ProblemJson`], answers with an RFC 9457
//! `application/problem+json` body in any [`RejectionBody`]. Any
//! `Fn(&Rejection) -> Response<B>`, with `B` the inner service's body type, can
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
use serde::Serialize;

use crate::body::RejectionBody;
use crate::grpc::GrpcStatus;
use crate::rejection::Rejection;

/// Builds the response for a rejected request, for an inner service whose
/// responses have bodies of type `B`.
pub trait RejectionResponder<B> {
    /// The response to send for `rejection`. Its status should be `rejection.status()`.
    fn respond(&self, rejection: &Rejection) -> Response<B>;

    /// The response to a gRPC request for `rejection`, where this responder
    /// makes one; the layer falls back to [`respond`](Self::respond) on `None`.
    /// [`ProblemJson`] answers with [`GrpcStatus`]; a closure answers `None`.
    fn respond_grpc(&self, rejection: &Rejection) -> Option<Response<B>> {
        let _ = rejection;
        None
    }
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
/// ```
/// use fencing_layer::{ProblemJson, Rejection};
///
/// let stale = Rejection::Stale { key: "/logs/x".into(), presented: 1, highest: 2 };
/// assert_eq!(
///     ProblemJson::body(&stale),
///     r#"{"type":"urn:fencing:problem:stale-token","title":"Stale fencing token","status":409,"#.to_owned()
///         + r#""detail":"fencing token 1 is stale for /logs/x: the highest seen is 2","#
///         + r#""key":"/logs/x","presented_token":1,"highest_token":2}"#
/// );
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

/// The prefix of every problem `type` URI this crate emits.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:fencing:problem:";

/// The problem details members, serialized in this order.
#[derive(Serialize)]
pub(crate) struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presented_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    highest_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_limit: Option<usize>,
}

impl Problem<'_> {
    /// A problem with only the standard members.
    pub(crate) fn plain(kind: &str, title: &'static str, status: u16, detail: String) -> Self {
        Problem {
            kind: format!("{PROBLEM_TYPE_PREFIX}{kind}"),
            title,
            status,
            detail,
            key: None,
            presented_token: None,
            highest_token: None,
            key_limit: None,
        }
    }

    pub(crate) fn to_bytes(&self) -> Bytes {
        // Serializing strings and integers cannot fail.
        serde_json::to_vec(self).map(Bytes::from).unwrap_or_default()
    }
}

impl ProblemJson {
    /// The problem details document for `rejection`, as JSON bytes.
    #[must_use]
    pub fn body(rejection: &Rejection) -> Bytes {
        let key_limit = match rejection {
            Rejection::KeyTableFull { limit } | Rejection::KeyTooLong { limit } => Some(*limit),
            _ => None,
        };
        let status = rejection.status().as_u16();
        let plain = Problem::plain(rejection.kind(), title(rejection), status, rejection.to_string());
        Problem {
            key: rejection.key(),
            presented_token: rejection.presented(),
            highest_token: rejection.highest(),
            key_limit,
            ..plain
        }
        .to_bytes()
    }
}

fn title(rejection: &Rejection) -> &'static str {
    match rejection {
        Rejection::MissingToken => "Fencing token required",
        Rejection::InvalidToken(_) => "Invalid fencing token",
        Rejection::MissingKey { .. } => "No resource key",
        Rejection::KeyTooLong { .. } => "Resource key too long",
        Rejection::Stale { .. } => "Stale fencing token",
        Rejection::Cancelled { .. } => "Cancelled by a newer fencing token",
        Rejection::DrainTimeout { .. } => "Older requests still in flight",
        Rejection::ClaimLost { .. } => "Replica claim lost",
        Rejection::KeyTableFull { .. } => "Fencing key table full",
        Rejection::StoreUnavailable { .. } => "Fencing store unavailable",
        Rejection::Unverified { .. } => "Unverified fencing token",
        Rejection::VerifierUnavailable { .. } => "Fencing token verifier unavailable",
    }
}

impl<B: RejectionBody> RejectionResponder<B> for ProblemJson {
    fn respond_grpc(&self, rejection: &Rejection) -> Option<Response<B>> {
        Some(GrpcStatus.respond(rejection))
    }

    fn respond(&self, rejection: &Rejection) -> Response<B> {
        let mut response = Response::new(B::from_rejection(Self::body(rejection)));
        *response.status_mut() = rejection.status();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        response
    }
}

impl Rejection {
    /// The layer's response for this rejection: `responder`'s, plus
    /// `Retry-After` where it applies and the rejection itself in the
    /// extensions, with one log line. For a handler or a store that refuses
    /// a request as the layer would (`fencing-postgres` does).
    pub fn respond_with<B, R: RejectionResponder<B>>(self, responder: &R) -> Response<B> {
        tracing::info!(
            kind = self.kind(),
            status = self.status().as_u16(),
            key = ?self.key(),
            presented = self.presented(),
            highest = self.highest(),
            "fenced request rejected"
        );
        let mut response = responder.respond(&self);
        if let Some(after) = self.retry_after() {
            let seconds = after.as_secs().saturating_add(u64::from(after.subsec_nanos() > 0));
            response.headers_mut().insert(http::header::RETRY_AFTER, seconds.max(1).into());
        }
        response.extensions_mut().insert(self);
        response
    }
}
