//! Two fenced routers on one store (as with one durable file per process): a
//! tenant header `acme` on one and a path parameter `acme` on the other are one
//! mark without namespaces, two with them.
#![cfg(feature = "axum")]

use axum::Router;
use axum::body::Body;
use axum::routing::put;
use fencing_layer::{
    FencingLayer, MarkStore,
    key::{HeaderKey, PathParamKey},
};
use http::{Request, StatusCode};
use tower::ServiceExt;

async fn put_with(router: &Router, uri: &str, tenant: &str, token: u64) -> StatusCode {
    let request = Request::put(uri)
        .header("x-tenant", tenant)
        .header("fencing-token", token.to_string())
        .body(Body::empty())
        .unwrap();
    router.clone().oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn namespaces_keep_two_routers_keys_apart_on_one_store() {
    let store = MarkStore::in_memory();
    let tenants = FencingLayer::new().store(store.clone()).key_extractor(HeaderKey::new("x-tenant"));
    let accounts = FencingLayer::new().store(store.clone()).key_extractor(PathParamKey::new("id"));
    let router = Router::new()
        .route("/tenants/settings", put(|| async {}).route_layer(tenants.clone().key_namespace("tenants")))
        .route("/accounts/{id}", put(|| async {}).route_layer(accounts.clone().key_namespace("accounts")));
    assert_eq!(put_with(&router, "/tenants/settings", "acme", 100).await, StatusCode::OK);
    // Account acme's holder has token 12: not stale, its key is its own.
    assert_eq!(put_with(&router, "/accounts/acme", "other", 12).await, StatusCode::OK);
    assert_eq!(put_with(&router, "/accounts/acme", "other", 11).await, StatusCode::CONFLICT);
    assert_eq!(store.mark("tenants:acme"), Some(100));
    assert_eq!(store.mark("accounts:acme"), Some(12));
    assert_eq!(store.mark("acme"), None);

    // Without namespaces (the default, unchanged): one key, `acme`, and the account's holder is locked out.
    let store = MarkStore::in_memory();
    let router = Router::new()
        .route("/tenants/settings", put(|| async {}).route_layer(tenants.store(store.clone())))
        .route("/accounts/{id}", put(|| async {}).route_layer(accounts.store(store.clone())));
    assert_eq!(put_with(&router, "/tenants/settings", "acme", 100).await, StatusCode::OK);
    assert_eq!(put_with(&router, "/accounts/acme", "other", 12).await, StatusCode::CONFLICT);
    assert_eq!(store.marks(), vec![("acme".to_owned(), 100)]);
}

/// The namespace applies whatever the order of the builder calls: set before
/// the extractor (the natural order), after it, before a `key_fn`, or on the
/// default path key. The 409's body names the namespaced key too.
#[tokio::test]
async fn the_namespace_applies_in_either_builder_order() {
    let store = MarkStore::in_memory();
    let before =
        FencingLayer::new().store(store.clone()).key_namespace("docs").key_extractor(PathParamKey::new("id"));
    let after = FencingLayer::new()
        .store(store.clone())
        .key_extractor(PathParamKey::new("id"))
        .key_namespace("notes");
    let closure =
        FencingLayer::new().store(store.clone()).key_namespace("tenants").key_fn(|r| r.header("x-tenant"));
    let path = FencingLayer::new().store(store.clone()).key_namespace("paths");
    let router = Router::new()
        .route("/docs/{id}", put(|| async {}).route_layer(before))
        .route("/notes/{id}", put(|| async {}).route_layer(after))
        .route("/settings", put(|| async {}).route_layer(closure))
        .route("/plain", put(|| async {}).route_layer(path));
    assert_eq!(put_with(&router, "/docs/42", "t", 7).await, StatusCode::OK);
    assert_eq!(put_with(&router, "/notes/42", "t", 8).await, StatusCode::OK);
    assert_eq!(put_with(&router, "/settings", "acme", 9).await, StatusCode::OK);
    assert_eq!(put_with(&router, "/plain", "t", 10).await, StatusCode::OK);
    let mut marks = store.marks();
    marks.sort();
    let expected = [("docs:42", 7), ("notes:42", 8), ("paths:/plain", 10), ("tenants:acme", 9)];
    assert_eq!(marks, expected.map(|(key, mark)| (key.to_owned(), mark)).to_vec());

    let stale = Request::put("/docs/42").header("fencing-token", "6").body(Body::empty()).unwrap();
    let response = router.clone().oneshot(stale).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["key"], "docs:42", "{problem}");
}
