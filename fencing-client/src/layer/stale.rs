//! [`ResponseHead`] and the one rule that reads a response as proof of a newer holder.

use http::{HeaderMap, StatusCode};

use fencing_layer::{FENCING_HIGHEST_TOKEN, FENCING_PROBLEM};

/// The status and headers of an inner client's response: what the client layer reads
/// to tell the fencing layer's stale-token refusal from the application's own answers.
///
/// Implemented for `http::Response<B>` (hyper, hyper-util, tonic) and
/// `reqwest::Response`; implement it for another client's response type to wrap that
/// client. Only the head is read, never the body.
pub trait ResponseHead {
    /// The HTTP status.
    fn status(&self) -> StatusCode;
    /// The response headers.
    fn headers(&self) -> &HeaderMap;
}

impl<B> ResponseHead for http::Response<B> {
    fn status(&self) -> StatusCode {
        http::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        http::Response::headers(self)
    }
}

impl ResponseHead for reqwest::Response {
    fn status(&self) -> StatusCode {
        reqwest::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        reqwest::Response::headers(self)
    }
}

/// `Some(highest)` when `response` is a fencing layer's proof that a newer token has
/// reached the resource: `Fencing-Problem: stale-token` or `cancelled` on a `409`, or
/// on a trailers-only gRPC answer with `grpc-status: 10` (`ABORTED`). An application's
/// own 409 (no `Fencing-Problem`) is not proof, nor is any other problem type.
pub(crate) fn superseded(response: &impl ResponseHead) -> Option<Option<u64>> {
    let headers = response.headers();
    let problem = headers.get(FENCING_PROBLEM)?.as_bytes();
    if problem != b"stale-token" && problem != b"cancelled" {
        return None;
    }
    let refused = response.status() == StatusCode::CONFLICT
        || headers.get("grpc-status").is_some_and(|status| status.as_bytes() == b"10");
    refused.then(|| headers.get(FENCING_HIGHEST_TOKEN).and_then(|value| value.to_str().ok()?.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, headers: &[(&'static str, &'static str)]) -> http::Response<()> {
        let mut response = http::Response::builder().status(status);
        for (name, value) in headers {
            response = response.header(*name, *value);
        }
        response.body(()).unwrap()
    }

    #[test]
    fn a_fencing_layers_stale_refusal_is_proof() {
        let stale = [("fencing-problem", "stale-token"), ("fencing-highest-token", "8")];
        assert_eq!(superseded(&response(409, &stale)), Some(Some(8)));
        assert_eq!(superseded(&response(409, &[("fencing-problem", "cancelled")])), Some(None));
        let grpc =
            [("grpc-status", "10"), ("fencing-problem", "stale-token"), ("fencing-highest-token", "9")];
        assert_eq!(superseded(&response(200, &grpc)), Some(Some(9)));
        // A highest token that is no number is left out, not trusted.
        let garbled = [("fencing-problem", "stale-token"), ("fencing-highest-token", "x")];
        assert_eq!(superseded(&response(409, &garbled)), Some(None));
    }

    #[test]
    fn other_answers_are_not() {
        // The application's own conflict, and the layer's other refusals.
        assert_eq!(superseded(&response(409, &[])), None);
        assert_eq!(superseded(&response(409, &[("fencing-problem", "missing-token")])), None);
        assert_eq!(superseded(&response(503, &[("fencing-problem", "drain-timeout")])), None);
        // The header on an answer that is not a refusal, and a gRPC status other than ABORTED.
        assert_eq!(superseded(&response(200, &[("fencing-problem", "stale-token")])), None);
        let grpc = [("grpc-status", "9"), ("fencing-problem", "stale-token")];
        assert_eq!(superseded(&response(200, &grpc)), None);
    }
}
