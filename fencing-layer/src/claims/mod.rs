//! Claims: the layer's contract across replicas, admitted in memory, safe when
//! database sessions die.
//!
//! A [`ClaimStore`] is a [`SharedStore`] for several
//! replicas of one resource. Each replica holds a **claim** on `(key, token)`
//! in a shared backend (PostgreSQL in `fencing-postgres`; any engine with
//! expiring records and notifications can carry one, see [`ClaimBackend`]),
//! with an expiry on the backend's clock. Every request of the replica with
//! that token is admitted in memory under the one claim, which a background
//! task renews. Nothing rests on a session staying alive: a claim is a row
//! with an expiry, not a lock held by a connection.
//!
//! ```
//! use fencing_layer::FencingLayer;
//! use fencing_layer::claims::{ClaimBackend, ClaimStore};
//! # use fencing_layer::claims::{BoxFuture, ClaimReply, ClaimRequest, ClaimSession};
//! # use fencing_layer::store::StoreError;
//! # struct Db;
//! # impl ClaimBackend for Db {
//! #     fn claim(&self, _: ClaimRequest<'_>) -> BoxFuture<'static, Result<ClaimReply, StoreError>> { unimplemented!() }
//! #     fn release(&self, _: &str, _: &str, _: u64) -> BoxFuture<'static, Result<(), StoreError>> { unimplemented!() }
//! #     fn open_session(&self) -> BoxFuture<'static, Result<ClaimSession, StoreError>> { unimplemented!() }
//! # }
//! use std::time::Duration;
//!
//! use fencing_layer::claims::ClaimTiming;
//!
//! let claims = ClaimStore::with_timing(Db, ClaimTiming::for_term(Duration::from_secs(5))).expect("a safe timing");
//! let layer = FencingLayer::new().shared_store(claims);
//! # let _ = layer;
//! ```
//!
//! # The protocol
//!
//! - **Enter** (in memory): the replica holds a valid claim on the request's
//!   token for its key: count the request in. A token below a mark this
//!   replica read from the backend (a grant, a refusal, a renewal, a read)
//!   gets 409.
//! - **Claim** (otherwise; one round trip): in one transaction the backend
//!   raises the mark to the token if it is lower and announces the raise, then
//!   grants the claim if the mark equals the token and no claim on a lower
//!   token is live. A mark above the token is a 409. No claim goes out while
//!   the replica has no background session to renew it (503), and none past
//!   [`ClaimStore::max_keys`] keys (503; a key's room is taken before its
//!   claim is sent, so racing requests cannot overshoot it). A grant whose
//!   request went away meanwhile is released at once.
//! - **Wait**: a live lower claim keeps the raise out. A replica that hears of
//!   the raise reads the key's mark; if it is above its claim, the claim
//!   admits nobody more and is released (its row deleted, the release
//!   announced) once its last request has left; a replica that never hears
//!   finds the mark with its next renewal, or lets the claim expire. The raise
//!   claims again on every release it hears of, when the soonest lower claim
//!   expires, and every 100 ms, until the drain bound (then 503; the mark
//!   stays raised).
//! - **Renew** (the keeper, every `renew_every`, each bounded by
//!   `renew_timeout`): extends every claim the replica holds that is still live
//!   by the backend's clock, skipping (never waiting on) a record another
//!   transaction holds, and reports the keys' marks (a mark above the claim is
//!   a raise the replica missed). An expired claim is never renewed.
//! - **Stop**: each claim is valid locally until `sent + term − margin`, where
//!   `sent` is when the last successful grant or renewal of it was *sent*, on
//!   this process's monotonic clock. Two stops, independent of each other,
//!   act on that deadline: the keeper arms it the moment the claim is
//!   installed, and each request inside checks it at every poll, with a timer
//!   of its own on the application's runtime. At the deadline (whichever stop
//!   sees it first), or when a renewal finds the claim gone, the claim is
//!   revoked: every request inside is stopped (its inner future dropped, 503
//!   `claim-lost`), and none enters again. The keeper revokes *first* and
//!   logs after, one line for all it revoked, through a queue it never waits
//!   on (`journal.rs`): a stalled log pipe cannot hold it. A request whose
//!   handler finishes after its claim was revoked or its deadline passed (a
//!   handler that never yielded cannot be dropped) also answers 503
//!   `claim-lost`, never what the handler made.
//! - **Sweep**: every five terms each replica deletes expired claims (a dead
//!   replica's stay otherwise) and forgets the marks it read for keys it holds
//!   no claim on. Marks themselves stay in the backend: the argument below
//!   needs a key's mark for as long as a holder of a lower token may write.
//!
//! Notifications are hints, never facts: any role that can connect can send
//! one (PostgreSQL's `NOTIFY` needs no privilege). A raise heard only makes
//! the keeper read the key's mark; a release makes waiters look again, and,
//! on a key this replica holds a claim on, has that claim renewed at once (a
//! claim deleted behind the replica's back, by hand say, is then found gone
//! and revoked within a round trip). The keeper takes at most 10,000 hints a
//! second; past that they wait in the channel ([`EVENTS`] of them), whose
//! oldest are dropped, and the keeper then renews every claim and reads every
//! claimed key's mark, at most once a renewal period. So a flood slows raises
//! (down to their 100 ms poll), never renewals or deadlines. Only what the
//! backend answers changes what a replica admits.
//!
//! # Why a higher token never runs beside a lower one
//!
//! Take a request `r` with token `t` inside on replica R, under R's claim `c`,
//! and a request with `u > t` admitted anywhere, under a claim granted at
//! backend time `g`. That grant found no live claim below `u`, so `c`'s row
//! was gone or expired at `g`:
//!
//! - *Gone*: R deletes a row only once nobody is inside under it (the last
//!   request's leaving starts the delete, and a claim that stopped admitting
//!   never admits again: `cell.rs`), and the delete names the grant, so it
//!   never removes a newer grant's row. So `r` had left.
//! - *Expired*: the row expires `term` after the backend wrote it, which is
//!   after R sent that grant or renewal. R's deadline for `c` is `term − margin`
//!   after that send, so, with clocks that run at the same rate within the
//!   margin, R's deadline came first, and R's keeper, on a thread of its own,
//!   stopped `r` then. A renewal cannot revive an expired row, and grant and
//!   renewal both lock the claim's row, so a renewal in flight cannot extend a
//!   row the grant judged expired.
//!
//! Admission in memory also needs the claim's token to still be the mark, or
//! not yet overtaken by an *admitted* token: a raise commits the higher mark
//! before it waits, but admits nothing until every lower claim is released or
//! expired, so a replica that has not yet heard of a raise may still admit the
//! lower token, and that request is then waited for (or stopped). Admitted
//! tokens, per key, in order of admission, never decrease.
//!
//! # The assumptions, and the one residual
//!
//! - Clocks run at the same rate, within the margin over a term: the
//!   replica's monotonic clock and the backend's clock (a wall clock jumped
//!   forward on the database host shortens every claim).
//! - The timing can keep a claim: `renew_every + renew_timeout < term −
//!   margin` ([`ClaimTiming::check`]; the stores refuse other timings), so a
//!   renewal sent on schedule is answered before the claim lapses here.
//!
//! Application workers that are blocked or busy do not matter: the keeper
//! renews, and revokes at deadlines, on a thread and runtime of its own. A
//! keeper that is late or stuck (whatever it waits on) does not matter to a
//! request that yields: its own deadline check stops it. What remains is one
//! residual, in two forms: a stop of the **whole process** (SIGSTOP, a VM
//! pause, a GC that stops every thread) **for longer than `term − margin`
//! after the last renewal it sent**: the claim may expire in the backend and
//! a newer token run while this process's requests are frozen inside; and a
//! **handler that never yields** while its claim lapses: it cannot be stopped
//! (it answers 503 `claim-lost`), but what it wrote before that may have
//! overlapped the newer holder's writes. Nobody can stop either from
//! outside; there, the resource's own check of the token (a version column,
//! `fencing-postgres`'s in-transaction fence) is what holds.
//!
//! # Costs
//!
//! A request with the replica's current token costs a map lookup, two atomic
//! counts, an allocation, and a clock read at each poll: no round trip, no
//! pooled connection. Each replica keeps two threads (the keeper, and the
//! journal that writes its log lines) and one background session (renewals, reads of marks,
//! notifications, sweeps); grants, releases and raises are short transactions
//! on the backend's pool.

