//! problem+json answers (RFC 9457), and the checks of a request whose failure is
//! one: a JSON body, a bounded body, the `?delay_ms` query. The storage
//! service's routes answer with them, and so does the payment stand-in of the
//! `scenarios` crate, so that every error of the demos reads the same.

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::limits::MAX_DELAY_MS;

/// An RFC 9457 problem details response: `application/problem+json`, its
/// `type` `urn:demo-resource:problem:KIND`, and `Retry-After` when asked.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    body: ProblemBody,
    /// `Retry-After`, in seconds.
    retry_after: Option<u64>,
}

/// The problem object, fields in the RFC's order, then the extension members.
#[derive(Debug, Serialize)]
struct ProblemBody {
    r#type: String,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

impl Problem {
    /// A problem of this status, type suffix (`stale-token`) and title, with an empty detail.
    #[must_use]
    pub fn new(status: StatusCode, kind: &str, title: &'static str) -> Self {
        let body = ProblemBody {
            r#type: format!("urn:demo-resource:problem:{kind}"),
            title,
            status: status.as_u16(),
            detail: String::new(),
            extra: Map::new(),
        };
        Self { status, body, retry_after: None }
    }

    /// Says what went wrong, for a person (the `detail` member).
    #[must_use]
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.body.detail = detail.into();
        self
    }

    /// Adds an extension member (`highest_token`, `max_bytes`...).
    #[must_use]
    pub fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.body.extra.insert(field.into(), value.into());
        self
    }

    /// A 400 of this type suffix and detail.
    #[must_use]
    pub fn bad_request(kind: &str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, kind, "Bad request").detail(detail)
    }

    /// A 500 saying `error`, which is logged at `error`.
    #[must_use]
    pub fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!("{error}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error").detail(error.to_string())
    }

    /// The status it answers with.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Asks the client to retry after `seconds`.
    #[must_use]
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&self.body).unwrap_or_default();
        let mut response = (self.status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<Problem> for Response {
    fn from(problem: Problem) -> Self {
        problem.into_response()
    }
}

/// `routes`, answering an unknown route (404) or a method a route does not take
/// (405) with problem+json, as every other error (the resource's and the payment
/// provider's routes alike).
pub fn problem_fallbacks<S: Clone + Send + Sync + 'static>(routes: Router<S>) -> Router<S> {
    routes
        .method_not_allowed_fallback(|| async {
            Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed")
                .detail("this route does not accept that method")
        })
        .fallback(|| async {
            Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found").detail("no such route")
        })
}

/// A 415 problem saying `detail`, unless the body is declared JSON
/// (`Content-Type: application/json`, parameters such as a charset allowed): the
/// admin reset and the payment provider's charges take nothing else.
pub fn require_json(headers: &axum::http::HeaderMap, detail: &'static str) -> Result<(), Problem> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if json {
        return Ok(());
    }
    Err(Problem::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "Unsupported media type")
        .detail(detail))
}

/// Parses the query of a write route: only `delay_ms`, at most once, a decimal
/// number of milliseconds up to [`MAX_DELAY_MS`].
pub fn parse_delay(query: Option<&str>) -> Result<Duration, Problem> {
    let mut delay = None;
    for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
        let (param, value) = pair.split_once('=').unwrap_or((pair, ""));
        if param != "delay_ms" {
            return Err(Problem::bad_request("bad-query", format!("unknown query parameter {param:?}")));
        }
        if delay.is_some() {
            return Err(Problem::bad_request("bad-query", "delay_ms given more than once"));
        }
        let ms = Some(value)
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms <= MAX_DELAY_MS)
            .ok_or_else(|| {
                Problem::bad_request(
                    "bad-query",
                    format!("delay_ms must be a whole number of milliseconds from 0 to {MAX_DELAY_MS}"),
                )
            })?;
        delay = Some(Duration::from_millis(ms));
    }
    Ok(delay.unwrap_or_default())
}

/// The whole body, at most `max` bytes: past it a 413 problem saying what
/// (`the body`, `a reset body`) must be at most `max` bytes, with `max_bytes`.
pub async fn read_limited(body: Body, max: usize, what: &str) -> Result<Bytes, Problem> {
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => {
            Err(Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large", "Body too large")
                .detail(format!("{what} must be at most {max} bytes"))
                .with("max_bytes", max))
        }
        Err(error) => Err(Problem::bad_request("bad-body", format!("cannot read the body: {error}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_ms_is_validated() {
        assert_eq!(parse_delay(None).unwrap(), Duration::ZERO);
        assert_eq!(parse_delay(Some("")).unwrap(), Duration::ZERO);
        assert_eq!(parse_delay(Some("delay_ms=250")).unwrap(), Duration::from_millis(250));
        assert_eq!(parse_delay(Some("delay_ms=10000")).unwrap(), Duration::from_secs(10));
        for bad in [
            "delay_ms=10001",
            "delay_ms=",
            "delay_ms",
            "delay_ms=-1",
            "delay_ms=+1",
            "delay_ms=1.5",
            "delay_ms=abc",
            "delay_ms=99999999999999999999999",
            "delay_ms=1&delay_ms=2",
            "delay=1",
        ] {
            let problem = parse_delay(Some(bad)).unwrap_err();
            assert_eq!(problem.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
