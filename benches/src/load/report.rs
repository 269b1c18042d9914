//! The results: one row per round and per target, the fenced/baseline ratios,
//! printed as a table and written as JSON.
//!
//! In the open loop every latency has two figures: "as sent" (from the moment
//! the request went out) and "corrected" (from its slot in the schedule). The
//! corrected ones are those to judge a target by; the gap between the two is
//! how much the closed-loop view would hide.
//!
//! ```
//! use fencing_benches::load::report::median;
//!
//! // The per-round throughput ratios are summed up by their median.
//! assert_eq!(median(&mut [0.97, 1.02, 0.91]), 0.97);
//! assert_eq!(median(&mut [1.0, 0.9]), 0.95);
//! ```

use std::collections::BTreeMap;

use serde::Serialize;

use super::tally::{Tally, micros};

/// One target's figures in one round.
#[derive(Debug, Clone, Serialize)]
pub struct RoundRow {
    /// 1-based.
    pub round: u32,
    /// The target's label.
    pub target: String,
    /// Requests measured.
    pub requests: u64,
    /// Measured requests per second.
    pub requests_per_s: f64,
    /// Latency percentiles, as sent.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// See `p50_us`.
    pub p999_us: f64,
    /// Open loop: p50 from the intended send time.
    pub corrected_p50_us: Option<f64>,
    /// Open loop: p99 from the intended send time.
    pub corrected_p99_us: Option<f64>,
    /// Open loop: how late requests went out after their slots, median.
    pub send_lag_p50_us: Option<f64>,
    /// See `send_lag_p50_us`: 99th percentile.
    pub send_lag_p99_us: Option<f64>,
    /// See `send_lag_p50_us`: largest.
    pub send_lag_max_us: Option<f64>,
    /// On-CPU time of the in-process server's threads per request (both servers share them).
    pub server_cpu_ns_per_request: Option<f64>,
    /// Answers by status, as in the summary ([`TargetRow`]).
    pub status_2xx: u64,
    /// See `status_2xx`.
    pub status_409: u64,
    /// See `status_2xx`.
    pub status_400: u64,
    /// Any other status (404 included).
    pub status_other: u64,
    /// Requests without an answer (connection refused or dropped, timeout).
    pub errors: u64,
    /// Connections the target closed between requests, replaced ([`Tally::reconnects`]).
    pub reconnects: u64,
}

impl RoundRow {
    /// Round `round` of `target`: `tally` over `seconds` measured; `cpu_ns`: the in-process
    /// servers' CPU time over the round (divided by every answer, warm-up included).
    #[must_use]
    pub fn new(round: u32, target: &str, tally: &Tally, seconds: f64, cpu_ns: Option<u64>) -> Self {
        let open = !tally.intended_latency.is_empty();
        let lag = |q: f64| (!tally.send_lag.is_empty()).then(|| micros(&tally.send_lag, q));
        Self {
            round,
            target: target.to_owned(),
            requests: tally.requests(),
            requests_per_s: tally.requests() as f64 / seconds,
            p50_us: micros(&tally.sent_latency, 0.5),
            p99_us: micros(&tally.sent_latency, 0.99),
            p999_us: micros(&tally.sent_latency, 0.999),
            corrected_p50_us: open.then(|| micros(&tally.intended_latency, 0.5)),
            corrected_p99_us: open.then(|| micros(&tally.intended_latency, 0.99)),
            send_lag_p50_us: lag(0.5),
            send_lag_p99_us: lag(0.99),
            send_lag_max_us: lag(1.0),
            server_cpu_ns_per_request: cpu_ns.map(|ns| ns as f64 / tally.all_requests as f64),
            status_2xx: tally.ok,
            status_409: tally.stale,
            status_400: tally.bad_request,
            status_other: tally.other_status,
            errors: tally.errors,
            reconnects: tally.reconnects,
        }
    }

    /// The round's line on stderr: the same counts, named the same way, as the summary's.
    #[must_use]
    pub fn line(&self, rounds: u32, loadavg: &str) -> String {
        let corrected = match (self.corrected_p50_us, self.corrected_p99_us) {
            (Some(p50), Some(p99)) => format!("  corrected p50 {p50:>7.1} p99 {p99:>8.1} us"),
            _ => String::new(),
        };
        let lag = match (self.send_lag_p50_us, self.send_lag_p99_us, self.send_lag_max_us) {
            (Some(p50), Some(p99), Some(max)) => {
                format!("  sent late p50 {p50:.1} p99 {p99:.1} max {max:.1} us")
            }
            _ => String::new(),
        };
        format!(
            "round {}/{rounds} {:<9} {:>9.0} req/s  p50 {:>7.1} us  p99 {:>7.1} us  p99.9 {:>7.1} us{corrected}{lag}  \
             server {:>9} CPU/req  2xx {} 409 {} 400 {} other {} errors {}{}  load {loadavg}",
            self.round,
            self.target,
            self.requests_per_s,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            cpu_per_request(self.server_cpu_ns_per_request),
            self.status_2xx,
            self.status_409,
            self.status_400,
            self.status_other,
            self.errors,
            if self.reconnects > 0 { format!(" reconnects {}", self.reconnects) } else { String::new() },
        )
    }
}