mod admit;
mod backend;
mod cell;
mod claim;
mod journal;
mod keeper;
#[cfg(all(test, loom))]
mod loom_model;
mod revocations;
mod room;
mod timing;

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::Notify;

pub use self::backend::{
    BoxFuture, ClaimBackend, ClaimEvent, ClaimRenewer, ClaimReply, ClaimRequest, ClaimSession, EVENTS,
    Renewal, check_text_key,
};
/// A request inside under a claim, as the store's permit holds it.
pub(crate) type Entered = Pin<Box<self::claim::Entered>>;
use self::claim::{Claim, State};
pub use self::revocations::Revocations;
use self::room::Room;
pub use self::timing::{
    ClaimTiming, ClaimTimingError, DEFAULT_MARGIN_FRACTION, DEFAULT_RENEWALS_PER_TERM, DEFAULT_TERM,
};
use crate::store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore, StoreError};

/// How often a waiting raise claims again when it hears nothing, at most.
const POLL: Duration = Duration::from_millis(100);

/// Wake-up channels for waiting raises, by key hash: a wake-up for one key
/// may wake another key's waiters, which just look again.
const STRIPES: usize = 64;

/// Most marks a replica remembers for turning stale tokens away in memory.
const MAX_KNOWN_MARKS: usize = crate::store::DEFAULT_MAX_KEYS;

