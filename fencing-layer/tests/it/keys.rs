//! Key functions and combined keys through a real axum app: closures need no
//! annotations and may borrow their key, parts combine, and a request without
//! a key is told what it lacked.
#![cfg(feature = "axum")]

use crate::common::{Reply, app};
use axum::Router;
use axum::body::Body;
use fencing_layer::{
    FencingLayer, MarkStore,
    key::{HeaderKey, KeyExtractor, KeyExtractorExt, PathParamKey},
};
use http::{HeaderName, Request, StatusCode};
use tower::ServiceExt;

async fn post(router: &Router, uri: &str, token: &str, tenant: Option<&str>) -> Reply {
    let mut request = Request::post(uri).header("fencing-token", token);
    if let Some(tenant) = tenant {
        request = request.header("x-tenant", tenant);
    }
    Reply::read(router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap()).await
}

/// A router over `app` fenced by a layer keyed by `extractor`, and its store.
fn keyed_by<E>(extractor: E) -> (Router, MarkStore)
where
    E: KeyExtractor<Body> + Clone + Send + Sync + 'static,
{
    let store = MarkStore::in_memory();
    let (router, _) = app(FencingLayer::new().store(store.clone()).key_extractor(extractor));
    (router, store)
}

fn tenant() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-tenant"))
}

#[tokio::test]
async fn a_borrowing_key_fn_keys_by_tenant() {
    let store = MarkStore::in_memory();
    // No annotations, and the key borrows from the request.
    let layer = FencingLayer::new().store(store.clone()).key_fn(|request| request.header("x-tenant"));
    let (router, writes) = app(layer);

    assert_eq!(post(&router, "/logs/a", "5", Some("acme")).await.status, StatusCode::OK);
    assert_eq!(post(&router, "/logs/b", "1", Some("other")).await.status, StatusCode::OK);
    // The tenant's mark covers every path.
    let stale = post(&router, "/logs/b", "4", Some("acme")).await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(stale.problem()["key"], "acme");
    assert_eq!((store.mark("acme"), store.mark("other")), (Some(5), Some(1)));

    let missing = post(&router, "/logs/a", "9", None).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    // The header the function asked for is named, as docs/integrating.md shows.
    assert_eq!(missing.problem()["detail"], "no resource key in the request: header x-tenant is missing");
    assert_eq!(writes.seen().len(), 2);
}

#[tokio::test]
async fn an_owned_key_fn_builds_its_key() {
    let store = MarkStore::in_memory();
    let layer = FencingLayer::new().store(store.clone()).key_fn_owned(|request| {
        let tenant = request.header("x-tenant")?;
        Some(format!("{tenant}:{}", request.path().rsplit('/').next()?))
    });
    let (router, _) = app(layer);
    assert_eq!(post(&router, "/logs/a", "3", Some("acme")).await.status, StatusCode::OK);
    assert_eq!(post(&router, "/logs/a", "2", Some("acme")).await.status, StatusCode::CONFLICT);
    assert_eq!(post(&router, "/logs/a", "1", Some("other")).await.status, StatusCode::OK);
    assert_eq!((store.mark("acme:a"), store.mark("other:a")), (Some(3), Some(1)));
}

#[tokio::test]
async fn a_header_and_a_path_parameter_make_one_key() {
    let (router, store) = keyed_by(tenant().and(PathParamKey::new("name")));

    assert_eq!(post(&router, "/logs/billing", "7", Some("acme")).await.status, StatusCode::OK);
    assert_eq!(post(&router, "/logs/billing", "6", Some("acme")).await.status, StatusCode::CONFLICT);
    assert_eq!(post(&router, "/logs/billing", "1", Some("other")).await.status, StatusCode::OK);
    assert_eq!(store.mark("acme|billing"), Some(7));
    assert_eq!(store.mark("other|billing"), Some(1));

    let missing = post(&router, "/logs/billing", "9", None).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem()["detail"], "no resource key in the request: header x-tenant is missing");
    // As docs/integrating.md shows it.
    assert_eq!(
        missing.body,
        r#"{"type":"urn:fencing:problem:missing-key","title":"No resource key","status":400,"detail":"no resource key in the request: header x-tenant is missing"}"#
    );
}

#[tokio::test]
async fn or_falls_back_to_the_next_extractor() {
    let (router, store) = keyed_by(tenant().or(PathParamKey::new("name")));
    assert_eq!(post(&router, "/logs/billing", "2", Some("acme")).await.status, StatusCode::OK);
    assert_eq!(post(&router, "/logs/billing", "1", None).await.status, StatusCode::OK);
    assert_eq!((store.mark("acme"), store.mark("billing")), (Some(2), Some(1)));
}
