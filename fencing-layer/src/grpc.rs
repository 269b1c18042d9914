//! Rejections as gRPC statuses.
//!
//! A gRPC client reads the outcome of a call from `grpc-status`, not from the
//! HTTP status, and takes any body as a message: a 409 with problem+json
//! reaches it as "protocol error". So the layer answers a gRPC request
//! (`content-type: application/grpc…`) with a *trailers-only* gRPC response
//! (HTTP 200, the status in the headers, no body) when its responder is the
//! default [`ProblemJson`](crate::respond::ProblemJson) (turn that off with
//! [`FencingLayer::grpc_statuses`](crate::FencingLayer::grpc_statuses); a
//! custom responder answers gRPC requests itself, or through
//! [`RejectionResponder::respond_grpc`](crate::respond::RejectionResponder::respond_grpc)):
//!
//! | rejection | HTTP | gRPC status |
//! |---|---|---|
//! | missing token | 428 | `FAILED_PRECONDITION` (9) |
//! | invalid token, missing key, key too long | 400 | `INVALID_ARGUMENT` (3) |
//! | stale token, cancelled | 409 | `ABORTED` (10) |
//! | verifier refused | 403 | `PERMISSION_DENIED` (7) |
//! | drain timeout, key table full, store or verifier unavailable | 503 | `UNAVAILABLE` (14) |
//!
//! The detail travels in `grpc-message`; the typed fields in metadata:
//! `fencing-problem` (the problem type, e.g. `stale-token`), `fencing-key`,
//! `fencing-presented-token`, `fencing-highest-token` and `fencing-key-limit`
//! where they apply, and `retry-after` on the 503s' statuses.
//!
//! ```
//! use fencing_layer::{Rejection, grpc::GrpcStatus};
//!
//! let stale = Rejection::Stale { key: "/pkg.Ledger/Append".into(), presented: 1, highest: 2 };
//! assert_eq!(GrpcStatus::code(&stale), 10); // ABORTED
//! ```

use http::{HeaderMap, HeaderValue, StatusCode, header};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::rejection::Rejection;

/// Answers rejections with gRPC statuses; the layer uses it for gRPC requests
/// by itself, and it can be set as the responder for every request with
/// [`FencingLayer::on_rejection`](crate::FencingLayer::on_rejection).
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcStatus;

/// `grpc-message` is percent-encoded: everything outside printable ASCII, and `%`.
const GRPC_MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

impl GrpcStatus {
    /// The gRPC status code for `rejection`.
    #[must_use]
    pub fn code(rejection: &Rejection) -> u8 {
        match rejection.status() {
            StatusCode::PRECONDITION_REQUIRED => 9, // FAILED_PRECONDITION
            StatusCode::BAD_REQUEST => 3,           // INVALID_ARGUMENT
            StatusCode::CONFLICT => 10,             // ABORTED
            StatusCode::FORBIDDEN => 7,             // PERMISSION_DENIED
            StatusCode::SERVICE_UNAVAILABLE => 14,  // UNAVAILABLE
            _ => 2,                                 // UNKNOWN: no rejection has another status
        }
    }

    /// The trailers-only response's headers for `rejection`.
    pub(crate) fn headers(rejection: &Rejection, headers: &mut HeaderMap) {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(u16::from(Self::code(rejection))));
        headers.insert("grpc-message", encoded(&rejection.to_string()));
        headers.insert("fencing-problem", HeaderValue::from_static(rejection.kind()));
        if let Some(key) = rejection.key() {
            headers.insert("fencing-key", encoded(key));
        }
        if let Some(token) = rejection.presented() {
            headers.insert("fencing-presented-token", HeaderValue::from(token));
        }
        if let Some(token) = rejection.highest() {
            headers.insert("fencing-highest-token", HeaderValue::from(token));
        }
        if let Some(limit) = rejection.key_limit() {
            headers.insert("fencing-key-limit", HeaderValue::from(limit));
        }
    }
}

/// A header value of `text`, percent-encoded as `grpc-message` is.
fn encoded(text: &str) -> HeaderValue {
    let text = utf8_percent_encode(text, GRPC_MESSAGE).to_string();
    // Percent-encoding leaves only visible ASCII and spaces: always a valid value.
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether `headers` are a gRPC request's: `application/grpc`, `application/grpc+proto`, ….
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|value| {
        let value = value.as_bytes();
        value.len() >= 16
            && value[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(value.get(16), None | Some(b'+' | b';'))
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use bytes::Bytes;
    use http::Response;

    use super::*;
    use crate::respond::RejectionResponder;

    #[test]
    fn recognises_grpc_content_types() {
        let grpc = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            is_grpc(&headers)
        };
        assert!(grpc("application/grpc"));
        assert!(grpc("application/grpc+proto"));
        assert!(grpc("Application/GRPC;charset=utf-8"));
        assert!(!grpc("application/grpc-web"));
        assert!(!grpc("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn a_stale_token_is_aborted_with_its_fields_in_metadata() {
        let stale = Rejection::Stale { key: "/Ledger/ünï".into(), presented: 3, highest: 9 };
        let response: Response<Bytes> = GrpcStatus.respond(&stale);
        let h = response.headers();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(h["grpc-status"], "10");
        assert_eq!(
            h["grpc-message"],
            "fencing token 3 is stale for /Ledger/%C3%BCn%C3%AF: the highest seen is 9"
        );
        assert_eq!(h["fencing-problem"], "stale-token");
        assert_eq!(h["fencing-key"], "/Ledger/%C3%BCn%C3%AF");
        assert_eq!(
            (&h["fencing-presented-token"], &h["fencing-highest-token"]),
            (&"3".parse().unwrap(), &"9".parse().unwrap())
        );
    }

    #[test]
    fn every_status_has_its_code() {
        use crate::token::TokenError;
        assert_eq!(GrpcStatus::code(&Rejection::MissingToken), 9);
        assert_eq!(GrpcStatus::code(&Rejection::InvalidToken(TokenError::Empty)), 3);
        assert_eq!(GrpcStatus::code(&Rejection::KeyTableFull { limit: 1 }), 14);
    }
}