/// A [`SharedStore`] of claims over a [`ClaimBackend`]; see the [module docs](self).
///
/// Cheap to clone; clones share the claims. The keeper (renewals, deadlines,
/// notifications) runs on a thread and runtime of its own, started by
/// [`ready`](Self::ready) or the first request that needs the backend, and
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct ClaimStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    backend: Arc<dyn ClaimBackend>,
    replica: String,
    timing: ClaimTiming,
    /// This replica's claims, by key: at most one each.
    claims: DashMap<String, Arc<Claim>, ahash::RandomState>,
    /// Most keys this replica holds claims on at once.
    max_claims: AtomicUsize,
    /// Keys whose claim is on its way to the backend, counted against
    /// `max_claims` before it is sent ([`Room`]).
    reserved: AtomicUsize,
    /// The highest mark read from the backend per key, to turn stale tokens
    /// away in memory. Never from a notification: anyone can send one.
    marks: DashMap<String, u64, ahash::RandomState>,
    stripes: [Arc<Notify>; STRIPES],
    hasher: ahash::RandomState,
    /// Installs and removals of claims, one at a time (never on the fast path).
    install: Mutex<()>,
    /// Claims in flight to the backend, by key and token: one each.
    claiming: Mutex<HashSet<(String, u64)>>,
    grants: AtomicU64,
    /// This process's monotonic clock, from when the store was made.
    epoch: Instant,
    /// Wakes the keeper: a claim was installed whose deadline comes before
    /// the one the keeper sleeps until.
    rearm: Arc<Notify>,
    /// The deadline the keeper sleeps until (`u64::MAX` while it looks for
    /// the soonest, or has none): an install wakes it only for a sooner one,
    /// so taking claims never has the keeper scan every claim per grant.
    armed: AtomicU64,
    /// The keeper has a background session that renews: grants go out only then.
    session_up: AtomicBool,
    /// Told whenever `session_up` changes.
    session_changed: Notify,
    /// The last renewal's report.
    last_renewal: Mutex<Option<RenewalReport>>,
    /// Revocations by cause.
    revocations: revocations::Counters,
    /// Log lines the keeper dropped rather than wait for the log output.
    dropped_log_lines: Arc<AtomicU64>,
    /// The application's runtime (the first request's): releases run there,
    /// so that the pooled connections they open are driven by the
    /// application's workers, not by the keeper's one thread.
    app: OnceLock<tokio::runtime::Handle>,
    /// The keeper's thread (`None`: it could not be started, so nothing is granted).
    keeper: OnceLock<Option<keeper::Handle>>,
}

