//! Contention: 1 and 2 threads sending requests with the current token, all to
//! one hot key or each thread to its own key, through the bare router, the no-op
//! layer, the fencing layer, the hand-written `from_fn` check and tower_governor.
//!
//! Each sample spawns N std threads, each with its own current-thread runtime and
//! router clone; they start together at a barrier and split the sample's
//! iterations between them. The time is the wall time until the last thread is
//! done, so a row's time is per request in aggregate and its throughput is the
//! total throughput: perfect scaling halves the time at 2 threads. Requests are
//! built inside the timed loop here (the same work for every row).
//!
//! Rows of group `contention`: `{service}/{threads}t_{hot|distinct}`.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fencing_benches::{fenced, governor, handwritten, noop, request, routes, seeded_store};
use http::{Method, Request};
use tower::{Service, ServiceExt};

const HOT: &str = "/logs/hot";
const MAX_THREADS: usize = 2;

fn thread_key(thread: usize) -> String {
    format!("/logs/t{thread}")
}

/// Sends `iters` requests split over `threads` threads; returns the wall time.
fn run(router: &Router, threads: usize, iters: u64, distinct: bool) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let share = iters / threads as u64;
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let router = router.clone();
            let barrier = Arc::clone(&barrier);
            let n = if t == 0 { iters - share * (threads as u64 - 1) } else { share };
            let path = if distinct { thread_key(t) } else { HOT.to_owned() };
            std::thread::spawn(move || {
                let runtime =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                barrier.wait();
                runtime.block_on(async move {
                    let mut router = router;
                    for _ in 0..n {
                        let req = request(Method::POST, &path, Some("7"));
                        let ready =
                            ServiceExt::<Request<Body>>::ready(&mut router).await.expect("infallible");
                        let response = ready.call(req).await.expect("infallible");
                        debug_assert!(response.status().is_success());
                        drop(response);
                    }
                });
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for worker in workers {
        worker.join().expect("bench thread");
    }
    start.elapsed()
}

fn contention(c: &mut Criterion) {
    let keys: Vec<String> = std::iter::once(HOT.to_owned()).chain((0..MAX_THREADS).map(thread_key)).collect();
    let seeds: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), 7)).collect();

    let governor_config = governor::seeded(0);
    for key in &keys {
        let _ = governor_config.limiter().check_key(key);
    }
    let services = [
        ("bare", routes()),
        ("noop_layer", noop()),
        ("fenced", fenced(seeded_store(0, 0, &seeds))),
        ("handwritten", handwritten::router(handwritten::seeded(0, &seeds))),
        ("governor", governor::router(governor_config)),
    ];

    let mut group = c.benchmark_group("contention");
    group.throughput(Throughput::Elements(1));
    for (name, router) in &services {
        for threads in 1..=MAX_THREADS {
            for distinct in [false, true] {
                let id = format!("{threads}t_{}", if distinct { "distinct" } else { "hot" });
                group.bench_function(BenchmarkId::new(*name, id), |b| {
                    b.iter_custom(|iters| run(router, threads, iters, distinct));
                });
            }
        }
    }
    group.finish();
}

criterion_group!(name = benches; config = common::brief(); targets = contention);
criterion_main!(benches);