/// A server's CPU time per request, or `n/a` where it is not known (a target in
/// another process: only the in-process stand-ins' threads are measured).
fn cpu_per_request(ns: Option<f64>) -> String {
    ns.filter(|ns| ns.is_finite()).map_or_else(|| "n/a".to_owned(), |ns| format!("{ns:.0} ns"))
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
}

impl Percentiles {
    fn of(histogram: &hdrhistogram::Histogram<u64>) -> Self {
        Self {
            p50_us: micros(histogram, 0.5),
            p99_us: micros(histogram, 0.99),
            p999_us: micros(histogram, 0.999),
            max_us: histogram.max() as f64 / 1_000.0,
        }
    }
}

/// One target over every round.
#[derive(Debug, Clone, Serialize)]
pub struct TargetRow {
    /// The target's label.
    pub target: String,
    /// Its base URL(s).
    pub url: String,
    /// Its path template.
    pub path: String,
    /// Requests measured.
    pub requests: u64,
    /// Seconds measured over all rounds.
    pub measured_s: f64,
    /// Aggregate requests per second.
    pub requests_per_s: f64,
    /// Over the rounds: median, lowest and highest rate.
    pub median_round_requests_per_s: f64,
    /// See `median_round_requests_per_s`.
    pub min_round_requests_per_s: f64,
    /// See `median_round_requests_per_s`.
    pub max_round_requests_per_s: f64,
    /// Latency from the moment each request was sent (the closed loop's only view).
    #[serde(flatten)]
    pub as_sent: Percentiles,
    /// Open loop: latency from each request's slot in the schedule (wrk2's correction).
    pub corrected: Option<Percentiles>,
    /// Open loop: how late requests went out after their slots (the generator's own share).
    pub send_lag: Option<Percentiles>,
    /// In-process only: server on-CPU time per request.
    pub server_cpu_ns_per_request: Option<f64>,
    /// Answers by status.
    pub status_2xx: u64,
    /// See `status_2xx`.
    pub status_409: u64,
    /// See `status_2xx`.
    pub status_400: u64,
    /// Any other status (404 included).
    pub status_other: u64,
    /// `status_other` by code (`{"404": 1234}`).
    pub status_other_by_code: BTreeMap<u16, u64>,
    /// Requests without an answer (connection refused or dropped, timeout).
    pub errors: u64,
    /// Of `errors`: connections that could not be opened.
    pub connect_errors: u64,
    /// Connections the target closed between requests, replaced ([`Tally::reconnects`]).
    pub reconnects: u64,
    /// The connections of each round.
    pub connections: u32,
    /// Open loop: slots never sent because the target was too slow.
    pub missed: u64,
}

impl TargetRow {
    /// The row for `tally`, measured over `measured_s` in rounds of `per_round` req/s.
    #[must_use]
    pub fn new(
        target: &super::target::Target,
        tally: &Tally,
        measured_s: f64,
        per_round: &mut [f64],
        connections: u32,
    ) -> Self {
        Self {
            target: target.label.clone(),
            url: target.urls(),
            path: target.template.as_str().to_owned(),
            requests: tally.requests(),
            measured_s,
            requests_per_s: tally.requests() as f64 / measured_s,
            median_round_requests_per_s: median(per_round),
            min_round_requests_per_s: per_round.iter().copied().fold(f64::INFINITY, f64::min),
            max_round_requests_per_s: per_round.iter().copied().fold(0.0, f64::max),
            as_sent: Percentiles::of(&tally.sent_latency),
            corrected: (!tally.intended_latency.is_empty()).then(|| Percentiles::of(&tally.intended_latency)),
            send_lag: (!tally.send_lag.is_empty()).then(|| Percentiles::of(&tally.send_lag)),
            server_cpu_ns_per_request: None,
            status_2xx: tally.ok,
            status_409: tally.stale,
            status_400: tally.bad_request,
            status_other: tally.other_status,
            status_other_by_code: tally.other_by_status.clone(),
            errors: tally.errors,
            connect_errors: tally.connect_errors,
            reconnects: tally.reconnects,
            connections,
            missed: tally.missed,
        }
    }

    /// Answers measured, whatever their status.
    #[must_use]
    pub fn answered(&self) -> u64 {
        self.status_2xx + self.status_409 + self.status_400 + self.status_other
    }

