//! What the scenario saw, as it happened, with the time since the run started:
//! the raw material of its timeline picture (`scenario/picture.rs`).

use std::fmt;

/// One of the scenario's three rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// A, paused past its TTL, writes after B; the resource is not fenced.
    WithoutFencing,
    /// The same, fenced.
    WithFencing,
    /// A's write is inside the handler when B writes.
    InFlight,
}

/// A lease holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The client that is paused.
    A,
    /// The next holder.
    B,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Holder::A => "A",
            Holder::B => "B",
        })
    }
}

/// Something the scenario did or observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happening {
    /// A round's resource is up.
    RoundStarted(Round),
    /// A round's writes are answered and its lease released.
    RoundEnded(Round),
    /// The lock service granted `holder` the lock with `token`.
    Granted {
        /// Who.
        holder: Holder,
        /// The grant's fencing token.
        token: u64,
    },
    /// The lock service reported `holder`'s lease gone (expired).
    Expired {
        /// Whose lease.
        holder: Holder,
    },
    /// `holder` released its lease.
    Released {
        /// Who.
        holder: Holder,
    },
    /// `holder` sent a write with `token`.
    WriteSent {
        /// Who.
        holder: Holder,
        /// The write's `Fencing-Token`.
        token: u64,
    },
    /// `holder`'s write was seen inside the handler.
    WriteInside {
        /// Who.
        holder: Holder,
    },
    /// `holder`'s write raised the mark and was seen held at the layer.
    WriteAtDoor {
        /// Who.
        holder: Holder,
    },
    /// `holder`'s write was answered with `status`.
    WriteAnswered {
        /// Who.
        holder: Holder,
        /// The write's token.
        token: u64,
        /// The HTTP status.
        status: u16,
    },
    /// The resource's mark for the round's key, as read from its mark store
    /// (`None`: the resource is not fenced and keeps no mark).
    Mark(Option<u64>),
}

/// A [`Happening`] and when, since the run started.
pub type Recorded = crate::timeline::Recorded<Happening>;

/// Collects [`Recorded`]s from every task of a run.
pub(super) type Recorder = crate::timeline::Recorder<Happening>;
