//! The layer's default responder works whatever body the inner service
//! answers with: `String`, boxed bodies, hyper's `Full`, axum's `Body`. Each is
//! driven through one admitted and one rejected request.

use std::convert::Infallible;

use bytes::Bytes;
use fencing_layer::{FencingLayer, Rejection};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// Sends a write with `token` to a fenced service answering `body()`; returns the status and body.
async fn send<B, F>(body: F, token: &str) -> (StatusCode, Bytes, Option<Rejection>)
where
    F: Fn() -> B + Clone + Send + 'static,
    B: Body + fencing_layer::respond::RejectionBody + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    let layer = FencingLayer::new();
    layer.mark_store().seed("/logs/a", 5).unwrap();
    let service = ServiceBuilder::new().layer(layer).service(service_fn(move |_: Request<()>| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(Response::new(body())) }
    }));
    let request = Request::post("/logs/a").header("Fencing-Token", token).body(()).unwrap();
    let mut response = service.oneshot(request).await.unwrap();
    let rejection = response.extensions_mut().remove::<Rejection>();
    let status = response.status();
    let collected = response.into_body().collect().await.unwrap().to_bytes();
    (status, collected, rejection)
}

fn is_stale_problem(body: &[u8]) -> bool {
    body.starts_with(br#"{"type":"urn:fencing:problem:stale-token""#)
}

#[tokio::test]
async fn a_string_body() {
    let (status, body, rejection) = send(|| String::from("stored"), "5").await;
    assert_eq!((status, &body[..], rejection), (StatusCode::OK, &b"stored"[..], None));
    let (status, body, rejection) = send(|| String::from("stored"), "4").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(is_stale_problem(&body), "{body:?}");
    assert!(matches!(rejection, Some(Rejection::Stale { presented: 4, highest: 5, .. })));
}

#[tokio::test]
async fn a_boxed_body() {
    let boxed = || UnsyncBoxBody::new(Full::new(Bytes::from_static(b"stored")).map_err(|e| match e {}));
    let (status, body, _) = send(boxed, "6").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"stored"[..]));
    let (status, body, _) = send(boxed, "1").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(is_stale_problem(&body), "{body:?}");
}

#[tokio::test]
async fn hyper_full_and_axum_bodies() {
    let full = || Full::new(Bytes::from_static(b"stored"));
    assert_eq!(send(full, "5").await.0, StatusCode::OK);
    assert!(is_stale_problem(&send(full, "3").await.1));
    let axum_body = || axum::body::Body::from("stored");
    assert_eq!(send(axum_body, "5").await.0, StatusCode::OK);
    let (status, body, _) = send(axum_body, "x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with(br#"{"type":"urn:fencing:problem:invalid-token""#), "{body:?}");
}

#[tokio::test]
async fn a_custom_responder_answers_with_the_inner_body_type() {
    let layer = FencingLayer::new().on_rejection(|rejection: &Rejection| {
        let mut response = Response::new(format!("refused: {}", rejection.kind()));
        *response.status_mut() = rejection.status();
        response
    });
    layer.mark_store().seed("/logs/a", 5).unwrap();
    let service = ServiceBuilder::new().layer(layer).service(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::from("stored")))
    }));
    let request = Request::post("/logs/a").header("Fencing-Token", "2").body(()).unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.into_body(), "refused: stale-token");
}
