//! The keeper: keeps a session open, renews this replica's claims, hears
//! raises and releases, and revokes every claim whose deadline passes.
//!
//! It runs on a thread and a runtime of its own, so application workers that
//! are blocked or busy (a handler that never yields, a CPU-bound burst) delay
//! no renewal and no revocation. It holds the store weakly and ends when the
//! store is dropped (the runtime goes with it, and with the runtime the
//! session's connection and any release in flight).
//!
//! A notification is a hint, never a fact: any role that can connect can send
//! one. A raise heard for a key this replica holds a lower claim on makes the
//! keeper *read* the key's mark; only what it reads changes anything.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};
use tokio::time::error::Elapsed;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Dispatch;

use super::claim::{Claim, State};
use super::journal::{Handoff, Metered};
use super::{BoxFuture, ClaimEvent, ClaimRenewer, ClaimSession, Inner, POLL, Renewal, RenewalReport};
use crate::store::StoreError;

/// The first pause before reopening a session that failed; it doubles up to a second.
const REOPEN_PAUSE: Duration = Duration::from_millis(50);
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Most keys waiting for their mark to be read at once; past it, the next
/// renewal reads every claimed key's mark instead.
const MAX_CHECKS: usize = 1024;

/// How soon a renewal that found rows busy (locked by a raise looking at
/// them, say) is tried again.
const BUSY_RETRY: Duration = Duration::from_millis(20);

/// Expired rows are swept this many terms apart.
const SWEEP_TERMS: u32 = 5;

type Bounded<T> = BoxFuture<'static, Result<Result<T, StoreError>, tokio::time::error::Elapsed>>;

/// The keeper's thread, as the store holds it: dropping it stops the keeper.
pub(super) struct Handle {
    runtime: tokio::runtime::Handle,
    task: tokio::task::AbortHandle,
}

impl Handle {
    /// Starts the keeper of `store` on a thread of its own, or says why it
    /// could not. Everything logged on that thread goes through a [`Handoff`]
    /// to the subscriber in force here (the caller's), never waiting for it.
    pub(super) fn start(
        store: Weak<Inner>,
        dropped: Arc<AtomicU64>,
        metered: Option<Metered>,
    ) -> Option<Self> {
        let (sender, started) = std::sync::mpsc::channel();
        let application = tracing::dispatcher::get_default(Dispatch::clone);
        let thread = std::thread::Builder::new().name("fencing-claims-keeper".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => return tracing::error!(%error, "claims: cannot build the keeper's runtime"),
            };
            let handoff = Handoff::start(application, dropped, metered);
            let task = runtime.spawn(run(store));
            let _ = sender.send(Handle { runtime: runtime.handle().clone(), task: task.abort_handle() });
            let _ = tracing::dispatcher::with_default(&handoff, || runtime.block_on(task));
        });
        if let Err(error) = thread {
            tracing::error!(%error, "claims: cannot start the keeper's thread");
            return None;
        }
        started.recv().ok()
    }

    /// Runs `future` on the keeper's runtime.
    pub(super) fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(future);
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A renewal in flight: what it asked for and when it was sent.
struct InFlight {
    sent: u64,
    /// Each claim asked for, with the grant asked for.
    held: Vec<(Arc<Claim>, u64)>,
    reply: Bounded<Renewal>,
}

async fn run(store: Weak<Inner>) {
    let Some(rearm) = store.upgrade().map(|inner| Arc::clone(&inner.rearm)) else { return };
    let mut pause = REOPEN_PAUSE;
    loop {
        let Some(inner) = store.upgrade() else { return };
        let opening = tokio::time::timeout(inner.timing.renew_timeout, inner.backend.open_session());
        drop(inner);
        // Deadlines keep running while no session is open.
        match minding_deadlines(&store, &rearm, opening).await {
            None => return,
            Some(Ok(Ok(session))) => {
                pause = REOPEN_PAUSE;
                serve(&store, &rearm, session).await;
            }
            Some(Ok(Err(error))) => tracing::warn!(%error, "claims: cannot open the background session"),
            Some(Err(_)) => tracing::warn!("claims: opening the background session timed out"),
        }
        minding_deadlines(&store, &rearm, tokio::time::sleep(pause)).await;
        pause = (pause * 2).min(REOPEN_PAUSE_MAX);
    }
}

