//! The upstream exchange of a fenced request, which owns the request's place
//! inside until it has ended, whatever the client does.
//!
//! hyper drops a request's service future when its client goes away. The
//! layer would then let the next holder in while the upstream may still be
//! applying the write; so a fenced request's exchange runs on a task of its
//! own, which owns the place ([`HeldPlace`]), and the service future only
//! waits for its response head. The place goes when the exchange has ended:
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
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::body::{GateBody, Upstream};
use crate::config::Timeouts;
use crate::metrics::GateMetrics;
use crate::problem::GateProblem;

/// What every request's exchange shares: the client, the bounds, the metrics,
/// and the tracker of tasks that shutdown waits for.
pub(crate) struct Shared {
    pub(crate) client: Client<HttpConnector, Incoming>,
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

/// Sends a fenced request on a task that owns `place` until the exchange ends,
/// and returns the upstream's answer; the task goes on if this is dropped.
pub(crate) async fn fenced(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    place: HeldPlace,
) -> Response<GateBody> {
    let (answer, answered) = oneshot::channel();
    let task = Arc::clone(&shared);
    shared.tasks.spawn(async move {
        let revoked = place.clone();
        let response = tokio::select! {
            biased;
            () = revoked.revoked() => Err((GateProblem::ClaimLost, "this gate lost its claim on the key".into(), false)),
            result = exchange(&task, request, Some(place.clone())) => result,
        };
        let response = match response {
            Ok(response) => response,
            Err((problem, detail, sent)) => {
                if sent {
                    task.quarantine(place);
                }
                problem.response(detail)
            }
        };
        // A client that left drops the receiver: the response, and with it
        // the upstream body (which reads itself to the end), is dropped here.
        let _ = answer.send(response);
    });
    answered.await.unwrap_or_else(|_| GateProblem::ShuttingDown.response("the exchange was stopped"))
}

/// A failed exchange: the refusal, its detail, and whether request bytes may have reached the upstream.
type Failure = (GateProblem, String, bool);

async fn exchange(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
    place: Option<HeldPlace>,
) -> Result<Response<GateBody>, Failure> {
    let bound = shared.timeouts.upstream();
    let response = match tokio::time::timeout(bound, shared.client.request(request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) if error.is_connect() => {
            shared.metrics.upstream(UpstreamOutcome::Unreachable);
            return Err((
                GateProblem::Unreachable,
                format!("no connection to the upstream: {}", cause(&error)),
                false,
            ));
        }
        Ok(Err(error)) => {
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
    Ok(Response::from_parts(head, GateBody::Upstream(Upstream::new(body, place, Arc::clone(shared)))))
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
