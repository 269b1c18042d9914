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
//! let claims = ClaimStore::with_timing(Db, ClaimTiming::for_term(Duration::from_secs(5)));
//! let layer = FencingLayer::new().shared_store(claims);
//! # let _ = layer;
//! ```
//!
//! # The protocol
//!
//! - **Enter** (in memory): the replica holds a valid claim on the request's
//!   token for its key: count the request in. A token below a mark this
//!   replica knows (from a grant, a renewal or an announced raise) gets 409.
//! - **Claim** (otherwise; one round trip): in one transaction the backend
//!   raises the mark to the token if it is lower and announces the raise, then
//!   grants the claim if the mark equals the token and no claim on a lower
//!   token is live. A mark above the token is a 409.
//! - **Wait**: a live lower claim keeps the raise out. Every replica that
//!   hears of the raise admits nobody more under its lower claim and releases
//!   it (deletes its row, announces the release) once its last request has
//!   left; a replica that never hears lets it expire. The raise claims again
//!   on every release it hears of, when the soonest lower claim expires, and
//!   every 100 ms, until the drain bound (then 503; the mark stays raised).
//! - **Renew** (background, every `renew_every`): one statement extends every
//!   claim the replica holds that is still live by the backend's clock, and
//!   reports the keys' marks (a mark above the claim is a raise the replica
//!   missed). An expired claim is never renewed.
//! - **Stop**: each claim is valid locally until `sent + term − margin`, where
//!   `sent` is when the last successful grant or renewal of it was *sent*, on
//!   this process's monotonic clock. At that deadline, or when a renewal finds
//!   the claim gone, the replica revokes it: every request inside is stopped
//!   (its inner future dropped, 503 `claim-lost`), and none enters again.
//!
//! # Why a higher token never runs beside a lower one
//!
//! Take a request `r` with token `t` inside on replica R, under R's claim `c`,
//! and a request with `u > t` admitted anywhere, under a claim granted at
//! backend time `g`. That grant found no live claim below `u`, so `c`'s row
//! was gone or expired at `g`:
//!
//! - *Gone*: R deletes a row only once nobody is inside under it (the last
//!   request's leaving starts the delete), and the delete names the grant, so
//!   it never removes a newer grant's row. So `r` had left.
//! - *Expired*: the row expires `term` after the backend wrote it, which is
//!   after R sent that grant or renewal. R's deadline for `c` is `term − margin`
//!   after that send, so, with clocks that run at the same rate within the
//!   margin, R's deadline came first and R stopped `r` then. A renewal cannot
//!   revive an expired row, and grant and renewal both lock the claim's row,
//!   so a renewal in flight cannot extend a row the grant judged expired.
//!
//! Admission in memory also needs the claim's token to still be the mark, or
//! not yet overtaken by an *admitted* token: a raise commits the higher mark
//! before it waits, but admits nothing until every lower claim is released or
//! expired, so a replica that has not yet heard of a raise may still admit the
//! lower token, and that request is then waited for (or stopped). Admitted
//! tokens, per key, in order of admission, never decrease.
//!
//! # The one assumption
//!
//! Clocks run at the same rate, within the margin over a term: the replica's
//! monotonic clock and the backend's clock (a wall clock jumped forward on the
//! database host shortens every claim). And a process that is *paused* (SIGSTOP,
//! a long GC or VM pause) for longer than the term cannot stop its own
//! requests: when it wakes, its claim may have expired and a newer token may be
//! running. Nobody can stop that from outside; there, the resource's own check
//! of the token (a version column, `fencing-postgres`'s in-transaction fence)
//! is what holds.
//!
//! # Costs
//!
//! A request with the replica's current token costs a map lookup, two atomic
//! counts and an allocation: no round trip, no pooled connection. Each replica
//! keeps one background session (renewals and notifications); grants,
//! releases and raises are short transactions on the backend's pool.

mod admit;
mod backend;
mod claim;
mod keeper;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use self::backend::{
    BoxFuture, ClaimBackend, ClaimEvent, ClaimRenewer, ClaimReply, ClaimRequest, ClaimSession, Renewed,
};
pub(crate) use self::claim::Entered;
use self::claim::{Claim, State};
use crate::store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore};

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

