//! The in-memory lease table, and the lease ids and expiries it is keyed by.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// A lease id: 128 random bits, shown as 32 lowercase hex characters.
pub(crate) type LeaseId = u128;

/// A lease in memory (live, or expired and not yet forgotten).
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) lease_id: LeaseId,
    pub(crate) holder: Box<str>,
    pub(crate) token: u64,
    pub(crate) ttl: Duration,
    pub(crate) expires: Instant,
}

/// The in-memory lock table. Only ever locked for short, await-free sections.
///
/// One entry per lease in each map; the name is shared (`Arc<str>`), so a lease
/// costs its name and holder once plus a fixed overhead (BENCHMARKS.md §9).
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// lock name → its current (possibly expired) lease.
    pub(crate) by_name: HashMap<Arc<str>, Live>,
    /// lease id → lock name.
    pub(crate) by_id: HashMap<LeaseId, Arc<str>>,
    /// (expiry, token) → lock name, earliest expiry first: expired leases are found
    /// without a scan. Tokens are unique, so keys are too.
    pub(crate) by_expiry: BTreeMap<(Instant, u64), Arc<str>>,
}

impl Table {
    pub(crate) fn insert(&mut self, name: Arc<str>, live: Live) {
        self.by_id.insert(live.lease_id, Arc::clone(&name));
        self.by_expiry.insert((live.expires, live.token), Arc::clone(&name));
        if let Some(old) = self.by_name.insert(name, live) {
            self.by_id.remove(&old.lease_id);
            self.by_expiry.remove(&(old.expires, old.token));
        }
    }

    pub(crate) fn remove_by_id(&mut self, lease_id: LeaseId) -> Option<(Arc<str>, Live)> {
        let name = self.by_id.remove(&lease_id)?;
        let live = self.by_name.remove(&name)?;
        self.by_expiry.remove(&(live.expires, live.token));
        Some((name, live))
    }

    /// Moves the expiry of `name`'s lease to `expires`.
    pub(crate) fn renew(&mut self, name: &Arc<str>, expires: Instant) {
        if let Some(live) = self.by_name.get_mut(name) {
            if let Some(n) = self.by_expiry.remove(&(live.expires, live.token)) {
                self.by_expiry.insert((expires, live.token), n);
            }
            live.expires = expires;
        }
    }

    /// Up to `limit` leases expired at `now`, earliest first: (name, lease id).
    pub(crate) fn expired(&self, now: Instant, limit: usize) -> Vec<(Arc<str>, LeaseId)> {
        self.by_expiry
            .iter()
            .take_while(|((expires, _), _)| *expires <= now)
            .take(limit)
            .filter_map(|(_, name)| self.by_name.get(name).map(|l| (Arc::clone(name), l.lease_id)))
            .collect()
    }

    /// The earliest expiry after `now`, if any lease is live.
    pub(crate) fn next_expiry(&self, now: Instant) -> Option<Instant> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.by_expiry.range((Excluded((now, u64::MAX)), Unbounded)).next().map(|((e, _), _)| *e)
    }
}

/// 128 random bits from the OS.
pub(crate) fn new_lease_id() -> Result<LeaseId, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a lease id: {e}"))?;
    Ok(u128::from_be_bytes(bytes))
}

/// A lease id as clients see it: 32 lowercase hex characters.
pub(crate) fn format_lease_id(id: LeaseId) -> String {
    format!("{id:032x}")
}

/// The lease id written as 32 lowercase hex characters; `None` for anything else
/// (no lease has such an id).
pub(crate) fn parse_lease_id(s: &str) -> Option<LeaseId> {
    if s.len() != 32 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// No TTL is accepted above this, whatever `max_ttl` says, so instants never overflow.
pub(crate) const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + ttl`; `ttl` is at most a [`CENTURY`] (validated), which cannot overflow a
/// monotonic clock counted from boot.
pub(crate) fn expiry(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl.min(CENTURY)).unwrap_or(now)
}
