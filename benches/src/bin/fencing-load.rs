//! `fencing-load`: a loopback load generator comparing a fenced service with the
//! same service unfenced.
//!
//! With no `--url` it starts two in-process servers on `127.0.0.1:0`, the
//! [`standin`](fencing_benches::standin) log service with and without the
//! fencing layer, and runs them alternately (`--rounds` rounds each,
//! interleaved, the order flipped every round), printing one line per round on
//! stderr, then both rows and the ratios. With `--url` (and optionally
//! `--baseline-url`) it drives running servers instead, e.g. `demo-resource
//! serve --in-memory` and `demo-resource serve --in-memory --no-fencing`.
//!
//! Every connection is an HTTP/1.1 keep-alive connection (hyper) writing
//! `POST /logs/load-{connection}` (or, with `--hot-key`, all of them `POST
//! /logs/hot`) with `Fencing-Token: 1000`; `--stale-pct` and
//! `--malformed-pct` mix in stale (`1`) and malformed (`01x`) tokens. Latency is
//! from just before the request is sent to the end of the response body.
//! In-process, it also reports the servers' on-CPU time per request (from
//! `/proc/self/task/*/schedstat`), which a busy machine disturbs far less than
//! throughput. Targets must be loopback addresses; every run is bounded in
//! connections and time.
//!
//! ```text
//! cargo run --release -p fencing-benches --bin fencing-load -- --connections 32 --duration 5 --rounds 3
//! ```

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http::{HeaderValue, Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};

/// Compare a fenced service's throughput and latency with the unfenced one's over loopback.
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
struct Args {
    /// Base URL of a running fenced target (`http://127.0.0.1:8080`), or several
    /// replicas of it separated by commas (connections spread evenly); loopback only.
    /// Without it, fenced and unfenced stand-ins run in-process.
    #[arg(long)]
    url: Option<String>,
    /// Base URL(s) of a running unfenced baseline to compare `--url` with; loopback only.
    #[arg(long, requires = "url")]
    baseline_url: Option<String>,
    /// Concurrent keep-alive connections per target.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// Seconds per round (measured part plus warm-up).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=120))]
    duration: u64,
    /// Rounds per target, interleaved.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Milliseconds at the start of each round left out of the results.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    warmup_ms: u64,
    /// Percent of requests carrying a stale token (409 when fenced).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    stale_pct: u8,
    /// Percent of requests carrying a malformed token (400 when fenced).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    malformed_pct: u8,
    /// Bytes in each request body.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(0..=65_536))]
    body_bytes: u32,
    /// Worker threads of the in-process servers' runtime.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    server_threads: u32,
    /// Worker threads of the client runtime.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    client_threads: u32,
    /// In-process only: a third target, the fenced stand-in with its marks in
    /// this PostgreSQL database (`PgSharedStore`), e.g. `host=127.0.0.1 user=postgres
    /// dbname=bench`; loopback only. Its tables are created if missing.
    #[arg(long, conflicts_with = "url")]
    shared_postgres: Option<String>,
    /// In-process only: a third target, the unfenced stand-in behind a layer
    /// that burns this many nanoseconds of CPU per request and does nothing
    /// else: how much a known cost moves the figures.
    #[arg(long, conflicts_with = "url", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    calibrate_ns: Option<u64>,
    /// In-process only: run just this target (`unfenced`, `fenced`, `spin` or `shared`),
    /// for a profiler.
    #[arg(long, conflicts_with = "url")]
    only: Option<String>,
    /// Every connection writes to one log, `/logs/hot` (one fencing key), instead
    /// of its own.
    #[arg(long)]
    hot_key: bool,
    /// In-process only: the fenced stand-in's layer leaves the token out of the
    /// request extensions (`FencingLayer::token_extension(false)`).
    #[arg(long, conflicts_with = "url")]
    no_token_extension: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The valid token every connection sends; stale ones send [`STALE_TOKEN`].
const VALID_TOKEN: &str = "1000";
const STALE_TOKEN: &str = "1";
const MALFORMED_TOKEN: &str = "01x";

/// One service under test: one server, or several replicas of it (connection
/// `i` goes to replica `i % n`).
#[derive(Debug, Clone)]
struct Target {
    label: String,
    replicas: Vec<(SocketAddr, HeaderValue)>,
}

impl Target {
    fn urls(&self) -> String {
        self.replicas.iter().map(|(addr, _)| format!("http://{addr}")).collect::<Vec<_>>().join(",")
    }
}

/// What one connection (or one round, or one target) saw.
struct Tally {
    histogram: Histogram<u64>,
    ok: u64,
    stale: u64,
    bad_request: u64,
    other_status: u64,
    errors: u64,
    /// Every request answered, warm-up included.
    all_requests: u64,
}

impl Tally {
    fn new() -> Self {
        Self {
            histogram: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds"),
            ok: 0,
            stale: 0,
            bad_request: 0,
            other_status: 0,
            errors: 0,
            all_requests: 0,
        }
    }