    /// The latencies to judge by: corrected in the open loop, as sent in the closed loop.
    #[must_use]
    pub fn latency(&self) -> Percentiles {
        self.corrected.unwrap_or(self.as_sent)
    }

    /// Percent of requests without a usable answer: no answer, or a status
    /// other than 2xx, 409 and 400 (which the token mix asks for).
    #[must_use]
    pub fn error_pct(&self) -> f64 {
        let bad = self.errors + self.status_other;
        let all = self.status_2xx + self.status_409 + self.status_400 + bad;
        if all == 0 { 100.0 } else { 100.0 * bad as f64 / all as f64 }
    }
}

/// The second target (fenced) over the first (baseline).
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    /// Aggregate requests per second.
    pub throughput: f64,
    /// The same, over the median round of each.
    pub median_round_throughput: f64,
    /// Latency ratios (corrected in the open loop).
    pub p50: f64,
    /// See `p50`.
    pub p99: f64,
    /// See `p50`.
    pub p999: f64,
    /// In-process only: server on-CPU time per request.
    pub server_cpu_per_request: Option<f64>,
    /// Throughput ratio of each round (the two targets ran back to back), and their median:
    /// the statistic least moved by a machine whose load drifts between rounds.
    pub per_round_throughput: Vec<f64>,
    /// See `per_round_throughput`.
    pub median_per_round_throughput: f64,
}

impl Ratios {
    /// `fenced / base`, with `per_round` the per-round throughput ratios.
    #[must_use]
    pub fn new(base: &TargetRow, fenced: &TargetRow, mut per_round: Vec<f64>) -> Self {
        let (b, f) = (base.latency(), fenced.latency());
        Self {
            median_per_round_throughput: median(&mut per_round),
            per_round_throughput: per_round,
            throughput: fenced.requests_per_s / base.requests_per_s,
            median_round_throughput: fenced.median_round_requests_per_s / base.median_round_requests_per_s,
            p50: f.p50_us / b.p50_us,
            p99: f.p99_us / b.p99_us,
            p999: f.p999_us / b.p999_us,
            server_cpu_per_request: fenced
                .server_cpu_ns_per_request
                .zip(base.server_cpu_ns_per_request)
                .map(|(f, b)| f / b),
        }
    }
}

/// The median of `values` (sorted in place); 0 when empty.
pub fn median(values: &mut [f64]) -> f64 {
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

/// Prints the table, one row per target, and the ratios, on stdout.
pub fn print(rows: &[TargetRow], ratios: Option<&Ratios>) {
    println!(
        "{:<9} {:>10} {:>11} {:>14} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>6} {:>6} {:>6} {:>6}",
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
        "other",
        "errors"
    );
    for row in rows {
        println!(
            "{:<9} {:>10} {:>11.0} {:>14.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>12} {:>8} {:>6} {:>6} {:>6} {:>6}",
            row.target,
            row.requests,
            row.requests_per_s,
            row.median_round_requests_per_s,
            row.as_sent.p50_us,
            row.as_sent.p99_us,
            row.as_sent.p999_us,
            row.as_sent.max_us,
            cpu_per_request(row.server_cpu_ns_per_request),
            row.status_2xx,
            row.status_409,
            row.status_400,
            row.status_other,
            row.errors
        );
    }
    if rows.iter().any(|row| row.corrected.is_some()) {
        println!(
            "open loop, latency from each request's intended send time (corrected for coordinated omission):"
        );
        for row in rows {
            if let Some(c) = row.corrected {
                println!(
                    "{:<9} {:>10} {:>11} {:>14} {:>9.1} {:>9.1} {:>9.1} {:>9.1}   missed slots {}, sent late by p50 {:.1} p99 {:.1} max {:.1} us",
                    row.target,
                    "",
                    "",
                    "",
                    c.p50_us,
                    c.p99_us,
                    c.p999_us,
                    c.max_us,
                    row.missed,
                    row.send_lag.map_or(f64::NAN, |l| l.p50_us),
                    row.send_lag.map_or(f64::NAN, |l| l.p99_us),
                    row.send_lag.map_or(f64::NAN, |l| l.max_us)
                );
            }
        }
    }
    if let (Some(r), [base, fenced, ..]) = (ratios, rows) {
        println!(
            "ratio {}/{}: throughput {:.3} (median round {:.3}, median of per-round ratios {:.3}), \
             p50 {:.3}, p99 {:.3}, p99.9 {:.3}{}, server CPU per request {:.3}",
            fenced.target,
            base.target,
            r.throughput,
            r.median_round_throughput,
            r.median_per_round_throughput,
            r.p50,
            r.p99,
            r.p999,
            if fenced.corrected.is_some() { " (corrected)" } else { "" },
            r.server_cpu_per_request.unwrap_or(f64::NAN)
        );
    }
}
