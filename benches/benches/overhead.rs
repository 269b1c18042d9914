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
//! - `fenced_extension_hot/N`: the same through a layer with `token_extension(true)`;
//! - `fenced_raise/N`: a token one higher than the last, every request;
//! - `fenced_stale/N`: a token below the mark (409, problem+json body);
//! - `fenced_missing/N`: no token (428);
//! - `fenced_get/N`: a GET (passes through);
//! - `handwritten_hot/N`: `from_fn` + `Mutex<HashMap<String, u64>>`, current token;
//! - `governor_hot/N`: tower_governor keyed by path, quota never reached.

mod common;

use std::cell::Cell;

use common::{any_status, each_request};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fencing_benches::{fenced, fenced_extension, governor, handwritten, noop, request, routes, seeded_store};
use http::Method;

const HOT: &str = "/logs/hot";
const RAISE: &str = "/logs/raise";
const STALE: &str = "/logs/stale";
const KEY_COUNTS: [usize; 3] = [1, 1_000, 1_000_000];

fn overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("overhead");
    group.throughput(Throughput::Elements(1));

    let hot = || request(Method::POST, HOT, Some("7"));
    group.bench_function(
        BenchmarkId::from_parameter("bare"),
        each_request(&runtime, &routes(), hot, any_status),
    );
    group.bench_function(
        BenchmarkId::from_parameter("noop_layer"),
        each_request(&runtime, &noop(), hot, any_status),
    );

    for keys in KEY_COUNTS {
        // The hot, raise and stale keys come on top of the `keys - 1` others, so the
        // table holds `keys` keys (plus the two special ones) as the row says.
        let others = keys - 1;
        let store = seeded_store(others, 8, &[(HOT, 7), (RAISE, 1), (STALE, 100)]);
        let router = fenced(store.clone());
        let extension = fenced_extension(store);
        let id = |name: &str| BenchmarkId::new(name, keys);
        // The no-op layer again, right before the rows it is the floor for, so that a
        // ratio compares runs minutes apart as little as possible on a busy machine.
        group.bench_function(id("noop_layer"), each_request(&runtime, &noop(), hot, any_status));
        group.bench_function(id("fenced_hot"), each_request(&runtime, &router, hot, any_status));
        group.bench_function(id("fenced_extension_hot"), each_request(&runtime, &extension, hot, any_status));
        drop(extension);
        let next = Cell::new(1u64);
        let raise = || {
            next.set(next.get() + 1);
            request(Method::POST, RAISE, Some(&next.get().to_string()))
        };
        group.bench_function(id("fenced_raise"), each_request(&runtime, &router, raise, any_status));
        let stale = || request(Method::POST, STALE, Some("5"));
        group.bench_function(id("fenced_stale"), each_request(&runtime, &router, stale, any_status));
        let missing = || request(Method::POST, HOT, None);
        group.bench_function(id("fenced_missing"), each_request(&runtime, &router, missing, any_status));
        let get = || request(Method::GET, HOT, None);
        group.bench_function(id("fenced_get"), each_request(&runtime, &router, get, any_status));
        drop(router);

        let router = handwritten::router(handwritten::seeded(others, &[(HOT, 7)]));
        group.bench_function(id("handwritten_hot"), each_request(&runtime, &router, hot, any_status));
        drop(router);

        let config = governor::seeded(others);
        let _ = config.limiter().check_key(&HOT.to_owned());
        let router = governor::router(config);
        group.bench_function(id("governor_hot"), each_request(&runtime, &router, hot, any_status));
    }
    group.finish();
}

criterion_group!(name = benches; config = common::brief(); targets = overhead);
criterion_main!(benches);
