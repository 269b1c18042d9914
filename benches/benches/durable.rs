//! The durable store (`MarkStore::open`, redb): the raise path, where each raise
//! is fsync'd before the request is admitted, and the equal-token path, which does
//! no disk I/O; with the in-memory store's two paths as the reference.
//!
//! One request per iteration through `ready().call()` on a current-thread
//! runtime; requests built and responses dropped outside the timing. The
//! marks file lives in a temporary directory (on the file system of `TMPDIR`).
//!
//! Rows of group `durable`: `{redb|memory}_{raise|hot}`.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use fencing_benches::{fenced, request};
use fencing_layer::MarkStore;
use http::{Method, Request};
use tokio::runtime::Runtime;
use tower::{Service, ServiceExt};

const HOT: &str = "/logs/hot";
const RAISE: &str = "/logs/raise";

fn bench(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    runtime: &Runtime,
    name: &str,
    router: &Router,
    make: impl Fn() -> Request<Body>,
) {
    group.bench_function(name, |b| {
        b.to_async(runtime).iter_batched(
            || (router.clone(), make()),
            |(mut router, req)| async move {
                let ready = ServiceExt::<Request<Body>>::ready(&mut router).await.expect("infallible");
                let response = ready.call(req).await.expect("infallible");
                assert!(response.status().is_success(), "{}", response.status());
                black_box(response)
            },
            BatchSize::SmallInput,
        );
    });
}

fn durable(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let stores = [
        ("redb", MarkStore::open(dir.path().join("marks.redb")).expect("open marks.redb")),
        ("memory", MarkStore::in_memory()),
    ];

    let mut group = c.benchmark_group("durable");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    for (name, store) in stores {
        store.seed(HOT, 7).expect("seed the hot key");
        store.seed(RAISE, 1).expect("seed the raise key");
        let router = fenced(store);
        let next = Cell::new(1u64);
        bench(&mut group, &runtime, &format!("{name}_raise"), &router, || {
            next.set(next.get() + 1);
            request(Method::POST, RAISE, Some(&next.get().to_string()))
        });
        bench(&mut group, &runtime, &format!("{name}_hot"), &router, || {
            request(Method::POST, HOT, Some("7"))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = durable
}
criterion_main!(benches);