impl ClaimStore {
    /// Claims in `backend`, with the [default timing](ClaimTiming::default).
    pub fn new(backend: impl ClaimBackend) -> Self {
        Self::build(backend, ClaimTiming::default())
    }

    /// Claims in `backend`, with `timing`.
    ///
    /// # Errors
    ///
    /// A timing that cannot keep claims safely ([`ClaimTiming::check`]):
    /// `renew_every + renew_timeout` must be shorter than `term − margin`.
    pub fn with_timing(backend: impl ClaimBackend, timing: ClaimTiming) -> Result<Self, ClaimTimingError> {
        timing.check()?;
        Ok(Self::build(backend, timing))
    }

    fn build(backend: impl ClaimBackend, timing: ClaimTiming) -> Self {
        let random = ahash::RandomState::new();
        let replica = format!("{:016x}{:016x}", random.hash_one(1u8), random.hash_one(std::process::id()));
        let inner = Inner {
            backend: Arc::new(backend),
            replica,
            timing,
            claims: DashMap::with_hasher(ahash::RandomState::new()),
            max_claims: AtomicUsize::new(crate::store::DEFAULT_MAX_KEYS),
            reserved: AtomicUsize::new(0),
            marks: DashMap::with_hasher(ahash::RandomState::new()),
            stripes: std::array::from_fn(|_| Arc::new(Notify::new())),
            hasher: ahash::RandomState::new(),
            install: Mutex::new(()),
            claiming: Mutex::new(HashSet::new()),
            grants: AtomicU64::new(0),
            epoch: Instant::now(),
            rearm: Arc::new(Notify::new()),
            armed: AtomicU64::new(u64::MAX),
            session_up: AtomicBool::new(false),
            session_changed: Notify::new(),
            last_renewal: Mutex::new(None),
            revocations: revocations::Counters::default(),
            dropped_log_lines: Arc::new(AtomicU64::new(0)),
            app: OnceLock::new(),
            keeper: OnceLock::new(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// At most `limit` keys claimed by this replica at once (default
    /// 1,000,000, as the layer's `max_keys`): a request for one more key gets
    /// 503 (fail closed) until a claim is released.
    #[must_use]
    pub fn max_keys(self, limit: usize) -> Self {
        self.inner.max_claims.store(limit, Ordering::Relaxed);
        self
    }

    /// Starts the keeper and waits until its background session is open, at
    /// most `renew_every + renew_timeout`. Call it when the replica starts:
    /// until a session is open no claim is granted (a claim nobody can renew
    /// would only lapse), and this says why.
    ///
    /// # Errors
    ///
    /// The session did not open in time (the backend unreachable, say).
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.inner.start();
        let bound = self.inner.timing.renew_every + self.inner.timing.renew_timeout;
        self.inner.session(bound).await
    }

    /// The timing in effect.
    #[must_use]
    pub fn claim_timing(&self) -> ClaimTiming {
        self.inner.timing
    }

    /// This replica's name in the backend (random per store).
    #[must_use]
    pub fn replica(&self) -> &str {
        &self.inner.replica
    }

    /// The highest mark of `key` this replica knows of (from its grants and
    /// renewals, and the marks it read), if any.
    #[must_use]
    pub fn known_mark(&self, key: &str) -> Option<u64> {
        let claimed = self.inner.claims.get(key).map(|claim| claim.overtaken_by().unwrap_or(claim.token));
        let heard = self.inner.marks.get(key).map(|mark| *mark);
        claimed.max(heard)
    }

    /// What the last renewal that came back did, if one did: how long it
    /// took and how many claims it carried. A renewal close to
    /// `renew_timeout` is a warning: past it, the session is opened again and
    /// claims may lapse.
    #[must_use]
    pub fn last_renewal(&self) -> Option<RenewalReport> {
        *self.inner.last_renewal.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many keys this replica holds a claim on, in any state.
    #[must_use]
    pub fn claims(&self) -> usize {
        self.inner.claims.len()
    }

    /// How this replica's claims were revoked so far, by cause, how late the
    /// keeper's revocations ran, and how many of its log lines it dropped
    /// (it never waits for the log output).
    #[must_use]
    pub fn revocations(&self) -> Revocations {
        self.inner.revocations.read(self.inner.dropped_log_lines.load(Ordering::Relaxed))
    }
}

/// No room for one more key: [`ClaimStore::max_keys`] are held or on their way.
#[derive(Debug)]
pub(super) struct KeyTableFull;

/// One renewal, as [`ClaimStore::last_renewal`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RenewalReport {
    /// From sending it to its answer.
    pub took: Duration,
    /// Claims it asked to extend.
    pub claims: usize,
    /// Of those, how many were extended.
    pub extended: usize,
}

impl std::fmt::Debug for ClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStore")
            .field("replica", &self.inner.replica)
            .field("timing", &self.inner.timing)
            .field("claims", &self.inner.claims.len())
            .finish_non_exhaustive()
    }
}

