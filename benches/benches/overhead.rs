//! What one request costs through the fencing layer, next to the bare router, a
//! no-op layer and the alternatives (a hand-written `from_fn` check, tower_governor's
//! keyed limiter), at 1, 1,000 and 1,000,000 pre-seeded keys.
//!
//! Every service is built once, outside the timed loop; each iteration is one
//! request through `ready().call()` on a clone of the router (an `Arc` clone),
//! on a current-thread runtime. Requests are built, and responses dropped,
//! outside the timing (`iter_batched`).
//!
//! Rows of group `overhead`:
//! - `bare`, `noop_layer`: the floor (keys do not apply; `noop_layer/N` repeats the
//!   no-op row next to the rows at N keys, so each ratio compares neighbours);
//! - `fenced_hot/N`: a seeded key, its current token (the common case);
//! - `fenced_lean_hot/N`: the same through a layer with `token_extension(false)`;
//! - `fenced_raise/N`: a token one higher than the last, every request;
//! - `fenced_stale/N`: a token below the mark (409, problem+json body);
//! - `fenced_missing/N`: no token (428);
//! - `fenced_get/N`: a GET (passes through);
//! - `handwritten_hot/N`: `from_fn` + `Mutex<HashMap<String, u64>>`, current token;
//! - `governor_hot/N`: tower_governor keyed by path, quota never reached.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fencing_benches::{fenced, fenced_lean, governor, handwritten, noop, request, routes, seeded_store};
use http::{Method, Request};
use tokio::runtime::Runtime;
use tower::{Service, ServiceExt};

const HOT: &str = "/logs/hot";
const RAISE: &str = "/logs/raise";
const STALE: &str = "/logs/stale";
const KEY_COUNTS: [usize; 3] = [1, 1_000, 1_000_000];

/// Times one request per iteration: `make` builds it (untimed), the router answers it.
fn bench_requests(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    runtime: &Runtime,
    id: BenchmarkId,
    router: &Router,
    make: impl Fn() -> Request<Body>,
) {
    group.bench_function(id, |b| {
        b.to_async(runtime).iter_batched(
            || (router.clone(), make()),
            |(mut router, req)| async move {
                let ready = ServiceExt::<Request<Body>>::ready(&mut router).await.expect("infallible");
                black_box(ready.call(req).await.expect("infallible"))
            },
            BatchSize::SmallInput,
        );
    });
}

fn overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("overhead");
    group.throughput(Throughput::Elements(1));

    let hot = || request(Method::POST, HOT, Some("7"));
    bench_requests(&mut group, &runtime, BenchmarkId::from_parameter("bare"), &routes(), hot);
    bench_requests(&mut group, &runtime, BenchmarkId::from_parameter("noop_layer"), &noop(), hot);

    for keys in KEY_COUNTS {
        // The hot, raise and stale keys come on top of the `keys - 1` others, so the
        // table holds `keys` keys (plus the two special ones) as the row says.
        let others = keys - 1;
        let store = seeded_store(others, 8, &[(HOT, 7), (RAISE, 1), (STALE, 100)]);
        let router = fenced(store.clone());
        let lean = fenced_lean(store);
        let id = |name: &str| BenchmarkId::new(name, keys);
        // The no-op layer again, right before the rows it is the floor for, so that a
        // ratio compares runs minutes apart as little as possible on a busy machine.
        bench_requests(&mut group, &runtime, id("noop_layer"), &noop(), hot);
        bench_requests(&mut group, &runtime, id("fenced_hot"), &router, hot);
        bench_requests(&mut group, &runtime, id("fenced_lean_hot"), &lean, hot);
        drop(lean);
        let next = Cell::new(1u64);
        bench_requests(&mut group, &runtime, id("fenced_raise"), &router, || {
            next.set(next.get() + 1);
            request(Method::POST, RAISE, Some(&next.get().to_string()))
        });
        bench_requests(&mut group, &runtime, id("fenced_stale"), &router, || {
            request(Method::POST, STALE, Some("5"))
        });
        bench_requests(&mut group, &runtime, id("fenced_missing"), &router, || {
            request(Method::POST, HOT, None)
        });
        bench_requests(&mut group, &runtime, id("fenced_get"), &router, || request(Method::GET, HOT, None));
        drop(router);

        let router = handwritten::router(handwritten::seeded(others, &[(HOT, 7)]));
        bench_requests(&mut group, &runtime, id("handwritten_hot"), &router, hot);
        drop(router);

        let config = governor::seeded(others);
        let _ = config.limiter().check_key(&HOT.to_owned());
        let router = governor::router(config);
        bench_requests(&mut group, &runtime, id("governor_hot"), &router, hot);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = overhead
}
criterion_main!(benches);
