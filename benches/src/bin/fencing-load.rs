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
//! `--max-error-pct` and `--min-rps` set the exit code (99 when broken); a run
//! that measured nothing trustworthy (connections refused, no answer, mostly
//! 404s) exits 3 and says why; `--plot` draws the latency percentiles. Targets
//! must be loopback addresses; every run is bounded in connections and time.
//!
//! Every run writes to keys of its own, `load-<run id>-<n>` in the path's
//! `{key}`, so it never raises a mark a real holder needs; a path without
//! `{key}` is refused against `--url` unless `--allow-real-keys`. `--help`
//! says what a run leaves behind. The parts are in [`fencing_benches::load`].
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
use fencing_benches::load::args::{self, Args};
use fencing_benches::load::compare::{self, Measured, Outcome};
use fencing_benches::load::inprocess::{self, loadavg};
use fencing_benches::load::json::{JsonReport, LeftBehind, Verdict};
use fencing_benches::load::request::{self, RequestSpec};
use fencing_benches::load::runner::Plan;
use fencing_benches::load::schedule::Schedule;
use fencing_benches::load::target::Target;
use fencing_benches::load::{plot, probe, report, thresholds, validity};
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

/// The arguments, then the run, then the report: the exit code says whether the run
/// measured anything (3 if not) and whether a threshold broke (99).
fn run() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.validate()?;
    if let Some(addr) = args.serve_only {
        return serve_only(&args, addr);
    }
    let run_id = args.run_id.clone().unwrap_or_else(args::new_run_id);
    let keys = Keys { prefix: args.key_prefix(&run_id), run_id };
    let plan = Arc::new(plan(&args)?);
    let targets = Targets::start(&args, &keys.prefix)?;
    let client = runtime(args.client_threads, "client")?;
    if !targets.in_process() {
        for target in &targets.list {
            if let Err(e) = client.block_on(probe::reachable(target)) {
                eprintln!("fencing-load: nothing measured: {e}");
                return Ok(ExitCode::from(validity::EXIT_CODE as u8));
            }
        }
    }
    let schedules = schedules(&args, &plan, &targets, &client)?;
    let measured = measure(&args, &plan, &targets, &keys, &schedules, &client);
    let verdict = report(&args, &plan, &targets, &keys, &schedules, &measured)?;
    drop(client);
    targets.stop();
    Ok(exit_code(&verdict))
}

/// `--serve-only ADDR`: the fenced stand-in for `--duration` seconds, nothing sent.
fn serve_only(args: &Args, addr: std::net::SocketAddr) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let runtime = runtime(args.server_threads, "server")?;
    let addr = inprocess::serve_fenced_at(&runtime, args, addr)?;
    eprintln!(
        "fencing-load: serving the fenced stand-in at http://{addr}/logs/{{name}} (POST) for {} s, \
         {} server thread(s)",
        args.duration, args.server_threads
    );
    std::thread::sleep(Duration::from_secs(args.duration));
    runtime.shutdown_background();
    Ok(ExitCode::SUCCESS)
}

