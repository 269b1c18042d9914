//! A bare loop of requests through one service, for profilers (perf, callgrind):
//! no harness, no batching, so the profile is the request path and little else.
//!
//! ```text
//! cargo build --release -p fencing-benches --example hot_loop
//! valgrind --tool=callgrind target/release/examples/hot_loop fenced 200000
//! ```
//!
//! The first argument picks the service (`bare`, `noop`, `fenced`, `fenced_raise`,
//! `handwritten`, `governor`), the second the number of requests (at most 100
//! million), the third how many other keys to pre-seed (default 0). It prints the
//! wall time and the on-CPU time per request (the latter from
//! `/proc/thread-self/schedstat`, less disturbed by other processes).

use axum::Router;
use axum::body::Body;
use fencing_benches::{fenced, governor, handwritten, noop, request, routes, seeded_store};
use http::{Method, Request};
use tower::{Service, ServiceExt};

const HOT: &str = "/logs/hot";

fn main() {
    let mut args = std::env::args().skip(1);
    let service = args.next().unwrap_or_else(|| "fenced".to_owned());
    let count: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000).min(100_000_000);
    let others: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0).min(10_000_000);
    let router: Router = match service.as_str() {
        "bare" => routes(),
        "noop" => noop(),
        "fenced" | "fenced_raise" => fenced(seeded_store(others, 1, &[(HOT, 7)])),
        "handwritten" => handwritten::router(handwritten::seeded(others, &[(HOT, 7)])),
        "governor" => {
            let config = governor::seeded(others);
            let _ = config.limiter().check_key(&HOT.to_owned());
            governor::router(config)
        }
        other => {
            eprintln!("unknown service {other}");
            std::process::exit(2);
        }
    };
    let raise = service == "fenced_raise";
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let cpu_start = thread_cpu_ns();
    let start = std::time::Instant::now();
    runtime.block_on(async move {
        let mut router = router;
        let mut token = 7u64;
        for _ in 0..count {
            if raise {
                token += 1;
            }
            let req: Request<Body> = request(Method::POST, HOT, Some(&token.to_string()));
            let ready = ServiceExt::<Request<Body>>::ready(&mut router).await.expect("infallible");
            let response = ready.call(req).await.expect("infallible");
            assert!(response.status().is_success());
        }
    });
    let elapsed = start.elapsed();
    let cpu = thread_cpu_ns().zip(cpu_start).map(|(end, start)| end.saturating_sub(start));
    let per = |ns: f64| ns / count as f64;
    match cpu {
        Some(cpu) => println!(
            "{service}: {count} requests, {:.1} ns wall, {:.1} ns on-CPU per request",
            per(elapsed.as_nanos() as f64),
            per(cpu as f64)
        ),
        None => {
            println!("{service}: {count} requests, {:.1} ns wall per request", per(elapsed.as_nanos() as f64))
        }
    }
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`), which
/// other processes competing for the cores do not inflate the way they do wall time.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}