/// Drives `future` to its end while revoking each claim whose deadline
/// passes, re-reading the deadlines whenever a claim is installed. `None`:
/// the store is gone.
async fn minding_deadlines<F: Future>(store: &Weak<Inner>, rearm: &Notify, future: F) -> Option<F::Output> {
    tokio::pin!(future);
    loop {
        let deadline = store.upgrade()?.next_deadline();
        tokio::select! {
            output = &mut future => return Some(output),
            () = sleep_until(deadline) => store.upgrade()?.revoke_expired(),
            () = rearm.notified() => {}
        }
    }
}

/// Marks this replica's session down when [`serve`] returns, however it returns.
struct SessionUp<'a>(&'a Weak<Inner>);

impl Drop for SessionUp<'_> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.set_session(false);
        }
    }
}

/// What the session is doing besides waiting.
#[derive(Default)]
struct Work {
    /// The periodic renewal in flight.
    renewal: Option<InFlight>,
    /// A renewal of the claims on keys a release was heard for, in flight:
    /// it finds a claim deleted behind this replica's back at once.
    verify: Option<InFlight>,
    /// Keys this replica holds a claim on that a release was heard for.
    to_verify: HashSet<String>,
    /// Keys a raise was heard for, and the read of their marks in flight.
    to_check: HashSet<String>,
    check: Option<Bounded<Vec<(String, u64)>>>,
    /// Renew every claim and read every claimed key's mark, as soon as the
    /// last such renewal is a period old.
    renew_all: bool,
    last_all: Option<Instant>,
    /// A renewal found rows busy: renew again then, not a whole period later.
    retry_at: Option<Instant>,
    hints: HintBudget,
}

