//! What the billing scenario saw, as it happened, with the time since it
//! started: the raw material of its timeline picture.

use super::PausePoint;
use crate::scenario::Holder;

/// What a fenced mark of a customer found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkOutcome {
    /// Marked as being charged under the holder's token.
    Marked,
    /// Already charged in this run: skipped.
    Skipped,
    /// Refused: the run has seen this higher token.
    Refused(u64),
}

/// Something the billing scenario did or observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Round `n` (0-based) begins: its provider is up.
    RoundStarted(usize),
    /// Round `n` is over: both instances are done.
    RoundEnded(usize),
    /// Redis granted `holder` the lock (`SET … NX PX`) with `token`.
    Granted {
        /// Who.
        holder: Holder,
        /// The grant's token (`INCR` of the lock's counter).
        token: u64,
    },
    /// Redis reported the lock key gone (its TTL ran out).
    Expired {
        /// Whose lease.
        holder: Holder,
    },
    /// `holder` released the lock.
    Released {
        /// Who.
        holder: Holder,
    },
    /// `holder` stopped dead (a GC pause, SIGSTOP) at `at`.
    Paused {
        /// Who.
        holder: Holder,
        /// Where in its job.
        at: PausePoint,
    },
    /// `holder` runs again, unaware of the pause.
    Resumed {
        /// Who.
        holder: Holder,
    },
    /// `holder`'s fenced mark of `customer` with `token`, and what it found.
    Marked {
        /// Who.
        holder: Holder,
        /// Whom.
        customer: String,
        /// The holder's token.
        token: u64,
        /// What the record answered.
        outcome: MarkOutcome,
    },
    /// The provider answered `holder`'s charge of `customer`.
    Charged {
        /// Who asked.
        holder: Holder,
        /// Whom.
        customer: String,
        /// The charge the provider answered with.
        charge_id: String,
        /// The provider replayed an earlier answer (same idempotency key): no money moved.
        replayed: bool,
    },
    /// `holder`'s fenced record of `customer`'s charge; `refused` carries the run's higher token.
    Completed {
        /// Who.
        holder: Holder,
        /// Whom.
        customer: String,
        /// `Some(run's token)` when refused.
        refused: Option<u64>,
    },
}

/// An [`Event`] and when, since the scenario started.
pub type Recorded = crate::timeline::Recorded<Event>;

/// Collects [`Recorded`]s from every task.
pub(super) type Recorder = crate::timeline::Recorder<Event>;