impl SharedStore for ClaimStore {
    #[inline]
    fn try_admit(&self, key: &str, token: u64) -> Option<Result<SharedPermit, SharedRefusal>> {
        let inner = &*self.inner;
        // The map's guard is dropped before anything else looks at the map.
        let claimed = inner.claims.get(key).map(|claim| {
            if claim.token == token { claim.try_enter(inner.now()).ok_or(0) } else { Err(claim.token) }
        });
        match claimed {
            Some(Ok(entered)) => return Some(Ok(SharedPermit::claim(entered))),
            Some(Err(claimed)) if claimed > token => {
                return Some(Err(SharedRefusal::Stale { highest: inner.highest(key, claimed) }));
            }
            _ => {}
        }
        match inner.marks.get(key) {
            Some(mark) if *mark > token => Some(Err(SharedRefusal::Stale { highest: *mark })),
            _ => None,
        }
    }

    fn admit(&self, key: &str, token: u64, drain: Duration) -> SharedAdmission {
        Box::pin(admit::admit(Arc::clone(&self.inner), key.to_owned(), token, drain))
    }
}

impl Inner {
    /// Nanoseconds since the store was made, on this process's monotonic clock.
    #[inline]
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// `since + term − margin`, for a grant or renewal sent at `since`.
    fn deadline_from(&self, since: u64) -> u64 {
        let valid = u64::try_from(self.timing.valid_for().as_nanos()).unwrap_or(u64::MAX);
        since.saturating_add(valid)
    }

    fn stripe(&self, key: &str) -> &Arc<Notify> {
        &self.stripes[(self.hasher.hash_one(key) as usize) % STRIPES]
    }

    fn wake(&self, key: &str) {
        self.stripe(key).notify_waiters();
    }

    fn wake_all(&self) {
        self.stripes.iter().for_each(|stripe| stripe.notify_waiters());
    }