/// Runs one session until it breaks (or the store is dropped).
async fn serve(store: &Weak<Inner>, rearm: &Notify, session: ClaimSession) {
    let ClaimSession { renewer, mut events } = session;
    let renewer: Arc<dyn ClaimRenewer> = Arc::from(renewer);
    let Some(inner) = store.upgrade() else { return };
    let timing = inner.timing;
    inner.set_session(true);
    // Whatever was announced while no session listened: everyone looks again.
    inner.wake_all();
    drop(inner);
    let _up = SessionUp(store);
    let mut tick = tokio::time::interval(timing.renew_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let sweep_every = timing.term * SWEEP_TERMS;
    let mut sweep = tokio::time::interval_at(Instant::now() + sweep_every, sweep_every);
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut work = Work::default();
    // Looked for again only when deadlines may have changed (a revocation, a
    // renewal, a sooner claim), never per hint or grant: it reads every claim.
    let mut deadline = None;
    let mut look_again = true;
    loop {
        let Some(inner) = store.upgrade() else { return };
        work.send_what_is_due(&inner, &renewer);
        if std::mem::take(&mut look_again) {
            deadline = inner.next_deadline();
        }
        drop(inner);
        let hints_open = work.hints.open();
        tokio::select! {
            // Deadlines first: a revocation never waits behind anything else.
            biased;
            () = sleep_until(deadline) => {
                let Some(inner) = store.upgrade() else { return };
                inner.revoke_expired();
                look_again = true;
            }
            () = rearm.notified() => look_again = true,
            _ = tick.tick() => {
                let Some(inner) = store.upgrade() else { return };
                inner.release_idle();
                look_again = true;
                work.renew_due(&inner, &renewer);
            }
            (sent, held, replied) = either_answer(&mut work.renewal, &mut work.verify) => {
                look_again = true;
                let Some(inner) = store.upgrade() else { return };
                if work.renewed(&inner, sent, &held, replied).is_break() {
                    return;
                }
            }
            read = ready(&mut work.check) => {
                look_again = true;
                let Some(inner) = store.upgrade() else { return };
                if marks_read(&inner, read).is_break() {
                    return;
                }
            }
            event = events.recv(), if hints_open => {
                let Some(inner) = store.upgrade() else { return };
                if work.heard(&inner, event).is_break() {
                    return;
                }
            }
            () = sleep_until(work.hints.reopens()), if !hints_open => {}
            () = sleep_until(work.retry_at), if work.retry_at.is_some() => {
                work.retry_at = None;
                let Some(inner) = store.upgrade() else { return };
                work.renew_due(&inner, &renewer);
            }
            _ = sweep.tick() => {
                let Some(inner) = store.upgrade() else { return };
                inner.sweep(&renewer);
            }
        }
    }
}

/// The reply of whichever renewal in flight answers first: the periodic one,
/// or the one of claims a release was heard for.
async fn either_answer(
    renewal: &mut Option<InFlight>,
    verify: &mut Option<InFlight>,
) -> (u64, Vec<(Arc<Claim>, u64)>, Replied<Renewal>) {
    tokio::select! {
        replied = answer(renewal) => replied,
        replied = answer(verify) => replied,
    }
}

/// The reply of the renewal in `slot`, taking it out; pending while there is none.
async fn answer(slot: &mut Option<InFlight>) -> (u64, Vec<(Arc<Claim>, u64)>, Replied<Renewal>) {
    let Some(in_flight) = slot.as_mut() else { return std::future::pending().await };
    let replied = in_flight.reply.as_mut().await;
    let InFlight { sent, held, .. } = slot.take().unwrap_or_else(|| unreachable!("polled above"));
    (sent, held, replied)
}

/// The output of the read in `slot`, taking it out; pending while there is none.
async fn ready<T>(slot: &mut Option<Bounded<T>>) -> Replied<T> {
    let Some(read) = slot.as_mut() else { return std::future::pending().await };
    let replied = read.as_mut().await;
    *slot = None;
    replied
}

/// A bounded call's outcome: its answer, its error, or its bound passed.
type Replied<T> = Result<Result<T, StoreError>, Elapsed>;

/// Whether the session goes on after what it was told; `Break` when it is broken.
type Session = ControlFlow<()>;

impl Work {
    /// Sends the periodic renewal of the claims due, unless one is in flight.
    fn renew_due(&mut self, inner: &Arc<Inner>, renewer: &Arc<dyn ClaimRenewer>) {
        if self.renewal.is_none() {
            self.renewal = Some(renew(inner, renewer, Which::Due));
        }
    }

    /// Sends what hints asked for, each once at a time: a full renewal (at
    /// most once a period, however many hints were lost), the renewal of
    /// claims a release was heard for, the read of marks a raise was heard for.
    fn send_what_is_due(&mut self, inner: &Arc<Inner>, renewer: &Arc<dyn ClaimRenewer>) {
        let timing = inner.timing;
        let period_passed = self.last_all.is_none_or(|last| last.elapsed() >= timing.renew_every);
        if self.renew_all && self.renewal.is_none() && period_passed {
            self.renew_all = false;
            self.last_all = Some(Instant::now());
            self.renewal = Some(renew(inner, renewer, Which::All));
        }
        if self.verify.is_none() && !self.to_verify.is_empty() {
            let keys = std::mem::take(&mut self.to_verify);
            self.verify = Some(renew(inner, renewer, Which::Keys(&keys)));
        }
        if self.check.is_none() && !self.to_check.is_empty() {
            let keys = self.to_check.drain().collect();
            self.check = Some(Box::pin(tokio::time::timeout(timing.renew_timeout, renewer.read_marks(keys))));
        }
    }

    /// A renewal's reply: extends the claims it covered (a retry soon when rows were busy).
    fn renewed(
        &mut self,
        inner: &Inner,
        sent: u64,
        held: &[(Arc<Claim>, u64)],
        replied: Replied<Renewal>,
    ) -> Session {
        match replied {
            Ok(Ok(renewal)) => {
                if inner.renewed(sent, held, renewal) {
                    self.retry_at = Some(Instant::now() + BUSY_RETRY);
                }
                Session::Continue(())
            }
            Ok(Err(error)) => broken(format_args!("renewal failed ({error})")),
            Err(_) => broken(format_args!("renewal timed out")),
        }
    }

    /// A notification: only a hint, and only [`HintBudget`]'s share of them a
    /// second. A raise above a claim held here has that key's mark read; a
    /// release on a key held here has that claim renewed (it may be the
    /// replica's own claim, deleted by hand); past `MAX_CHECKS` of either,
    /// everything is renewed and read instead.
    fn heard(&mut self, inner: &Inner, event: Result<ClaimEvent, broadcast::error::RecvError>) -> Session {
        self.hints.spend();
        match event {
            Ok(ClaimEvent::Raised { key, token }) => {
                if inner.holds_below(&key, token) {
                    self.look_at(&key, Look::Mark);
                }
                inner.wake(&key);
            }
            Ok(ClaimEvent::Released { key, .. }) => {
                if inner.holds(&key) {
                    self.look_at(&key, Look::Claim);
                }
                inner.wake(&key);
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "claims: notifications came faster than they were heard");
                self.renew_all = true;
                if self.hints.may_wake_all() {
                    inner.wake_all();
                }
            }
            Err(broadcast::error::RecvError::Closed) => {
                return broken(format_args!("the background session ended"));
            }
        }
        Session::Continue(())
    }

    fn look_at(&mut self, key: &str, look: Look) {
        let keys = match look {
            Look::Mark => &mut self.to_check,
            Look::Claim => &mut self.to_verify,
        };
        if keys.len() < MAX_CHECKS {
            keys.insert(key.to_owned());
        } else {
            self.renew_all = true;
        }
    }
}

