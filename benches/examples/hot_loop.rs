//! A bare loop of requests through one service, for profilers (perf, callgrind):
//! no harness, no batching, so the profile is the request path and little else.
//!
//! ```text
//! cargo build --release -p fencing-benches --example hot_loop
//! valgrind --tool=callgrind target/release/examples/hot_loop fenced 200000
//! ```
//!
//! The first argument picks the service (`bare`, `noop`, `fenced`, `fenced_extension`
//! (the layer with `token_extension(true)`), `fenced_raise`,
//! `verified` (an Ed25519 verifier, equal tokens: it is never asked),
//! `signed_raise` and `verified_raise` (every request raises with a freshly signed
//! proof; only the second checks it, so their difference is one verification),
//! `handwritten`, `governor`; with `--features metrics`, `fenced_metrics` (the
//! layer's `metrics` feature, no recorder installed) and `fenced_prometheus` (a
//! Prometheus recorder installed)), the second the number of requests (at most 100
//! million), the third how many other keys to pre-seed (default 0). It prints the
//! wall time and the on-CPU time per request (the latter from
//! `/proc/thread-self/schedstat`, less disturbed by other processes).
//!
//! `hot_loop compare [rounds] [keys]` measures the services against each other
//! the way a noisy machine allows: every round runs a block of 20,000 requests
//! through each service in turn, so a slow stretch of the machine hits all of
//! them alike, and each service's cost over `noop` is taken within the round.
//! It prints the median and the quartiles over the rounds (default 200 rounds,
//! 1 key) of wall time per request: run it on an otherwise idle machine.

use axum::Router;
use axum::body::Body;
use fencing_benches::{
    fenced, fenced_extension, fenced_verified, governor, handwritten, noop, request, routes, seeded_store,
};
use http::{Method, Request};
use tower::{Service, ServiceExt};

const HOT: &str = "/logs/hot";

/// The lock service's key for the `*_raise` services' proofs.
static SIGNER: std::sync::LazyLock<fencing_layer::verify::ProofSigner> =
    std::sync::LazyLock::new(|| fencing_layer::verify::ProofSigner::generate().expect("randomness"));

fn main() {
    let mut args = std::env::args().skip(1);
    let service = args.next().unwrap_or_else(|| "fenced".to_owned());
    if service == "compare" {
        let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200).clamp(1, 100_000);
        let others: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0).min(10_000_000);
        return compare(rounds, others);
    }
    let count: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000).min(100_000_000);
    let others: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0).min(10_000_000);
    let Some(router) = service_named(&service, others) else {
        eprintln!("unknown service {service}");
        std::process::exit(2);
    };
    let raise = matches!(service.as_str(), "fenced_raise" | "signed_raise" | "verified_raise");
    let sign = service.ends_with("_raise") && service != "fenced_raise";
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
            let mut req: Request<Body> = request(Method::POST, HOT, Some(&token.to_string()));
            if sign {
                let proof = SIGNER.sign(HOT, token);
                req.headers_mut().insert("fencing-proof", proof.parse().expect("base64 is a header value"));
            }
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

/// The router the benches call `name`, with `others` extra keys pre-seeded.
fn service_named(name: &str, others: usize) -> Option<Router> {
    Some(match name {
        "bare" => routes(),
        "noop" => noop(),
        "fenced" | "fenced_raise" | "signed_raise" => fenced(seeded_store(others, 1, &[(HOT, 7)])),
        "fenced_extension" => fenced_extension(seeded_store(others, 1, &[(HOT, 7)])),
        "verified" | "verified_raise" => fenced_verified(seeded_store(others, 1, &[(HOT, 7)]), &SIGNER),
        #[cfg(feature = "metrics")]
        "fenced_metrics" => fenced(seeded_store(others, 1, &[(HOT, 7)])),
        #[cfg(feature = "metrics")]
        "fenced_prometheus" => {
            // Kept by the recorder for the whole run; nobody scrapes it.
            let _handle = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("the first recorder");
            fenced(seeded_store(others, 1, &[(HOT, 7)]))
        }
        #[cfg(not(feature = "metrics"))]
        "fenced_metrics" | "fenced_prometheus" => {
            eprintln!(
                "{name} needs the metrics feature: cargo build --release -p fencing-benches --example hot_loop --features metrics"
            );
            std::process::exit(2);
        }
        "handwritten" => handwritten::router(handwritten::seeded(others, &[(HOT, 7)])),
        "governor" => {
            let config = governor::seeded(others);
            let _ = config.limiter().check_key(&HOT.to_owned());
            governor::router(config)
        }
        _ => return None,
    })
}

/// Interleaved blocks through every service; the cost over `noop` per round.
fn compare(rounds: usize, others: usize) {
    const BLOCK: u64 = 20_000;
    const NAMES: [&str; 6] = ["bare", "noop", "fenced", "fenced_extension", "handwritten", "governor"];
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut routers: Vec<Router> =
        NAMES.iter().map(|name| service_named(name, others).expect("known")).collect();
    let mut per_request: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); NAMES.len()];
    runtime.block_on(async {
        for round in 0..=rounds {
            for (i, router) in routers.iter_mut().enumerate() {
                // Wall time: the schedstat counter moves in scheduler ticks, too coarse
                // for a block. A block the machine interrupted is an outlier, and the
                // medians below drop it.
                let start = std::time::Instant::now();
                for _ in 0..BLOCK {
                    let req: Request<Body> = request(Method::POST, HOT, Some("7"));
                    let ready = ServiceExt::<Request<Body>>::ready(&mut *router).await.expect("infallible");
                    let response = ready.call(req).await.expect("infallible");
                    assert!(response.status().is_success());
                }
                let spent = start.elapsed().as_nanos();
                // Round 0 warms caches and the allocator up; it is not counted.
                if round > 0 {
                    per_request[i].push(spent as f64 / BLOCK as f64);
                }
            }
        }
    });
    let noop = &per_request[1];
    println!("{rounds} rounds of {BLOCK} requests per service, {} keys; wall ns per request", others + 1);
    println!("{:<12} {:>22} {:>26}", "service", "median [q1–q3]", "over noop, median [q1–q3]");
    for (name, samples) in NAMES.iter().zip(&per_request) {
        let over: Vec<f64> = samples.iter().zip(noop).map(|(s, n)| s - n).collect();
        let (m, q1, q3) = quartiles(samples.clone());
        let (om, oq1, oq3) = quartiles(over);
        println!("{name:<12} {m:>8.1} [{q1:.1}–{q3:.1}] {om:>+10.1} [{oq1:+.1}–{oq3:+.1}]");
    }
}

/// Median, first and third quartile.
fn quartiles(mut samples: Vec<f64>) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`), which
/// other processes competing for the cores do not inflate the way they do wall time.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}
