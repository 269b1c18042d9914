//! The admission rule, for one key, in one place.
//!
//! Every decision that can change what a key admits happens in
//! [`KeyState::admit_raising`], under the key's mutex, and nothing awaits while that
//! mutex is held. The state it guards:
//!
//! - `mark`: the highest token seen. It rises the moment a higher token
//!   arrives, so every later lower token is refused at once.
//! - `recorded`: the highest mark the durable log has confirmed (equal to
//!   `mark` when there is no log). A token above it is never admitted.
//! - `recording`: the highest token some request has the duty to record, so
//!   that one raise is written once however many requests carry it.
//! - `inside`: the token of the requests currently inside the inner service.
//!   They all carry the same token: a higher token waits until they have all
//!   left, a lower one is stale.
//!
//! How many are inside lives outside the mutex, in the atomic `gate` word,
//! with two flags: `OPEN` (the mutex has declared `open_token` the current
//! mark, recorded, and the token of those inside) and `WAITERS` (someone sleeps
//! until the count drains). That lets the common request — the holder's
//! current token, again — enter and leave with one atomic add each
//! ([`KeyState::try_enter`]), and fall back to the mutex for anything else.
//!
//! Invariant 1 (monotonic admission) holds because a request enters only with
//! `token == mark`, and `mark` never falls. Invariant 2 (no overlap across
//! holders) holds because a request enters only when nobody is inside or those
//! inside carry its own token. Invariant 3 (durable marks) holds because a
//! request enters only when `token <= recorded`.
//!
//! Why the fast path keeps invariant 2: a raise clears `OPEN` with one
//! read-modify-write on `gate` that also returns the count. A fast entrant adds
//! itself to the count first and only then looks at `OPEN` and `open_token`.
//! Both are read-modify-writes of one word, so one comes first: either the
//! raise sees the entrant in the count and waits for it, or the entrant sees
//! `OPEN` cleared (or reopened for the higher token) and backs out. Backing out
//! is an ordinary leave, so a raise that counted it is woken all the same.
//! So the count may include entrants about to back out, and `inside` is the
//! token last admitted, which may be stale once the count is zero: a decision
//! only ever waits longer because of either. `open_token` only rises (it is set
//! to the mark, which only rises), so an entrant that read its own token twice
//! around its add cannot have been fooled by a close and a reopen (no ABA).
//!
//! Waiters sleep on a per-key [`Notify`], created the first time a key has to
//! wait. It is woken whenever the outcome for a waiter may have changed: a raise,
//! the last request leaving while `WAITERS` is set, a log write finishing or
//! failing, a seed making a pending token durable.
//!
//! Liveness (invariant 6) rests on one rule: the request told to record a
//! raise holds a [`RecordDuty`], and the duty reports when it is dropped —
//! success only if the log confirmed the write, a hand-back otherwise (an
//! error, a panic, a dropped future, a writer thread that died). A hand-back
//! resets `recording` and wakes the waiters, and the next request with the
//! token writes. So every token above `recorded` has exactly one live duty or
//! none, never a promise that nobody will keep. `store/loom_model.rs` checks
//! all of this under every interleaving of a few threads.

use std::sync::{Arc, PoisonError};

use super::sync::{AtomicU32, AtomicU64, Mutex, MutexGuard, Notify, Ordering, OwnedNotified};

/// In `gate`: the fast path admits `open_token`. Set and cleared only under the mutex.
const OPEN: u32 = 1 << 31;
/// In `gate`: someone waits for the count to reach zero. Set and cleared only under the mutex.
const WAITERS: u32 = 1 << 30;
/// In `gate`: how many requests are inside (and fast entrants about to back out).
const COUNT: u32 = WAITERS - 1;

