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
