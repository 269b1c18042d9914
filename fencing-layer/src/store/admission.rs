//! The admission rule, for one key, in one place.
//!
//! Every decision about a token happens in [`KeyState::admit`], under the key's
//! mutex, and nothing awaits while that mutex is held. The state it guards:
//!
//! - `mark`: the highest token seen. It rises the moment a higher token
//!   arrives, so every later lower token is refused at once.
//! - `recorded`: the highest mark the durable log has confirmed (equal to
//!   `mark` when there is no log). A token above it is never admitted.
//! - `recording`: the highest token handed to the log writer, so that one
//!   raise is written once however many requests carry it.
//! - `inside` / `inside_count`: the token of the requests currently inside the
//!   inner service, and how many there are. They all carry the same token:
//!   a higher token waits until the count drains to zero, a lower one is stale.
//!
//! Invariant 1 (monotonic admission) holds because a request enters only with
//! `token == mark`, and `mark` never falls. Invariant 2 (no overlap across
//! holders) holds because a request enters only when nobody is inside or those
//! inside carry its own token. Invariant 3 (durable marks) holds because a
//! request enters only when `token <= recorded`.
//!
//! Waiters sleep on a per-key [`Notify`], created the first time a key has to
//! wait. It is woken whenever the outcome for a waiter may have changed: a raise,
//! the last request leaving, a log write finishing.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// What a request with a given token may do now.
pub(crate) enum Admission {
    /// Enter the inner service now, holding this place until done.
    Enter(InsideGuard),
    /// Refuse: the token is below the mark.
    Stale { highest: u64 },
    /// Wait for the notification, then ask again.
    Wait(OwnedNotified),
    /// Write the raise to the durable log, then ask again.
    Record,
}

/// The mark and in-flight bookkeeping of one resource key.
#[derive(Debug)]
pub(crate) struct KeyState {
    marks: Mutex<Marks>,
}

#[derive(Debug)]
struct Marks {
    mark: u64,
    recorded: u64,
    recording: u64,
    inside: u64,
    inside_count: u32,
    wake: Option<Arc<Notify>>,
}

impl Marks {
    /// A wake-up registered now: it sees every `notify_waiters` from here on.
    fn notified(&mut self) -> OwnedNotified {
        Arc::clone(self.wake.get_or_insert_with(Arc::default)).notified_owned()
    }

    fn wake_waiters(&self) {
        if let Some(wake) = &self.wake {
            wake.notify_waiters();
        }
    }
}

impl KeyState {
    /// A key whose mark is `mark`, already durable (new keys start at 0).
    pub(crate) fn new(mark: u64) -> Self {
        Self {
            marks: Mutex::new(Marks {
                mark,
                recorded: mark,
                recording: mark,
                inside: 0,
                inside_count: 0,
                wake: None,
            }),
        }
    }

    // No code that can panic runs under this lock, but a poisoned mutex must
    // never turn into a panic on the request path.
    fn lock(&self) -> MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides what a request carrying `token` may do. `durable` says whether a
    /// raise must be recorded before it is admitted.
    pub(crate) fn admit(self: &Arc<Self>, key: &str, token: u64, durable: bool) -> Admission {
        let mut m = self.lock();
        let old = m.mark;
        let admission = self.decide(&mut m, token, durable);
        drop(m);
        if token > old {
            tracing::info!(key = ?key, old, new = token, "fencing mark raised");
        }
        admission
    }

    fn decide(self: &Arc<Self>, m: &mut Marks, token: u64, durable: bool) -> Admission {
        if token < m.mark {
            return Admission::Stale { highest: m.mark };
        }
        if token > m.mark {
            m.mark = token;
            if !durable {
                m.recorded = token;
                m.recording = token;
            }
            // Lower-token waiters are stale now; under the cancel policy, so is
            // whoever is inside.
            m.wake_waiters();
        }
        // From here on `token == m.mark`.
        if token > m.recorded {
            if token > m.recording {
                m.recording = token;
                return Admission::Record;
            }
            return Admission::Wait(m.notified());
        }
        if m.inside_count == 0 || m.inside == token {
            m.inside = token;
            m.inside_count += 1;
            return Admission::Enter(InsideGuard(Arc::clone(self)));
        }
        Admission::Wait(m.notified())
    }

