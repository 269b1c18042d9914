//! What a run saw, as it happened, with the time since it started: the raw
//! material of a timeline picture. The scenario and the billing scenario each
//! record their own kind of event.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An event of kind `E` and when, since the run started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded<E> {
    /// Time since the run started (the monotonic clock).
    pub at: Duration,
    /// What.
    pub what: E,
}

/// Collects [`Recorded`]s from every task of a run.
#[derive(Debug, Clone)]
pub(crate) struct Recorder<E> {
    start: Instant,
    log: Arc<Mutex<Vec<Recorded<E>>>>,
}

impl<E> Recorder<E> {
    pub(crate) fn new() -> Self {
        Self { start: Instant::now(), log: Arc::default() }
    }

    /// Notes `what` as happening now.
    pub(crate) fn note(&self, what: E) {
        let at = self.start.elapsed();
        // A poisoned log only means another task panicked mid-push; the entries stand.
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(Recorded { at, what });
    }

    /// Everything noted so far, in order.
    pub(crate) fn take(&self) -> Vec<Recorded<E>> {
        let mut log = std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()));
        log.sort_by_key(|recorded| recorded.at);
        log
    }
}