/// What a request with a given token may do now.
pub(crate) enum Admission {
    /// Enter the inner service now, holding this place until done.
    Enter(InsideGuard),
    /// Refuse: the token is below the mark.
    Stale { highest: u64 },
    /// Wait for the notification, then ask again; what for says which bound applies.
    Wait(OwnedNotified, WaitFor),
    /// Write the raise to the durable log (the duty is this request's alone),
    /// then ask again.
    Record(RecordDuty),
    /// The token would raise the mark from `mark`: have it verified, then ask
    /// again as verified. Nothing changed.
    Verify { mark: u64 },
}

/// What a raise needs before it happens, as the layer is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// A raise is recorded in the durable log before it is admitted.
    pub(crate) durable: bool,
    /// A raise is verified first (and this request's token has not been yet).
    pub(crate) verify: bool,
}

/// In-memory marks, no verifier (for the tests and the loom model).
#[cfg(test)]
pub(crate) const LOCAL: Rules = Rules { durable: false, verify: false };
/// Durable marks, no verifier.
#[cfg(test)]
pub(crate) const DURABLE: Rules = Rules { durable: true, verify: false };

/// What a waiting request waits for, and so which bound applies to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitFor {
    /// Lower-token requests still inside: the drain bound.
    Drain,
    /// Another request's durable write of this raise: the write bound.
    Write,
    /// The verifier's answer on this request's raise: the verify bound.
    Verify,
}

/// The mark and in-flight bookkeeping of one resource key.
#[derive(Debug)]
pub(crate) struct KeyState {
    gate: AtomicU32,
    open_token: AtomicU64,
    marks: Mutex<Marks>,
}

