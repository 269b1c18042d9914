//! What one connection, one round or one target saw: latency histograms and status counts.
//!
//! ```
//! use fencing_benches::load::tally::Tally;
//!
//! let mut round = Tally::new();
//! let mut conn = Tally::new();
//! conn.sent_latency.record(2_000_000).unwrap();
//! conn.count_status(409);
//! round.add(&conn);
//! assert_eq!((round.requests(), round.stale), (1, 1));
//! // A closed loop has no corrected view: the latency to judge by is as sent.
//! assert!(std::ptr::eq(round.latency(), &round.sent_latency));
//! ```

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

/// Counts and latencies (nanoseconds).
#[derive(Debug, Clone)]
pub struct Tally {
    /// From the moment each request was sent to the end of its response body.
    pub sent_latency: Histogram<u64>,
    /// Open loop only: from the moment each request was *meant* to be sent
    /// (its slot in the constant-rate schedule), wrk2's correction for
    /// coordinated omission. Empty in the closed loop.
    pub intended_latency: Histogram<u64>,
    /// Open loop only: how late each request went out after its slot. The
    /// generator's own share of the corrected latency: the pacing thread's
    /// wake-up and hand-over (tens of microseconds), a busy client thread, and
    /// a target still answering the connection's previous request.
    pub send_lag: Histogram<u64>,
    /// 2xx answers.
    pub ok: u64,
    /// 409 answers (stale token).
    pub stale: u64,
    /// 400 answers (malformed token).
    pub bad_request: u64,
    /// Any other status (404 included).
    pub other_status: u64,
    /// The statuses counted in `other_status`, by code.
    pub other_by_status: BTreeMap<u16, u64>,
    /// Connections that failed, requests that got no response.
    pub errors: u64,
    /// Of `errors`: connections that could not be opened (refused, most often).
    pub connect_errors: u64,
    /// Connections the target closed between requests (nginx after
    /// `keepalive_requests`, a load balancer's idle bound), replaced by new
    /// ones, as wrk does: not errors, but each costs a handshake.
    pub reconnects: u64,
    /// Every request answered, warm-up included.
    pub all_requests: u64,
    /// Open loop: requests whose slot came before the end of the round but
    /// that were never sent, because the target was still answering earlier ones.
    pub missed: u64,
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

impl Tally {
    /// Nothing seen yet.
    #[must_use]
    pub fn new() -> Self {
        Self {
            sent_latency: histogram(),
            intended_latency: histogram(),
            send_lag: histogram(),
            ok: 0,
            stale: 0,
            bad_request: 0,
            other_status: 0,
            other_by_status: BTreeMap::new(),
            errors: 0,
            connect_errors: 0,
            reconnects: 0,
            all_requests: 0,
            missed: 0,
        }
    }

    /// Adds `other`'s counts and latencies to these.
    pub fn add(&mut self, other: &Self) {
        self.sent_latency.add(&other.sent_latency).expect("same histogram bounds");
        self.intended_latency.add(&other.intended_latency).expect("same histogram bounds");
        self.send_lag.add(&other.send_lag).expect("same histogram bounds");
        self.ok += other.ok;
        self.stale += other.stale;
        self.bad_request += other.bad_request;
        self.other_status += other.other_status;
        for (status, n) in &other.other_by_status {
            *self.other_by_status.entry(*status).or_default() += n;
        }
        self.errors += other.errors;
        self.connect_errors += other.connect_errors;
        self.reconnects += other.reconnects;
        self.all_requests += other.all_requests;
        self.missed += other.missed;
    }

    /// Counts one answer's status.
    pub fn count_status(&mut self, status: u16) {
        match status {
            200..=299 => self.ok += 1,
            409 => self.stale += 1,
            400 => self.bad_request += 1,
            _ => {
                self.other_status += 1;
                *self.other_by_status.entry(status).or_default() += 1;
            }
        }
    }

    /// Answers measured (after the warm-up), whatever their status.
    #[must_use]
    pub fn answered(&self) -> u64 {
        self.ok + self.stale + self.bad_request + self.other_status
    }

    /// Requests measured (after the warm-up).
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.sent_latency.len()
    }

    /// The latencies to judge the target by: corrected in the open loop, as sent in the closed loop.
    #[must_use]
    pub fn latency(&self) -> &Histogram<u64> {
        if self.intended_latency.is_empty() { &self.sent_latency } else { &self.intended_latency }
    }
}

/// Microseconds at `quantile` of `histogram` (nanoseconds).
#[must_use]
pub fn micros(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1_000.0
}