/// What a hint makes the keeper look at for a key it holds.
enum Look {
    /// The key's mark (a raise was heard).
    Mark,
    /// The claim itself (a release was heard).
    Claim,
}

/// How many hints the keeper takes a second: whatever arrives past that
/// waits in the session's channel, whose oldest are dropped when it is full
/// (the keeper then renews everything once and wakes every waiter, at most
/// once per [`POLL`]). So a flood costs the keeper a bounded share of its
/// thread, and raises fall back to their poll; renewals and deadlines go on.
struct HintBudget {
    left: u32,
    window_ends: Instant,
    last_wake_all: Option<Instant>,
}

/// Hints taken per window of [`HINT_WINDOW`]: 10,000 a second.
const HINTS_PER_WINDOW: u32 = 1_000;
const HINT_WINDOW: Duration = Duration::from_millis(100);

impl Default for HintBudget {
    fn default() -> Self {
        Self { left: HINTS_PER_WINDOW, window_ends: Instant::now() + HINT_WINDOW, last_wake_all: None }
    }
}

impl HintBudget {
    /// Whether another hint may be taken now (a new window refills the budget).
    fn open(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.window_ends {
            self.left = HINTS_PER_WINDOW;
            self.window_ends = now + HINT_WINDOW;
        }
        self.left > 0
    }

    /// When the budget refills.
    fn reopens(&self) -> Option<Instant> {
        Some(self.window_ends)
    }

    fn spend(&mut self) {
        self.left = self.left.saturating_sub(1);
    }

    /// Whether every waiter may be woken now: at most once per [`POLL`].
    fn may_wake_all(&mut self) -> bool {
        let now = Instant::now();
        let may = self.last_wake_all.is_none_or(|last| now.duration_since(last) >= POLL);
        if may {
            self.last_wake_all = Some(now);
        }
        may
    }
}

/// The marks read for keys a raise was heard for: the table's mark is what acts.
fn marks_read(inner: &Inner, read: Replied<Vec<(String, u64)>>) -> Session {
    match read {
        Ok(Ok(marks)) => {
            marks.into_iter().for_each(|(key, mark)| inner.read_mark(&key, mark));
            Session::Continue(())
        }
        Ok(Err(error)) => broken(format_args!("reading marks failed ({error})")),
        Err(_) => broken(format_args!("reading marks timed out")),
    }
}

/// Logs why the session is given up; the keeper opens another.
fn broken(why: std::fmt::Arguments<'_>) -> Session {
    tracing::warn!("claims: {why}; reopening the session");
    Session::Break(())
}

/// Which claims a renewal carries.
enum Which<'a> {
    /// Those whose deadline would come before the renewal after next could be
    /// answered (so one renewal may fail and the next still lands in time),
    /// not every claim at every tick: with the default timing a claim is
    /// renewed about every other period.
    Due,
    /// Every claim, and every claimed key's mark read.
    All,
    /// The claims on these keys.
    Keys(&'a HashSet<String>),
}