/// The run's id and the text before each key's number.
struct Keys {
    run_id: String,
    prefix: String,
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
    /// `--url` (and `--baseline-url`), or the two in-process stand-ins; their keys after
    /// `key_prefix`. A `--url` whose requests would write to real keys is refused unless
    /// `--allow-real-keys`.
    fn start(args: &Args, key_prefix: &str) -> Result<Self, Box<dyn std::error::Error>> {
        if let Some(url) = &args.url {
            let list = Target::from_urls(
                url,
                args.baseline_url.as_deref(),
                args.path.as_deref(),
                args.default_path(),
            )?
            .into_iter()
            .map(|target| target.with_key_prefix(key_prefix))
            .collect::<Result<Vec<_>, _>>()?;
            if !args.allow_real_keys {
                refuse_real_keys(&list, key_prefix)?;
            }
            return Ok(Targets { list, server_runtime: None });
        }
        let runtime = runtime(args.server_threads, "server")?;
        let list = inprocess::targets(&runtime, args, key_prefix)?;
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

/// Refuses targets whose requests would write to keys a real holder may use: a path
/// without `{key}` (before any `?`), or keys without a prefix.
fn refuse_real_keys(targets: &[Target], key_prefix: &str) -> Result<(), String> {
    let consequence = "every request would write to a real key of the service and raise its mark \
        for good (the fencing layer never evicts a mark), so the key's real holder, whose tokens \
        are lower than this run's, would get 409 until someone resets the mark";
    for target in targets {
        if !target.template.key_in_path() {
            return Err(format!(
                "refusing path template {:?} for {}: it has no {{key}} in its path; {consequence}. \
                 Put {{key}} in the path (it expands to {key_prefix}<n>, keys of this run only), \
                 or pass --allow-real-keys if this server's marks may be raised (a throwaway server)",
                target.template.as_str(),
                target.label
            ));
        }
    }
    if key_prefix.is_empty() {
        return Err(format!(
            "refusing --key-prefix '': {{key}} would expand to bare numbers; {consequence}. \
             Pick a prefix no real key has, or pass --allow-real-keys"
        ));
    }
    Ok(())
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

/// One schedule per target for the whole run, so that rising tokens keep rising across
/// rounds; with `--start-above-mark`, each key's first token one above its mark on that target.
fn schedules(
    args: &Args,
    plan: &Arc<Plan>,
    targets: &Targets,
    client: &Runtime,
) -> Result<Vec<Arc<Schedule>>, String> {
    let mut schedules = Vec::new();
    for target in &targets.list {
        let schedule = Schedule::new(
            args.key_count(),
            args.connections,
            args.new_holder_every,
            args.stale_pct,
            args.malformed_pct,
        )
        .with_first_token(args.first_token);
        let schedule = if args.start_above_mark {
            let marks = client.block_on(probe::marks(target, plan, args.key_count(), args.connections))?;
            let marked = marks.iter().flatten().count();
            let highest = marks.iter().flatten().max();
            eprintln!(
                "fencing-load: --start-above-mark: {} keys of {} probed, {marked} had a mark{}",
                marks.len(),
                target.label,
                highest.map_or(String::new(), |h| format!(" (the highest {h})"))
            );
            let firsts = marks
                .iter()
                .map(|mark| mark.map_or(args.first_token, |m| m.saturating_add(1).max(args.first_token)))
                .collect();
            schedule.with_first_tokens(firsts)
        } else {
            schedule
        };
        schedules.push(Arc::new(schedule));
    }
    Ok(schedules)
}

/// Every round of every target, announced on stderr first.
fn measure(
    args: &Args,
    plan: &Arc<Plan>,
    targets: &Targets,
    keys: &Keys,
    schedules: &[Arc<Schedule>],
    client: &Runtime,
) -> Measured {
    let loadavg_start = loadavg();
    let template = targets.list.last().map(|t| &t.template);
    eprintln!(
        "fencing-load: {} target(s), {} {} on {} connections, {}, {} rounds x {} s (first {} ms not counted), load {}",
        targets.list.len(),
        plan.request.method,
        template.map_or("", |t| t.as_str()),
        args.connections,
        args.rate.map_or("closed loop".to_owned(), |r| format!("open loop at {r} req/s")),
        args.rounds,
        args.duration,
        args.warmup_ms,
        loadavg_start
    );
    if let Some(template) = template
        && template.key_in_path()
    {
        eprintln!(
            "fencing-load: run id {}: {} keys, {} to {}",
            keys.run_id,
            args.key_count(),
            template.expand(0, 0, 0),
            template.expand(0, 0, args.key_count() - 1)
        );
    }
    let server_threads = targets.in_process().then_some("server");
    let outcome = compare::run(client, &targets.list, plan, schedules, args.rounds, server_threads);
    Measured { outcome, loadavg_start, loadavg_end: loadavg() }
}

// The report.

/// What the run concluded: why its figures are not a measurement, its warnings, the
/// thresholds broken.
struct Conclusion {
    invalid: Vec<String>,
    warnings: Vec<String>,
    violations: Vec<String>,
}

/// The rows and ratios on stdout, warnings and what the run left behind on stderr,
/// `--plot` and `--json` written; what the run concluded.
fn report(
    args: &Args,
    plan: &Plan,
    targets: &Targets,
    keys: &Keys,
    schedules: &[Arc<Schedule>],
    measured: &Measured,
) -> Result<Conclusion, Box<dyn std::error::Error>> {
    let outcome = &measured.outcome;
    report::print(&outcome.rows, outcome.ratios.as_ref());
    println!("load average: start {}, end {}", measured.loadavg_start, measured.loadavg_end);
    for row in outcome.rows.iter().filter(|row| row.reconnects > 0) {
        println!(
            "{}: the target closed {} connections between requests; fencing-load opened new ones \
             (not errors; each cost a handshake)",
            row.target, row.reconnects
        );
    }
    let conclusion = Conclusion {
        invalid: validity::invalid(&outcome.rows, args.max_other_share),
        warnings: [
            validity::rate_not_reached(&outcome.rows, args.rate),
            validity::warnings(
                &outcome.rows,
                schedules.first().and_then(|s| s.expected_409_share()),
                args.warn_409_share,
            ),
        ]
        .concat(),
        violations: args.thresholds().judge(&outcome.rows, outcome.ratios.as_ref()),
    };
    for warning in &conclusion.warnings {
        eprintln!("warning: {warning}");
    }
    let left_behind = left_behind(args, targets, measured);
    if let Some(left) = &left_behind {
        eprintln!(
            "left behind, if the target is fenced: marks on {} keys, {} to {} (never evicted; \
             kept on disk by a durable store; no real holder uses these keys; --help says how to \
             find them)",
            left.keys, left.first, left.last
        );
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot_svg(args, outcome))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.json {
        let first_tokens = schedules
            .iter()
            .map(|s| {
                let firsts = (0..args.key_count()).map(|k| s.first_token(k));
                (firsts.clone().min().unwrap_or(0), firsts.max().unwrap_or(0))
            })
            .collect();
        let verdict = Verdict {
            run_id: &keys.run_id,
            key_prefix: &keys.prefix,
            first_tokens,
            left_behind,
            invalid: &conclusion.invalid,
            warnings: &conclusion.warnings,
            violations: &conclusion.violations,
        };
        let json = JsonReport::new(args, plan, targets.in_process(), measured, &verdict);
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(conclusion)
}

/// Against `--url`: the keys the fenced target (the last) answered on, whose marks stay.
fn left_behind(args: &Args, targets: &Targets, measured: &Measured) -> Option<LeftBehind> {
    if targets.in_process() {
        return None;
    }
    let (target, row) = targets.list.last().zip(measured.outcome.rows.last())?;
    // Only a 2xx or a 409 says a fenced target took the key: all 404s (a wrong
    // route) or no answers say nothing was left.
    (row.status_2xx + row.status_409 > 0).then(|| LeftBehind {
        keys: args.key_count(),
        first: target.template.expand(0, 0, 0),
        last: target.template.expand(0, 0, args.key_count() - 1),
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

/// Success; or 3 after naming why nothing trustworthy was measured; or the thresholds'
/// exit code after naming each broken one.
fn exit_code(conclusion: &Conclusion) -> ExitCode {
    for violation in &conclusion.violations {
        eprintln!("threshold broken: {violation}");
    }
    for cause in &conclusion.invalid {
        eprintln!("invalid run: {cause}");
    }
    if !conclusion.invalid.is_empty() {
        ExitCode::from(validity::EXIT_CODE as u8)
    } else if !conclusion.violations.is_empty() {
        ExitCode::from(thresholds::EXIT_CODE as u8)
    } else {
        ExitCode::SUCCESS
    }
}
