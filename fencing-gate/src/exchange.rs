//! The upstream exchange of a fenced request, which owns the request's place
//! inside until it has ended, whatever the client does.
//!
//! hyper drops a request's service future when its client goes away. The
//! layer would then let the next holder in while the upstream may still be
//! applying the write; so a fenced request's exchange owns the place
//! ([`HeldPlace`]), and should hyper drop it before the response head, what is
//! left of it goes on, on a task of its own (no task is spawned otherwise).
//! The place goes when the exchange has ended:
//!
//! | how it ended | the place |
//! |---|---|
//! | response read to its end (by the client, or by the gate after the client left) | let go |
//! | no connection could be opened (nothing was sent) | let go; 502 |
//! | connection broke after the request was sent, or no answer within `upstream_ms` | held for `quarantine_ms`, then let go; 502 or 504 |
//! | the store took it back (a gate losing its replica claim) | exchange dropped, connection closed; 503 |
//!
//! While the place is held, higher tokens for the key wait (up to the drain
//! bound, then 503 with the mark raised); when it goes, they enter.

use std::fmt;
use std::sync::Arc;

use fencing_layer::future::HeldPlace;
use http::{Request, Response};
use hyper::body::Incoming;
use tokio_util::task::TaskTracker;

use crate::body::{GateBody, Upstream};
use crate::config::Timeouts;
use crate::metrics::GateMetrics;
use crate::problem::GateProblem;
use crate::upstream::{Pool, SendError};

/// What every request's exchange shares: the upstream's connections, the
/// bounds, the metrics, and the tracker of tasks that shutdown waits for.
pub(crate) struct Shared {
    pub(crate) pool: Pool,
    pub(crate) timeouts: Timeouts,
    pub(crate) metrics: GateMetrics,
    pub(crate) tasks: TaskTracker,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared").field("timeouts", &self.timeouts).finish_non_exhaustive()
    }
}

impl Shared {
    /// Holds `place` for the quarantine: an exchange whose outcome is unknown.
    pub(crate) fn quarantine(&self, place: HeldPlace) {
        self.metrics.quarantined();
        let quarantine = self.timeouts.quarantine();
        tracing::warn!(
            token = place.token().get(),
            quarantine_ms = quarantine.as_millis() as u64,
            "upstream exchange ended with its outcome unknown: the key stays closed to higher tokens"
        );
        tokio::spawn(async move {
            tokio::time::sleep(quarantine).await;
            drop(place);
        });
    }
}

/// Sends an unfenced request and returns the upstream's answer.
pub(crate) async fn unfenced(shared: Arc<Shared>, request: Request<Incoming>) -> Response<GateBody> {
    match exchange(&shared, request, None).await {
        Ok(response) => response,
        Err((problem, detail, _)) => problem.response(detail),
    }
}

/// Sends a fenced request, holding `place` until the exchange has ended, and
/// returns the upstream's answer. Its caller runs it to its end even if the
/// client leaves ([`ProxyFuture`](crate::proxy::ProxyFuture)).
pub(crate) async fn fenced(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    place: HeldPlace,
) -> Response<GateBody> {
    let revoked = place.clone();
    let response = tokio::select! {
        biased;
        () = revoked.revoked() => Err((GateProblem::ClaimLost, "this gate lost its claim on the key".into(), false)),
        result = exchange(&shared, request, Some(place.clone())) => result,
    };
    match response {
        Ok(response) => response,
        Err((problem, detail, sent)) => {
            if sent {
                shared.quarantine(place);
            }
            problem.response(detail)
        }
    }
}

/// A failed exchange: the refusal, its detail, and whether request bytes may have reached the upstream.
type Failure = (GateProblem, String, bool);

async fn exchange(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
    place: Option<HeldPlace>,
) -> Result<Response<GateBody>, Failure> {
    let bound = shared.timeouts.upstream();
    let (response, sender) = match tokio::time::timeout(bound, shared.pool.send(request)).await {
        Ok(Ok(answered)) => answered,
        Ok(Err(SendError::Connect(error))) => {
            shared.metrics.upstream(UpstreamOutcome::Unreachable);
            return Err((GateProblem::Unreachable, format!("no connection to the upstream: {error}"), false));
        }
        Ok(Err(SendError::Sent(error))) => {
            shared.metrics.upstream(UpstreamOutcome::Broke);
            let detail =
                format!("the upstream connection failed after the request was sent: {}", cause(&error));
            return Err((GateProblem::Broke, detail, true));
        }
        Err(_) => {
            shared.metrics.upstream(UpstreamOutcome::TimedOut);
            let detail = format!("the upstream did not answer within {} ms", bound.as_millis());
            return Err((GateProblem::TimedOut, detail, true));
        }
    };
    shared.metrics.upstream(UpstreamOutcome::Answered);
    let (mut head, body) = response.into_parts();
    crate::forward::strip_hop_by_hop(&mut head.headers);
    let body = Upstream::new(body, place, sender, Arc::clone(shared));
    Ok(Response::from_parts(head, GateBody::Upstream(body)))
}

/// The innermost cause of a client error, which says what happened ("connection refused").
fn cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = error;
    while let Some(source) = inner.source() {
        inner = source;
    }
    inner.to_string()
}

/// How an upstream exchange went, for the metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) enum UpstreamOutcome {
    /// The upstream answered (any status).
    Answered,
    /// No connection.
    Unreachable,
    /// The connection broke after sending.
    Broke,
    /// No answer within the bound.
    TimedOut,
}
