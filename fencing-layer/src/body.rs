//! [`ResponseBody`]: the body of every response the layer returns.
//!
//! A rejection is answered by the layer itself, so its body is not one the
//! inner service made. As tower-http's middlewares do, the layer wraps the
//! inner service's body type in an enum that is either that body or the
//! rejection's bytes. That is what lets the default responder work with any
//! body: axum's, `String`, boxed bodies, hyper's `Full`, tonic's.
//!
//! ```
//! use bytes::Bytes;
//! use fencing_layer::FencingLayer;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::BodyExt;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // A service whose responses are `Response<String>`.
//! let app = ServiceBuilder::new().layer(FencingLayer::new()).service(service_fn(
//!     |_: Request<()>| async { Ok::<_, std::convert::Infallible>(Response::new(String::from("stored"))) },
//! ));
//! let stale = Request::post("/logs/x").header("Fencing-Token", "abc").body(()).unwrap();
//! let response = app.oneshot(stale).await.unwrap();
//! assert_eq!(response.status(), StatusCode::BAD_REQUEST);
//! let body: Bytes = response.into_body().collect().await.unwrap().to_bytes();
//! assert!(body.starts_with(br#"{"type":"urn:fencing:problem:invalid-token""#));
//! # }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The inner service's body, or the body of a rejection the layer answered.
    ///
    /// Implements [`http_body::Body`] whenever `B` does with data that can be
    /// made from [`Bytes`] (every common body: axum's, hyper's, `String`,
    /// boxed bodies, tonic's). Axum takes it as it takes any body.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // Taken by the one frame it sends.
        Rejection { bytes: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps a body from the inner service (or from a custom responder).
    pub fn new(body: B) -> Self {
        Self { kind: Kind::Inner { body } }
    }

    /// A body of `bytes`, sent in one frame: how the layer's own rejections travel.
    pub fn full(bytes: Bytes) -> Self {
        Self { kind: Kind::Rejection { bytes: Some(bytes).filter(|b| !b.is_empty()) } }
    }

    /// The inner body, when this is one.
    pub fn into_inner(self) -> Option<B> {
        match self.kind {
            Kind::Inner { body } => Some(body),
            Kind::Rejection { .. } => None,
        }
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(bytes: Bytes) -> Self {
        Self::full(bytes)
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Rejection { bytes } => {
                f.debug_tuple("ResponseBody::Rejection").field(&bytes.as_ref().map_or(0, Bytes::len)).finish()
            }
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Rejection { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b.into())))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Rejection { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Rejection { bytes } => SizeHint::with_exact(bytes.as_ref().map_or(0, Bytes::len) as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};

    use super::*;

    #[tokio::test]
    async fn a_rejection_body_is_one_exact_frame() {
        let body = ResponseBody::<Full<Bytes>>::full(Bytes::from_static(b"{}"));
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "{}");
        let empty = ResponseBody::<Full<Bytes>>::full(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn an_inner_body_passes_through() {
        let body = ResponseBody::new(String::from("stored"));
        assert_eq!(body.size_hint().exact(), Some(6));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "stored");
        assert_eq!(ResponseBody::new(String::from("x")).into_inner().as_deref(), Some("x"));
        assert!(ResponseBody::<String>::full(Bytes::from_static(b"x")).into_inner().is_none());
    }
}
