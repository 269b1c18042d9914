//! One claim as this replica holds it: its key and token, its atomics
//! (`cell.rs`: who is inside, how long it is valid, its state), and the
//! wake-up that stops the requests inside when it is lost.
//!
//! Two stops, independent of each other: the keeper revokes the claim at its
//! deadline (on a thread of its own), and each request inside checks the
//! deadline itself at every poll, with a timer armed for it on the
//! application's runtime. Whichever comes first revokes the claim for all of
//! its requests; a stuck keeper leaves the second.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Sleep;

use super::Inner;
pub(super) use super::cell::State;
use super::cell::{ClaimCell, Then};
use crate::store::ClaimedPlace;

pub(super) struct Claim {
    pub(super) key: String,
    pub(super) token: u64,
    cell: ClaimCell,
    lost: Arc<Notify>,
    /// The store's clock's zero: deadlines are nanoseconds after it.
    epoch: Instant,
    store: Weak<Inner>,
}

impl Claim {
    pub(super) fn new(key: String, token: u64, grant: u64, deadline: u64, store: &Arc<Inner>) -> Self {
        let cell = ClaimCell::new(grant, deadline);
        let (lost, epoch, store) = (Arc::new(Notify::new()), store.epoch, Arc::downgrade(store));
        Self { key, token, cell, lost, epoch, store }
    }

    /// Nanoseconds since the store's clock's zero, as the store counts them.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// When the deadline passes, on tokio's clock.
    fn deadline_instant(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.epoch) + Duration::from_nanos(self.deadline())
    }

    pub(super) fn state(&self) -> State {
        self.cell.state()
    }

    pub(super) fn grant(&self) -> u64 {
        self.cell.grant()
    }

    pub(super) fn deadline(&self) -> u64 {
        self.cell.deadline()
    }

    pub(super) fn inside(&self) -> u64 {
        self.cell.inside()
    }

    /// The token above this claim's that a raise brought, if one did.
    pub(super) fn overtaken_by(&self) -> Option<u64> {
        Some(self.cell.overtaken_by()).filter(|&by| by > self.token)
    }

    /// A new grant of the same token backs this claim until `deadline` (never shortened).
    pub(super) fn extend(&self, grant: u64, deadline: u64) {
        if self.cell.extend(grant, deadline) == Then::Release {
            self.release_row(grant);
        }
    }

    /// A renewal of `grant` succeeded: valid until `deadline`.
    pub(super) fn renewed(&self, grant: u64, deadline: u64) {
        self.cell.renewed(grant, deadline);
    }

    /// Enters if the claim is valid at `now`.
    #[inline]
    pub(super) fn try_enter(self: &Arc<Self>, now: u64) -> Option<Pin<Box<Entered>>> {
        // Created before the state is read, so a revocation after the read wakes it
        // (`notify_waiters` wakes every `Notified` created before it, polled or not).
        let lost = Arc::clone(&self.lost).notified_owned();
        match self.cell.try_enter(now) {
            Ok(()) => {
                Some(Box::pin(Entered { claim: Arc::clone(self), lost, timer: None, step: Duration::ZERO }))
            }
            Err(then) => {
                self.then(then);
                None
            }
        }
    }

    /// A higher token raised the key's mark: admit nobody more, release once empty.
    pub(super) fn overtake(&self, by: u64) {
        self.then(self.cell.overtake(by));
    }

    /// Releases the claim if nobody is inside and nobody entered since the
    /// last call.
    pub(super) fn release_if_idle(&self) {
        self.then(self.cell.release_if_idle());
    }

    /// The claim may no longer be relied on: stop everyone inside. Whether
    /// this call revoked it (false: it was revoked already).
    pub(super) fn revoke(&self) -> bool {
        let (first, then) = self.cell.revoke();
        if first {
            self.lost.notify_waiters();
        }
        self.then(then);
        first
    }

    fn then(&self, then: Then) {
        if then == Then::Release {
            self.release_row(self.grant());
        }
    }

    /// Hands `grant`'s row to the store to be deleted. The delete names the
    /// grant, so it can never remove a newer grant's row.
    fn release_row(&self, grant: u64) {
        if let Some(store) = self.store.upgrade() {
            store.release(&self.key, self.token, grant);
        }
    }
}

