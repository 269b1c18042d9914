//! The gate's own series, beside the layer's (`fencing_requests_total` and
//! the rest, labelled `layer="gate"`), through the `metrics` facade:
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fencing_gate_upstream_total` | counter | `outcome` | upstream exchanges: `answered`, `unreachable` (502, nothing sent), `failed` (502 after sending), `timeout` (504) |
//! | `fencing_gate_quarantines_total` | counter | | exchanges whose outcome is unknown: their key stayed closed to higher tokens for the quarantine |
//! | `fencing_gate_refused_total` | counter | `reason` | requests the gate refused before fencing: `headers-too-large`, `ambiguous-path`, `unsupported-transfer-coding`, `upgrade-refused`, `connect-refused` |

use metrics::Counter;

use crate::exchange::UpstreamOutcome;
use crate::problem::GateProblem;

/// Handles made once, with the recorder installed then: every series exists at zero.
#[derive(Debug, Clone)]
pub(crate) struct GateMetrics {
    upstream: [Counter; 4],
    quarantines: Counter,
    refused: [Counter; 5],
}

impl GateMetrics {
    pub(crate) fn new() -> Self {
        let upstream = ["answered", "unreachable", "failed", "timeout"]
            .map(|outcome| metrics::counter!("fencing_gate_upstream_total", "outcome" => outcome));
        let refused = [
            "headers-too-large",
            "ambiguous-path",
            "unsupported-transfer-coding",
            "upgrade-refused",
            "connect-refused",
        ]
        .map(|reason| metrics::counter!("fencing_gate_refused_total", "reason" => reason));
        let quarantines = metrics::counter!("fencing_gate_quarantines_total");
        for counter in upstream.iter().chain(&refused).chain([&quarantines]) {
            counter.increment(0);
        }
        Self { upstream, quarantines, refused }
    }

    pub(crate) fn upstream(&self, outcome: UpstreamOutcome) {
        self.upstream[outcome as usize].increment(1);
    }

    pub(crate) fn quarantined(&self) {
        self.quarantines.increment(1);
    }

    pub(crate) fn refused(&self, problem: GateProblem) {
        let index = match problem {
            GateProblem::HeadersTooLarge => 0,
            GateProblem::AmbiguousPath => 1,
            GateProblem::UnsupportedTransferCoding => 2,
            GateProblem::UpgradeRefused => 3,
            GateProblem::ConnectRefused => 4,
            _ => return,
        };
        self.refused[index].increment(1);
    }
}
