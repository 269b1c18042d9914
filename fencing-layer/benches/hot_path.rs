//! The layer's per-request cost on the hot path: an axum router with a trivial
//! handler, bare and fenced, driven through `ready().call()` in one thread.
//! The full comparison (alternatives, contention, durable store, memory) lives
//! in the `fencing-benches` package.

use std::hint::black_box;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use fencing_layer::{FencingLayer, MarkStore};
use http::Request;
use tower::{Service, ServiceExt};

fn request(path: &str, token: Option<&str>) -> Request<Body> {
    let mut request = Request::post(path);
    if let Some(token) = token {
        request = request.header("fencing-token", token);
    }
    request.body(Body::empty()).unwrap()
}

fn hot_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let routes = || Router::new().route("/logs/{name}", post(|| async { "ok" }));
    // `with_state(())`, as `axum::serve` does: the route layers are then built once, not per request.
    let bare = routes().with_state::<()>(());
    let store = MarkStore::in_memory();
    store.seed("/logs/hot", 7).unwrap();
    let fenced = routes().route_layer(FencingLayer::new().store(store)).with_state::<()>(());

    let mut group = c.benchmark_group("hot_path");
    group.throughput(Throughput::Elements(1));
    for (name, router, token) in [("bare", &bare, None), ("fenced_current_token", &fenced, Some("7"))] {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter_batched(
                || (router.clone(), request("/logs/hot", token)),
                |(mut router, req)| async move {
                    let ready = ServiceExt::<Request<Body>>::ready(&mut router).await.unwrap();
                    black_box(ready.call(req).await.unwrap())
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