/// Renewals per term, by default: four may fail in a row before a claim lapses.
pub const DEFAULT_RENEWALS_PER_TERM: u32 = 5;

/// How often a waiting raise claims again when it hears nothing, at most.
const POLL: Duration = Duration::from_millis(100);

/// Wake-up channels for waiting raises, by key hash: a wake-up for one key
/// may wake another key's waiters, which just look again.
const STRIPES: usize = 64;

/// Most marks a replica remembers for turning stale tokens away in memory.
const MAX_KNOWN_MARKS: usize = crate::store::DEFAULT_MAX_KEYS;

/// A [`SharedStore`] of claims over a [`ClaimBackend`]; see the [module docs](self).
///
/// Cheap to clone; clones share the claims. The background task starts with
/// the first request that needs the backend, on that request's runtime, and
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct ClaimStore {
    inner: Arc<Inner>,
}

/// The timing of claims: term, renewal period, margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTiming {
    /// How long a claim lasts on the backend's clock unless renewed.
    pub term: Duration,
    /// How often the replica renews its claims.
    pub renew_every: Duration,
    /// How long before the term runs out, counted from when a grant or
    /// renewal was sent, the replica stops the claim's requests.
    pub margin: Duration,
}

impl ClaimTiming {
    /// The defaults for `term`: renew five times per term, a margin of a tenth.
    #[must_use]
    pub fn for_term(term: Duration) -> Self {
        Self { term, renew_every: term / DEFAULT_RENEWALS_PER_TERM, margin: term / DEFAULT_MARGIN_FRACTION }
    }

    /// How long a claim is valid here after its grant or renewal was sent.
    fn valid_for(&self) -> Duration {
        self.term.saturating_sub(self.margin)
    }
}

impl Default for ClaimTiming {
    fn default() -> Self {
        Self::for_term(DEFAULT_TERM)
    }
}

