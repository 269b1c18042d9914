//! [`Failure`]: the stories' one error, only a message (why a scenario could
//! not be run to the end), and how the scenarios make one: a step's context,
//! and a bound on every step.

use std::fmt;
use std::future::Future;
use std::time::Duration;

/// What failed and why, in words; nothing in it is meant to be matched on.
#[derive(Debug)]
pub struct Failure(pub(crate) String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// `context: error`.
pub(crate) fn fail(context: &str, error: impl fmt::Display) -> Failure {
    Failure(format!("{context}: {error}"))
}

/// Bound on every wait of a scenario, so a broken run fails instead of hanging.
pub(crate) const STEP_BOUND: Duration = Duration::from_secs(10);

/// `work`'s output, or a failure naming `step` once it has taken [`STEP_BOUND`].
pub(crate) async fn bounded<T>(step: &str, work: impl Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(STEP_BOUND, work)
        .await
        .map_err(|_| Failure(format!("{step}: not done within {STEP_BOUND:?}")))
}
