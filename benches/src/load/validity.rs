//! Whether a run measured anything: a run whose figures would mislead fails
//! with [`EXIT_CODE`], naming why, and answers the schedule did not expect are
//! warned about.
//!
//! A run measured nothing trustworthy when a target answered no request, when
//! connections to it could not be opened (refused, most often: the figures
//! would cover only the others), or when most of its answers are outside 2xx,
//! 409 and 400 (a wrong path or method: 404s come back fast, and a run of them
//! looks like a fast service). These are judged on every target, before and
//! apart from the thresholds, which judge a valid run.
//!
//! ```
//! use fencing_benches::load::validity::EXIT_CODE;
//!
//! assert_eq!(EXIT_CODE, 3);
//! ```

use std::fmt::Write as _;

use super::report::TargetRow;

/// The exit code of a run whose figures are not a measurement.
pub const EXIT_CODE: i32 = 3;

/// Why the run's figures are not a measurement of `rows`' targets, one sentence per
/// cause; empty when they are. `max_other_share`: the largest share of answers
/// allowed outside 2xx, 409 and 400.
#[must_use]
pub fn invalid(rows: &[TargetRow], max_other_share: f64) -> Vec<String> {
    let mut out = Vec::new();
    for row in rows {
        let name = format!("{} ({}{})", row.target, row.url, row.path);
        let answered = row.answered();
        if row.connect_errors > 0 {
            out.push(format!(
                "{name}: {} connection(s) could not be opened (refused, or no such server): \
                 the figures cover only the others",
                row.connect_errors
            ));
        }
        if answered == 0 {
            out.push(format!(
                "{name}: no request was answered ({} without an answer): nothing was measured",
                row.errors
            ));
            continue;
        }
        let share = row.status_other as f64 / answered as f64;
        if share > max_other_share {
            let mut codes = String::new();
            for (code, n) in &row.status_other_by_code {
                let _ = write!(codes, "{}{code} ×{n}", if codes.is_empty() { "" } else { ", " });
            }
            let hint = if row.status_other_by_code.keys().any(|&c| c == 404 || c == 405) {
                ": is the path template or the method right?"
            } else {
                ""
            };
            out.push(format!(
                "{name}: {:.1} % of {answered} answers were outside 2xx, 409 and 400 ({codes}), \
                 above --max-other-share {max_other_share}{hint}",
                100.0 * share
            ));
        }
    }
    out
}

/// Warnings about `rows`: more 409s than the schedule expects (`expected_409`, a
/// share; `None` when it cannot say) by more than `tolerance`, which means the keys
/// already had marks above the run's tokens.
#[must_use]
pub fn warnings(rows: &[TargetRow], expected_409: Option<f64>, tolerance: f64) -> Vec<String> {
    let Some(expected) = expected_409 else { return Vec::new() };
    let mut out = Vec::new();
    for row in rows {
        let answered = row.answered();
        if answered == 0 {
            continue;
        }
        let share = row.status_409 as f64 / answered as f64;
        if share > expected + tolerance {
            out.push(format!(
                "{}: {:.1} % of answers were 409 (stale token) where the schedule expects {:.1} %: \
                 the keys already had marks above this run's tokens (an earlier run with the same \
                 --run-id or --key-prefix, or keys of a real holder), so this run mostly measured \
                 refusals. Use fresh keys (a new run id, the default), --first-token above the \
                 marks, or --start-above-mark",
                row.target,
                100.0 * share,
                100.0 * expected
            ));
        }
    }
    out
}

/// A plain sentence for each target the open loop could not drive at `rate`
/// (requests per second in all): slots it never sent, because the target (or the
/// generator) was too slow. Its latencies are then an overloaded target's.
#[must_use]
pub fn rate_not_reached(rows: &[TargetRow], rate: Option<f64>) -> Vec<String> {
    let Some(rate) = rate else { return Vec::new() };
    rows.iter()
        .filter(|row| row.missed > 0)
        .map(|row| {
            format!(
                "{}: the target rate was not reached: {rate:.0} req/s asked, {:.0} req/s sent; {} slots \
                 were never sent, and the latencies are those of an overloaded target (lower --rate to \
                 measure it below saturation)",
                row.target, row.requests_per_s, row.missed
            )
        })
        .collect()
}
