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

/// The counters behind [`Revocations`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    at_deadline: AtomicU64,
    found_gone: AtomicU64,
    by_request: AtomicU64,
    latest_late_ns: AtomicU64,
}

impl Counters {
    pub(super) fn at_deadline(&self, claims: u64, late: Duration) {
        self.at_deadline.fetch_add(claims, Relaxed);
        let late = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        self.latest_late_ns.fetch_max(late, Relaxed);
    }

    pub(super) fn found_gone(&self, claims: u64) {
        self.found_gone.fetch_add(claims, Relaxed);
    }

    pub(super) fn by_request(&self) {
        self.by_request.fetch_add(1, Relaxed);
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