#[derive(Debug)]
struct Marks {
    mark: u64,
    recorded: u64,
    recording: u64,
    inside: u64,
    /// Live [`RecordDuty`]s: while any is, a write for this key may be in flight.
    duties: u32,
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
            gate: AtomicU32::new(0),
            open_token: AtomicU64::new(0),
            marks: Mutex::new(Marks {
                mark,
                recorded: mark,
                recording: mark,
                inside: 0,
                duties: 0,
                wake: None,
            }),
        }
    }

    // No code that can panic runs under this lock, but a poisoned mutex must
    // never turn into a panic on the request path.
    fn lock(&self) -> MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fast path: enters without the mutex when `token` is the open token,
    /// that is, the mark, already recorded, and the token of anyone inside.
    /// `None` means "ask [`admit_raising`](Self::admit_raising)", never "refused".
    #[inline(always)]
    pub(crate) fn try_enter(self: &Arc<Self>, token: u64) -> Option<InsideGuard> {
        if self.open_token.load(Ordering::Acquire) != token {
            return None;
        }
        // Count ourselves in first, then check; see the module docs for why.
        let gate = self.gate.fetch_add(1, Ordering::AcqRel);
        debug_assert!(gate & COUNT < COUNT, "more than 2^30 requests inside one key");
        if gate & OPEN != 0 && self.open_token.load(Ordering::Acquire) == token {
            return Some(InsideGuard(Arc::clone(self)));
        }
        self.leave();
        None
    }

    /// Decides what a request carrying `token` may do under `rules`.
    #[cfg(test)]
    pub(crate) fn admit(self: &Arc<Self>, key: &str, token: u64, rules: Rules) -> Admission {
        self.admit_raising(key, token, rules).0
    }

    /// Decides what a request carrying `token` may do under `rules`, and
    /// whether that raised the mark (exactly one request reports each raise).
    pub(crate) fn admit_raising(self: &Arc<Self>, key: &str, token: u64, rules: Rules) -> (Admission, bool) {
        let mut m = self.lock();
        let old = m.mark;
        let admission = self.decide(&mut m, token, rules);
        drop(m);
        let raised = token > old && !matches!(admission, Admission::Verify { .. });
        if raised {
            log_raise(key, old, token);
        }
        (admission, raised)
    }

    fn decide(self: &Arc<Self>, m: &mut Marks, token: u64, rules: Rules) -> Admission {
        if token < m.mark {
            return Admission::Stale { highest: m.mark };
        }
        if token > m.mark {
            if rules.verify {
                return Admission::Verify { mark: m.mark };
            }
            self.raise(m, token);
            if !rules.durable {
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
                m.duties += 1;
                return Admission::Record(RecordDuty { state: Arc::clone(self), token, ok: false });
            }
            return Admission::Wait(m.notified(), WaitFor::Write);
        }
        let gate = self.gate.load(Ordering::Acquire);
        if gate & COUNT == 0 || m.inside == token {
            return self.enter_locked(m, token, gate);
        }
        // Lower tokens are inside: ask the last one out to wake us, unless it
        // left in the meantime.
        let gate = self.gate.fetch_or(WAITERS, Ordering::AcqRel);
        if gate & COUNT == 0 {
            return self.enter_locked(m, token, gate);
        }
        Admission::Wait(m.notified(), WaitFor::Drain)
    }

    /// Raises the mark, closing the fast path for the old one first.
    fn raise(&self, m: &mut Marks, token: u64) {
        self.gate.fetch_and(!OPEN, Ordering::AcqRel);
        m.mark = token;
    }

    /// Lets `token` (the mark, recorded, and nobody else's inside) in, and opens
    /// the fast path for it. `gate` is a recent value; `OPEN` in it is current,
    /// because only the mutex holder changes that flag.
    fn enter_locked(self: &Arc<Self>, m: &mut Marks, token: u64, gate: u32) -> Admission {
        m.inside = token;
        if gate & OPEN == 0 {
            self.open_token.store(token, Ordering::Release);
            self.gate.fetch_add(OPEN + 1, Ordering::AcqRel);
        } else {
            self.gate.fetch_add(1, Ordering::AcqRel);
        }
        Admission::Enter(InsideGuard(Arc::clone(self)))
    }

    /// A request admitted by [`admit_raising`](Self::admit_raising) or
    /// [`try_enter`](Self::try_enter) has left the inner service (or a fast
    /// entrant backs out).
    #[inline]
    fn leave(&self) {
        let gate = self.gate.fetch_sub(1, Ordering::AcqRel);
        if gate & COUNT == 1 && gate & WAITERS != 0 {
            self.wake_drained();
        }
    }

    /// The last request out wakes whoever waits for the key to drain.
    #[cold]
    fn wake_drained(&self) {
        let m = self.lock();
        // Everyone registered is woken; whoever still has to wait sets it again.
        self.gate.fetch_and(!WAITERS, Ordering::AcqRel);
        m.wake_waiters();
    }

    /// A [`RecordDuty`] for `token` is discharged: written if `ok`, else handed back.
    fn recorded(&self, token: u64, ok: bool) {
        let mut m = self.lock();
        m.duties -= 1;
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
            self.raise(&mut m, token);
        }
        if token > m.recorded {
            m.recorded = token;
            m.recording = m.recording.max(token);
            // A raise, or a pending one made durable: either way waiters may go on.
            m.wake_waiters();
        }
        m.mark
    }
}

/// Why [`KeyState::reset`] did not reset a mark.
#[derive(Debug)]
pub(crate) enum ResetRefused<E> {
    /// A raise of this key is being recorded; try again once it is.
    Recording,
    /// The durable log did not take the new mark; nothing changed.
    Log(E),
}

impl KeyState {
    /// Sets the mark to `to`, up or down: an operator's deliberate repair (a
    /// forged token bricked the key, or the lock service's counter started
    /// over). Returns the old mark. `write` makes `to` durable first; it runs
    /// under the key's lock, when no raise of this key is being recorded, so
    /// no write of an older raise can land after it.
    ///
    /// Requests inside stay inside, and the rules go on from the new mark: a
    /// token other than theirs still waits for them to leave, so no two
    /// holders are ever inside at once. Monotonic admission restarts from `to`.
    pub(crate) fn reset<E>(
        &self,
        to: u64,
        write: impl FnOnce() -> Result<(), E>,
    ) -> Result<u64, ResetRefused<E>> {
        let mut m = self.lock();
        if m.duties > 0 {
            return Err(ResetRefused::Recording);
        }
        write().map_err(ResetRefused::Log)?;
        let old = m.mark;
        // Close the fast path: it admits the old mark, which may be the forged token.
        self.gate.fetch_and(!OPEN, Ordering::AcqRel);
        m.mark = to;
        m.recorded = to;
        m.recording = to;
        // Waiters decide again from the new mark.
        m.wake_waiters();
        Ok(old)
    }
}

