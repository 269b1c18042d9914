//! `--json PATH`: the run's settings, rows, ratios and broken thresholds as one JSON file.

use serde::Serialize;

use crate::load::args::Args;
use crate::load::compare::Measured;
use crate::load::report;
use crate::load::runner::Plan;

/// The JSON file of `--json`.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
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
    loadavg_start: &'a str,
    loadavg_end: &'a str,
    rounds_detail: &'a [report::RoundRow],
    targets: &'a [report::TargetRow],
    /// Present when there are two targets: the second (fenced) over the first (unfenced).
    ratios: Option<&'a report::Ratios>,
    /// Every threshold the run broke.
    violations: &'a [String],
}

impl<'a> JsonReport<'a> {
    /// The report of a run of `plan` from `args`; `in_process`: the targets were the
    /// in-process stand-ins (then `server_threads` is reported).
    #[must_use]
    pub fn new(
        args: &Args,
        plan: &'a Plan,
        in_process: bool,
        measured: &'a Measured,
        violations: &'a [String],
    ) -> Self {
        let outcome = &measured.outcome;
        JsonReport {
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
            server_threads: in_process.then_some(args.server_threads),
            client_threads: args.client_threads,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            loadavg_start: &measured.loadavg_start,
            loadavg_end: &measured.loadavg_end,
            rounds_detail: &outcome.rounds,
            targets: &outcome.rows,
            ratios: outcome.ratios.as_ref(),
            violations,
        }
    }
}
