//! [`RejectionBody`]: response body types the layer can write a rejection into.
//!
//! The layer answers a rejected request itself, in the inner service's own
//! response type, so it must make a body of that type from the rejection's
//! bytes. Every common body can be made that way: axum's, `String`, `Bytes`,
//! hyper's `Full`, boxed bodies and (feature `tonic`) tonic's. The layer keeps
//! the inner service's `Response<B>` unchanged, so an admitted request's
//! response passes through as it is, without being wrapped or boxed (wrapping
//! costs axum one allocation per response when it boxes the body back).
//!
//! ```
//! use bytes::Bytes;
//! use fencing_layer::FencingLayer;
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // A service whose responses are `Response<String>`.
//! let app = ServiceBuilder::new().layer(FencingLayer::new()).service(service_fn(
//!     |_: Request<()>| async { Ok::<_, std::convert::Infallible>(Response::new(String::from("stored"))) },
//! ));
//! let request = Request::post("/logs/x").header("Fencing-Token", "abc").body(()).unwrap();
//! let response: Response<String> = app.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), StatusCode::BAD_REQUEST);
//! assert!(response.body().starts_with(r#"{"type":"urn:fencing:problem:invalid-token""#));
//! # }
//! ```
//!
//! A body type of your own needs one line: `impl RejectionBody for MyBody`.
//! A custom responder ([`FencingLayer::on_rejection`](crate::FencingLayer::on_rejection))
//! builds its own bodies and needs no such impl.

use bytes::Bytes;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};

/// A response body the default responders ([`ProblemJson`](crate::respond::ProblemJson),
/// [`GrpcStatus`](crate::grpc::GrpcStatus)) can write a rejection into.
pub trait RejectionBody: Sized {
    /// A body of `bytes` (a problem+json document, or nothing for a gRPC status).
    fn from_rejection(bytes: Bytes) -> Self;
}

impl RejectionBody for Bytes {
    fn from_rejection(bytes: Bytes) -> Self {
        bytes
    }
}

impl RejectionBody for Vec<u8> {
    fn from_rejection(bytes: Bytes) -> Self {
        bytes.into()
    }
}

impl RejectionBody for String {
    fn from_rejection(bytes: Bytes) -> Self {
        // The layer's rejection bodies are JSON or empty: always UTF-8.
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl RejectionBody for Full<Bytes> {
    fn from_rejection(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl<E: 'static> RejectionBody for UnsyncBoxBody<Bytes, E> {
    fn from_rejection(bytes: Bytes) -> Self {
        Full::new(bytes).map_err(|never| match never {}).boxed_unsync()
    }
}

impl<E: 'static> RejectionBody for BoxBody<Bytes, E> {
    fn from_rejection(bytes: Bytes) -> Self {
        Full::new(bytes).map_err(|never| match never {}).boxed()
    }
}

#[cfg(feature = "axum")]
impl RejectionBody for axum::body::Body {
    fn from_rejection(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }
}

#[cfg(feature = "tonic")]
impl RejectionBody for tonic::body::Body {
    fn from_rejection(bytes: Bytes) -> Self {
        tonic::body::Body::new(Full::new(bytes))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use http_body::Body;

    use super::*;

    async fn collect<B: Body>(body: B) -> Bytes
    where
        B::Error: std::fmt::Debug,
    {
        body.collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn every_body_carries_the_bytes() {
        let bytes = Bytes::from_static(b"{}");
        assert_eq!(String::from_rejection(bytes.clone()), "{}");
        assert_eq!(Vec::<u8>::from_rejection(bytes.clone()), b"{}");
        assert_eq!(collect(Full::from_rejection(bytes.clone())).await, "{}");
        assert_eq!(
            collect(UnsyncBoxBody::<Bytes, std::io::Error>::from_rejection(bytes.clone())).await,
            "{}"
        );
        assert_eq!(collect(BoxBody::<Bytes, std::io::Error>::from_rejection(bytes)).await, "{}");
        assert!(Full::from_rejection(Bytes::new()).is_end_stream());
    }
}