/// Sends a renewal of the claims `which` names, bounded by `renew_timeout`.
fn renew(inner: &Arc<Inner>, renewer: &Arc<dyn ClaimRenewer>, which: Which<'_>) -> InFlight {
    let timing = inner.timing;
    let soon = u64::try_from((timing.renew_every * 2 + timing.renew_timeout).as_nanos()).unwrap_or(u64::MAX);
    let horizon = inner.now().saturating_add(soon);
    let wanted = |claim: &Claim| match &which {
        Which::Due => claim.deadline() <= horizon,
        Which::All => true,
        Which::Keys(keys) => keys.contains(&claim.key),
    };
    let held: Vec<(Arc<Claim>, u64)> = inner
        .claims
        .iter()
        .filter(|claim| claim.state().may_have_inside() && wanted(claim))
        .map(|claim| (Arc::clone(&claim), claim.grant()))
        .collect();
    let asked = held.iter().map(|(claim, grant)| (claim.key.clone(), *grant)).collect();
    let sent = inner.now();
    let reply = renewer.renew(&inner.replica, asked, timing.term);
    InFlight { sent, held, reply: Box::pin(tokio::time::timeout(timing.renew_timeout, reply)) }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl State {
    /// A claim in this state may still have requests inside that rely on it:
    /// it is renewed, and revoked at its deadline.
    pub(super) fn may_have_inside(self) -> bool {
        matches!(self, State::Valid | State::Overtaken | State::Releasing)
    }
}

impl Inner {
    /// The earliest deadline of a claim that still admits or has requests
    /// inside, noted in `armed` for installs to compare theirs with.
    fn next_deadline(&self) -> Option<Instant> {
        // Any claim installed while this looks wakes the keeper again.
        self.armed.store(u64::MAX, Ordering::SeqCst);
        let now = self.now();
        let soonest = self
            .claims
            .iter()
            .filter(|claim| claim.state().may_have_inside())
            // The mutant never revokes: a past deadline would wake the keeper in a loop.
            .filter(|claim| !mutant::no_deadline_revoke() || claim.deadline() > now)
            .map(|claim| claim.deadline())
            .min()?;
        self.armed.store(soonest, Ordering::SeqCst);
        Some(Instant::from_std(self.epoch) + Duration::from_nanos(soonest))
    }

    /// Revokes every claim whose deadline has passed, all of them before
    /// anything is logged: their requests are stopped. Then one line for all.
    fn revoke_expired(&self) {
        if mutant::no_deadline_revoke() {
            return;
        }
        let now = self.now();
        let expired: Vec<Arc<Claim>> = self
            .claims
            .iter()
            .filter(|claim| claim.state().may_have_inside() && claim.deadline() <= now)
            .map(|claim| Arc::clone(&claim))
            .collect();
        // Revoked outside the map's guards: a release started here takes them again.
        let mut stopped = Stopped::default();
        for claim in &expired {
            if claim.revoke() {
                stopped.count(claim);
            }
        }
        stopped.done(self.now());
        self.revocations.at_deadline(stopped.claims, stopped.latest_late);
        if stopped.claims > 0 {
            tracing::warn!(
                claims = stopped.claims,
                inside = stopped.inside,
                key = stopped.example.as_deref(),
                late = ?stopped.latest_late,
                "claims: claims not renewed in time were revoked; their requests were stopped"
            );
        }
    }

    /// Releases claims nobody used since the last tick, so raises elsewhere need not wait for them.
    fn release_idle(&self) {
        let valid: Vec<Arc<Claim>> = self
            .claims
            .iter()
            .filter(|claim| claim.state() == State::Valid)
            .map(|claim| Arc::clone(&claim))
            .collect();
        valid.iter().for_each(|claim| claim.release_if_idle());
    }

    /// A renewal sent at `sent` for `held` came back with `renewal`: true if
    /// some claims' rows were busy (and were not renewed). Claims found gone
    /// are revoked before anything is logged.
    fn renewed(&self, sent: u64, held: &[(Arc<Claim>, u64)], renewal: Renewal) -> bool {
        let deadline = self.deadline_from(sent);
        let took = Duration::from_nanos(self.now().saturating_sub(sent));
        let report = RenewalReport { took, claims: held.len(), extended: renewal.extended.len() };
        *self.last_renewal.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(report);
        let extended: HashSet<u64> = renewal.extended.into_iter().collect();
        let busy: HashSet<u64> = renewal.busy.into_iter().collect();
        let raised: HashMap<u64, u64> = renewal.raised.into_iter().collect();
        let mut gone = Stopped::default();
        for (claim, grant) in held {
            if let Some(&mark) = raised.get(grant).filter(|&&mark| mark > claim.token) {
                self.raised(&claim.key, mark);
            }
            if extended.contains(grant) {
                claim.renewed(*grant, deadline);
            } else if busy.contains(grant) {
                // Live, but its row was locked by someone else: it keeps the deadline it has.
            } else if claim.grant() == *grant && claim.state().may_have_inside() && claim.revoke() {
                // Gone from the backend (expired, then deleted by a raise; or
                // deleted by hand) and not replaced by a newer grant meanwhile.
                gone.count(claim);
            }
        }
        self.revocations.found_gone(gone.claims);
        if gone.claims > 0 {
            tracing::warn!(
                claims = gone.claims,
                inside = gone.inside,
                key = gone.example.as_deref(),
                "claims: a renewal found claims gone from the backend; their requests were stopped"
            );
        }
        if !busy.is_empty() {
            tracing::debug!(claims = busy.len(), "claims: rows were busy; renewed again shortly");
        }
        !busy.is_empty()
    }

    /// The backend read `key`'s mark as `mark` (after a notification said it rose).
    fn read_mark(&self, key: &str, mark: u64) {
        if self.holds_below(key, mark) {
            self.raised(key, mark);
        }
    }

    /// Deletes expired rows (any replica's: a dead one's stay otherwise), and
    /// forgets the marks of keys this replica holds no claim on (the backend has them).
    fn sweep(&self, renewer: &Arc<dyn ClaimRenewer>) {
        self.marks.retain(|key, _| self.claims.contains_key(key));
        let sweep = tokio::time::timeout(self.timing.renew_timeout, renewer.sweep());
        tokio::spawn(async move {
            match sweep.await {
                Ok(Ok(0)) => {}
                Ok(Ok(swept)) => tracing::debug!(swept, "claims: expired claims deleted"),
                Ok(Err(error)) => tracing::debug!(%error, "claims: sweeping expired claims failed"),
                Err(_) => tracing::debug!("claims: sweeping expired claims timed out"),
            }
        });
    }
}

/// Claims one pass revoked, summed up for one log line.
#[derive(Default)]
struct Stopped {
    claims: u64,
    inside: u64,
    /// One of the keys, for the log line.
    example: Option<String>,
    /// The soonest deadline among them.
    soonest: Option<u64>,
    /// How long after the soonest deadline the pass had revoked them all.
    latest_late: Duration,
}

impl Stopped {
    fn count(&mut self, claim: &Claim) {
        self.claims += 1;
        self.inside += claim.inside();
        self.soonest = Some(self.soonest.map_or(claim.deadline(), |soonest| soonest.min(claim.deadline())));
        if self.example.is_none() {
            self.example = Some(claim.key.clone());
        }
    }

    /// The pass ended at `now`.
    fn done(&mut self, now: u64) {
        if let Some(soonest) = self.soonest {
            self.latest_late = Duration::from_nanos(now.saturating_sub(soonest));
        }
    }
}
/// The mutant switch of the `mutants` feature (tests only): without the
/// feature, every switch is a constant `false`.
mod mutant {
    /// `FENCING_MUTANT=no-deadline-revoke`: the keeper stops no request when a
    /// claim's local deadline passes (a lost renewal cancels nothing).
    #[cfg(feature = "mutants")]
    pub(super) fn no_deadline_revoke() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            let on = std::env::var("FENCING_MUTANT").is_ok_and(|mutant| mutant == "no-deadline-revoke");
            if on {
                tracing::error!("MUTANT no-deadline-revoke: claims are not revoked at their local deadline");
            }
            on
        })
    }

    #[cfg(not(feature = "mutants"))]
    #[inline(always)]
    pub(super) const fn no_deadline_revoke() -> bool {
        false
    }
}