pub(crate) struct Inner {
    backend: Box<dyn ClaimBackend>,
    replica: String,
    timing: ClaimTiming,
    /// This replica's claims, by key: at most one each.
    claims: DashMap<String, Arc<Claim>, ahash::RandomState>,
    /// The highest mark heard of per key, to turn stale tokens away in memory.
    marks: DashMap<String, u64, ahash::RandomState>,
    stripes: [Arc<Notify>; STRIPES],
    hasher: ahash::RandomState,
    /// Installs and removals of claims, one at a time (never on the fast path).
    install: Mutex<()>,
    /// Claims in flight to the backend, by key and token: one each.
    claiming: Mutex<HashSet<(String, u64)>>,
    grants: AtomicU64,
    epoch: Instant,
    runtime: OnceLock<tokio::runtime::Handle>,
    keeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ClaimStore {
    /// Claims in `backend`, with the [default timing](ClaimTiming::default).
    pub fn new(backend: impl ClaimBackend) -> Self {
        Self::with_timing(backend, ClaimTiming::default())
    }

    /// Claims in `backend`, with `timing`. `renew_every` should leave room
    /// for a few renewals within `term − margin`, or claims lapse between
    /// renewals (each lapse stops the claim's requests with 503).
    pub fn with_timing(backend: impl ClaimBackend, timing: ClaimTiming) -> Self {
        let random = ahash::RandomState::new();
        let replica = format!("{:016x}{:016x}", random.hash_one(1u8), random.hash_one(std::process::id()));
        let inner = Inner {
            backend: Box::new(backend),
            replica,
            timing,
            claims: DashMap::with_hasher(ahash::RandomState::new()),
            marks: DashMap::with_hasher(ahash::RandomState::new()),
            stripes: std::array::from_fn(|_| Arc::new(Notify::new())),
            hasher: ahash::RandomState::new(),
            install: Mutex::new(()),
            claiming: Mutex::new(HashSet::new()),
            grants: AtomicU64::new(0),
            epoch: Instant::now(),
            runtime: OnceLock::new(),
            keeper: Mutex::new(None),
        };
        Self { inner: Arc::new(inner) }
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

    /// The highest mark of `key` this replica knows of (from its grants,
    /// renewals and the raises it heard), if any.
    #[must_use]
    pub fn known_mark(&self, key: &str) -> Option<u64> {
        let claimed = self.inner.claims.get(key).map(|claim| claim.overtaken_by().unwrap_or(claim.token));
        let heard = self.inner.marks.get(key).map(|mark| *mark);
        claimed.max(heard)
    }

    /// How many keys this replica holds a claim on, in any state.
    #[must_use]
    pub fn claims(&self) -> usize {
        self.inner.claims.len()
    }
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
    /// Nanoseconds since the store was made, on the monotonic clock.
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

    /// Remembers that `key`'s mark is at least `mark`.
    fn note_mark(&self, key: &str, mark: u64) {
        if let Some(mut known) = self.marks.get_mut(key) {
            *known = (*known).max(mark);
            return;
        }
        if self.marks.len() < MAX_KNOWN_MARKS {
            let mut known = self.marks.entry(key.to_owned()).or_insert(mark);
            *known = (*known).max(mark);
        }
    }

    /// A raise of `key` to `token` was announced (or found by a renewal).
    fn raised(&self, key: &str, token: u64) {
        self.note_mark(key, token);
        let claim = self.claims.get(key).map(|claim| Arc::clone(&claim));
        if let Some(claim) = claim.filter(|claim| claim.token < token) {
            claim.overtake(token);
        }
        self.wake(key);
    }

    /// Installs (or extends) this replica's claim on `(key, token)` after the
    /// backend granted `grant`, sent at `sent`, and enters it.
    fn install(self: &Arc<Self>, key: &str, token: u64, grant: u64, sent: u64) -> Option<Entered> {
        let deadline = self.deadline_from(sent);
        let _one_at_a_time = self.install.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let current = self.claims.get(key).map(|claim| Arc::clone(&claim));
        let claim = match current {
            Some(claim) if claim.token == token && claim.state() == State::Valid => {
                claim.extend(grant, deadline);
                claim
            }
            // Lower, or no longer valid (its requests are leaving or stopped):
            // the new grant's row has replaced its row already.
            _ => {
                let claim =
                    Arc::new(Claim::new(key.to_owned(), token, grant, deadline, Arc::downgrade(self)));
                self.claims.insert(key.to_owned(), Arc::clone(&claim));
                claim
            }
        };
        claim.try_enter(self.now())
    }

    /// Deletes the row of `grant` (a claim nobody is inside any more), then
    /// forgets the claim and wakes whoever waits on the key.
    fn release(self: &Arc<Self>, key: &str, token: u64, grant: u64) {
        let Some(runtime) = self.runtime.get() else { return };
        let store = Arc::downgrade(self);
        let release = self.backend.release(&self.replica, key, grant);
        let key = key.to_owned();
        runtime.spawn(async move {
            let outcome = release.await;
            let Some(store) = store.upgrade() else { return };
            if let Err(error) = outcome {
                // The row expires by itself within the term.
                tracing::debug!(key, token, %error, "a claim's release failed; it will expire");
            }
            store.forget(&key, grant);
            store.wake(&key);
        });
    }

    /// Drops the local claim on `key` if it is still `grant`'s and not valid.
    fn forget(&self, key: &str, grant: u64) {
        let _one_at_a_time = self.install.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.claims.remove_if(key, |_, claim| claim.grant() == grant && claim.state() != State::Valid);
    }

    /// Starts the background task, once, on the current runtime.
    fn start(self: &Arc<Self>) {
        if self.runtime.get().is_some() {
            return;
        }
        let runtime = tokio::runtime::Handle::current();
        if self.runtime.set(runtime.clone()).is_ok() {
            let task = runtime.spawn(keeper::run(Arc::downgrade(self)));
            *self.keeper.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(task);
        }
    }

    fn next_grant(&self) -> u64 {
        self.grants.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.keeper.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}
