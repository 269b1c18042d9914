//! A claim's timing (term, renewal period, renewal bound, margin) and the one
//! rule it must keep to be safe: a renewal sent on schedule is answered before
//! the claim it renews lapses here.

use std::fmt;
use std::time::Duration;

/// How long a claim lasts unless renewed, by default: a replica that dies
/// holds up raises on its keys for at most this long, which equals the
/// layer's default drain bound, so a raise that waits the default bound
/// outlasts a dead replica's claim.
pub const DEFAULT_TERM: Duration = Duration::from_secs(5);

/// How long before the backend's expiry a replica stops its own requests, by
/// default, as a fraction of the term (a tenth: 500 ms of the default term).
/// It covers clock-rate drift (NTP slews at most 0.05 %: 2.5 ms over 5 s) and
/// the time it takes to drop the requests inside, with room to spare.
pub const DEFAULT_MARGIN_FRACTION: u32 = 10;

/// Renewals per term, by default: with the default bound on each, two may
/// fail in a row before a claim lapses.
pub const DEFAULT_RENEWALS_PER_TERM: u32 = 5;

/// The timing of claims: term, renewal period and bound, margin.
///
/// [`check`](Self::check) says whether it is safe; the stores refuse it otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTiming {
    /// How long a claim lasts on the backend's clock unless renewed.
    pub term: Duration,
    /// How often the replica renews its claims.
    pub renew_every: Duration,
    /// How long a renewal may take before it counts as failed (and the
    /// session is opened again).
    pub renew_timeout: Duration,
    /// How long before the term runs out, counted from when a grant or
    /// renewal was sent, the replica stops the claim's requests.
    pub margin: Duration,
}

impl ClaimTiming {
    /// The defaults for `term`: renew five times per term, each renewal
    /// bounded by the period, a margin of a tenth.
    #[must_use]
    pub fn for_term(term: Duration) -> Self {
        let renew_every = term / DEFAULT_RENEWALS_PER_TERM;
        Self { term, renew_every, renew_timeout: renew_every, margin: term / DEFAULT_MARGIN_FRACTION }
    }

    /// How long a claim is valid here after its grant or renewal was sent.
    #[must_use]
    pub fn valid_for(&self) -> Duration {
        self.term.saturating_sub(self.margin)
    }

    /// Whether this timing can keep a claim: a renewal sent on schedule and
    /// answered within its bound lands before the claim lapses here, that is
    /// `renew_every + renew_timeout < term − margin`; and every period is above zero.
    ///
    /// # Errors
    ///
    /// The rule each refused timing breaks.
    pub fn check(&self) -> Result<(), ClaimTimingError> {
        let refuse = |why| Err(ClaimTimingError { timing: *self, why });
        if self.renew_every.is_zero() || self.renew_timeout.is_zero() || self.term.is_zero() {
            return refuse("term, renew_every and renew_timeout must be above zero");
        }
        if self.margin >= self.term {
            return refuse("the margin must be shorter than the term");
        }
        if self.renew_every + self.renew_timeout >= self.valid_for() {
            return refuse(
                "renew_every + renew_timeout must be shorter than term − margin: otherwise a claim \
                 lapses here before the renewal that should keep it can be answered",
            );
        }
        Ok(())
    }
}

impl Default for ClaimTiming {
    fn default() -> Self {
        Self::for_term(DEFAULT_TERM)
    }
}

/// A [`ClaimTiming`] that cannot keep claims safely (see [`ClaimTiming::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimTimingError {
    timing: ClaimTiming,
    why: &'static str,
}

impl fmt::Display for ClaimTimingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ClaimTiming { term, renew_every, renew_timeout, margin } = self.timing;
        write!(
            f,
            "unsafe claim timing (term {term:?}, renew_every {renew_every:?}, renew_timeout \
             {renew_timeout:?}, margin {margin:?}): {}",
            self.why
        )
    }
}

impl std::error::Error for ClaimTimingError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(term: u64, renew_every: u64, renew_timeout: u64, margin: u64) -> ClaimTiming {
        let ms = Duration::from_millis;
        ClaimTiming {
            term: ms(term),
            renew_every: ms(renew_every),
            renew_timeout: ms(renew_timeout),
            margin: ms(margin),
        }
    }

    #[test]
    fn the_defaults_are_safe_for_any_term() {
        for term in [1, 50, 500, 5_000, 60_000] {
            assert_eq!(ClaimTiming::for_term(Duration::from_millis(term)).check(), Ok(()), "term {term} ms");
        }
    }

    #[test]
    fn a_renewal_that_cannot_land_before_the_deadline_is_refused() {
        // The attack's timing: renewed every 3 s, a 1 s term.
        let error = timing(1_000, 3_000, 3_000, 100).check().unwrap_err();
        assert!(error.to_string().contains("renew_every + renew_timeout"), "{error}");
        // Exactly at the bound: refused; a millisecond under: taken.
        assert!(timing(1_000, 400, 400, 200).check().is_err());
        assert!(timing(1_000, 400, 399, 200).check().is_ok());
        assert!(timing(1_000, 0, 100, 100).check().is_err());
        assert!(timing(1_000, 100, 100, 1_000).check().is_err());
    }
}
