//! `fencing-load`: a loopback load generator for any fenced HTTP service,
//! compared with the same service unfenced.
//!
//! With no `--url` it starts two in-process servers on `127.0.0.1:0`, the
//! [`standin`](fencing_benches::standin) log service with and without the
//! fencing layer. With `--url` (and optionally `--baseline-url`) it drives
//! running servers instead: `demo-resource serve --in-memory` and
//! `demo-resource serve --in-memory --no-fencing`, or your own service's
//! route with a path template, method, headers and body. The targets run
//! alternately (`--rounds` rounds each, interleaved, the order flipped every
//! round); it prints one line per round on stderr, then a row per target and
//! the ratios. A closed loop by default; `--rate` makes it an open loop with
//! latencies corrected for coordinated omission. `--max-p99`, `--min-ratio`,
//! `--max-error-pct` and `--min-rps` set the exit code (99 when broken);
//! `--plot` draws the latency percentiles. Targets must be loopback
//! addresses; every run is bounded in connections and time. The parts are in
//! [`fencing_benches::load`].
//!
//! ```text
//! cargo run --release -p fencing-benches --bin fencing-load -- --connections 32 --duration 5 --rounds 3
//! fencing-load --url 'http://127.0.0.1:3000/api/docs/{key}' -X PUT -H 'Content-Type: application/json' \
//!   --body '{"text":"hi"}' --rate 2000 --max-p99 20 --plot latency.svg
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use fencing_benches::load::args::Args;
use fencing_benches::load::compare::{self, Outcome};
use fencing_benches::load::inprocess::{self, loadavg};
use fencing_benches::load::plot;
use fencing_benches::load::request::{self, RequestSpec};
use fencing_benches::load::runner::Plan;
use fencing_benches::load::schedule::Schedule;
use fencing_benches::load::target::Target;
use fencing_benches::load::{report, thresholds};
use http::HeaderName;
use serde::Serialize;

/// The JSON file of `--json`.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    connections: u32,
    rate: Option<f64>,
    duration_s: u64,
    rounds: u32,
    warmup_ms: u64,
    stale_pct: u8,
    malformed_pct: u8,
    new_holder_every: Option<u64>,
    keys: u32,
    method: &'a str,
    body_bytes: usize,
    server_threads: Option<u32>,
    client_threads: u32,
    cores: usize,
    loadavg_start: String,
    loadavg_end: String,
    rounds_detail: &'a [report::RoundRow],
    targets: &'a [report::TargetRow],
    /// Present when there are two targets: the second (fenced) over the first (unfenced).
    ratios: Option<&'a report::Ratios>,
    /// Every threshold the run broke.
    violations: &'a [String],
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencing-load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.validate()?;
    let plan = Arc::new(plan(&args)?);

    // Keep the server runtime alive until the end when the targets are in-process.
    let mut server_runtime = None;
    let targets = match &args.url {
        Some(url) => {
            Target::from_urls(url, args.baseline_url.as_deref(), args.path.as_deref(), args.default_path())?
        }
        None => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(args.server_threads as usize)
                .thread_name("server")
                .enable_all()
                .build()?;
            let targets = inprocess::targets(&runtime, &args)?;
            server_runtime = Some(runtime);
            targets
        }
    };
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads as usize)
        .thread_name("client")
        .enable_all()
        .build()?;
    // One schedule per target for the whole run, so that rising tokens keep rising across rounds.
    let schedules: Vec<_> = targets
        .iter()
        .map(|_| {
            Arc::new(Schedule::new(
                args.key_count(),
                args.connections,
                args.new_holder_every,
                args.stale_pct,
                args.malformed_pct,
            ))
        })
        .collect();

    let loadavg_start = loadavg();
    eprintln!(
        "fencing-load: {} target(s), {} {} on {} connections, {}, {} rounds x {} s (first {} ms not counted), load {}",
        targets.len(),
        plan.request.method,
        targets.last().map_or("", |t| t.template.as_str()),
        args.connections,
        args.rate.map_or("closed loop".to_owned(), |r| format!("open loop at {r} req/s")),
        args.rounds,
        args.duration,
        args.warmup_ms,
        loadavg_start
    );
    let server_threads = server_runtime.as_ref().map(|_| "server");
    let outcome = compare::run(&client, &targets, &plan, &schedules, args.rounds, server_threads);
    let loadavg_end = loadavg();
    report::print(&outcome.rows, outcome.ratios.as_ref());
    println!("load average: start {loadavg_start}, end {loadavg_end}");

    let violations = args.thresholds().judge(&outcome.rows, outcome.ratios.as_ref());

    if let Some(path) = &args.plot {
        std::fs::write(path, plot_svg(&args, &outcome))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.json {
        let report = JsonReport {
            connections: args.connections,
            rate: args.rate,
            duration_s: args.duration,
            rounds: args.rounds,
            warmup_ms: args.warmup_ms,
            stale_pct: args.stale_pct,
            malformed_pct: args.malformed_pct,
            new_holder_every: args.new_holder_every,
            keys: args.key_count(),
            method: plan.request.method.as_str(),
            body_bytes: plan.request.body.len(),
            server_threads: server_runtime.as_ref().map(|_| args.server_threads),
            client_threads: args.client_threads,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            loadavg_start,
            loadavg_end,
            rounds_detail: &outcome.rounds,
            targets: &outcome.rows,
            ratios: outcome.ratios.as_ref(),
            violations: &violations,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        eprintln!("wrote {}", path.display());
    }
    drop(client);
    if let Some(runtime) = server_runtime {
        runtime.shutdown_background();
    }
    if violations.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for violation in &violations {
        eprintln!("threshold broken: {violation}");
    }
    Ok(ExitCode::from(thresholds::EXIT_CODE as u8))
}

/// What every round sends, from the arguments.
fn plan(args: &Args) -> Result<Plan, String> {
    let headers = args.headers.iter().map(|h| request::parse_header(h)).collect::<Result<_, _>>()?;
    let token_header = HeaderName::from_bytes(args.token_header.as_bytes())
        .map_err(|_| format!("--token-header {:?}: not a valid header name", args.token_header))?;
    Ok(Plan {
        request: RequestSpec {
            method: request::parse_method(&args.method)?,
            headers,
            body: request::body(args.body.as_deref(), args.body_file.as_deref(), args.body_bytes)?,
        },
        token_header,
        connections: args.connections,
        rate: args.rate,
        duration: Duration::from_secs(args.duration),
        warmup: Duration::from_millis(args.warmup_ms),
    })
}

/// The plot of every target: corrected (solid) and as sent (dashed) in the open loop.
fn plot_svg(args: &Args, outcome: &Outcome) -> String {
    let mode = args.rate.map_or("closed loop".to_owned(), |r| format!("open loop, {r} req/s"));
    let title = format!(
        "fencing-load: {} connections, {mode}, {} x {} s",
        args.connections, args.rounds, args.duration
    );
    let targets: Vec<_> = outcome.rows.iter().map(|row| row.target.as_str()).zip(&outcome.tallies).collect();
    plot::of_targets(&title, &targets)
}
