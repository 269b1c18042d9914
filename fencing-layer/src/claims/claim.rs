//! One claim as this replica holds it: its token, who is inside, how long it
//! is valid by this process's monotonic clock, and its state.
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
//! Only `Valid` admits. Entering is "count in, then look at the state"; every
//! transition out of `Valid` is "change the state, then look at the count".
//! Both sides use sequentially consistent operations, so at least one of them
//! sees the other (the store-buffer pattern): a request that saw `Valid` is
//! counted by the time the release looks, and one counted too late sees the
//! new state and leaves.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::Inner;

const VALID: u8 = 0;
const OVERTAKEN: u8 = 1;
const RELEASING: u8 = 2;
const LOST: u8 = 3;

/// A claim's state (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Valid,
    Overtaken,
    Releasing,
    Lost,
}

pub(super) struct Claim {
    pub(super) key: String,
    pub(super) token: u64,
    /// The grant whose row backs this claim (updated when a new grant extends it).
    grant: AtomicU64,
    inside: AtomicU64,
    state: AtomicU8,
    /// Valid until then: nanoseconds on the store's clock.
    deadline: AtomicU64,
    /// Set by every entry, cleared by the keeper's idle check.
    touched: AtomicBool,
    /// The token that overtook it, once one did.
    overtaken_by: AtomicU64,
    /// The release was started (once per claim).
    releasing: AtomicBool,
    lost: Arc<Notify>,
    store: Weak<Inner>,
}

impl Claim {
    pub(super) fn new(key: String, token: u64, grant: u64, deadline: u64, store: Weak<Inner>) -> Self {
        Self {
            key,
            token,
            grant: AtomicU64::new(grant),
            inside: AtomicU64::new(0),
            state: AtomicU8::new(VALID),
            deadline: AtomicU64::new(deadline),
            touched: AtomicBool::new(true),
            overtaken_by: AtomicU64::new(0),
            releasing: AtomicBool::new(false),
            lost: Arc::new(Notify::new()),
            store,
        }
    }

    pub(super) fn state(&self) -> State {
        match self.state.load(SeqCst) {
            VALID => State::Valid,
            OVERTAKEN => State::Overtaken,
            RELEASING => State::Releasing,
            _ => State::Lost,
        }
    }

    pub(super) fn grant(&self) -> u64 {
        self.grant.load(SeqCst)
    }

    pub(super) fn deadline(&self) -> u64 {
        self.deadline.load(SeqCst)
    }

    pub(super) fn inside(&self) -> u64 {
        self.inside.load(SeqCst)
    }

    /// The token above this claim's that a raise brought, if one did.
    pub(super) fn overtaken_by(&self) -> Option<u64> {
        Some(self.overtaken_by.load(SeqCst)).filter(|&by| by > self.token)
    }

    /// A new grant of the same token backs this claim until `deadline` (never shortened).
    pub(super) fn extend(&self, grant: u64, deadline: u64) {
        self.grant.store(grant, SeqCst);
        self.deadline.fetch_max(deadline, SeqCst);
    }

    /// A renewal of `grant` succeeded: valid until `deadline`.
    pub(super) fn renewed(&self, grant: u64, deadline: u64) {
        if self.grant() == grant {
            self.deadline.fetch_max(deadline, SeqCst);
        }
    }

    /// Enters if the claim is valid at `now`: count in first, then look.
    #[inline]
    pub(super) fn try_enter(self: &Arc<Self>, now: u64) -> Option<Entered> {
        self.inside.fetch_add(1, SeqCst);
        // Registered before the state is read, so a revocation after the read wakes it.
        let lost = Box::pin(Arc::clone(&self.lost).notified_owned());
        if self.state.load(SeqCst) == VALID && now < self.deadline.load(SeqCst) {
            if !self.touched.load(std::sync::atomic::Ordering::Relaxed) {
                self.touched.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            return Some(Entered { claim: Arc::clone(self), lost });
        }
        drop(lost);
        self.leave();
        None
    }

    fn leave(&self) {
        if self.inside.fetch_sub(1, SeqCst) == 1 && self.state.load(SeqCst) != VALID {
            self.release();
        }
    }

    /// A higher token raised the key's mark: admit nobody more, release once empty.
    pub(super) fn overtake(&self, by: u64) {
        self.overtaken_by.fetch_max(by, SeqCst);
        if self.state.compare_exchange(VALID, OVERTAKEN, SeqCst, SeqCst).is_ok()
            && self.inside.load(SeqCst) == 0
        {
            self.release();
        }
    }

    /// Releases the claim if nobody is inside and nobody entered since the
    /// last call: true if it did.
    pub(super) fn release_if_idle(&self) -> bool {
        if self.touched.swap(false, SeqCst) || self.inside.load(SeqCst) > 0 {
            return false;
        }
        if self.state.compare_exchange(VALID, RELEASING, SeqCst, SeqCst).is_err() {
            return false;
        }
        if self.inside.load(SeqCst) > 0 {
            // Someone entered between the two looks: they are inside, keep the claim.
            if self.state.compare_exchange(RELEASING, VALID, SeqCst, SeqCst).is_ok() {
                return false;
            }
        }
        self.release();
        true
    }

    /// The claim may no longer be relied on: stop everyone inside.
    pub(super) fn revoke(&self) {
        if self.state.swap(LOST, SeqCst) != LOST {
            self.lost.notify_waiters();
        }
        // Its row goes only once everyone inside has been dropped (the last `leave`).
        if self.inside.load(SeqCst) == 0 {
            self.release();
        }
    }

    /// Hands the claim to the store for its row to be deleted, once. The
    /// delete names the grant, so it can never remove a newer grant's row.
    fn release(&self) {
        if self.releasing.swap(true, SeqCst) {
            return;
        }
        if let Some(store) = self.store.upgrade() {
            store.release(&self.key, self.token, self.grant());
        }
    }
}

/// A request inside under a claim: leaves when dropped.
pub(crate) struct Entered {
    claim: Arc<Claim>,
    lost: Pin<Box<OwnedNotified>>,
}

impl Entered {
    pub(crate) fn key(&self) -> &str {
        &self.claim.key
    }

    /// Ready once the claim is lost.
    pub(crate) fn poll_revoked(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.lost.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.claim.state() == State::Lost {
                return Poll::Ready(());
            }
            // Woken for nothing (no other cause exists today): watch again.
            self.lost = Box::pin(Arc::clone(&self.claim.lost).notified_owned());
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.claim.leave();
    }
}
