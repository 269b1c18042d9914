//! How this replica's claims were revoked, counted: what an operator (or a
//! test) reads to see that requests were stopped in time, and by which stop.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Revocations of this replica's claims since the store was made, by cause,
/// as [`ClaimStore::revocations`](super::ClaimStore::revocations) reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revocations {
    /// Claims the keeper revoked at their deadline (not renewed in time).
    pub at_deadline: u64,
    /// Claims a renewal found gone from the backend (expired and deleted by a
    /// raise, or deleted by hand).
    pub found_gone: u64,
    /// Claims a request inside revoked itself, its own timer having seen the
    /// deadline pass before the keeper did (the keeper was late or stuck).
    pub by_request: u64,
    /// The longest any claim stayed unrevoked past its deadline, as the
    /// keeper found it: how late the keeper's revocations ran.
    pub latest_late: Duration,
    /// Log lines the keeper dropped because the log output did not keep up
    /// (it never waits for it).
    pub dropped_log_lines: u64,
}

/// The counters behind [`Revocations`] (and the metrics, with the feature).
#[derive(Debug, Default)]
pub(super) struct Counters {
    at_deadline: AtomicU64,
    found_gone: AtomicU64,
    by_request: AtomicU64,
    latest_late_ns: AtomicU64,
    #[cfg(feature = "metrics")]
    pub(super) metered: std::sync::OnceLock<Metered>,
}

impl Counters {
    pub(super) fn at_deadline(&self, claims: u64, late: Duration) {
        self.at_deadline.fetch_add(claims, Relaxed);
        let late = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        self.latest_late_ns.fetch_max(late, Relaxed);
        #[cfg(feature = "metrics")]
        self.metered.get().inspect(|metered| metered.deadline.increment(claims));
    }

    pub(super) fn found_gone(&self, claims: u64) {
        self.found_gone.fetch_add(claims, Relaxed);
        #[cfg(feature = "metrics")]
        self.metered.get().inspect(|metered| metered.gone.increment(claims));
    }

    pub(super) fn by_request(&self) {
        self.by_request.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.metered.get().inspect(|metered| metered.request.increment(1));
    }

    pub(super) fn read(&self, dropped_log_lines: u64) -> Revocations {
        Revocations {
            at_deadline: self.at_deadline.load(Relaxed),
            found_gone: self.found_gone.load(Relaxed),
            by_request: self.by_request.load(Relaxed),
            latest_late: Duration::from_nanos(self.latest_late_ns.load(Relaxed)),
            dropped_log_lines,
        }
    }
}

/// The same counts through the [`metrics`](https://docs.rs/metrics) facade
/// (feature `metrics`): `fencing_claims_revoked_total{cause}` (`deadline`,
/// `gone`, `request`) and `fencing_claims_log_lines_dropped_total`. Built when
/// the keeper starts, with the recorder in effect then, so every series
/// exists at zero from the start; no label names a key.
#[cfg(feature = "metrics")]
#[derive(Debug, Clone)]
pub(super) struct Metered {
    deadline: metrics::Counter,
    gone: metrics::Counter,
    request: metrics::Counter,
    pub(super) dropped: metrics::Counter,
}

#[cfg(feature = "metrics")]
impl Metered {
    const REVOKED: &str = "fencing_claims_revoked_total";
    const DROPPED: &str = "fencing_claims_log_lines_dropped_total";

    pub(super) fn new() -> Self {
        metrics::describe_counter!(
            Self::REVOKED,
            metrics::Unit::Count,
            "Replica claims revoked, by cause: deadline (not renewed in time), gone (found deleted), request (a request's own deadline check)"
        );
        metrics::describe_counter!(
            Self::DROPPED,
            metrics::Unit::Count,
            "Log lines the claims keeper dropped rather than wait for a slow or stalled log output"
        );
        Self {
            deadline: metrics::counter!(Self::REVOKED, "cause" => "deadline"),
            gone: metrics::counter!(Self::REVOKED, "cause" => "gone"),
            request: metrics::counter!(Self::REVOKED, "cause" => "request"),
            dropped: metrics::counter!(Self::DROPPED),
        }
    }
}