pin_project! {
    /// A request inside under a claim: leaves when dropped. Boxed once, as the
    /// store's [`ClaimedPlace`], with its wake-up and its timer inside the box.
    pub(crate) struct Entered {
        claim: Arc<Claim>,
        #[pin]
        lost: OwnedNotified,
        // Armed at the claim's deadline on the first poll, moved when a renewal extends it.
        #[pin]
        timer: Option<Sleep>,
        // How far a timer that fired early (tokio's wheel ahead of the clock) is pushed, doubling.
        step: Duration,
    }

    impl PinnedDrop for Entered {
        fn drop(this: Pin<&mut Self>) {
            this.claim.then(this.claim.cell.leave());
        }
    }
}

/// The first push of a timer that fired before the clock reached its deadline.
const EARLY_STEP: Duration = Duration::from_millis(1);

impl ClaimedPlace for Entered {
    fn key(&self) -> &str {
        &self.claim.key
    }

    /// Ready once the claim is lost, or its deadline has passed: then this
    /// request revokes the claim itself (the second stop; the keeper may be
    /// late), which stops every other request inside it too.
    fn poll_revoked(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            let held = this.claim.cell.held(this.claim.now());
            // The mutant leaves a passed deadline to the keeper.
            let waits_for_keeper = mutant::no_request_deadline() && this.claim.state() != State::Lost;
            if !held && !waits_for_keeper {
                if this.claim.revoke()
                    && let Some(store) = this.claim.store.upgrade()
                {
                    store.revocations.by_request();
                }
                return Poll::Ready(());
            }
            if this.lost.as_mut().poll(cx).is_ready() {
                // Woken: `held` above sees a revocation. Watch again.
                this.lost.set(Arc::clone(&this.claim.lost).notified_owned());
                continue;
            }
            if !held {
                // The mutant: only the keeper's revocation stops this request.
                return Poll::Pending;
            }
            let at = this.claim.deadline_instant().max(tokio::time::Instant::now() + *this.step);
            match this.timer.as_mut().as_pin_mut() {
                Some(timer) if timer.deadline() == at => {}
                Some(timer) => timer.reset(at),
                None => this.timer.set(Some(tokio::time::sleep_until(at))),
            }
            let Some(timer) = this.timer.as_mut().as_pin_mut() else { unreachable!("set above") };
            if timer.poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Fired: the deadline passed (seen above), or a renewal moved it
            // later (armed again), or tokio's wheel ran ahead of the clock:
            // then the timer is pushed past `at`, further each time, so this
            // loop ends.
            if this.claim.deadline_instant() <= at {
                *this.step = (*this.step * 2).max(EARLY_STEP);
            }
        }
    }

    /// Whether the claim still covers this request now: not lost, and its
    /// deadline not passed (a keeper that could not act in time counts too).
    /// A handler that finished when this is false answers 503, not success.
    fn held(&self) -> bool {
        self.claim.cell.held(self.claim.now())
    }
}

/// The mutant switch of the `mutants` feature (tests only): without the
/// feature, every switch is a constant `false`.
mod mutant {
    /// `FENCING_MUTANT=no-request-deadline` (or `no-deadline-revoke`, which
    /// takes both stops out): a request does not stop itself when it sees its
    /// claim's deadline pass; only the keeper's revocation stops it.
    #[cfg(feature = "mutants")]
    pub(super) fn no_request_deadline() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            std::env::var("FENCING_MUTANT")
                .is_ok_and(|mutant| mutant == "no-request-deadline" || mutant == "no-deadline-revoke")
        })
    }

    #[cfg(not(feature = "mutants"))]
    #[inline(always)]
    pub(super) const fn no_request_deadline() -> bool {
        false
    }
}