    /// The highest mark known for `key`, at least `at_least`.
    fn highest(&self, key: &str, at_least: u64) -> u64 {
        let claimed = self.claims.get(key).and_then(|claim| claim.overtaken_by()).unwrap_or(0);
        let known = self.marks.get(key).map_or(0, |mark| *mark);
        at_least.max(claimed).max(known)
    }

    /// Remembers that `key`'s mark is at least `mark`: only what the backend
    /// answered (a grant, a refusal, a renewal, a read), never a notification.
    /// Whether that is news: the known mark rose, or none could be kept.
    fn note_mark(&self, key: &str, mark: u64) -> bool {
        if let Some(mut known) = self.marks.get_mut(key) {
            let rose = mark > *known;
            *known = (*known).max(mark);
            return rose;
        }
        if self.marks.len() < MAX_KNOWN_MARKS {
            let mut known = self.marks.entry(key.to_owned()).or_insert(mark);
            *known = (*known).max(mark);
        }
        true
    }

    /// The backend says `key`'s mark is `mark`: a claim below it admits
    /// nobody more and is released once empty. This key's waiters are woken
    /// when that is news (the known mark rose, or the claim was not yet
    /// overtaken by it); whether they were.
    fn raised(&self, key: &str, mark: u64) -> bool {
        let rose = self.note_mark(key, mark);
        let claim = self.claims.get(key).map(|claim| Arc::clone(&claim));
        let overtook = claim.filter(|claim| claim.token < mark).is_some_and(|claim| {
            let news = claim.overtaken_by().is_none_or(|by| by < mark);
            claim.overtake(mark);
            news
        });
        let news = rose || overtook;
        if news {
            self.wake(key);
        }
        news
    }

    /// Whether this replica holds a claim on `key` below `token`: only then
    /// is a notification of a raise worth reading the mark for.
    fn holds_below(&self, key: &str, token: u64) -> bool {
        self.claims.get(key).is_some_and(|claim| {
            claim.token < token && matches!(claim.state(), State::Valid | State::Overtaken)
        })
    }

    /// Whether this replica holds a claim on `key` that may have requests
    /// inside: only then is a release heard on it worth a look at the claim.
    fn holds(&self, key: &str) -> bool {
        self.claims.get(key).is_some_and(|claim| claim.state().may_have_inside())
    }

    /// Room for `key`'s claim, taken before the claim is sent: at most
    /// `max_claims` keys are held or on their way at any time, however many
    /// requests for new keys race. `None`: no room.
    fn reserve(self: &Arc<Self>, key: &str) -> Option<Room> {
        let _one_at_a_time = self.install.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.claims.contains_key(key) {
            // Its claim replaces the one held: no new key (checked again at install).
            return Some(Room::within_key());
        }
        self.take_room().then(|| Room::taken(self))
    }

    /// Counts one more key on its way, if there is room (under `install`).
    fn take_room(&self) -> bool {
        let limit = self.max_claims.load(Ordering::Relaxed);
        let room = self.claims.len() + self.reserved.load(Ordering::SeqCst) < limit;
        if room {
            self.reserved.fetch_add(1, Ordering::SeqCst);
        }
        room
    }

    /// Installs (or extends) this replica's claim on `(key, token)` after the
    /// backend granted `grant`, sent at `sent`, wakes the keeper to arm its
    /// deadline, and enters it. `Err`: no room after all (the key's claim was
    /// dropped meanwhile, and other keys took the room); the caller releases
    /// the grant.
    fn install(
        self: &Arc<Self>,
        key: &str,
        token: u64,
        grant: u64,
        sent: u64,
        room: &mut Room,
    ) -> Result<Option<Entered>, KeyTableFull> {
        let deadline = self.deadline_from(sent);
        let _one_at_a_time = self.install.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let current = self.claims.get(key).map(|claim| Arc::clone(&claim));
        if current.is_none() && !room.counts_a_key() {
            if !self.take_room() {
                return Err(KeyTableFull);
            }
            *room = Room::taken(self);
        }
        let claim = match current {
            Some(claim) if claim.token == token && claim.state() == State::Valid => {
                claim.extend(grant, deadline);
                claim
            }
            // Lower, or no longer valid (its requests are leaving or stopped):
            // the new grant's row has replaced its row already.
            _ => {
                let claim = Arc::new(Claim::new(key.to_owned(), token, grant, deadline, self));
                self.claims.insert(key.to_owned(), Arc::clone(&claim));
                claim
            }
        };
        // The keeper sleeps until the soonest deadline it knew (or is looking
        // for it): this one may be sooner.
        if deadline <= self.armed.load(Ordering::SeqCst) {
            self.rearm.notify_one();
        }
        Ok(claim.try_enter(self.now()))
    }

