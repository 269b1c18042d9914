//! A claim's atomics and their rules, apart from what they serve (the key, the
//! wake-ups, the store), so that the loom model (`claims/loom_model.rs`) runs
//! this very code under every interleaving.
//!
//! ```text
//!            raise heard          last one leaves
//!   Valid ───────────────▶ Overtaken ─────────────▶ released (row deleted)
//!     │  idle, nobody inside                              ▲
//!     ├──────────────────▶ Releasing ─────────────────────┘
//!     │  deadline passed, or a renewal found it gone
//!     └──────────────────▶ Lost: everyone inside is stopped (503)
//! ```
//!
//! Only `Valid` admits, and no state goes back to `Valid`. The state and the
//! count of requests inside are **one atomic word**: entering adds one and
//! reads the state in the same step, and the idle release moves `(Valid, 0)`
//! to `(Releasing, 0)` in one compare-and-swap, which fails if anyone counted
//! in. So a request is never admitted into a claim that is being released,
//! and the delete starts only once nobody is inside: whoever sees the count
//! reach zero with the state out of `Valid` starts it, once (`releasing`).
//!
//! Two earlier versions, each caught by the models, show why the word is one.
//! The idle release looked at the count, then moved the state: a request
//! admitted between the two was left inside a `Releasing` claim, which the
//! store then replaced with a new grant and stopped watching. And when its
//! second look found a count, it turned `Releasing` back into `Valid`; but that
//! count could be a request that had seen `Releasing`, left, and started the
//! delete, so requests were then admitted under a claim with no row.
//! `loom-mutants.sh` and the claims model's mutants bring both back.

use crate::store::sync::{AtomicBool, AtomicU64, Ordering::SeqCst};

const VALID: u64 = 0;
const OVERTAKEN: u64 = 1;
const RELEASING: u64 = 2;
const LOST: u64 = 3;

/// The state sits in the word's top two bits, the count in the rest.
const SHIFT: u32 = 62;
const COUNT: u64 = (1 << SHIFT) - 1;

fn state_of(word: u64) -> u64 {
    word >> SHIFT
}

fn count_of(word: u64) -> u64 {
    word & COUNT
}

/// A claim's state (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Valid,
    Overtaken,
    Releasing,
    Lost,
}

/// What a caller must do after a transition: start the row's release (the
/// delete of [`ClaimCell::grant`]'s row), or nothing.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    Release,
    Nothing,
}

impl Then {
    fn release_if(yes: bool) -> Self {
        if yes { Then::Release } else { Then::Nothing }
    }
}

pub(crate) struct ClaimCell {
    /// The grant whose row backs this claim (updated when a new grant extends it).
    grant: AtomicU64,
    /// The state and the count of requests inside (see the module docs).
    word: AtomicU64,
    /// Valid until then: nanoseconds on the store's clock.
    deadline: AtomicU64,
    /// Set by every entry, cleared by the keeper's idle check.
    touched: AtomicBool,
    /// The token that overtook it, once one did.
    overtaken_by: AtomicU64,
    /// The release was started (once per claim).
    releasing: AtomicBool,
}

impl ClaimCell {
    pub(crate) fn new(grant: u64, deadline: u64) -> Self {
        Self {
            grant: AtomicU64::new(grant),
            word: AtomicU64::new(VALID << SHIFT),
            deadline: AtomicU64::new(deadline),
            touched: AtomicBool::new(true),
            overtaken_by: AtomicU64::new(0),
            releasing: AtomicBool::new(false),
        }
    }

    pub(crate) fn state(&self) -> State {
        match state_of(self.word.load(SeqCst)) {
            VALID => State::Valid,
            OVERTAKEN => State::Overtaken,
            RELEASING => State::Releasing,
            _ => State::Lost,
        }
    }

    pub(crate) fn grant(&self) -> u64 {
        self.grant.load(SeqCst)
    }

    pub(crate) fn deadline(&self) -> u64 {
        self.deadline.load(SeqCst)
    }

    pub(crate) fn inside(&self) -> u64 {
        count_of(self.word.load(SeqCst))
    }

    pub(crate) fn overtaken_by(&self) -> u64 {
        self.overtaken_by.load(SeqCst)
    }