    fn add(&mut self, other: &Self) {
        self.histogram.add(&other.histogram).expect("same histogram bounds");
        self.ok += other.ok;
        self.stale += other.stale;
        self.bad_request += other.bad_request;
        self.other_status += other.other_status;
        self.errors += other.errors;
        self.all_requests += other.all_requests;
    }

    fn requests(&self) -> u64 {
        self.histogram.len()
    }
}

#[derive(Debug, Serialize)]
struct RoundRow {
    round: u32,
    target: String,
    requests: u64,
    requests_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// On-CPU time of the in-process server's threads per request (both servers share them).
    server_cpu_ns_per_request: Option<f64>,
}

#[derive(Debug, Serialize)]
struct TargetRow {
    target: String,
    url: String,
    requests: u64,
    measured_s: f64,
    requests_per_s: f64,
    median_round_requests_per_s: f64,
    min_round_requests_per_s: f64,
    max_round_requests_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    server_cpu_ns_per_request: Option<f64>,
    status_2xx: u64,
    status_409: u64,
    status_400: u64,
    status_other: u64,
    errors: u64,
}

#[derive(Debug, Serialize)]
struct Ratios {
    /// `target / baseline` (fenced / unfenced): aggregate requests per second.
    throughput: f64,
    /// The same, over the median round of each.
    median_round_throughput: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    /// In-process only: server on-CPU time per request.
    server_cpu_per_request: Option<f64>,
    /// Throughput ratio of each round (the two targets ran back to back), and their median:
    /// the statistic least moved by a machine whose load drifts between rounds.
    per_round_throughput: Vec<f64>,
    median_per_round_throughput: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    connections: u32,
    duration_s: u64,
    rounds: u32,
    warmup_ms: u64,
    stale_pct: u8,
    malformed_pct: u8,
    body_bytes: u32,
    server_threads: Option<u32>,
    client_threads: u32,
    cores: usize,
    loadavg_start: String,
    loadavg_end: String,
    rounds_detail: Vec<RoundRow>,
    targets: Vec<TargetRow>,
    /// Present when there are two targets: the second (fenced) over the first (unfenced).
    ratios: Option<Ratios>,
}

/// Nanoseconds spent on a CPU by this process's threads named `name` (tokio's
/// `thread_name`), from `/proc/self/task/*/schedstat`: unlike wall time, other
/// processes competing for the cores do not inflate it. `None` off Linux.
fn threads_cpu_ns(name: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        total += stat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()).unwrap_or(0);
    }
    Some(total)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Parses `http://host:port[/]`, or several separated by commas (replicas), and
/// insists that every address they name is loopback.
fn loopback_target(label: &str, urls: &str) -> Result<Target, String> {
    let replicas = urls.split(',').map(loopback_replica).collect::<Result<_, _>>()?;
    Ok(Target { label: label.to_owned(), replicas })
}

fn loopback_replica(url: &str) -> Result<(SocketAddr, HeaderValue), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url}: only http:// URLs"))?;
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') {
        return Err(format!("{url}: give the base URL, without a path"));
    }
    let addrs: Vec<SocketAddr> = authority
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .filter(|addr| addr.ip().is_loopback())
        .collect();
    let addr = *addrs.first().ok_or_else(|| format!("{url}: not a loopback address; refusing"))?;
    let authority = HeaderValue::from_str(authority).map_err(|e| format!("{url}: {e}"))?;
    Ok((addr, authority))
}