/// Logs a raise of `key`'s mark from `old` to `new`. A key at 0 had no mark
/// ([`MarkStore::mark`](super::MarkStore::mark) said `None`), so its first
/// raise says so instead of `old=0`. Out of line: raises are rare, and the
/// admission around it stays as small as before.
#[cold]
#[inline(never)]
fn log_raise(key: &str, old: u64, new: u64) {
    if old == 0 {
        tracing::info!(key = ?key, new, "fencing mark raised: the key's first");
    } else {
        tracing::info!(key = ?key, old, new, "fencing mark raised");
    }
}

/// The duty to make one raise durable, given to exactly one request by
/// [`KeyState::admit_raising`]; every other request with that token waits for it.
///
/// Dropping it reports the outcome: a success only after
/// [`succeeded`](Self::succeeded), anything else — an error, a panic, a
/// dropped future, a writer that went away — hands the duty back, and the next
/// request with the token writes. So no token is ever left with a write that
/// nobody will make.
#[derive(Debug)]
pub(crate) struct RecordDuty {
    state: Arc<KeyState>,
    token: u64,
    ok: bool,
}

impl RecordDuty {
    /// The token to record.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// The raise is durable; reported when this is dropped.
    pub(crate) fn succeeded(&mut self) {
        self.ok = true;
    }
}

impl Drop for RecordDuty {
    fn drop(&mut self) {
        self.state.recorded(self.token, self.ok);
    }
}