    /// A request admitted by [`admit`](Self::admit) has left the inner service.
    fn leave(&self) {
        let mut m = self.lock();
        m.inside_count -= 1;
        if m.inside_count == 0 {
            m.wake_waiters();
        }
    }

    /// The log writer finished recording `token`.
    pub(crate) fn recorded(&self, token: u64, ok: bool) {
        let mut m = self.lock();
        if ok {
            m.recorded = m.recorded.max(token);
        } else if m.recording == token {
            // Let the next waiter with this token try the write again.
            m.recording = m.recorded;
        }
        m.wake_waiters();
    }

    /// For the cancel policy: a wake-up for when `token` may have been
    /// overtaken, or the higher mark if it already has been.
    pub(crate) fn watch(&self, token: u64) -> Result<OwnedNotified, u64> {
        let mut m = self.lock();
        if m.mark > token {
            return Err(m.mark);
        }
        Ok(m.notified())
    }

    /// The highest token seen.
    pub(crate) fn mark(&self) -> u64 {
        self.lock().mark
    }

    /// Raises the mark to at least `token`, which the caller has already made
    /// durable. Returns the mark.
    pub(crate) fn seed(&self, token: u64) -> u64 {
        let mut m = self.lock();
        if token > m.mark {
            m.mark = token;
            m.wake_waiters();
        }
        m.recorded = m.recorded.max(token);
        m.recording = m.recording.max(token);
        m.mark
    }
}

/// A place inside the inner service, made only by [`KeyState::admit`]; leaving
/// is tied to drop, so a cancelled or panicking inner future still lets the
/// next holder in.
#[derive(Debug)]
pub(crate) struct InsideGuard(Arc<KeyState>);

impl InsideGuard {
    pub(crate) fn state(&self) -> &Arc<KeyState> {
        &self.0
    }
}

impl Drop for InsideGuard {
    fn drop(&mut self) {
        self.0.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admits `token` and keeps its place until the returned guard is dropped.
    fn enter(state: &Arc<KeyState>, token: u64) -> Option<InsideGuard> {
        match state.admit("k", token, false) {
            Admission::Enter(guard) => Some(guard),
            _ => None,
        }
    }

    #[test]
    fn equal_tokens_share_the_inside_and_higher_ones_wait() {
        let state = Arc::new(KeyState::new(0));
        let first = enter(&state, 1).unwrap();
        let second = enter(&state, 1).unwrap();
        assert!(matches!(state.admit("k", 2, false), Admission::Wait(_)));
        // The raise already happened: token 1 is stale now, even though it is inside.
        assert!(matches!(state.admit("k", 1, false), Admission::Stale { highest: 2 }));
        drop(first);
        assert!(matches!(state.admit("k", 2, false), Admission::Wait(_)));
        drop(second);
        assert!(enter(&state, 2).is_some());
        assert_eq!(state.mark(), 2);
    }

    #[test]
    fn a_durable_raise_is_recorded_once_before_anyone_enters() {
        let state = Arc::new(KeyState::new(3));
        assert!(matches!(state.admit("k", 5, true), Admission::Record));
        assert!(matches!(state.admit("k", 5, true), Admission::Wait(_)));
        state.recorded(5, false);
        // The failed write is retried by the next request, not skipped.
        assert!(matches!(state.admit("k", 5, true), Admission::Record));
        state.recorded(5, true);
        assert!(matches!(state.admit("k", 5, true), Admission::Enter(_)));
        assert!(matches!(state.admit("k", 3, true), Admission::Stale { highest: 5 }));
    }

    #[test]
    fn watch_reports_an_overtaken_token() {
        let state = Arc::new(KeyState::new(0));
        let _inside = enter(&state, 4).unwrap();
        assert!(state.watch(4).is_ok());
        assert!(matches!(state.admit("k", 9, false), Admission::Wait(_)));
        assert_eq!(state.watch(4).err(), Some(9));
    }
}
