//! The service's clock: tokio's monotonic `Instant`, except that it never goes back.
//!
//! Lease expiry is decided on this clock, at each request (no timer). Linux's
//! `CLOCK_MONOTONIC` never steps back, but a process can be given one that does
//! (libfaketime moving both clocks, RELIABILITY.md §29): every lease would then
//! live as much longer as the clock went back, an hour for `-1h`. So a step back
//! is measured and added to an offset, and time carries on from the latest
//! instant shown: a lease lives its TTL of real time whatever the step. A step
//! *forward* cannot be told from time passing (a suspended VM is exactly that),
//! and ends leases early, the safe side, which fencing tokens cover.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// One service's clock (one per service, so that services on different tokio
/// clocks, as paused-clock tests have, never see each other's time).
#[derive(Debug, Default)]
pub(crate) struct Clock {
    /// The latest instant shown and how far the clock has stepped back in all.
    shown: Mutex<Option<(Instant, Duration)>>,
}

impl Clock {
    /// Now, on this clock: monotonic, never back.
    pub(crate) fn now(&self) -> Instant {
        let raw = Instant::now();
        let mut shown = self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (latest, mut back) = shown.unwrap_or((raw, Duration::ZERO));
        let mut now = raw + back;
        if now < latest {
            back += latest - now;
            tracing::warn!(stepped_back = ?(latest - now), "the monotonic clock stepped back; leases keep their real TTL");
            now = latest;
        }
        *shown = Some((now, back));
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_the_clock_forward() {
        let clock = Clock::default();
        let first = clock.now();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.now() - first, Duration::from_secs(5));
    }
}