/// A place inside the inner service, made only by [`KeyState::admit_raising`]; leaving
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
    #[inline]
    fn drop(&mut self) {
        self.0.leave();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Admits `token` and keeps its place until the returned guard is dropped.
    fn enter(state: &Arc<KeyState>, token: u64) -> Option<InsideGuard> {
        match state.admit("k", token, LOCAL) {
            Admission::Enter(guard) => Some(guard),
            _ => None,
        }
    }

    #[test]
    fn equal_tokens_share_the_inside_and_higher_ones_wait() {
        let state = Arc::new(KeyState::new(0));
        let first = enter(&state, 1).unwrap();
        let second = enter(&state, 1).unwrap();
        assert!(matches!(state.admit("k", 2, LOCAL), Admission::Wait(_, WaitFor::Drain)));
        // The raise already happened: token 1 is stale now, even though it is inside.
        assert!(matches!(state.admit("k", 1, LOCAL), Admission::Stale { highest: 2 }));
        drop(first);
        assert!(matches!(state.admit("k", 2, LOCAL), Admission::Wait(_, WaitFor::Drain)));
        drop(second);
        assert!(enter(&state, 2).is_some());
        assert_eq!(state.mark(), 2);
    }

    fn duty(admission: Admission) -> RecordDuty {
        match admission {
            Admission::Record(duty) => duty,
            _ => panic!("expected the duty to record"),
        }
    }

    #[test]
    fn a_durable_raise_is_recorded_once_before_anyone_enters() {
        let state = Arc::new(KeyState::new(3));
        let first = duty(state.admit("k", 5, DURABLE));
        assert_eq!(first.token(), 5);
        let Admission::Wait(woken, WaitFor::Write) = state.admit("k", 5, DURABLE) else {
            panic!("5 is being written")
        };
        drop(first);
        // The failed write wakes the waiters, and the next request retries it.
        assert!(fired(woken));
        let mut second = duty(state.admit("k", 5, DURABLE));
        let Admission::Wait(woken, WaitFor::Write) = state.admit("k", 5, DURABLE) else {
            panic!("5 is being written")
        };
        second.succeeded();
        drop(second);
        assert!(fired(woken));
        assert!(matches!(state.admit("k", 5, DURABLE), Admission::Enter(_)));
        assert!(matches!(state.admit("k", 3, DURABLE), Admission::Stale { highest: 5 }));
    }

    #[test]
    fn a_duty_dropped_in_a_panic_is_handed_back() {
        let state = Arc::new(KeyState::new(0));
        let admission = state.admit("k", 7, DURABLE);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _admission = admission;
            panic!("the request panicked before submitting its write");
        }));
        assert!(unwound.is_err());
        assert_eq!(duty(state.admit("k", 7, DURABLE)).token(), 7, "the token was stranded");
    }

    #[test]
    fn seeding_a_pending_token_wakes_its_waiters() {
        let state = Arc::new(KeyState::new(0));
        let _writing = duty(state.admit("k", 4, DURABLE));
        let Admission::Wait(woken, WaitFor::Write) = state.admit("k", 4, DURABLE) else {
            panic!("4 is being written")
        };
        assert_eq!(state.seed(4), 4, "the mark was already 4");
        assert!(fired(woken), "the waiter sleeps although 4 is durable");
        assert!(matches!(state.admit("k", 4, DURABLE), Admission::Enter(_)));
    }

    /// Whether a wake-up has fired, without waiting for it.
    fn fired(notified: OwnedNotified) -> bool {
        use std::future::Future;
        use std::task::{Context, Waker};
        std::pin::pin!(notified).poll(&mut Context::from_waker(Waker::noop())).is_ready()
    }

    #[test]
    fn the_fast_path_admits_only_the_open_token_and_a_raise_closes_it() {
        let state = Arc::new(KeyState::new(0));
        // Nothing is open until the mutex has admitted the token once.
        assert!(state.try_enter(5).is_none());
        let first = enter(&state, 5).unwrap();
        let fast = state.try_enter(5).expect("the current token enters without the mutex");
        assert!(state.try_enter(4).is_none());
        assert!(state.try_enter(6).is_none());

        // A raise closes it at once: the old token no longer gets in, not even fast.
        let Admission::Wait(raise_waits, WaitFor::Drain) = state.admit("k", 6, LOCAL) else {
            panic!("5 is inside")
        };
        assert!(state.try_enter(5).is_none());
        assert!(matches!(state.admit("k", 5, LOCAL), Admission::Stale { highest: 6 }));
        assert!(state.try_enter(6).is_none(), "6 must wait for 5 to drain");

        // The last fast entrant out wakes the raise, which then enters and reopens for 6.
        drop(first);
        drop(fast);
        assert!(fired(raise_waits));
        let six = enter(&state, 6).unwrap();
        assert!(state.try_enter(6).is_some());
        drop(six);
        assert_eq!(state.gate.load(Ordering::Acquire) & COUNT, 0, "every guard left");
    }

    #[test]
    fn a_durable_raise_opens_the_fast_path_only_once_recorded() {
        let state = Arc::new(KeyState::new(3));
        let mut writing = duty(state.admit("k", 5, DURABLE));
        assert!(state.try_enter(5).is_none());
        writing.succeeded();
        drop(writing);
        let _inside = enter(&state, 5).unwrap();
        assert!(state.try_enter(5).is_some());
    }

    #[test]
    fn watch_reports_an_overtaken_token() {
        let state = Arc::new(KeyState::new(0));
        let _inside = enter(&state, 4).unwrap();
        assert!(state.watch(4).is_ok());
        assert!(matches!(state.admit("k", 9, LOCAL), Admission::Wait(_, WaitFor::Drain)));
        assert_eq!(state.watch(4).err(), Some(9));
    }
}
