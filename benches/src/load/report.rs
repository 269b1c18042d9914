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
    /// Open loop: p99 from the intended send time.
    pub corrected_p99_us: Option<f64>,
    /// On-CPU time of the in-process server's threads per request (both servers share them).
    pub server_cpu_ns_per_request: Option<f64>,
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
    /// See `status_2xx`.
    pub status_other: u64,
    /// Requests without an answer (connection refused or dropped, timeout).
    pub errors: u64,
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
            errors: tally.errors,
            missed: tally.missed,
        }
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
    for row in rows {
        println!(
            "{:<9} {:>10} {:>11.0} {:>14.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.0} ns {:>8} {:>6} {:>6} {:>6}",
            row.target,
            row.requests,
            row.requests_per_s,
            row.median_round_requests_per_s,
            row.as_sent.p50_us,
            row.as_sent.p99_us,
            row.as_sent.p999_us,
            row.as_sent.max_us,
            row.server_cpu_ns_per_request.unwrap_or(f64::NAN),
            row.status_2xx,
            row.status_409,
            row.status_400,
            row.errors + row.status_other
        );
    }
    if rows.iter().any(|row| row.corrected.is_some()) {
        println!(
            "open loop, latency from each request's intended send time (corrected for coordinated omission):"
        );
        for row in rows {
            if let Some(c) = row.corrected {
                println!(
                    "{:<9} {:>10} {:>11} {:>14} {:>9.1} {:>9.1} {:>9.1} {:>9.1}   missed slots {}, sent late by p50 {:.1} p99 {:.1} us",
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
                    row.send_lag.map_or(f64::NAN, |l| l.p99_us)
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
