//! The gate's own refusals, as problem+json in the layer's shape, with the
//! `fencing-problem` header the layer's rejections carry, so that a client
//! reads a 502 from the gate the way it reads a 409 from the layer.

use std::time::Duration;

use fencing_layer::FENCING_PROBLEM;
use fencing_layer::respond::Problem;
use http::{HeaderValue, Response, StatusCode};

use crate::body::GateBody;

/// A refusal of the gate's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateProblem {
    /// No connection to the upstream could be opened: nothing was sent (502).
    Unreachable,
    /// The upstream connection broke after the request was sent: the outcome is unknown (502).
    Broke,
    /// The upstream did not answer within the bound (504).
    TimedOut,
    /// Too many header fields, or too many bytes of them (431).
    HeadersTooLarge,
    /// A path with `.` or `..` segments, empty segments, an escaped `/`, or
    /// escapes that do not decode to UTF-8 (400).
    AmbiguousPath,
    /// A transfer coding other than `chunked` (501).
    UnsupportedTransferCoding,
    /// An `Upgrade` request while upgrades are refused (501).
    UpgradeRefused,
    /// A `CONNECT` request: the gate is a reverse proxy, not a forward one (501).
    ConnectRefused,
    /// The store took the request's place back mid-exchange (a gate losing its
    /// replica claim): the exchange was stopped (503).
    ClaimLost,
}

impl GateProblem {
    fn parts(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::Unreachable => (StatusCode::BAD_GATEWAY, "upstream-unreachable", "Upstream unreachable"),
            Self::Broke => (StatusCode::BAD_GATEWAY, "upstream-failed", "Upstream failed"),
            Self::TimedOut => (StatusCode::GATEWAY_TIMEOUT, "upstream-timeout", "Upstream timed out"),
            Self::HeadersTooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers-too-large",
                "Request headers too large",
            ),
            Self::AmbiguousPath => (StatusCode::BAD_REQUEST, "ambiguous-path", "Ambiguous path"),
            Self::UnsupportedTransferCoding => {
                (StatusCode::NOT_IMPLEMENTED, "unsupported-transfer-coding", "Unsupported transfer coding")
            }
            Self::UpgradeRefused => (StatusCode::NOT_IMPLEMENTED, "upgrade-refused", "Upgrade refused"),
            Self::ConnectRefused => (StatusCode::NOT_IMPLEMENTED, "connect-refused", "CONNECT refused"),
            Self::ClaimLost => (StatusCode::SERVICE_UNAVAILABLE, "claim-lost", "Claim lost"),
        }
    }

    /// The response, with `detail`.
    pub(crate) fn response(self, detail: impl Into<String>) -> Response<GateBody> {
        let (status, kind, title) = self.parts();
        let mut problem = Problem::new(status, kind, title).detail(detail);
        if matches!(self, Self::Unreachable | Self::ClaimLost) {
            problem = problem.retry_after(Duration::from_secs(1));
        }
        let mut response: Response<GateBody> = problem.response();
        response.headers_mut().insert(FENCING_PROBLEM, HeaderValue::from_static(kind));
        response.extensions_mut().insert(self);
        response
    }
}
