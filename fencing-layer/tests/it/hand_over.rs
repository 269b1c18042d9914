//! `FencingLayer::hand_over_places`: the place inside travels with the request,
//! and the request counts as inside until whoever took it drops it, not when
//! the response future ends. On tokio's paused clock, as `overlap.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::routing::post;
use fencing_layer::future::HeldPlace;
use fencing_layer::store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore};
use fencing_layer::{FencingLayer, InFlightPolicy};
use http::StatusCode;
use tokio::sync::oneshot;
use tokio::time::sleep;

use crate::common::{post_token, spawn_post};

/// A router whose handler answers at once and leaves the request's place in `kept`.
fn keeping(layer: FencingLayer, kept: Arc<Mutex<Vec<HeldPlace>>>) -> Router {
    let handler = move |request: Request| {
        let kept = kept.clone();
        async move {
            if let Some(place) = request.extensions().get::<HeldPlace>() {
                kept.lock().unwrap().push(place.clone());
            }
            "ok"
        }
    };
    Router::new().route("/r/{key}", post(handler)).route_layer(layer)
}

#[tokio::test(start_paused = true)]
async fn a_higher_token_waits_for_the_handed_over_place_not_for_the_response() {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let router = keeping(FencingLayer::new().hand_over_places(true), kept.clone());
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::OK);
    let place = kept.lock().unwrap().pop().expect("the handler got the place");
    assert_eq!(place.token().get(), 1);
    assert!(place.is_held());
    // Token 1's response is done, but its place is still held: token 2 waits.
    let second = spawn_post(&router, 0, 2);
    sleep(Duration::from_secs(2)).await;
    assert!(!second.is_finished(), "token 2 entered while token 1's place was held");
    // Equal tokens still share the inside, and the mark rose: 1 is stale now.
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::CONFLICT);
    assert_eq!(post_token(&router, 7, 5).await.status, StatusCode::OK, "another key is not held up");
    drop(place);
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_place_nobody_took_is_released_with_the_request() {
    let layer = FencingLayer::new().hand_over_places(true);
    let router = Router::new().route("/r/{key}", post(|| async { "ok" })).route_layer(layer);
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::OK);
    // Dropped with the request's extensions: token 2 does not wait.
    let second = post_token(&router, 0, 2);
    let reply = tokio::time::timeout(Duration::from_millis(1), second).await.expect("token 2 waited");
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn the_drain_bound_still_answers_503_while_a_place_is_held() {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let layer = FencingLayer::new().hand_over_places(true).drain_timeout(Duration::from_secs(3));
    let router = keeping(layer, kept.clone());
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::OK);
    let reply = post_token(&router, 0, 2).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.problem()["type"], "urn:fencing:problem:drain-timeout");
    kept.lock().unwrap().clear();
    // The mark stayed raised: token 2 enters now that the place is gone.
    assert_eq!(post_token(&router, 0, 2).await.status, StatusCode::OK);
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::CONFLICT);
}

#[tokio::test(start_paused = true)]
async fn the_cancel_policy_cannot_take_back_a_handed_over_place() {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let layer = FencingLayer::new().hand_over_places(true).in_flight_policy(InFlightPolicy::Cancel);
    let router = keeping(layer, kept.clone());
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::OK);
    let second = spawn_post(&router, 0, 2);
    sleep(Duration::from_secs(1)).await;
    assert!(!second.is_finished(), "token 2 entered while token 1's handed-over place was held");
    kept.lock().unwrap().clear();
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
}

/// A shared store whose permits its test can revoke.
#[derive(Clone, Default)]
struct Revoking(Arc<Mutex<Vec<oneshot::Sender<()>>>>);

impl SharedStore for Revoking {
    fn admit(&self, _key: &str, _token: u64, _drain: Duration) -> SharedAdmission {
        let (revoke, revoked) = oneshot::channel::<()>();
        self.0.lock().unwrap().push(revoke);
        Box::pin(async move {
            Ok::<_, SharedRefusal>(SharedPermit::revocable((), async move {
                let _ = revoked.await;
            }))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_shared_stores_revocation_reaches_the_holder_of_the_place() {
    let store = Revoking::default();
    let kept = Arc::new(Mutex::new(Vec::new()));
    let router =
        keeping(FencingLayer::new().hand_over_places(true).shared_store(store.clone()), kept.clone());
    let request = http::Request::post("/r/0").header("fencing-token", "4").body(Body::empty()).unwrap();
    let reply = tower::ServiceExt::oneshot(router, request).await.unwrap();
    // The layer no longer holds the work, so it answers what the handler made.
    assert_eq!(reply.status(), StatusCode::OK);
    let place = kept.lock().unwrap().pop().expect("the handler got the place");
    assert!(place.is_held());
    let watcher = tokio::spawn({
        let place = place.clone();
        async move { place.revoked().await }
    });
    sleep(Duration::from_secs(1)).await;
    assert!(!watcher.is_finished(), "revoked before the store said so");
    store.0.lock().unwrap().pop().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(1), watcher).await.expect("the revocation arrived").unwrap();
    assert!(!place.is_held());
}
