//! The axum feature: the token extractor, its rejection, and the path-parameter key.
#![cfg(feature = "axum")]

use crate::common::Reply;
use axum::Router;
use axum::body::Body;
use axum::routing::post;
use fencing_layer::{FencingLayer, FencingToken, MarkStore, key::PathParamKey};
use http::{Request, StatusCode};
use tower::ServiceExt;

async fn send(router: &Router, method: &str, uri: &str, token: Option<&str>) -> Reply {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("fencing-token", token);
    }
    Reply::read(router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap()).await
}

fn body(reply: &Reply) -> &str {
    std::str::from_utf8(&reply.body).unwrap()
}

#[tokio::test]
async fn handlers_extract_the_admitted_token() {
    let router = Router::new()
        .route(
            "/docs/{doc}",
            post(|token: FencingToken| async move { token.to_string() })
                .get(|token: Option<FencingToken>| async move { format!("{token:?}") }),
        )
        .route_layer(FencingLayer::new());
    let reply = send(&router, "POST", "/docs/a", Some("42")).await;
    assert_eq!((reply.status, body(&reply)), (StatusCode::OK, "42"));
    let reply = send(&router, "GET", "/docs/a", None).await;
    assert_eq!((reply.status, body(&reply)), (StatusCode::OK, "None"));
}

#[tokio::test]
async fn a_missing_layer_is_a_clear_500() {
    let router =
        Router::new().route("/docs/{doc}", post(|token: FencingToken| async move { token.to_string() }));
    let reply = send(&router, "POST", "/docs/a", Some("42")).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.headers["content-type"], "application/problem+json");
    assert!(body(&reply).contains("no FencingLayer admitted this request"));
}

#[tokio::test]
async fn path_param_keys_share_a_mark_across_routes_and_nesting() {
    let store = MarkStore::in_memory();
    let layer = FencingLayer::new().store(store.clone()).key_extractor(PathParamKey::new("doc"));
    let docs = Router::new()
        .route("/t/{tenant}/docs/{doc}", post(|| async {}))
        .route("/files/{*doc}", post(|| async {}))
        .route_layer(layer.clone());
    let router = Router::new().nest("/v1", docs).route("/plain", post(|| async {}).route_layer(layer));

    assert_eq!(send(&router, "POST", "/v1/t/acme/docs/42", Some("5")).await.status, StatusCode::OK);
    assert_eq!(store.mark("42"), Some(5));
    // Another tenant path to the same document id, percent-encoded: same mark.
    assert_eq!(send(&router, "POST", "/v1/t/other/docs/%342", Some("4")).await.status, StatusCode::CONFLICT);
    assert_eq!(send(&router, "POST", "/v1/files/a/b", Some("1")).await.status, StatusCode::OK);
    assert_eq!(store.mark("a/b"), Some(1));
    // A route without the parameter has no key.
    let reply = send(&router, "POST", "/plain", Some("1")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem()["type"], "urn:fencing:problem:missing-key");
    assert_eq!(
        reply.problem()["detail"],
        "no resource key in the request: the route /plain has no path parameter doc"
    );
}

#[tokio::test]
async fn by_default_the_handler_gets_the_token_without_an_extension_and_waits_its_turn() {
    use axum::Extension;
    use std::sync::{Arc, Mutex};
    use tokio::sync::{Notify, mpsc};

    let store = MarkStore::in_memory();
    // The default layer: no extension insert.
    let layer = FencingLayer::new().store(store.clone());
    // The handler records what it saw: the extractor's token, the extension (absent), the header.
    let (entered, mut entries) = mpsc::unbounded_channel::<String>();
    let release = Arc::new(Notify::new());
    let hold_first = Arc::new(Mutex::new(true));
    let handler = {
        let release = Arc::clone(&release);
        move |token: FencingToken, extension: Option<Extension<FencingToken>>, headers: http::HeaderMap| {
            let (entered, release, hold_first) =
                (entered.clone(), Arc::clone(&release), Arc::clone(&hold_first));
            async move {
                let header = headers["fencing-token"].to_str().unwrap().to_owned();
                let extension = extension.map(|Extension(token)| token);
                entered.send(format!("{token} {extension:?} {header}")).unwrap();
                let hold = std::mem::replace(&mut *hold_first.lock().unwrap(), false);
                if hold {
                    release.notified().await;
                }
                // Still the admitted token after the handler waited (another request ran meanwhile).
                assert_eq!(FencingToken::current(), Some(token));
                token.to_string()
            }
        }
    };
    let router = Router::new().route("/docs/{doc}", post(handler)).route_layer(layer);

    // Token 5 enters and stays inside; token 6 must wait for it to leave.
    let first = tokio::spawn({
        let router = router.clone();
        async move { send(&router, "POST", "/docs/a", Some("5")).await }
    });
    assert_eq!(entries.recv().await.unwrap(), "5 None 5");
    let second = tokio::spawn({
        let router = router.clone();
        async move { send(&router, "POST", "/docs/a", Some("6")).await }
    });
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(entries.try_recv().is_err(), "token 6 entered while token 5 was inside");
    assert_eq!(store.mark("/docs/a"), Some(6), "the mark rises at once");
    release.notify_one();
    let first = first.await.unwrap();
    assert_eq!((first.status, body(&first)), (StatusCode::OK, "5"));
    assert_eq!(entries.recv().await.unwrap(), "6 None 6");
    let second = second.await.unwrap();
    assert_eq!((second.status, body(&second)), (StatusCode::OK, "6"));
    assert_eq!(send(&router, "POST", "/docs/a", Some("5")).await.status, StatusCode::CONFLICT);
    assert_eq!(FencingToken::current(), None, "left set outside the layer");
}

#[tokio::test]
async fn with_token_extension_the_token_is_also_in_the_extensions() {
    use axum::Extension;

    let layer = FencingLayer::new().token_extension(true);
    let router = Router::new()
        .route(
            "/docs/{doc}",
            post(|Extension(token): Extension<FencingToken>| async move { token.to_string() }),
        )
        .route_layer(layer);
    let reply = send(&router, "POST", "/docs/a", Some("8")).await;
    assert_eq!((reply.status, body(&reply)), (StatusCode::OK, "8"));
    // The default layer does not insert it: axum's own extractor says so.
    let router = Router::new()
        .route(
            "/docs/{doc}",
            post(|Extension(token): Extension<FencingToken>| async move { token.to_string() }),
        )
        .route_layer(FencingLayer::new());
    assert_eq!(send(&router, "POST", "/docs/a", Some("8")).await.status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn a_layer_between_cannot_make_the_handler_see_another_token() {
    use axum::middleware::{self, Next};

    // Rewrites the token header (and the extension) after the fencing layer checked it.
    async fn rewrite(mut request: axum::extract::Request, next: Next) -> axum::response::Response {
        request.headers_mut().insert("fencing-token", http::HeaderValue::from_static("999"));
        request.extensions_mut().insert(FencingToken::new(999));
        next.run(request).await
    }
    let store = MarkStore::in_memory();
    let router = Router::new()
        .route("/docs/{doc}", post(|token: FencingToken| async move { token.to_string() }))
        .route_layer(middleware::from_fn(rewrite))
        .route_layer(FencingLayer::new().store(store.clone()));
    let reply = send(&router, "POST", "/docs/a", Some("4")).await;
    assert_eq!((reply.status, body(&reply)), (StatusCode::OK, "4"));
    assert_eq!(store.mark("/docs/a"), Some(4));
}
