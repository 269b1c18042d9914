//! `--json PATH`: the run's settings, keys, rows, ratios, broken thresholds,
//! validity and warnings as one JSON file.

use serde::Serialize;

use crate::load::args::Args;
use crate::load::compare::Measured;
use crate::load::report;
use crate::load::runner::Plan;

/// What the run decided beyond its arguments, and what it concluded.
#[derive(Debug, Serialize)]
pub struct Verdict<'a> {
    /// The run id in the keys (`load-<run id>-<n>`).
    pub run_id: &'a str,
    /// The text before each key's number in `{key}`.
    pub key_prefix: &'a str,
    /// Per target, in the order of `targets`: the lowest and highest first token of its
    /// keys (they differ after `--start-above-mark`).
    pub first_tokens: Vec<(u64, u64)>,
    /// Against `--url`: the keys the run wrote to, whose marks stay (first and last path).
    pub left_behind: Option<LeftBehind>,
    /// Why the figures are not a measurement (exit 3); empty when they are.
    pub invalid: &'a [String],
    /// What the run warned about on stderr.
    pub warnings: &'a [String],
    /// Every threshold the run broke (exit 99).
    pub violations: &'a [String],
}

/// The keys a run against `--url` leaves marks on.
#[derive(Debug, Clone, Serialize)]
pub struct LeftBehind {
    /// How many keys.
    pub keys: u32,
    /// The path of key 0.
    pub first: String,
    /// The path of the last key.
    pub last: String,
}

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
    first_token: u64,
    start_above_mark: bool,
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
    #[serde(flatten)]
    verdict: &'a Verdict<'a>,
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
        verdict: &'a Verdict<'a>,
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
            first_token: args.first_token,
            start_above_mark: args.start_above_mark,
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
            verdict,
        }
    }
}
