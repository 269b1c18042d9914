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
use fencing_benches::load::compare::{self, Measured, Outcome};
use fencing_benches::load::inprocess::{self, loadavg};
use fencing_benches::load::json::JsonReport;
use fencing_benches::load::plot;
use fencing_benches::load::request::{self, RequestSpec};
use fencing_benches::load::runner::Plan;
use fencing_benches::load::schedule::Schedule;
use fencing_benches::load::target::Target;
use fencing_benches::load::{report, thresholds};
use http::HeaderName;
use tokio::runtime::Runtime;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencing-load: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The arguments, then the run, then the report: the exit code says whether a threshold broke.
fn run() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.validate()?;
    let plan = Arc::new(plan(&args)?);
    let targets = Targets::start(&args)?;
    let client = runtime(args.client_threads, "client")?;
    let measured = measure(&args, &plan, &targets, &client);
    let violations = report(&args, &plan, &targets, &measured)?;
    drop(client);
    targets.stop();
    Ok(exit_code(&violations))
}

// The arguments.

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

// The run.

/// The targets, and the runtime of the in-process ones (kept alive until the end).
struct Targets {
    list: Vec<Target>,
    server_runtime: Option<Runtime>,
}

impl Targets {
    /// `--url` (and `--baseline-url`), or the two in-process stand-ins.
    fn start(args: &Args) -> Result<Self, Box<dyn std::error::Error>> {
        if let Some(url) = &args.url {
            let list = Target::from_urls(
                url,
                args.baseline_url.as_deref(),
                args.path.as_deref(),
                args.default_path(),
            )?;
            return Ok(Targets { list, server_runtime: None });
        }
        let runtime = runtime(args.server_threads, "server")?;
        let list = inprocess::targets(&runtime, args)?;
        Ok(Targets { list, server_runtime: Some(runtime) })
    }

    fn in_process(&self) -> bool {
        self.server_runtime.is_some()
    }

    fn stop(self) {
        if let Some(runtime) = self.server_runtime {
            runtime.shutdown_background();
        }
    }
}

/// A multi-threaded runtime whose threads are named `name` (the in-process servers'
/// CPU time is measured by that name).
fn runtime(threads: u32, name: &str) -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads as usize)
        .thread_name(name)
        .enable_all()
        .build()
}

/// Every round of every target, announced on stderr first.
fn measure(args: &Args, plan: &Arc<Plan>, targets: &Targets, client: &Runtime) -> Measured {
    // One schedule per target for the whole run, so that rising tokens keep rising across rounds.
    let schedules: Vec<_> = targets
        .list
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
        targets.list.len(),
        plan.request.method,
        targets.list.last().map_or("", |t| t.template.as_str()),
        args.connections,
        args.rate.map_or("closed loop".to_owned(), |r| format!("open loop at {r} req/s")),
        args.rounds,
        args.duration,
        args.warmup_ms,
        loadavg_start
    );
    let server_threads = targets.in_process().then_some("server");
    let outcome = compare::run(client, &targets.list, plan, &schedules, args.rounds, server_threads);
    Measured { outcome, loadavg_start, loadavg_end: loadavg() }
}

// The report.

/// The rows and ratios on stdout, `--plot` and `--json` written; the thresholds broken.
fn report(
    args: &Args,
    plan: &Plan,
    targets: &Targets,
    measured: &Measured,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let outcome = &measured.outcome;
    report::print(&outcome.rows, outcome.ratios.as_ref());
    println!("load average: start {}, end {}", measured.loadavg_start, measured.loadavg_end);
    let violations = args.thresholds().judge(&outcome.rows, outcome.ratios.as_ref());
    if let Some(path) = &args.plot {
        std::fs::write(path, plot_svg(args, outcome))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.json {
        let json = JsonReport::new(args, plan, targets.in_process(), measured, &violations);
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(violations)
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

/// Success, or the thresholds' exit code after naming each broken one.
fn exit_code(violations: &[String]) -> ExitCode {
    if violations.is_empty() {
        return ExitCode::SUCCESS;
    }
    for violation in violations {
        eprintln!("threshold broken: {violation}");
    }
    ExitCode::from(thresholds::EXIT_CODE as u8)
}