/// A default layer deciding in a `PgSharedStore` on `config`, a loopback database.
async fn shared_postgres_layer(
    config: &str,
) -> Result<fencing_layer::FencingLayer, Box<dyn std::error::Error>> {
    let config: tokio_postgres::Config = config.parse()?;
    let loopback = config.get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => {
            (name.as_str(), 0).to_socket_addrs().is_ok_and(|mut a| a.all(|a| a.ip().is_loopback()))
        }
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !loopback {
        return Err("--shared-postgres: not a loopback database; refusing".into());
    }
    let limits = fencing_postgres::PoolLimits { max_size: 64, ..Default::default() };
    let store = fencing_postgres::PgSharedStore::new(
        fencing_postgres::pool(config.clone(), limits)?,
        config,
        Default::default(),
    );
    store.migrate().await?;
    Ok(fencing_layer::FencingLayer::new().shared_store(store))
}

/// A tiny deterministic generator for the token mix (no need for a crate).
struct XorShift(u64);

impl XorShift {
    fn next_percent(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % 100) as u8
    }
}

/// One keep-alive connection sending requests back to back until `end`.
async fn connection(
    target: Target,
    id: u32,
    args: Arc<Args>,
    body: Bytes,
    record_from: Instant,
    end: Instant,
) -> Tally {
    let mut tally = Tally::new();
    let (addr, authority) = &target.replicas[id as usize % target.replicas.len()];
    let stream = match TcpStream::connect(addr).await {
        Ok(stream) => stream,
        Err(_) => {
            tally.errors += 1;
            return tally;
        }
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await else {
        tally.errors += 1;
        return tally;
    };
    let driver = tokio::spawn(conn);
    let path = if args.hot_key { "/logs/hot".to_owned() } else { format!("/logs/load-{id}") };
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (u64::from(id) + 1).wrapping_mul(0xD134_2543_DE82_EF95));
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        let roll = rng.next_percent();
        let token = if roll < args.stale_pct {
            STALE_TOKEN
        } else if roll < args.stale_pct.saturating_add(args.malformed_pct) {
            MALFORMED_TOKEN
        } else {
            VALID_TOKEN
        };
        let request = Request::post(path.as_str())
            .header(header::HOST, authority.clone())
            .header(fencing_benches::TOKEN_HEADER, token)
            .body(Full::new(body.clone()))
            .expect("a valid request");
        if sender.ready().await.is_err() {
            tally.errors += 1;
            break;
        }
        let status = match sender.send_request(request).await {
            Ok(response) => {
                let status = response.status();
                match response.into_body().collect().await {
                    Ok(_) => status,
                    Err(_) => {
                        tally.errors += 1;
                        break;
                    }
                }
            }
            Err(_) => {
                tally.errors += 1;
                break;
            }
        };
        tally.all_requests += 1;
        if sent < record_from {
            continue;
        }
        let nanos = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
        tally.histogram.saturating_record(nanos.max(1));
        match status.as_u16() {
            200..=299 => tally.ok += 1,
            409 => tally.stale += 1,
            400 => tally.bad_request += 1,
            _ => tally.other_status += 1,
        }
    }
    drop(sender);
    driver.abort();
    tally
}

/// One round against one target: every connection for `--duration` seconds.
async fn round(target: &Target, args: &Arc<Args>) -> (Tally, Duration) {
    let body = Bytes::from(vec![b'x'; args.body_bytes as usize]);
    let start = Instant::now();
    let record_from = start + Duration::from_millis(args.warmup_ms);
    let end = start + Duration::from_secs(args.duration);
    let tasks: Vec<_> = (0..args.connections)
        .map(|id| {
            tokio::spawn(connection(target.clone(), id, Arc::clone(args), body.clone(), record_from, end))
        })
        .collect();
    let mut tally = Tally::new();
    for task in tasks {
        match task.await {
            Ok(t) => tally.add(&t),
            Err(_) => tally.errors += 1,
        }
    }
    let measured = end.saturating_duration_since(record_from.min(end));
    (tally, measured)
}

fn micros(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1_000.0
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        f64::midpoint(values[n / 2 - 1], values[n / 2])
    }
}

