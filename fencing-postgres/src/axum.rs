//! `FenceError` as an axum response: the layer's problem+json where the layer
//! has the same refusal, problem+json of the same shape for database failures.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fencing_layer::respond::{Problem, ProblemJson};

use crate::error::FenceError;

/// What a 503 tells the client to wait: conflicts and lost connections clear
/// quickly, and the pool's own waits are a few seconds.
const RETRY_AFTER: Duration = Duration::from_secs(1);

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
        let problem = if self.is_retryable() {
            tracing::warn!(error = %self, "fenced transaction failed: answering 503");
            let problem = if matches!(self, Self::Retry(_) | Self::MigrationBlocked { .. }) {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "transaction-conflict", "Transaction conflict")
                    .detail("the transaction conflicted with a concurrent one or waited too long for a lock")
            } else {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "database-unavailable", "Database unavailable")
                    .detail("the database could not be reached, or no connection was free in time")
            };
            problem.retry_after(RETRY_AFTER)
        } else if matches!(self, Self::FencedByClaims { .. }) {
            tracing::error!(error = %self, "fenced transaction refused: the key is fenced two ways");
            Problem::new(StatusCode::CONFLICT, "fenced-elsewhere", "Key fenced another way")
                .detail("the key is fenced through the shared store (replica claims); fence each key one way")
        } else if matches!(self, Self::KeyHasNul) {
            tracing::info!(error = %self, "fenced transaction refused");
            Problem::new(StatusCode::BAD_REQUEST, "invalid-key", "Invalid resource key")
                .detail("the resource key contains a NUL character, which the mark table cannot store")
        } else {
            tracing::error!(error = %self, "fenced transaction failed: answering 500");
            Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "database-error", "Database error")
                .detail("the database reported an error")
        };
        problem.response()
    }
}
