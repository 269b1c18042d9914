//! `FenceError` as an axum response: the layer's problem+json where the layer
//! has the same refusal, problem+json of the same shape for database failures.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fencing_layer::{PROBLEM_TYPE_PREFIX, ProblemJson};
use serde::Serialize;

use crate::error::FenceError;

/// What a 503 tells the client to wait, in seconds: conflicts and lost
/// connections clear quickly, and the pool's own waits are a few seconds.
const RETRY_AFTER_SECONDS: u32 = 1;

/// The problem details members, in the layer's order.
#[derive(Serialize)]
struct Problem {
    #[serde(rename = "type")]
    kind: String,
    title: &'static str,
    status: u16,
    detail: &'static str,
}

impl IntoResponse for FenceError {
    /// 409 for a stale token and 400 for a key too long, with the layer's
    /// exact body; 400 for a key holding NUL; 503 with `Retry-After` when a
    /// retry may succeed (conflict, database unreachable, pool exhausted);
    /// 500 otherwise. One log line each; the driver's error text goes to the
    /// log, never to the client.
    fn into_response(self) -> Response {
        if let Some(rejection) = self.rejection() {
            return rejection.respond_with(&ProblemJson);
        }
        let (status, kind, title, detail) = if self.is_retryable() {
            tracing::warn!(error = %self, "fenced transaction failed: answering 503");
            if matches!(self, Self::Retry(_)) {
                let detail = "the transaction conflicted with a concurrent one or waited too long for a lock";
                (StatusCode::SERVICE_UNAVAILABLE, "transaction-conflict", "Transaction conflict", detail)
            } else {
                let detail = "the database could not be reached, or no connection was free in time";
                (StatusCode::SERVICE_UNAVAILABLE, "database-unavailable", "Database unavailable", detail)
            }
        } else if matches!(self, Self::FencedByClaims { .. }) {
            tracing::error!(error = %self, "fenced transaction refused: the key is fenced two ways");
            let detail =
                "the key is fenced through the shared store (replica claims); fence each key one way";
            (StatusCode::CONFLICT, "fenced-elsewhere", "Key fenced another way", detail)
        } else if matches!(self, Self::KeyHasNul) {
            tracing::info!(error = %self, "fenced transaction refused");
            let detail = "the resource key contains a NUL character, which the mark table cannot store";
            (StatusCode::BAD_REQUEST, "invalid-key", "Invalid resource key", detail)
        } else {
            tracing::error!(error = %self, "fenced transaction failed: answering 500");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "database-error",
                "Database error",
                "the database reported an error",
            )
        };
        let problem =
            Problem { kind: format!("{PROBLEM_TYPE_PREFIX}{kind}"), title, status: status.as_u16(), detail };
        // Serializing strings and integers cannot fail.
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, Body::from(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}
