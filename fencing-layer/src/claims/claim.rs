//! One claim as this replica holds it: its key and token, its atomics
//! (`cell.rs`: who is inside, how long it is valid, its state), and the
//! wake-up that stops the requests inside when it is lost.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::Inner;
pub(super) use super::cell::State;
use super::cell::{ClaimCell, Then};
use crate::store::ClaimedPlace;

pub(super) struct Claim {
    pub(super) key: String,
    pub(super) token: u64,
    cell: ClaimCell,
    lost: Arc<Notify>,
    store: Weak<Inner>,
}

impl Claim {
    pub(super) fn new(key: String, token: u64, grant: u64, deadline: u64, store: Weak<Inner>) -> Self {
        Self { key, token, cell: ClaimCell::new(grant, deadline), lost: Arc::new(Notify::new()), store }
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
            Ok(()) => Some(Box::pin(Entered { claim: Arc::clone(self), lost })),
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

    /// The claim may no longer be relied on: stop everyone inside.
    pub(super) fn revoke(&self) {
        let (first, then) = self.cell.revoke();
        if first {
            self.lost.notify_waiters();
        }
        self.then(then);
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
    /// store's [`ClaimedPlace`], with its wake-up inside the box.
    pub(crate) struct Entered {
        claim: Arc<Claim>,
        #[pin]
        lost: OwnedNotified,
    }

    impl PinnedDrop for Entered {
        fn drop(this: Pin<&mut Self>) {
            this.claim.then(this.claim.cell.leave());
        }
    }
}

impl ClaimedPlace for Entered {
    fn key(&self) -> &str {
        &self.claim.key
    }

    /// Ready once the claim is lost.
    fn poll_revoked(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            if this.lost.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if this.claim.state() == State::Lost {
                return Poll::Ready(());
            }
            // Woken for nothing (no other cause exists today): watch again.
            this.lost.set(Arc::clone(&this.claim.lost).notified_owned());
        }
    }

    /// Whether the claim still covers this request now: not lost, and its
    /// deadline not passed (a keeper that could not act in time counts too).
    /// A handler that finished when this is false answers 503, not success.
    fn held(&self) -> bool {
        let now = self.claim.store.upgrade().map_or(u64::MAX, |store| store.now());
        self.claim.cell.held(now)
    }
}