/// Starts `router` on `127.0.0.1:0` in `runtime`; returns its address.
fn serve_in_process(runtime: &tokio::runtime::Runtime, router: axum::Router) -> std::io::Result<SocketAddr> {
    use axum::serve::ListenerExt;
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    runtime.spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Arc::new(Args::parse());
    if u32::from(args.stale_pct) + u32::from(args.malformed_pct) > 100 {
        return Err("--stale-pct plus --malformed-pct must be at most 100".into());
    }
    if args.warmup_ms >= args.duration * 1_000 {
        return Err("--warmup-ms must be shorter than --duration".into());
    }

    // Keep the server runtime alive until the end when the targets are in-process.
    let mut server_runtime = None;
    let targets = match &args.url {
        Some(url) => {
            let mut targets = Vec::new();
            if let Some(baseline) = &args.baseline_url {
                targets.push(loopback_target("baseline", baseline)?);
            }
            targets.push(loopback_target("target", url)?);
            targets
        }
        None => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(args.server_threads as usize)
                .thread_name("server")
                .enable_all()
                .build()?;
            let mut targets = Vec::new();
            let mut routers = vec![
                ("unfenced", fencing_benches::standin::router(false)),
                (
                    "fenced",
                    fencing_benches::standin::router_with(Some(
                        fencing_layer::FencingLayer::new().token_extension(!args.no_token_extension),
                    )),
                ),
            ];
            if let Some(ns) = args.calibrate_ns {
                routers.push(("spin", fencing_benches::standin::router_spinning(ns)));
            }
            if let Some(config) = &args.shared_postgres {
                let layer = runtime.block_on(shared_postgres_layer(config))?;
                routers.push(("shared", fencing_benches::standin::router_with(Some(layer))));
            }
            for (label, router) in routers {
                if args.only.as_deref().is_some_and(|only| only != label) {
                    continue;
                }
                let addr = serve_in_process(&runtime, router)?;
                let authority = HeaderValue::from_str(&addr.to_string())?;
                targets.push(Target { label: label.to_owned(), replicas: vec![(addr, authority)] });
            }
            server_runtime = Some(runtime);
            targets
        }
    };
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads as usize)
        .thread_name("client")
        .enable_all()
        .build()?;

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let loadavg_start = loadavg();
    eprintln!(
        "fencing-load: {} target(s), {} connections, {} rounds x {} s (first {} ms not counted), load {}",
        targets.len(),
        args.connections,
        args.rounds,
        args.duration,
        args.warmup_ms,
        loadavg_start
    );
    let mut totals: Vec<(Tally, Duration, Vec<f64>, u64)> =
        targets.iter().map(|_| (Tally::new(), Duration::ZERO, Vec::new(), 0)).collect();
    let mut rounds_detail = Vec::new();
    for r in 1..=args.rounds {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if r % 2 == 0 {
            order.reverse();
        }
        for i in order {
            let target = &targets[i];
            let cpu_before = server_runtime.as_ref().and_then(|_| threads_cpu_ns("server"));
            let (tally, measured) = client.block_on(round(target, &args));
            let cpu = cpu_before.zip(threads_cpu_ns("server")).map(|(before, after)| after - before);
            let rps = tally.requests() as f64 / measured.as_secs_f64();
            let row = RoundRow {
                round: r,
                target: target.label.clone(),
                requests: tally.requests(),
                requests_per_s: rps,
                p50_us: micros(&tally.histogram, 0.5),
                p99_us: micros(&tally.histogram, 0.99),
                p999_us: micros(&tally.histogram, 0.999),
                // Every request of the round, warm-up included, against the CPU time of the round.
                server_cpu_ns_per_request: cpu.map(|ns| ns as f64 / tally.all_requests as f64),
            };
            eprintln!(
                "round {r}/{} {:<9} {:>9.0} req/s  p50 {:>7.1} us  p99 {:>7.1} us  p99.9 {:>7.1} us  \
                 server {:>6.0} ns CPU/req  2xx {} 409 {} 400 {} other {} errors {}  load {}",
                args.rounds,
                row.target,
                row.requests_per_s,
                row.p50_us,
                row.p99_us,
                row.p999_us,
                row.server_cpu_ns_per_request.unwrap_or(f64::NAN),
                tally.ok,
                tally.stale,
                tally.bad_request,
                tally.other_status,
                tally.errors,
                loadavg()
            );
            rounds_detail.push(row);
            let total = &mut totals[i];
            total.0.add(&tally);
            total.1 += measured;
            total.2.push(rps);
            if let Some(ns) = cpu {
                total.3 += ns;
            }
        }
    }
    let loadavg_end = loadavg();

    let rows: Vec<TargetRow> = targets
        .iter()
        .zip(&mut totals)
        .map(|(target, (tally, measured, per_round, cpu_ns))| {
            let h = &tally.histogram;
            TargetRow {
                target: target.label.clone(),
                url: target.urls(),
                requests: tally.requests(),
                measured_s: measured.as_secs_f64(),
                requests_per_s: tally.requests() as f64 / measured.as_secs_f64(),
                median_round_requests_per_s: median(per_round),
                min_round_requests_per_s: per_round.iter().copied().fold(f64::INFINITY, f64::min),
                max_round_requests_per_s: per_round.iter().copied().fold(0.0, f64::max),
                p50_us: micros(h, 0.5),
                p99_us: micros(h, 0.99),
                p999_us: micros(h, 0.999),
                max_us: h.max() as f64 / 1_000.0,
                server_cpu_ns_per_request: server_runtime
                    .as_ref()
                    .map(|_| *cpu_ns as f64 / tally.all_requests as f64),
                status_2xx: tally.ok,
                status_409: tally.stale,
                status_400: tally.bad_request,
                status_other: tally.other_status,
                errors: tally.errors,
            }
        })
        .collect();
    let mut per_round: Vec<f64> = (1..=args.rounds)
        .filter_map(|r| {
            let rps = |label: &str| {
                rounds_detail
                    .iter()
                    .find(|row| row.round == r && row.target == label)
                    .map(|row| row.requests_per_s)
            };
            Some(rps(&targets.get(1)?.label)? / rps(&targets.first()?.label)?)
        })
        .collect();
    let ratios = match rows.as_slice() {
        [base, fenced] => Some(Ratios {
            per_round_throughput: per_round.clone(),
            median_per_round_throughput: median(&mut per_round),
            throughput: fenced.requests_per_s / base.requests_per_s,
            median_round_throughput: fenced.median_round_requests_per_s / base.median_round_requests_per_s,
            p50: fenced.p50_us / base.p50_us,
            p99: fenced.p99_us / base.p99_us,
            p999: fenced.p999_us / base.p999_us,
            server_cpu_per_request: fenced
                .server_cpu_ns_per_request
                .zip(base.server_cpu_ns_per_request)
                .map(|(f, b)| f / b),
        }),
        _ => None,
    };

    println!(
        "{:<9} {:>10} {:>11} {:>14} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>6} {:>6} {:>6}",
        "target",
        "requests",
        "req/s",
        "median rnd/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "srv CPU/req",
        "2xx",
        "409",
        "400",
        "errors"
    );
    for row in &rows {
        println!(
            "{:<9} {:>10} {:>11.0} {:>14.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.0} ns {:>8} {:>6} {:>6} {:>6}",
            row.target,
            row.requests,
            row.requests_per_s,
            row.median_round_requests_per_s,
            row.p50_us,
            row.p99_us,
            row.p999_us,
            row.max_us,
            row.server_cpu_ns_per_request.unwrap_or(f64::NAN),
            row.status_2xx,
            row.status_409,
            row.status_400,
            row.errors
        );
    }
    if let Some(r) = &ratios {
        println!(
            "ratio {}/{}: throughput {:.3} (median round {:.3}, median of per-round ratios {:.3}), \
             p50 {:.3}, p99 {:.3}, p99.9 {:.3}, server CPU per request {:.3}",
            rows[1].target,
            rows[0].target,
            r.throughput,
            r.median_round_throughput,
            r.median_per_round_throughput,
            r.p50,
            r.p99,
            r.p999,
            r.server_cpu_per_request.unwrap_or(f64::NAN)
        );
    }
    println!("load average: start {loadavg_start}, end {loadavg_end}");

    if let Some(path) = &args.json {
        let report = Report {
            connections: args.connections,
            duration_s: args.duration,
            rounds: args.rounds,
            warmup_ms: args.warmup_ms,
            stale_pct: args.stale_pct,
            malformed_pct: args.malformed_pct,
            body_bytes: args.body_bytes,
            server_threads: server_runtime.as_ref().map(|_| args.server_threads),
            client_threads: args.client_threads,
            cores,
            loadavg_start,
            loadavg_end,
            rounds_detail,
            targets: rows,
            ratios,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        eprintln!("wrote {}", path.display());
    }
    drop(client);
    if let Some(runtime) = server_runtime {
        runtime.shutdown_background();
    }
    Ok(())
}
