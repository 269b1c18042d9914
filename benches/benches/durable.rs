//! The durable store (`MarkStore::open`, redb): the raise path, where each raise
//! is fsync'd before the request is admitted, and the equal-token path, which does
//! no disk I/O; with the in-memory store's two paths as the reference.
//!
//! One request per iteration through `ready().call()` on a current-thread
//! runtime; requests built and responses dropped outside the timing. The
//! marks file lives in a temporary directory (on the file system of `TMPDIR`).
//!
//! Rows of group `durable`: `{redb|memory}_{raise|hot}`.

mod common;

use std::cell::Cell;

use common::{each_request, success};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fencing_benches::{fenced, request};
use fencing_layer::MarkStore;
use http::Method;

const HOT: &str = "/logs/hot";
const RAISE: &str = "/logs/raise";

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
        let raise = || {
            next.set(next.get() + 1);
            request(Method::POST, RAISE, Some(&next.get().to_string()))
        };
        group.bench_function(format!("{name}_raise"), each_request(&runtime, &router, raise, success));
        let hot = || request(Method::POST, HOT, Some("7"));
        group.bench_function(format!("{name}_hot"), each_request(&runtime, &router, hot, success));
    }
    group.finish();
}

criterion_group!(name = benches; config = common::brief(); targets = durable);
criterion_main!(benches);
