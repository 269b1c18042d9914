//! Hostile-load soak of the lock service: one client grants leases with unique
//! 200-byte names and holders over loopback, past the lease bound, and the
//! process's resident memory is printed as it goes (BENCHMARKS.md §9).
//!
//! ```text
//! cargo run --release -p demo-lock-service --example lease_soak -- \
//!     [--max-leases N] [--attempts N] [--ttl-ms MS] [--concurrency N] [--report-every N]
//! ```
//!
//! With a TTL longer than the run (the default, 1 h) the table fills to the bound
//! and every later grant is refused with 503: RSS at the bound, divided by the
//! bound, is the memory per lease. With a short TTL (`--ttl-ms 2000`) expired
//! leases are forgotten and their slots reused: RSS must stay flat however many
//! unique names go by. The service runs in this process (RSS includes the
//! client, a constant), on a fresh data directory in the system's temp dir.

use std::time::{Duration, Instant};

use demo_lock_service::{Config, LockService};
use reqwest::StatusCode;
use serde_json::json;

mod rss;
use rss::rss_kib;

struct Args {
    max_leases: usize,
    attempts: usize,
    ttl_ms: u64,
    concurrency: usize,
    report_every: usize,
}

fn args() -> Args {
    let mut a =
        Args { max_leases: 20_000, attempts: 60_000, ttl_ms: 3_600_000, concurrency: 8, report_every: 5_000 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let n: u64 = value.parse().unwrap_or_else(|_| panic!("{flag}: not a number: {value}"));
        let n_usize = usize::try_from(n).unwrap();
        match flag.as_str() {
            "--max-leases" => a.max_leases = n_usize,
            "--attempts" => a.attempts = n_usize,
            "--ttl-ms" => a.ttl_ms = n,
            "--concurrency" => a.concurrency = n_usize.max(1),
            "--report-every" => a.report_every = n_usize.max(1),
            _ => panic!("unknown flag {flag}"),
        }
    }
    a
}

#[tokio::main]
async fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    let service = LockService::open(Config::new(dir.path()).with_max_leases(a.max_leases)).unwrap();
    let running = service.clone().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = running.base_url();
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap();
    let holder = "h".repeat(200);
    // Warm up the server and client (connections, buffers) before the baseline.
    let _ = http.get(format!("{base}/healthz")).send().await.unwrap();
    let rss0 = rss_kib();
    println!(
        "max_leases={} attempts={} ttl_ms={} concurrency={} names=200B holders=200B",
        a.max_leases, a.attempts, a.ttl_ms, a.concurrency
    );
    println!(
        "{:>8} {:>9} {:>8} {:>8} {:>10} {:>8} {:>8}",
        "t_s", "attempts", "granted", "503", "in_memory", "rss_MiB", "db_MiB"
    );
    let start = Instant::now();
    let (mut granted, mut full) = (0usize, 0usize);
    let mut next = 0usize;
    let mut rss_at_bound = None;
    while next < a.attempts {
        let batch = a.report_every.min(a.attempts - next);
        let (g, f) = run_batch(&http, &base, &holder, next, batch, a.ttl_ms, a.concurrency).await;
        granted += g;
        full += f;
        next += batch;
        let in_memory = service.leases_in_memory();
        let rss = rss_kib();
        if rss_at_bound.is_none() && in_memory >= a.max_leases {
            rss_at_bound = Some(rss);
        }
        let db = std::fs::metadata(dir.path().join("locks.redb")).map(|m| m.len()).unwrap_or(0);
        println!(
            "{:>8.1} {:>9} {:>8} {:>8} {:>10} {:>8.1} {:>8.1}",
            start.elapsed().as_secs_f64(),
            next,
            granted,
            full,
            in_memory,
            rss as f64 / 1024.0,
            db as f64 / 1048576.0
        );
    }
    println!("baseline rss {:.1} MiB", rss0 as f64 / 1024.0);
    if let Some(rss) = rss_at_bound {
        println!(
            "at the bound: {:.0} bytes of RSS per lease ((rss at {} leases - baseline) / {})",
            (rss.saturating_sub(rss0) * 1024) as f64 / a.max_leases as f64,
            a.max_leases,
            a.max_leases
        );
    }
    running.shutdown().await.unwrap();
}

/// Asks for `n` unique names from `first` on, `concurrency` at a time; (granted, 503s).
async fn run_batch(
    http: &reqwest::Client,
    base: &str,
    holder: &str,
    first: usize,
    n: usize,
    ttl_ms: u64,
    concurrency: usize,
) -> (usize, usize) {
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (http, base, holder) = (http.clone(), base.to_owned(), holder.to_owned());
        tasks.push(tokio::spawn(async move {
            let (mut granted, mut full) = (0, 0);
            let mut i = first + w;
            while i < first + n {
                let name = format!("{i:0>200}");
                let r = http
                    .post(format!("{base}/v1/leases"))
                    .json(&json!({"name": name, "holder": holder, "ttl_ms": ttl_ms}))
                    .send()
                    .await
                    .unwrap();
                match r.status() {
                    StatusCode::CREATED => granted += 1,
                    StatusCode::SERVICE_UNAVAILABLE => {
                        assert!(r.headers().contains_key("retry-after"));
                        full += 1;
                    }
                    s => panic!("unexpected {s}: {}", r.text().await.unwrap_or_default()),
                }
                i += concurrency;
            }
            (granted, full)
        }));
    }
    let mut out = (0, 0);
    for t in tasks {
        let (g, f) = t.await.unwrap();
        out.0 += g;
        out.1 += f;
    }
    out
}