    /// Counts in and reads the state in one step: in if the claim is valid
    /// at `now`. Counted out again otherwise (which may start the release).
    #[inline]
    pub(crate) fn try_enter(&self, now: u64) -> Result<(), Then> {
        let word = self.word.fetch_add(1, SeqCst);
        if state_of(word) == VALID && now < self.deadline.load(SeqCst) {
            if !self.touched.load(std::sync::atomic::Ordering::Relaxed) {
                self.touched.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            return Ok(());
        }
        Err(self.leave())
    }

    /// Counts out: the last one out of a claim that no longer admits releases it.
    pub(crate) fn leave(&self) -> Then {
        let word = self.word.fetch_sub(1, SeqCst);
        Then::release_if(count_of(word) == 1 && state_of(word) != VALID && self.start_release())
    }

    /// Whether a request inside may still answer: the claim was not lost and
    /// its deadline has not passed at `now`.
    #[inline]
    pub(crate) fn held(&self, now: u64) -> bool {
        state_of(self.word.load(SeqCst)) != LOST && now < self.deadline.load(SeqCst)
    }

    /// A higher token raised the key's mark: admit nobody more, release once empty.
    pub(crate) fn overtake(&self, by: u64) -> Then {
        self.overtaken_by.fetch_max(by, SeqCst);
        let moved = self.word.fetch_update(SeqCst, SeqCst, |word| {
            (state_of(word) == VALID).then_some(count_of(word) | OVERTAKEN << SHIFT)
        });
        Then::release_if(moved.is_ok_and(|word| count_of(word) == 0) && self.start_release())
    }

    /// Releases the claim if nobody is inside and nobody entered since the
    /// last call: `(Valid, 0)` to `(Releasing, 0)` in one step, so nobody can
    /// be admitted in between.
    pub(crate) fn release_if_idle(&self) -> Then {
        if self.touched.swap(false, SeqCst) {
            return Then::Nothing;
        }
        let idle = self.word.compare_exchange(VALID << SHIFT, RELEASING << SHIFT, SeqCst, SeqCst);
        Then::release_if(idle.is_ok() && self.start_release())
    }

    /// The claim may no longer be relied on: the caller stops everyone inside
    /// (`true` in the first place: this call lost it). Its row goes only once
    /// everyone inside has been dropped (the last `leave`).
    pub(crate) fn revoke(&self) -> (bool, Then) {
        let word = self.word.fetch_or(LOST << SHIFT, SeqCst);
        (state_of(word) != LOST, Then::release_if(count_of(word) == 0 && self.start_release()))
    }

    /// A new grant of the same token backs this claim until `deadline` (never
    /// shortened). If the claim stopped admitting meanwhile, its release may
    /// have read the old grant: then the caller releases the new grant's row
    /// too (a second delete of one grant's row deletes nothing).
    pub(crate) fn extend(&self, grant: u64, deadline: u64) -> Then {
        self.grant.store(grant, SeqCst);
        self.deadline.fetch_max(deadline, SeqCst);
        Then::release_if(state_of(self.word.load(SeqCst)) != VALID && self.releasing.load(SeqCst))
    }

    /// A renewal of `grant` succeeded: valid until `deadline`.
    pub(crate) fn renewed(&self, grant: u64, deadline: u64) {
        if self.grant() == grant {
            self.deadline.fetch_max(deadline, SeqCst);
        }
    }

    /// True once, for whoever starts the release.
    fn start_release(&self) -> bool {
        !self.releasing.swap(true, SeqCst)
    }
}

#[cfg(all(test, loom))]
impl ClaimCell {
    /// For the loom model: stores every atomic's value again, with `SeqCst`.
    /// Loom regards a `SeqCst` load as `AcqRel`, save that it never returns a
    /// store older than the newest `SeqCst` one, and an atomic's initial value
    /// is not a `SeqCst` store: after this, a `SeqCst` load returns the newest
    /// store, as the rules above assume.
    pub(super) fn seq_cst_stores(&self) {
        self.grant.store(self.grant.load(SeqCst), SeqCst);
        self.word.store(self.word.load(SeqCst), SeqCst);
        self.deadline.store(self.deadline.load(SeqCst), SeqCst);
        self.touched.store(self.touched.load(SeqCst), SeqCst);
        self.overtaken_by.store(self.overtaken_by.load(SeqCst), SeqCst);
        self.releasing.store(self.releasing.load(SeqCst), SeqCst);
    }
}
