//! Where the layer goes in an axum app: on each route's method router
//! (`put(h).get(g).route_layer(layer)`), so that a method the route does not
//! serve gets axum's 405 and never reaches the layer. `Router::route_layer`
//! wraps each route's 405 fallback too: there a wrong method with a high token
//! raised the mark before axum refused it, and locked the real holder out.
#![cfg(feature = "axum")]

use crate::common::Reply;
use axum::Router;
use axum::body::Body;
use axum::routing::put;
use fencing_layer::{FencingLayer, MarkStore};
use http::{Request, StatusCode};
use tower::ServiceExt;

async fn send(router: &Router, method: &str, uri: &str, token: Option<&str>) -> StatusCode {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("fencing-token", token);
    }
    Reply::read(router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap()).await.status
}

/// The README's placement: a request axum refuses with 405 moves no mark.
#[tokio::test]
async fn a_method_the_route_does_not_serve_is_405_and_moves_no_mark() {
    let layer = FencingLayer::new();
    let store: MarkStore = layer.mark_store().clone();
    let router = Router::new()
        .route("/api/docs/{doc}", put(|| async { "stored" }).get(|| async { "read" }).route_layer(layer));
    assert_eq!(send(&router, "DELETE", "/api/docs/report", None).await, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        send(&router, "DELETE", "/api/docs/report", Some("100")).await,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(store.mark("/api/docs/report"), None, "a refused method raised the mark");
    assert_eq!(send(&router, "PUT", "/api/docs/report", Some("12")).await, StatusCode::OK);
    assert_eq!(send(&router, "PUT", "/api/docs/report", Some("11")).await, StatusCode::CONFLICT);
    assert_eq!(send(&router, "GET", "/api/docs/report", None).await, StatusCode::OK);
    // Unknown paths are the router's 404, outside every route's layer.
    assert_eq!(send(&router, "PUT", "/elsewhere", Some("1")).await, StatusCode::NOT_FOUND);
    assert_eq!(store.len(), 1);
}

/// Why not `Router::route_layer`: it wraps each route's 405 fallback as well,
/// so the layer sees (and fences) a method that axum then refuses. Kept as a
/// test so that the README's warning stays true of the axum in use.
#[tokio::test]
async fn router_route_layer_fences_the_405_fallback_too() {
    let layer = FencingLayer::new();
    let store = layer.mark_store().clone();
    let router = Router::new().route("/api/docs/{doc}", put(|| async { "stored" })).route_layer(layer);
    assert_eq!(send(&router, "DELETE", "/api/docs/report", None).await, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(
        send(&router, "DELETE", "/api/docs/report", Some("100")).await,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(store.mark("/api/docs/report"), Some(100));
    assert_eq!(send(&router, "PUT", "/api/docs/report", Some("12")).await, StatusCode::CONFLICT);
}
