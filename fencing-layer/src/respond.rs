//! Turning a [`Rejection`] into a response.
//!
//! The default, [`ProblemJson`], answers with an RFC 9457
//! `application/problem+json` body ([`Problem`]) in any [`RejectionBody`]. Any
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

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::grpc::GrpcStatus;
use crate::headers::{FENCING_HIGHEST_TOKEN, FENCING_PROBLEM};
use crate::rejection::Rejection;

pub use crate::body::RejectionBody;

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
/// use fencing_layer::Rejection;
/// use fencing_layer::respond::ProblemJson;
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
const PROBLEM_TYPE_PREFIX: &str = "urn:fencing:problem:";

/// An RFC 9457 problem details response in the shape of the layer's own:
/// `type` (`urn:fencing:problem:` and a kind), `title`, `status`, `detail`,
/// then any extension members in the order they were added, as
/// `application/problem+json`, with `Retry-After` where set. For a handler or
/// a store that refuses requests of its own beside the layer's, so that a
/// client reads every refusal the same way (`fencing-postgres` answers its
/// database failures with it).
///
/// ```
/// use std::time::Duration;
/// use fencing_layer::respond::Problem;
/// use http::StatusCode;
///
/// let busy = Problem::new(StatusCode::SERVICE_UNAVAILABLE, "database-unavailable", "Database unavailable")
///     .detail("the database could not be reached")
///     .text("database", "orders")
///     .number("attempts", 3)
///     .retry_after(Duration::from_millis(1500));
/// let response: http::Response<String> = busy.response();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(
///     *response.body(),
///     r#"{"type":"urn:fencing:problem:database-unavailable","title":"Database unavailable","status":503,"#
///         .to_owned()
///         + r#""detail":"the database could not be reached","database":"orders","attempts":3}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
    members: Vec<(&'static str, Member)>,
    retry_after: Option<Duration>,
}

/// An extension member's value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    Text(String),
    Number(u64),
}

impl Problem {
    /// A problem of `kind` (the last segment of its `type` URI), answered with
    /// `status`, with an empty detail and no extension members.
    pub fn new(status: StatusCode, kind: &'static str, title: &'static str) -> Self {
        Self { status, kind, title, detail: String::new(), members: Vec::new(), retry_after: None }
    }

    /// The problem of `rejection`, with the layer's extension members
    /// (`key`, `presented_token`, `highest_token`, `key_limit`) where they apply.
    pub fn of(rejection: &Rejection) -> Self {
        let mut problem =
            Self::new(rejection.status(), rejection.kind(), rejection.title()).detail(rejection.to_string());
        if let Some(key) = rejection.key() {
            problem = problem.text("key", key);
        }
        if let Some(presented) = rejection.presented() {
            problem = problem.number("presented_token", presented);
        }
        if let Some(highest) = rejection.highest() {
            problem = problem.number("highest_token", highest);
        }
        if let Some(limit) = rejection.key_limit() {
            problem = problem.number("key_limit", limit as u64);
        }
        problem
    }

    /// The `detail`: this occurrence, in words.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }

    /// Adds the extension member `name` with a string value.
    pub fn text(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.members.push((name, Member::Text(value.into())));
        self
    }

    /// Adds the extension member `name` with a number value.
    pub fn number(mut self, name: &'static str, value: u64) -> Self {
        self.members.push((name, Member::Number(value)));
        self
    }

    /// Answers with `Retry-After`: `after` in whole seconds, rounded up, at least 1.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The problem's status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem details document, as JSON bytes.
    #[must_use]
    pub fn to_bytes(&self) -> Bytes {
        // Serializing strings and integers cannot fail.
        serde_json::to_vec(self).map(Bytes::from).unwrap_or_default()
    }

    /// The response: the status, `Content-Type: application/problem+json`,
    /// `Retry-After` where set, and the document in any [`RejectionBody`].
    #[must_use]
    pub fn response<B: RejectionBody>(&self) -> Response<B> {
        let mut response = Response::new(B::from_rejection(self.to_bytes()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, retry_after_seconds(after));
        }
        response
    }
}

/// `after` as a `Retry-After` value: whole seconds, rounded up, at least 1.
fn retry_after_seconds(after: Duration) -> HeaderValue {
    let seconds = after.as_secs().saturating_add(u64::from(after.subsec_nanos() > 0));
    seconds.max(1).into()
}

/// The members in RFC 9457 order, then the extension members in the order added.
impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4 + self.members.len()))?;
        map.serialize_entry("type", &format_args!("{PROBLEM_TYPE_PREFIX}{}", self.kind))?;
        map.serialize_entry("title", self.title)?;
        map.serialize_entry("status", &self.status.as_u16())?;
        map.serialize_entry("detail", &self.detail)?;
        for (name, value) in &self.members {
            match value {
                Member::Text(text) => map.serialize_entry(name, text)?,
                Member::Number(number) => map.serialize_entry(name, number)?,
            }
        }
        map.end()
    }
}

impl ProblemJson {
    /// The problem details document for `rejection`, as JSON bytes.
    #[must_use]
    pub fn body(rejection: &Rejection) -> Bytes {
        Problem::of(rejection).to_bytes()
    }
}

impl<B: RejectionBody> RejectionResponder<B> for ProblemJson {
    fn respond_grpc(&self, rejection: &Rejection) -> Option<Response<B>> {
        Some(GrpcStatus.respond(rejection))
    }

    fn respond(&self, rejection: &Rejection) -> Response<B> {
        // `Fencing-Problem` and `Retry-After` are the layer's to add, whichever the responder.
        Problem::of(rejection).response()
    }
}

impl Rejection {
    /// The layer's response for this rejection: `responder`'s, plus
    /// [`FENCING_PROBLEM`], [`FENCING_HIGHEST_TOKEN`] and `Retry-After` where
    /// they apply, and the rejection itself in the
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
        // The layer's own headers, whichever the responder: a client reads the
        // refusal from them without the body (`fencing-client` stops at a stale one).
        let headers = response.headers_mut();
        headers.insert(FENCING_PROBLEM, HeaderValue::from_static(self.kind()));
        if let Some(highest) = self.highest() {
            headers.insert(FENCING_HIGHEST_TOKEN, HeaderValue::from(highest));
        }
        if let Some(after) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, retry_after_seconds(after));
        }
        response.extensions_mut().insert(self);
        response
    }
}

/// A gRPC request's refusal as a trailers-only response (see [`GrpcStatus`]).
impl<B: RejectionBody> RejectionResponder<B> for GrpcStatus {
    fn respond(&self, rejection: &Rejection) -> Response<B> {
        // Trailers-only: no body, so the headers end the stream and carry the status.
        let mut response = Response::new(B::from_rejection(Bytes::new()));
        Self::headers(rejection, response.headers_mut());
        response
    }
}
