//! Pass/fail limits for CI, k6 style: a run that breaks one prints which and
//! exits with [`EXIT_CODE`].
//!
//! They judge the fenced target (the last one: `--url`'s, or the in-process
//! `fenced` stand-in); latencies are the corrected ones in the open loop.
//!
//! ```
//! use fencing_benches::load::thresholds::Thresholds;
//!
//! let limits = Thresholds { max_p99_ms: Some(5.0), ..Thresholds::default() };
//! assert!(!limits.is_empty());
//! ```

use super::report::{Ratios, TargetRow};

/// The exit code of a run that broke a threshold (k6's).
pub const EXIT_CODE: i32 = 99;

/// The limits a run must meet; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Thresholds {
    /// Highest p99 latency, milliseconds.
    pub max_p99_ms: Option<f64>,
    /// Lowest fenced/baseline throughput (the median of the per-round ratios).
    pub min_ratio: Option<f64>,
    /// Highest percent of requests without a usable answer (see [`TargetRow::error_pct`]).
    pub max_error_pct: Option<f64>,
    /// Lowest aggregate requests per second.
    pub min_rps: Option<f64>,
}

impl Thresholds {
    /// Whether no limit is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Every limit the fenced row of `rows` (`target` or `fenced`, the last
    /// such) and `ratios` break, as sentences.
    #[must_use]
    pub fn judge(&self, rows: &[TargetRow], ratios: Option<&Ratios>) -> Vec<String> {
        match rows.iter().rev().find(|row| row.target == "fenced" || row.target == "target") {
            Some(row) => self.violations(row, ratios),
            None if self.is_empty() => Vec::new(),
            None => vec!["thresholds: no fenced target to judge (--only?)".to_owned()],
        }
    }

    /// Every limit `judged` (and `ratios`, when there is a baseline) breaks, as sentences.
    #[must_use]
    pub fn violations(&self, judged: &TargetRow, ratios: Option<&Ratios>) -> Vec<String> {
        let mut out = Vec::new();
        let name = &judged.target;
        if let Some(max) = self.max_p99_ms {
            let p99_ms = judged.latency().p99_us / 1_000.0;
            if p99_ms > max {
                out.push(format!("--max-p99 {max}: {name} p99 was {p99_ms:.3} ms"));
            }
        }
        if let Some(max) = self.max_error_pct {
            let pct = judged.error_pct();
            if pct > max {
                out.push(format!("--max-error-pct {max}: {name} had {pct:.2} % errors"));
            }
        }
        if let Some(min) = self.min_rps
            && judged.requests_per_s < min
        {
            out.push(format!("--min-rps {min}: {name} ran at {:.0} req/s", judged.requests_per_s));
        }
        if let Some(min) = self.min_ratio {
            match ratios {
                Some(r) if r.median_per_round_throughput >= min => {}
                Some(r) => out.push(format!(
                    "--min-ratio {min}: throughput ratio (median of per-round ratios) was {:.3}",
                    r.median_per_round_throughput
                )),
                None => out.push(format!("--min-ratio {min}: no baseline to compare with")),
            }
        }
        out
    }
}
