//! [`Deadline`]: the bound on a wait, which a clock stepped back cannot cut short.
//!
//! tokio's timer wheel remembers the latest time it has seen, and fires every
//! deadline below that at once. Linux's `CLOCK_MONOTONIC` never steps back,
//! but a process can be given one that does (libfaketime moving both clocks,
//! RELIABILITY.md §29): a raise then waited "5 s" for its durable write, was
//! woken at once, and answered 503 although the write was fine.
//!
//! So a sleep that fires is believed only when the clock agrees that the bound
//! has passed. When it does not, the wheel is ahead of the clock: the sleep is
//! pushed past the deadline that just fired (the wheel has seen at least that
//! far), by a step that doubles each time, so a step back of an hour costs a
//! few dozen wake-ups, not millions. The wait then lasts until the clock has
//! caught up with the wheel: as long as every other tokio timer in the process,
//! which the step back has frozen too. A bound stretched is the safe side
//! here: this bound only decides when a waiting request gives up with a 503;
//! admission never depends on it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

pin_project! {
    /// A bound on a wait, measured on tokio's clock.
    pub(super) struct Deadline {
        #[pin]
        sleep: Sleep,
        // When the bound passes, by the clock (the sleep may be pushed later).
        at: Instant,
    }
}

impl Deadline {
    /// A deadline `bound` from now.
    pub(super) fn after(bound: Duration) -> Self {
        let at = instant_after(bound);
        Self { sleep: tokio::time::sleep_until(at), at }
    }

    /// Starts a new bound, `bound` from now.
    pub(super) fn reset(self: Pin<&mut Self>, bound: Duration) {
        let this = self.project();
        *this.at = instant_after(bound);
        this.sleep.reset(*this.at);
    }
}

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let mut step = Duration::ZERO;
        loop {
            ready!(this.sleep.as_mut().poll(cx));
            let now = Instant::now();
            if now >= *this.at {
                return Poll::Ready(());
            }
            // Fired early: the clock stepped back below what the wheel has seen.
            step = step.saturating_mul(2).max(*this.at - now);
            // Past what `Instant` can hold, as far as `instant_after` goes: still later than the wheel.
            let fired = this.sleep.deadline();
            let later = fired.checked_add(step).unwrap_or_else(|| instant_after(Duration::MAX).max(fired));
            tracing::debug!(early_by = ?(*this.at - now), "a timer fired before its deadline: the clock stepped back");
            this.sleep.as_mut().reset(later.max(*this.at));
        }
    }
}

/// `bound` from now. Any `Duration`, up to `Duration::MAX`, is a valid bound:
/// past what `Instant` can hold it means "as good as never", as with tokio's `sleep`.
fn instant_after(bound: Duration) -> Instant {
    const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);
    let now = Instant::now();
    now.checked_add(bound).unwrap_or_else(|| now + FAR_FUTURE)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_when_the_bound_has_passed_and_not_before() {
        let start = Instant::now();
        let mut deadline = std::pin::pin!(Deadline::after(Duration::from_secs(5)));
        deadline.as_mut().await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        deadline.as_mut().reset(Duration::from_millis(20));
        let again = Instant::now();
        deadline.await;
        assert_eq!(again.elapsed(), Duration::from_millis(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_bound_past_what_instant_holds_never_fires() {
        let deadline = Deadline::after(Duration::MAX);
        let waited = tokio::time::timeout(Duration::from_secs(86_400 * 365), deadline).await;
        assert!(waited.is_err(), "Duration::MAX fired within a year");
    }
}
