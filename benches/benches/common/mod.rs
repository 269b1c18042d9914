//! What the criterion benches share (each includes this file as `mod common`):
//! the run lengths, and timing one request per iteration through a router.

#![allow(dead_code)] // Each bench uses its own part.

use std::hint::black_box;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use criterion::measurement::WallTime;
use criterion::{BatchSize, Bencher, Criterion};
use http::{Request, Response};
use tokio::runtime::Runtime;
use tower::{Service, ServiceExt};

/// 1 s of warm-up and 3 s of measurement per row: enough for stable medians on
/// requests of a microsecond or so, short enough to run every bench in minutes.
pub(crate) fn brief() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3))
}

/// What `bench_function` times for one row: one request per iteration through
/// `ready().call()` on a clone of `router` (an `Arc` clone); `make` builds it and
/// the response is dropped outside the timing (`iter_batched`); `check` looks at
/// each response, inside.
pub(crate) fn each_request<'a>(
    runtime: &'a Runtime,
    router: &'a Router,
    make: impl Fn() -> Request<Body> + 'a,
    check: impl Fn(&Response<Body>) + Copy + 'a,
) -> impl FnMut(&mut Bencher<'_, WallTime>) + 'a {
    move |b| {
        b.to_async(runtime).iter_batched(
            || (router.clone(), make()),
            |(mut router, req)| async move {
                let ready = ServiceExt::<Request<Body>>::ready(&mut router).await.expect("infallible");
                let response = ready.call(req).await.expect("infallible");
                check(&response);
                black_box(response)
            },
            BatchSize::SmallInput,
        );
    }
}

/// A `check` for rows whose every answer is the row's point, whatever its status.
pub(crate) fn any_status(_: &Response<Body>) {}

/// A `check` for rows that must be admitted: a failure (a 503 from a store that
/// cannot write, say) must stop the bench, not be timed as a fast answer.
pub(crate) fn success(response: &Response<Body>) {
    assert!(response.status().is_success(), "{}", response.status());
}