    /// Deletes the row of `grant` (a claim nobody is inside any more), on the
    /// application's runtime (the keeper's if none is known), then forgets the
    /// claim and wakes whoever waits on the key. Bounded by the term: past it
    /// the row has expired anyway.
    fn release(self: &Arc<Self>, key: &str, token: u64, grant: u64) {
        let store = Arc::downgrade(self);
        let release = self.backend.release(&self.replica, key, grant);
        let (key, bound) = (key.to_owned(), self.timing.term);
        let task = async move {
            let outcome = tokio::time::timeout(bound, release).await;
            let Some(store) = store.upgrade() else { return };
            match outcome {
                Ok(Ok(())) => {}
                // The row expires by itself within the term.
                Ok(Err(error)) => {
                    tracing::debug!(key, token, %error, "a claim's release failed; it will expire")
                }
                Err(_) => tracing::debug!(key, token, "a claim's release timed out; it will expire"),
            }
            store.forget(&key, grant);
            store.wake(&key);
        };
        match (self.app.get(), self.keeper.get().and_then(Option::as_ref)) {
            (Some(app), _) => drop(app.spawn(task)),
            (None, Some(keeper)) => keeper.spawn(task),
            (None, None) => {}
        }
    }

    /// Drops the local claim on `key` if it is still `grant`'s and not valid.
    fn forget(&self, key: &str, grant: u64) {
        let _one_at_a_time = self.install.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.claims.remove_if(key, |_, claim| claim.grant() == grant && claim.state() != State::Valid);
    }

    /// Starts the keeper, once, on a thread of its own, and notes the
    /// application's runtime (the caller's).
    fn start(self: &Arc<Self>) {
        if self.app.get().is_none()
            && let Ok(app) = tokio::runtime::Handle::try_current()
        {
            let _ = self.app.set(app);
        }
        let dropped = Arc::clone(&self.dropped_log_lines);
        self.keeper.get_or_init(|| {
            // Every series at zero from the start, with the recorder in effect here.
            #[cfg(feature = "metrics")]
            let metered = Some(self.revocations.metered.get_or_init(revocations::Metered::new).clone());
            #[cfg(not(feature = "metrics"))]
            let metered = None;
            keeper::Handle::start(Arc::downgrade(self), dropped, metered)
        });
    }

    /// Waits, at most `bound`, until the keeper has a session.
    async fn session(&self, bound: Duration) -> Result<(), StoreError> {
        let waited = tokio::time::timeout(bound, async {
            loop {
                let changed = self.session_changed.notified();
                if self.session_up.load(Ordering::SeqCst) {
                    return;
                }
                changed.await;
            }
        });
        waited.await.map_err(|_| {
            StoreError::log(std::io::Error::other(format!(
                "claims: no background session within {bound:?}, so no claim could be renewed; \
                 none is granted until one opens"
            )))
        })
    }

    fn set_session(&self, up: bool) {
        self.session_up.store(up, Ordering::SeqCst);
        self.session_changed.notify_waiters();
    }

    fn next_grant(&self) -> u64 {
        self.grants.fetch_add(1, Ordering::Relaxed) + 1
    }
}
