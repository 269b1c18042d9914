//! A model of the replica-claims protocol (`src/claims/`, carried on
//! PostgreSQL by `fencing-postgres/src/claims.rs`), checked by
//! [stateright](https://docs.rs/stateright)'s breadth-first search: every
//! state of replicas sharing one key reachable within a number of steps,
//! under lost sessions, delayed and lost messages, drifting clocks, handlers
//! that block their worker thread, and every interleaving of a request's
//! entry with the keeper's idle release.
//!
//! | test | replicas | tokens | steps | states (unique) | CPU time |
//! |---|---|---|---|---|---|
//! | `two_replicas` | 2 | 1 to 3 | 11 | 5.6 million (1.36 million) | 6 s |
//! | `two_replicas_two_tokens` | 2 | 1 to 2 | 14 | 19.7 million (3.99 million) | 25 s |
//! | `three_replicas` | 3 | 1 to 3 | 9 | 5.2 million (1.37 million) | 7 s |
//!
//! In the release profile, each test on two threads: about 20 s for the
//! three on two idle cores, 1.6 GB. Each step more multiplies the states by
//! two to three (12 steps of 2 replicas and 3 tokens: 2.9 million unique
//! states, 15 s of CPU; 10 steps of 3 replicas: 3.9 million, 20 s). Every
//! mutant below is caught within 14 steps of two replicas with tokens 1 and
//! 2, the bound of `two_replicas_two_tokens`: the protocol as fixed passes
//! every path as long as the longest counterexample. Replicas are
//! interchangeable, so the checker sorts them after every step (symmetry
//! reduction); a path it prints names each replica as in the initial state,
//! and is replayed step by step before it is printed.
//!
//! ```sh
//! cargo test -p fencing-claims-model --release --test claims_model -- --nocapture
//! CLAIMS_STEPS=14 CLAIMS_TOKENS=3 cargo test ...   # another bound (steps 0: none)
//! fencing-layer/claims-model/claims-mutants.sh       # each mutant below must be caught
//! ```
//!
//! # Invariant 2
//!
//! Checked in every state reached: **a request that may still answer success
//! never runs beside a higher token.** Precisely: every request admitted under
//! a claim that is not `Lost` has the highest token admitted anywhere, under
//! any claim, lost or not.
//!
//! Why "not lost": a revocation drops every request inside that yields, so a
//! lost claim normally has nobody inside, and the invariant is then the plain
//! "all tokens inside are equal". The exception is a handler that blocks its
//! worker thread ([`Action::Block`]): nothing can drop it, so it stays inside
//! its lost claim until it is done, and may still run when a higher token is
//! admitted (the documented residual: nobody can stop code that does not
//! yield; the resource's own check of the token is what holds there). What
//! the layer promises for it is a 503 `claim-lost`, never success: a claim
//! that is lost is never held again (`poll_inside` in `future/claimed.rs`,
//! `Entered::held`). So the invariant leaves out requests under lost claims
//! and nothing else: a request under a claim not lost counts as one that may
//! still succeed, and no token above its own may be admitted anywhere, not
//! even under a claim lost since. (The code also answers 503 once the claim's
//! deadline has passed, before the keeper revoked it; the model does not rely
//! on that: its invariant is the stricter one.)
//!
//! `sometimes` properties check that the model is not vacuous, each reached
//! with 2 replicas and tokens 1 to 3 (steps of the first path found): requests inside on every
//! replica at once (6 steps); the highest token inside while a replica has
//! not heard of it (3); a claim overtaken with a request inside (4); a claim
//! lost while another replica holds a higher one (7); a request counted in
//! while `release_if_idle` is between its two steps (6); a blocked request
//! inside its lost claim beside a higher token (11); a renewal that extends
//! a row after the deadline it sets has passed (7: a slow renewal). With 3
//! replicas and 9 steps all but the blocked one are reached.
//!
//! # What is modelled, and where it is in the code
//!
//! The database: the key's mark and one claim row per replica (`token`,
//! `grant`, time left before it expires on the database's clock). Each
//! replica: its claim in the map (token, grant, state `Valid` / `Overtaken` /
//! `Releasing` / `Lost`, time left before its local deadline, requests
//! counted in but not yet past their look, requests inside that yield,
//! requests inside that block their thread, release started, whether
//! `release_if_idle` is between its two steps on it, whether the keeper knows
//! its deadline), claims replaced in the map that still have requests in
//! them, the highest mark it heard of, its claim in flight, its background
//! session (up or down), its renewal in flight, the raises queued on its
//! session (`NOTIFY`), and its releases in flight.
//!
//! | action | code |
//! |---|---|
//! | [`Action::Request`]: a request that finds no claim with its token that admits, and nothing that refuses it in memory (409), claims through the database: it overtakes a lower claim and sends a claim | `ClaimStore::try_admit` (`claims/mod.rs`), `admit::look` and `admit::admit` (`claims/admit.rs`), `Claim::overtake` |
//! | [`Action::Enter`]: a request with the claim's token counts in (`inside += 1`) | `Claim::try_enter`, `ClaimCell::try_enter`'s `fetch_add` (`claims/claim.rs`, `claims/cell.rs`) |
//! | [`Action::Look`]: a counted-in request looks at the state and the deadline: in if `Valid` and before it, else it counts out again, and the last one out of a claim that no longer admits starts its release | `ClaimCell::try_enter`'s look, `ClaimCell::leave` |
//! | [`Action::ClaimAtDb`]: the claim transaction, atomic: raise the mark if lower (queue the raise on every session listening), delete expired lower rows, grant if the mark equals the token and no lower row is left. A refusal (`Stale`, `Wait`) is taken in at once: it notes the mark and overtakes a lower claim, and the request may claim again at any later time | `PgClaims::claim` (`fencing-postgres/src/claims.rs`: `raise`, `lock_mark`, `lock_lower`, `drop_expired`, `grant` in one transaction); `admit::admit`, `Inner::raised` |
//! | [`Action::ClaimReply`]: a grant's reply arrives (any time later): the claim is installed (or extended) with its deadline counted from when the claim was *sent*, the keeper is woken at once (it knows the new deadline: "armed"), and the request enters | `admit::admit`, `Inner::install` (`rearm`), `Inner::deadline_from`, `Claim::try_enter` |
//! | [`Action::Block`]: a request inside stops yielding (its handler blocks its worker thread) until it is done | — (an application handler) |
//! | [`Action::Leave`]: a request inside (yielding or blocked) is done; the last one out of a claim that no longer admits starts its release | `Entered::drop`, `ClaimCell::leave` |
//! | [`Action::ReleaseIdle`]: the keeper's idle check finds nobody counted in a valid claim and makes it `Releasing` (it admits nobody more) | `Inner::release_idle`, `Claim::release_if_idle`, `ClaimCell::release_if_idle`'s look and `compare_exchange` (keeper tick) |
//! | [`Action::ReleaseIdleLook`]: then it looks at the count: nobody, it starts the release; somebody counted in meanwhile, it leaves the claim `Releasing`, and the last one out starts the release | `ClaimCell::release_if_idle`'s second look |
//! | [`Action::ReleaseAtDb`] / [`Action::ReleaseFails`]: the delete of one grant's row runs (or fails: the row expires by itself), then the replica forgets the claim | `Claim::release_row`, `Inner::release` (on the keeper's runtime), `Inner::forget`; `PgClaims::release` |
//! | [`Action::RenewSend`], [`Action::RenewAtDb`], [`Action::RenewReply`]: a renewal is sent on the session; at the database (any time later) it extends the row only if it is still that grant's and live; the reply (any time later) notes a higher mark (a missed raise), extends the local deadline from when the renewal was *sent*, or revokes a claim found gone. `Valid`, `Overtaken` and `Releasing` claims are renewed | `keeper::renew`, `Inner::renewed`, `Claim::renewed`, `State::may_have_inside`; `Renewer::renew` (`renew` statement) |
//! | [`Action::Notify`]: a raise queued on the session is heard (and the mark read) | `keeper::serve` (`ClaimEvent::Raised`), `Inner::read_mark`, `Inner::raised` |
//! | [`Action::Revoke`]: the local deadline passed: the claim admits nobody more, every request inside that yields is stopped (its inner future dropped), a blocked one stays until it is done (and answers 503) | `Inner::revoke_expired`, `Claim::revoke` |
//! | [`Action::SessionLost`]: the background session breaks: queued raises and the renewal in flight (sent or not, answered or not) are lost; the rows stay | `keeper::serve` returning, `keeper::run` |
//! | [`Action::SessionOpen`]: a new session listens again | `keeper::run` (`open_session`) |
//! | [`Action::Tick`]: one unit of time passes on every clock | — |
//!
//! The keeper (renewals, raises heard, idle releases, revocations, sessions)
//! runs on a thread and a runtime of its own (`keeper::Handle::start`), so a
//! blocked request does not stop it; it does one thing at a time, so none of
//! its steps runs while `release_if_idle` is between its two steps. Every one
//! of its steps learns every deadline again (under `unarmed-deadline`, that is
//! how a new claim's deadline becomes known).
//!
//! Not modelled: `Released` notifications (they only wake a waiting raise,
//! and here every request may be retried at any time anyway: the drain bound
//! and its 503 are liveness, not safety); a renewal that finds its row busy
//! (it changes nothing; a renewal never answered before its session drops
//! covers what the claim sees); the sweep of expired rows (an expired row
//! acts in every step as no row: no renewal revives it, no grant waits for
//! it).
//!
//! # What each step merges, and why that is sound
//!
//! Entering is "count in, then look at the state"; every transition out of
//! `Valid` is "change the state, then look at the count" (`claims/cell.rs`).
//! The model splits where an interleaving changes an outcome, and merges
//! where it cannot:
//!
//! - a request's count-in and its look are two steps ([`Action::Enter`],
//!   [`Action::Look`]), and so are `release_if_idle`'s change of state and
//!   its look at the count ([`Action::ReleaseIdle`],
//!   [`Action::ReleaseIdleLook`]): the release race lives between them;
//! - a request that looks and does not get in counts out, then looks at the
//!   state, in its look's step; overtaking and revoking change the state and
//!   look at the count in one step. No state but the mutant's ever goes back
//!   to `Valid`, and whichever of the two sides looks second sees the other:
//!   any order of their parts ends with one release started, by one side or
//!   the other, which the merged steps reach too;
//! - `release_if_idle`'s first look (nobody counted in) and its change to
//!   `Releasing` are one step. The model requires this of the code: a request
//!   admitted between them would be inside a `Releasing` claim, which a new
//!   grant of the same token replaces in the map, and nobody guards it any
//!   more (mutant `idle-window`). The idle check's other condition, nobody
//!   entered since the last tick (`touched`), is left out: the idle release
//!   may run at any time, more behaviours than the code has;
//! - a grant's reply installs the claim and the claiming request enters in
//!   one step. A new claim is `touched`, so no idle release takes it before
//!   that entry; an extended one could be made `Releasing` between install's
//!   look at its state and the extension, which `ClaimCell::extend` handles
//!   by releasing the new grant's row too: not modelled (a claim stuck
//!   `Releasing` would only keep its row, liveness);
//! - a request counted in on a claim that is `Overtaken`, `Lost`, or
//!   `Releasing` once `release_if_idle` is done with it, or `Valid` past its
//!   deadline, only counts out again at its look, which at most delays the
//!   release: such count-ins are not modelled (the release is delayed at will
//!   anyway).
//!
//! # Time and clocks
//!
//! Time is discrete and kept relative: each row holds the time left before it
//! expires, each local claim the time left before its deadline, each message
//! in flight its age since it was sent. So time can pass for ever while the
//! state space stays finite (no bound on time; the bound is on the number of
//! steps, [`Action::Tick`] included).
//!
//! A claim's row expires [`TERM`] after the database writes it, which is at or
//! after the moment the replica sent the grant or renewal. The replica's
//! deadline is `sent + TERM − MARGIN` on its own clock; its clock may run
//! slow against the database's by up to [`DRIFT`] (< [`MARGIN`]) over that
//! interval, so on the database's clock the deadline falls at
//! `sent + TERM − MARGIN + DRIFT`. Only that worst case is modelled: a clock
//! that runs fast stops its requests sooner, which the model already covers
//! (requests may leave, and an idle claim be released, at any time).
//!
//! Slow messages: a claim's or a renewal's database step may come any number
//! of ticks after its send, and its reply any number after that; the deadline
//! a reply sets always counts from the send (the message's age), so a reply
//! may set a deadline already past. A renewal may even extend a row after the
//! deadline it sets has passed (a `sometimes` property): the row then
//! outlives a claim its replica has revoked, which only delays a raise.
//!
//! Within one instant, events happen in any order; a deadline reached must be
//! acted on before time moves on by a keeper that knows it and can run. The
//! code has a second stop the model does not need: each request checks its
//! claim's deadline itself, so a keeper that is late or stuck is not a
//! residual there. What the model assumes is the residual the code states:
//! **no process is stopped for longer than `term − margin` after the last
//! renewal it sent** (nobody can stop a process that is not running), and a
//! handler that never yields answers 503 but may have written meanwhile.
//! Blocked application workers are not such a stop: the keeper runs on a
//! thread of its own (`Block`).
//! A keeper that does not know a deadline (`unarmed-deadline`) or cannot run
//! (`keeper-on-workers`) lets time move on past it.
//!
//! # Assumptions and bounds
//!
//! - clocks drift by less than the margin over a term; no process or keeper
//!   stopped for longer than `term − margin` after its last renewal (above);
//! - one key (keys are independent: every statement and message names one);
//! - tokens 1 to 3 (1 to 2 in `two_replicas_two_tokens` and under every
//!   mutant, which needs no more); at most [`MAX_INSIDE`] request per claim
//!   at once (counted in, inside or blocked), at most one blocked request per
//!   replica, one claim in flight per replica (requests with the same token
//!   that find no valid claim wait for it in the code too: `Claiming`);
//! - grant ids are reused once nothing (row, claim, message) names them any
//!   more, which keeps them finite without changing any comparison;
//! - a release's delete and the replica's `forget` that follows it are one
//!   step; a claim replaced in the map with nobody in it is dropped (the code
//!   drops its `Arc`; an old renewal's reply could still revoke it, which only
//!   deletes that grant's row); a claim replaced in the map is renewed and
//!   revoked by nobody, as in the code (the keeper looks at the map);
//! - a refused claim's reply is taken in by the transaction's step: a later
//!   reply would only keep the replica less informed for longer, as a
//!   delayed notification does; a request that goes away before its grant's
//!   reply is not modelled (its row only blocks raises until it expires);
//! - renewals may be sent at any time, and replies take any time (the code
//!   renews every `renew_every` and gives up on a reply after
//!   `renew_timeout`): more behaviours than the code has, never fewer.
//!
//! # Mutants
//!
//! `CLAIMS_MUTANT` breaks the protocol; the test then passes only if the
//! checker finds a state that breaks invariant 2 (tokens 1 and 2, up to
//! [`MUTANT_STEPS`] steps, one thread: breadth first), and prints the
//! shortest path to it. The length of that path, with 2 replicas and 3:
//!
//! - `no-cancel` (9 steps, 9 with 3 replicas): a replica that cannot renew
//!   does not stop its requests at its local deadline (no [`Action::Revoke`]);
//! - `session-frees-claims` (7, 7): the database drops a replica's claim rows
//!   when its session is lost (a claim held by a connection, which the design
//!   forbids);
//! - `drift-at-margin` (9, 9): the clocks may drift by as much as the margin
//!   (the assumption the proof needs, shown to be needed);
//! - `revert-releasing` (14; 2 replicas only): `release_if_idle` turns
//!   `Releasing` back into `Valid` when its look finds someone counted in,
//!   as the code did: that someone may have been a request that saw
//!   `Releasing`, left, and started the release, so the next request is
//!   admitted under a claim whose row is deleted, and a raise elsewhere is
//!   granted beside it;
//! - `unarmed-deadline` (9, 9): a grant's reply installs a claim without
//!   waking the keeper, which learns the deadline only at its next step
//!   (renewal sent or answered, raise heard, session opened, idle check), as
//!   the code did (the keeper re-read deadlines only on its tick, an event or
//!   a reconnection): the deadline passes with nobody acting on it;
//! - `keeper-on-workers` (10, 10): the keeper runs on the application's
//!   workers, as it did: while one of a replica's requests blocks its thread,
//!   the replica's keeper takes no step, and time moves on past the
//!   deadline; the blocked request's claim is never revoked, so it may answer
//!   success beside a higher token (and requests that yield are not stopped
//!   either);
//! - `idle-window` (12; 2 replicas only): `release_if_idle` looks at the
//!   count, then changes the state, in two atomic operations (as
//!   `ClaimCell::release_if_idle` did when this mutant was written), without
//!   `revert-releasing`'s going back: a request admitted between them is
//!   inside a `Releasing` claim. A request of the same token finds that
//!   claim not admitting and claims again; its grant takes over the row and
//!   its claim replaces the old one in the map, out of which nobody renews,
//!   overtakes or revokes the old one any more. The new claim is overtaken
//!   and released, and a higher token is admitted beside the request still
//!   inside the old one (one replica is enough).
//!
//! `revert-releasing` and `idle-window` run with 2 replicas only: their
//! counterexamples are the longest, and the search of 3 replicas to their
//! depth does not fit in CI (to 12 steps for `idle-window`: 43 million
//! states, 9.7 million unique, 5 GB, 47 s of CPU; `revert-releasing` needs
//! two steps more, each a factor of two to three).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

/// How long a row lasts after the database writes it, in time units.
const TERM: u8 = 3;
/// How long before `TERM` (counted from the send) a replica stops its requests.
const MARGIN: u8 = 2;
/// How far a replica's deadline may drift, on the database's clock, from
/// `sent + TERM − MARGIN` (strictly less than `MARGIN`).
const DRIFT: u8 = MARGIN - 1;
/// The highest token of the unmutated checks.
const TOKENS: u8 = 3;
/// The highest token under a mutant (every mutant needs two).
const MUTANT_TOKENS: u8 = 2;
/// Requests under one claim at once, at most (counted in, inside or blocked).
const MAX_INSIDE: u8 = 1;
/// Grant ids per replica in use at once, at most (the model panics if it needs more).
const GRANTS: u8 = 6;

/// How far the search goes under a mutant: each one is caught in fewer steps
/// (the search stops at the first state that breaks invariant 2).
const MUTANT_STEPS: usize = 16;

/// How many properties [`Claims::properties`] lists.
const PROPERTIES: usize = 8;

/// The property every reachable state must have.
const INVARIANT_2: &str = "invariant 2: no request that may still succeed runs beside a higher token";

/// A way to break the protocol that the checker must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutant {
    /// No revoke at the local deadline.
    NoCancel,
    /// The database deletes a replica's rows when its session is lost.
    SessionFreesClaims,
    /// The clocks drift by as much as the margin.
    DriftAtMargin,
    /// `release_if_idle` turns `Releasing` back into `Valid` when it finds someone counted in.
    RevertReleasing,
    /// `release_if_idle` looks at the count, then makes the claim `Releasing`
    /// in a separate step: a request admitted in between is inside a
    /// `Releasing` claim, which a new grant of the same token replaces.
    IdleWindow,
    /// The keeper learns a new claim's deadline only when it next wakes for something else.
    UnarmedDeadline,
    /// The keeper runs on the application's workers: a blocked worker stalls it.
    KeeperOnWorkers,
}

impl Mutant {
    fn from_env() -> Option<Self> {
        let name = std::env::var("CLAIMS_MUTANT").ok().filter(|name| !name.is_empty())?;
        Some(match name.as_str() {
            "no-cancel" => Self::NoCancel,
            "session-frees-claims" => Self::SessionFreesClaims,
            "drift-at-margin" => Self::DriftAtMargin,
            "revert-releasing" => Self::RevertReleasing,
            "idle-window" => Self::IdleWindow,
            "unarmed-deadline" => Self::UnarmedDeadline,
            "keeper-on-workers" => Self::KeeperOnWorkers,
            other => panic!("unknown CLAIMS_MUTANT {other:?}"),
        })
    }
}

/// The model: how many replicas, the highest token, and which mutant (if any).
#[derive(Clone, Debug)]
struct Claims {
    replicas: usize,
    tokens: u8,
    mutant: Option<Mutant>,
    /// Which properties were found already, by index (see [`Claims::first`]).
    found: Arc<Vec<AtomicBool>>,
}

impl Claims {
    fn new(replicas: usize, tokens: u8, mutant: Option<Mutant>) -> Self {
        let found = Arc::new((0..PROPERTIES).map(|_| AtomicBool::new(false)).collect());
        Self { replicas, tokens, mutant, found }
    }

    /// True the first time `found` is true for property `index`, then false:
    /// stateright keeps the path to the *last* state found for a property,
    /// and the first one found (breadth first) is a shortest one.
    fn first(&self, index: usize, found: impl FnOnce() -> bool) -> bool {
        !self.found[index].load(Ordering::Relaxed)
            && found()
            && !self.found[index].swap(true, Ordering::Relaxed)
    }

    fn drift(&self) -> u8 {
        if self.mutant == Some(Mutant::DriftAtMargin) { MARGIN } else { DRIFT }
    }

    /// Ages past this make every deadline counted from the send already past.
    fn age_cap(&self) -> u8 {
        TERM - MARGIN + self.drift()
    }

    /// Time left before a deadline set by a grant or renewal sent `age` ago,
    /// with the clock's drift `drift` over that interval.
    fn deadline_in(&self, age: u8, drift: i8) -> u8 {
        let left = i16::from(TERM - MARGIN) + i16::from(drift) - i16::from(age);
        u8::try_from(left.max(0)).expect("small")
    }

    fn drifts(&self) -> impl Iterator<Item = i8> {
        let drift = i8::try_from(self.drift()).expect("small");
        std::iter::once(drift)
    }

    /// The replica's keeper cannot run: under `keeper-on-workers`, one of its
    /// requests blocks a worker thread the keeper needs.
    fn stalled(&self, r: &Replica) -> bool {
        self.mutant == Some(Mutant::KeeperOnWorkers) && r.claims().any(|(_, claim)| claim.blocked > 0)
    }

    /// The replica's keeper can take a step: not stalled, and not inside
    /// `release_if_idle` (between its two steps; a task does one thing at a time).
    fn keeper_free(&self, r: &Replica) -> bool {
        !self.stalled(r) && !r.claims().any(|(_, claim)| claim.checking)
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum ClaimState {
    Valid,
    Overtaken,
    Releasing,
    Lost,
}

/// A claim as a replica holds it (`claims/claim.rs`, `claims/cell.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct LocalClaim {
    token: u8,
    grant: u8,
    state: ClaimState,
    /// Time left before the local deadline, on the database's clock.
    deadline_in: u8,
    /// Requests admitted that yield: a revocation drops them.
    inside: u8,
    /// Requests admitted whose handler blocks its worker thread: a
    /// revocation cannot drop them; they leave when they are done, and then
    /// answer 503 if the claim was lost meanwhile.
    blocked: u8,
    /// Requests counted in that have not looked at the state yet
    /// (`try_enter` between its two steps).
    entering: u8,
    /// The release was started (once per claim).
    releasing: bool,
    /// `release_if_idle` made it `Releasing` and has not looked at the count yet.
    checking: bool,
    /// The keeper knows its deadline (always, but under `unarmed-deadline`).
    armed: bool,
}

/// A claim row in the database.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    token: u8,
    grant: u8,
    /// Time left before it expires; 0: expired.
    expires_in: u8,
}

/// A claim in flight.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    token: u8,
    grant: u8,
    /// Time since it was sent (capped).
    age: u8,
    /// The transaction ran and granted it; the reply is on its way. (A
    /// refusal, `Stale` or `Wait`, is taken in by the transaction's step.)
    granted: bool,
}

/// A renewal in flight on the session.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Renewal {
    grant: u8,
    /// Time since it was sent (capped): the deadline its reply sets counts from the send.
    age: u8,
    /// Once run: `Some(higher)` if the row was extended (`higher`: the key's
    /// mark if above the claim's token, else 0), `None` if it was gone or expired.
    reply: Option<Option<u8>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Replica {
    /// The claim in the map.
    claim: Option<LocalClaim>,
    /// Claims replaced in the map (or forgotten) while requests were still in them.
    orphans: Vec<LocalClaim>,
    /// The highest mark heard of.
    known: u8,
    pending: Option<Pending>,
    session: bool,
    renewal: Option<Renewal>,
    /// Raises announced on the session, not yet heard (in order).
    raises: Vec<u8>,
    /// Grants whose release is in flight.
    releases: Vec<u8>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    mark: u8,
    rows: Vec<Option<Row>>,
    replicas: Vec<Replica>,
}

/// Which claim of a replica: the one in the map, or a replaced one.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Which {
    Current,
    Orphan(usize),
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    Request { replica: usize, token: u8 },
    Enter { replica: usize },
    Look { replica: usize, which: Which },
    ClaimAtDb { replica: usize },
    ClaimReply { replica: usize, drift: i8 },
    Block { replica: usize },
    Leave { replica: usize, which: Which, blocked: bool },
    ReleaseIdle { replica: usize },
    ReleaseIdleLook { replica: usize, which: Which },
    ReleaseAtDb { replica: usize, grant: u8 },
    ReleaseFails { replica: usize, grant: u8 },
    RenewSend { replica: usize },
    RenewAtDb { replica: usize },
    RenewReply { replica: usize, drift: i8 },
    Notify { replica: usize },
    Revoke { replica: usize },
    SessionLost { replica: usize },
    SessionOpen { replica: usize },
    Tick,
}

impl Action {
    /// The replica the action is on (none for `Tick`).
    fn replica_mut(&mut self) -> Option<&mut usize> {
        match self {
            Action::Request { replica, .. }
            | Action::Enter { replica }
            | Action::Look { replica, .. }
            | Action::ClaimAtDb { replica }
            | Action::ClaimReply { replica, .. }
            | Action::Block { replica }
            | Action::Leave { replica, .. }
            | Action::ReleaseIdle { replica }
            | Action::ReleaseIdleLook { replica, .. }
            | Action::ReleaseAtDb { replica, .. }
            | Action::ReleaseFails { replica, .. }
            | Action::RenewSend { replica }
            | Action::RenewAtDb { replica }
            | Action::RenewReply { replica, .. }
            | Action::Notify { replica }
            | Action::Revoke { replica }
            | Action::SessionLost { replica }
            | Action::SessionOpen { replica } => Some(replica),
            Action::Tick => None,
        }
    }
}

impl LocalClaim {
    /// The claim's `inside` count in the code: everyone counted in.
    fn count(&self) -> u8 {
        self.inside + self.blocked + self.entering
    }

    /// Requests admitted (past their look) and not yet gone.
    fn admitted(&self) -> u8 {
        self.inside + self.blocked
    }

    /// `ClaimCell::start_release`: hands the grant to the store for its row to be deleted, once.
    fn release(&mut self, releases: &mut Vec<u8>) {
        if !self.releasing {
            self.releasing = true;
            releases.push(self.grant);
        }
    }

    /// `ClaimCell::leave` once the count went down: the last one out of a
    /// claim that no longer admits starts its release.
    fn left(&mut self, releases: &mut Vec<u8>) {
        if self.count() == 0 && self.state != ClaimState::Valid {
            self.release(releases);
        }
    }

    /// `ClaimCell::overtake`.
    fn overtake(&mut self, releases: &mut Vec<u8>) {
        if self.state == ClaimState::Valid {
            self.state = ClaimState::Overtaken;
            if self.count() == 0 {
                self.release(releases);
            }
        }
    }

    /// `Claim::revoke`: the requests that yield are stopped (dropped); a
    /// blocked one stays until it is done, and a counted-in one leaves at its look.
    fn revoke(&mut self, releases: &mut Vec<u8>) {
        self.state = ClaimState::Lost;
        self.inside = 0;
        if self.count() == 0 {
            self.release(releases);
        }
    }

    /// `State::may_have_inside`: renewed, and revoked at its deadline.
    fn watched(&self) -> bool {
        matches!(self.state, ClaimState::Valid | ClaimState::Overtaken | ClaimState::Releasing)
    }
}

impl Replica {
    /// `Inner::raised`: note the mark, overtake a lower claim.
    fn raised(&mut self, mark: u8) {
        self.known = self.known.max(mark);
        if let Some(claim) = self.claim.as_mut().filter(|claim| claim.token < mark) {
            claim.overtake(&mut self.releases);
        }
    }

    /// The keeper woke: it knows every deadline again (only `unarmed-deadline` ever unarms one).
    fn arm(&mut self) {
        if let Some(claim) = self.claim.as_mut() {
            claim.armed = true;
        }
    }

    /// A grant id nothing names any more.
    fn fresh_grant(&self, row: Option<Row>) -> u8 {
        let used = |grant: u8| {
            row.is_some_and(|row| row.grant == grant)
                || self.claims().any(|(_, claim)| claim.grant == grant)
                || self.pending.is_some_and(|pending| pending.grant == grant)
                || self.renewal.is_some_and(|renewal| renewal.grant == grant)
                || self.releases.contains(&grant)
        };
        (1..=GRANTS).find(|&grant| !used(grant)).expect("more grant ids in use than GRANTS")
    }

    /// Every claim object of the replica: the one in the map, then the replaced ones.
    fn claims(&self) -> impl Iterator<Item = (Which, &LocalClaim)> {
        let current = self.claim.iter().map(|claim| (Which::Current, claim));
        current.chain(self.orphans.iter().enumerate().map(|(index, claim)| (Which::Orphan(index), claim)))
    }

    fn claim_mut(&mut self, which: Which) -> &mut LocalClaim {
        match which {
            Which::Current => self.claim.as_mut().expect("a current claim"),
            Which::Orphan(index) => &mut self.orphans[index],
        }
    }

    /// Runs `change` on one claim with the replica's releases at hand, then tidies.
    fn with_claim(&mut self, which: Which, change: impl FnOnce(&mut LocalClaim, &mut Vec<u8>)) {
        let mut releases = std::mem::take(&mut self.releases);
        change(self.claim_mut(which), &mut releases);
        self.releases = releases;
        self.tidy();
    }

    /// The claim object a message about `grant` refers to.
    fn by_grant(&mut self, grant: u8) -> Option<&mut LocalClaim> {
        self.claim.iter_mut().chain(self.orphans.iter_mut()).find(|claim| claim.grant == grant)
    }

    /// Drops replaced claims that nobody is in any more (`release_if_idle`'s
    /// look at one would find nobody, and start a release that deletes
    /// nothing: its row is gone already, or is a newer grant's).
    fn tidy(&mut self) {
        self.orphans.retain(|claim| claim.count() > 0);
    }

    /// Clears what no step reads any more, so that states which differ only
    /// there are one state: the deadline of a lost claim, and of a claim
    /// replaced in the map (nobody revokes it at its deadline, and nobody is
    /// admitted under it: it is not `Valid`, unless `revert-releasing`'s look
    /// makes it so), the age of a renewal that found its row gone, whether the
    /// keeper knows the deadline of a claim it never revokes.
    fn forget_what_no_step_reads(&mut self) {
        if let Some(claim) = self.claim.as_mut().filter(|claim| claim.state == ClaimState::Lost) {
            claim.deadline_in = 0;
            claim.armed = true;
        }
        for claim in &mut self.orphans {
            claim.armed = true;
            if !claim.checking {
                claim.deadline_in = 0;
            }
        }
        if let Some(renewal) = self.renewal.as_mut().filter(|r| r.reply == Some(None)) {
            renewal.age = 0;
        }
    }

    /// Renames grant ids 1, 2, ... in the order they are first named (row,
    /// claim, replaced claims, claim in flight, renewal, releases): only
    /// which ids are equal matters, so states that differ only in the names
    /// are one state.
    fn rename_grants(&mut self, row: &mut Option<Row>) {
        self.forget_what_no_step_reads();
        let mut names = [0u8; GRANTS as usize];
        let mut named = 0;
        let mut rename = |grant: &mut u8| {
            let index = names[..named].iter().position(|&name| name == *grant).unwrap_or_else(|| {
                names[named] = *grant;
                named += 1;
                named - 1
            });
            *grant = u8::try_from(index + 1).expect("small");
        };
        if let Some(row) = row.as_mut() {
            rename(&mut row.grant);
        }
        for claim in self.claim.iter_mut().chain(self.orphans.iter_mut()) {
            rename(&mut claim.grant);
        }
        if let Some(pending) = self.pending.as_mut() {
            rename(&mut pending.grant);
        }
        if let Some(renewal) = self.renewal.as_mut() {
            rename(&mut renewal.grant);
        }
        self.releases.iter_mut().for_each(rename);
        self.releases.sort_unstable();
    }
}

impl State {
    /// Every claim object with requests admitted under it: (token, lost).
    fn admitted(&self) -> impl Iterator<Item = (u8, bool)> + '_ {
        self.replicas
            .iter()
            .flat_map(|replica| replica.claim.iter().chain(replica.orphans.iter()))
            .filter(|claim| claim.admitted() > 0)
            .map(|claim| (claim.token, claim.state == ClaimState::Lost))
    }

    /// Invariant 2: every request admitted whose claim is not lost (it may
    /// still answer success) has the highest token admitted anywhere.
    fn invariant_2(&self) -> bool {
        let Some(top) = self.admitted().map(|(token, _)| token).max() else { return true };
        self.admitted().all(|(token, lost)| lost || token == top)
    }

    /// Sorts the replicas (each with its row): replicas are interchangeable,
    /// so states that differ only in their order are one state (symmetry
    /// reduction). Returns the sorted state and, for each position, where
    /// its replica was.
    fn sorted(mut self) -> (State, Vec<usize>) {
        // Insertion sort by swaps: two or three replicas, most often in order already.
        let mut order: Vec<usize> = (0..self.replicas.len()).collect();
        for end in 1..self.replicas.len() {
            let mut at = end;
            while at > 0
                && (&self.replicas[at - 1], &self.rows[at - 1]) > (&self.replicas[at], &self.rows[at])
            {
                self.replicas.swap(at - 1, at);
                self.rows.swap(at - 1, at);
                order.swap(at - 1, at);
                at -= 1;
            }
        }
        (self, order)
    }
}

/// Whether a request with `token` claims through the database (overtaking
/// a lower claim first): `try_admit`, then `look`, found no claim with its
/// token that admits, and nothing that refuses it in memory (409); and no
/// claim is in flight on this replica already.
fn asks(r: &Replica, token: u8) -> bool {
    if r.pending.is_some() || r.known > token {
        return false;
    }
    match r.claim.as_ref() {
        Some(claim) if claim.token > token => false,
        Some(claim) if claim.token == token => match claim.state {
            ClaimState::Valid => claim.deadline_in == 0,
            ClaimState::Overtaken => false,
            ClaimState::Releasing | ClaimState::Lost => true,
        },
        _ => true,
    }
}

/// Whether a request with the claim's token counts in ([`Action::Enter`]),
/// where that can change anything: the claim is valid (and before its
/// deadline), or `release_if_idle` is between its two steps on it. A request
/// counted in on any other claim only leaves again at its look, which at
/// most delays the release the model already delays at will.
fn enters(claim: &LocalClaim) -> bool {
    claim.count() < MAX_INSIDE
        && match claim.state {
            ClaimState::Valid => claim.deadline_in > 0,
            ClaimState::Releasing => claim.checking,
            ClaimState::Overtaken | ClaimState::Lost => false,
        }
}

impl Claims {
    /// One step, the replicas left in their order.
    fn step(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::Request { replica, token } => {
                let row = s.rows[replica];
                let r = &mut s.replicas[replica];
                // `look`: a lower claim takes nobody more from now on.
                if let Some(claim) = r.claim.as_mut().filter(|claim| claim.token < token) {
                    claim.overtake(&mut r.releases);
                }
                let grant = r.fresh_grant(row);
                r.pending = Some(Pending { token, grant, age: 0, granted: false });
            }
            Action::Enter { replica } => {
                s.replicas[replica].claim.as_mut().expect("checked").entering += 1;
            }
            Action::Look { replica, which } => {
                s.replicas[replica].with_claim(which, |claim, releases| {
                    claim.entering -= 1;
                    if claim.state == ClaimState::Valid && claim.deadline_in > 0 {
                        claim.inside += 1;
                    } else {
                        claim.left(releases);
                    }
                });
            }
            Action::ClaimAtDb { replica } => {
                let pending = s.replicas[replica].pending.expect("checked");
                let token = pending.token;
                if s.mark < token {
                    s.mark = token;
                    for r in s.replicas.iter_mut().filter(|r| r.session) {
                        r.raises.push(token);
                    }
                }
                for row in &mut s.rows {
                    if row.is_some_and(|row| row.token < token && row.expires_in == 0) {
                        *row = None;
                    }
                }
                let lower_live = s.rows.iter().flatten().any(|row| row.token < token);
                let r = &mut s.replicas[replica];
                if s.mark > token {
                    // Stale: the reply only notes the mark (its delay only keeps
                    // this replica less informed, as a delayed notification does).
                    r.pending = None;
                    r.raised(s.mark);
                } else if !lower_live {
                    s.rows[replica] = Some(Row { token, grant: pending.grant, expires_in: TERM });
                    r.pending = Some(Pending { granted: true, ..pending });
                } else {
                    // Wait: the request waits and claims again later (here: a later `Request`).
                    r.pending = None;
                    r.raised(token);
                }
            }
            Action::ClaimReply { replica, drift } => {
                let r = &mut s.replicas[replica];
                let pending = r.pending.take().expect("checked");
                let token = pending.token;
                r.known = r.known.max(token);
                let deadline_in = self.deadline_in(pending.age, drift);
                // `Inner::install`; the keeper is woken at once (`rearm`), but
                // under `unarmed-deadline`.
                match r.claim.as_mut() {
                    Some(claim) if claim.token == token && claim.state == ClaimState::Valid => {
                        claim.grant = pending.grant;
                        claim.deadline_in = claim.deadline_in.max(deadline_in);
                    }
                    _ => {
                        if let Some(old) = r.claim.take() {
                            r.orphans.push(old);
                        }
                        r.claim = Some(LocalClaim {
                            token,
                            grant: pending.grant,
                            state: ClaimState::Valid,
                            deadline_in,
                            inside: 0,
                            blocked: 0,
                            entering: 0,
                            releasing: false,
                            checking: false,
                            armed: self.mutant != Some(Mutant::UnarmedDeadline),
                        });
                    }
                }
                // The claiming request's `try_enter` (see the module docs).
                let claim = r.claim.as_mut().expect("installed");
                if claim.state == ClaimState::Valid && claim.deadline_in > 0 && claim.count() < MAX_INSIDE {
                    claim.inside += 1;
                }
                r.tidy();
            }
            Action::Block { replica } => {
                let claim = s.replicas[replica].claim.as_mut().expect("checked");
                claim.inside -= 1;
                claim.blocked += 1;
            }
            Action::Leave { replica, which, blocked } => {
                s.replicas[replica].with_claim(which, |claim, releases| {
                    if blocked {
                        claim.blocked -= 1;
                    } else {
                        claim.inside -= 1;
                    }
                    claim.left(releases);
                });
            }
            Action::ReleaseIdle { replica } => {
                let r = &mut s.replicas[replica];
                r.arm();
                let claim = r.claim.as_mut().expect("checked");
                claim.state = ClaimState::Releasing;
                claim.checking = true;
            }
            Action::ReleaseIdleLook { replica, which } => {
                let revert = self.mutant == Some(Mutant::RevertReleasing);
                s.replicas[replica].with_claim(which, |claim, releases| {
                    claim.checking = false;
                    if claim.count() == 0 {
                        claim.release(releases);
                    } else if revert {
                        // "Someone entered between the two looks: keep the claim."
                        claim.state = ClaimState::Valid;
                    }
                    // Else it stays `Releasing`: the last one out releases it.
                });
            }
            Action::ReleaseAtDb { replica, grant } | Action::ReleaseFails { replica, grant } => {
                if matches!(action, Action::ReleaseAtDb { .. })
                    && s.rows[replica].is_some_and(|row| row.grant == grant)
                {
                    s.rows[replica] = None;
                }
                let r = &mut s.replicas[replica];
                let index = r.releases.iter().position(|&g| g == grant).expect("checked");
                r.releases.remove(index);
                // `Inner::forget`.
                if r.claim
                    .as_ref()
                    .is_some_and(|claim| claim.grant == grant && claim.state != ClaimState::Valid)
                {
                    let old = r.claim.take().expect("checked");
                    r.orphans.push(old);
                    r.tidy();
                }
            }
            Action::RenewSend { replica } => {
                let r = &mut s.replicas[replica];
                r.arm();
                let grant = r.claim.as_ref().expect("checked").grant;
                r.renewal = Some(Renewal { grant, age: 0, reply: None });
            }
            Action::RenewAtDb { replica } => {
                let renewal = s.replicas[replica].renewal.expect("checked");
                let row =
                    s.rows[replica].as_mut().filter(|row| row.grant == renewal.grant && row.expires_in > 0);
                let reply = row.map(|row| {
                    row.expires_in = TERM;
                    if s.mark > row.token { s.mark } else { 0 }
                });
                s.replicas[replica].renewal = Some(Renewal { reply: Some(reply), ..renewal });
            }
            Action::RenewReply { replica, drift } => {
                let r = &mut s.replicas[replica];
                r.arm();
                let renewal = r.renewal.take().expect("checked");
                match renewal.reply.expect("checked") {
                    Some(higher) => {
                        if higher > 0 {
                            r.raised(higher);
                        }
                        let deadline_in = self.deadline_in(renewal.age, drift);
                        if let Some(claim) = r.by_grant(renewal.grant) {
                            claim.deadline_in = claim.deadline_in.max(deadline_in);
                        }
                    }
                    None => {
                        let mut releases = std::mem::take(&mut r.releases);
                        if let Some(claim) = r.by_grant(renewal.grant).filter(|claim| claim.watched()) {
                            claim.revoke(&mut releases);
                        }
                        r.releases = releases;
                        r.tidy();
                    }
                }
            }
            Action::Notify { replica } => {
                let r = &mut s.replicas[replica];
                r.arm();
                let mark = r.raises.remove(0);
                r.raised(mark);
            }
            Action::Revoke { replica } => {
                s.replicas[replica].with_claim(Which::Current, LocalClaim::revoke);
            }
            Action::SessionLost { replica } => {
                let r = &mut s.replicas[replica];
                r.session = false;
                r.raises.clear();
                r.renewal = None;
                if self.mutant == Some(Mutant::SessionFreesClaims) {
                    s.rows[replica] = None;
                }
            }
            Action::SessionOpen { replica } => {
                let r = &mut s.replicas[replica];
                r.arm();
                r.session = true;
            }
            Action::Tick => {
                for row in s.rows.iter_mut().flatten() {
                    row.expires_in = row.expires_in.saturating_sub(1);
                }
                let cap = self.age_cap();
                for r in &mut s.replicas {
                    if let Some(claim) = r.claim.as_mut() {
                        claim.deadline_in = claim.deadline_in.saturating_sub(1);
                    }
                    if let Some(pending) = r.pending.as_mut() {
                        pending.age = (pending.age + 1).min(cap);
                    }
                    if let Some(renewal) = r.renewal.as_mut() {
                        renewal.age = (renewal.age + 1).min(cap);
                    }
                }
            }
        }
        for (r, row) in s.replicas.iter_mut().zip(s.rows.iter_mut()) {
            r.rename_grants(row);
        }
        Some(s)
    }

    /// A path found by the checker, with each replica named as in the initial
    /// state (the checker sorts the replicas after every step).
    fn unsorted(&self, path: &Path<State, Action>) -> (Vec<Action>, State) {
        let steps = path.clone().into_vec();
        // For each position in the sorted state, which replica is there.
        let mut names: Vec<usize> = (0..self.replicas).collect();
        let mut actions = Vec::new();
        for (state, action) in &steps {
            let Some(action) = *action else { break };
            let mut named = action;
            if let Some(replica) = named.replica_mut() {
                *replica = names[*replica];
            }
            actions.push(named);
            let (_, order) = self.step(state, action).expect("a step of the path").sorted();
            names = order.iter().map(|&from| names[from]).collect();
        }
        let last = path.last_state().clone();
        let mut state = last.clone();
        for (position, &name) in names.iter().enumerate() {
            state.rows[name] = last.rows[position];
            state.replicas[name] = last.replicas[position].clone();
        }
        // The path as printed is a path of the model: replayed without sorting, it ends there.
        let mut replayed = self.init_states().remove(0);
        for &action in &actions {
            let mut enabled = Vec::new();
            self.actions(&replayed, &mut enabled);
            assert!(enabled.contains(&action), "{action:?} is not enabled in {replayed:?}");
            replayed = self.step(&replayed, action).expect("a step");
        }
        assert_eq!(replayed, state, "the path replayed");
        (actions, state)
    }
}

impl Model for Claims {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let replica = Replica {
            claim: None,
            orphans: Vec::new(),
            known: 0,
            pending: None,
            session: true,
            renewal: None,
            raises: Vec::new(),
            releases: Vec::new(),
        };
        vec![State { mark: 0, rows: vec![None; self.replicas], replicas: vec![replica; self.replicas] }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let mut tick = true;
        for (replica, r) in state.replicas.iter().enumerate() {
            let stalled = self.stalled(r);
            let keeper = self.keeper_free(r);
            for token in 1..=self.tokens {
                if asks(r, token) {
                    actions.push(Action::Request { replica, token });
                }
            }
            if r.claim.as_ref().is_some_and(enters) {
                actions.push(Action::Enter { replica });
            }
            for (which, claim) in r.claims() {
                if claim.entering > 0 {
                    actions.push(Action::Look { replica, which });
                }
                if claim.inside > 0 {
                    actions.push(Action::Leave { replica, which, blocked: false });
                }
                if claim.blocked > 0 {
                    actions.push(Action::Leave { replica, which, blocked: true });
                }
                if claim.checking && !stalled {
                    actions.push(Action::ReleaseIdleLook { replica, which });
                }
            }
            match r.pending {
                Some(Pending { granted: false, .. }) => actions.push(Action::ClaimAtDb { replica }),
                Some(Pending { granted: true, .. }) => {
                    actions.extend(self.drifts().map(|drift| Action::ClaimReply { replica, drift }));
                }
                None => {}
            }
            if r.claim.as_ref().is_some_and(|claim| claim.inside > 0)
                && !r.claims().any(|(_, claim)| claim.blocked > 0)
            {
                actions.push(Action::Block { replica });
            }
            // Nobody counted in; under `idle-window`, nobody at some earlier
            // time (when it looked), which the model does not keep: any time.
            let window = self.mutant == Some(Mutant::IdleWindow);
            if keeper
                && r.claim
                    .as_ref()
                    .is_some_and(|claim| claim.state == ClaimState::Valid && (claim.count() == 0 || window))
            {
                actions.push(Action::ReleaseIdle { replica });
            }
            for &grant in &r.releases {
                actions.push(Action::ReleaseAtDb { replica, grant });
                actions.push(Action::ReleaseFails { replica, grant });
            }
            match r.renewal {
                None if keeper && r.session && r.claim.as_ref().is_some_and(LocalClaim::watched) => {
                    actions.push(Action::RenewSend { replica });
                }
                None => {}
                Some(Renewal { reply: None, .. }) => actions.push(Action::RenewAtDb { replica }),
                Some(Renewal { reply: Some(Some(_)), .. }) if keeper => {
                    actions.extend(self.drifts().map(|drift| Action::RenewReply { replica, drift }));
                }
                Some(Renewal { reply: Some(None), .. }) if keeper => {
                    actions.push(Action::RenewReply { replica, drift: 0 });
                }
                Some(_) => {}
            }
            if keeper && !r.raises.is_empty() {
                actions.push(Action::Notify { replica });
            }
            // A deadline reached must be acted on before time moves on, by a
            // keeper that knows it and can run.
            let due = r
                .claim
                .as_ref()
                .is_some_and(|claim| claim.watched() && claim.deadline_in == 0 && claim.armed);
            if due && self.mutant != Some(Mutant::NoCancel) {
                if keeper {
                    actions.push(Action::Revoke { replica });
                }
                if !stalled {
                    tick = false;
                }
            }
            if r.session {
                actions.push(Action::SessionLost { replica });
            } else if keeper {
                actions.push(Action::SessionOpen { replica });
            }
        }
        if tick {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        Some(self.step(state, action)?.sorted().0)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(INVARIANT_2, |model: &Claims, s: &State| !model.first(0, || !s.invariant_2())),
            // Not vacuous: the interesting states are reached.
            Property::sometimes("requests inside on every replica", |model: &Claims, s: &State| {
                model.first(1, || s.replicas.iter().all(|r| r.claim.as_ref().is_some_and(|c| c.inside > 0)))
            }),
            Property::sometimes(
                "the highest token inside while a replica has not heard of it",
                |model: &Claims, s: &State| {
                    model.first(2, || {
                        s.admitted().any(|(token, _)| token == model.tokens)
                            && s.replicas.iter().any(|r| r.known < model.tokens)
                    })
                },
            ),
            Property::sometimes("a claim overtaken with a request inside", |model: &Claims, s: &State| {
                model.first(3, || {
                    s.replicas.iter().any(|r| {
                        r.claim.as_ref().is_some_and(|c| c.state == ClaimState::Overtaken && c.inside > 0)
                    })
                })
            }),
            Property::sometimes(
                "a claim lost while another replica holds a higher one",
                |model: &Claims, s: &State| {
                    model.first(4, || {
                        s.replicas
                            .iter()
                            .any(|r| r.claim.as_ref().is_some_and(|c| c.state == ClaimState::Lost))
                            && s.admitted().any(|(token, _)| token > 1)
                    })
                },
            ),
            Property::sometimes(
                "a request counted in while release_if_idle is between its steps",
                |model: &Claims, s: &State| {
                    model.first(5, || {
                        s.replicas.iter().any(|r| r.claims().any(|(_, c)| c.checking && c.entering > 0))
                    })
                },
            ),
            Property::sometimes(
                "a blocked request outlives its lost claim beside a higher token",
                |model: &Claims, s: &State| {
                    model.first(6, || {
                        s.replicas.iter().any(|r| {
                            r.claims().any(|(_, c)| {
                                c.state == ClaimState::Lost
                                    && c.blocked > 0
                                    && s.admitted().any(|(token, _)| token > c.token)
                            })
                        })
                    })
                },
            ),
            Property::sometimes(
                "a renewal extends a row after the deadline it sets has passed",
                |model: &Claims, s: &State| {
                    model.first(7, || {
                        s.replicas.iter().any(|r| {
                            r.renewal.is_some_and(|renewal| {
                                matches!(renewal.reply, Some(Some(_))) && renewal.age >= model.age_cap()
                            })
                        })
                    })
                },
            ),
        ]
    }
}

/// Checks the model with `replicas` replicas and tokens 1 to `tokens`:
/// every state reachable in at most `steps` steps, and reports what it saw.
/// Under a mutant: tokens 1 to [`MUTANT_TOKENS`], up to [`MUTANT_STEPS`]
/// steps, one thread. `CLAIMS_TOKENS` and `CLAIMS_STEPS` override both (0
/// steps: every reachable state).
fn check(replicas: usize, tokens: u8, steps: usize) {
    let mutant = Mutant::from_env();
    let (tokens, steps) = if mutant.is_some() { (MUTANT_TOKENS, MUTANT_STEPS) } else { (tokens, steps) };
    let tokens = std::env::var("CLAIMS_TOKENS").ok().and_then(|tokens| tokens.parse().ok()).unwrap_or(tokens);
    let steps = std::env::var("CLAIMS_STEPS").ok().and_then(|steps| steps.parse().ok()).unwrap_or(steps);
    let model = Claims::new(replicas, tokens, mutant);
    let started = Instant::now();
    let mut builder = model.checker();
    if steps > 0 {
        // stateright counts the initial state as depth 1 and checks the
        // states below its target depth only.
        builder = builder.target_max_depth(steps + 2);
    }
    let checker = match mutant {
        // One thread: breadth-first, so the counterexample found is a shortest one.
        Some(_) => builder.finish_when(HasDiscoveries::AnyFailures).spawn_bfs().join(),
        None => {
            builder.threads(std::thread::available_parallelism().map_or(1, usize::from)).spawn_bfs().join()
        }
    };
    let elapsed = started.elapsed();
    println!(
        "claims model, {replicas} replicas, tokens 1 to {tokens}{}{}: {} states ({} unique), max depth {}, {:.1} s",
        mutant.map_or(String::new(), |mutant| format!(", mutant {mutant:?}")),
        if steps > 0 { format!(", paths of up to {steps} steps") } else { String::new() },
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        elapsed.as_secs_f64(),
    );
    match mutant {
        None => {
            if let Some(path) = checker.discovery(INVARIANT_2) {
                let (actions, last) = checker.model().unsorted(&path);
                let steps: Vec<String> = actions.iter().map(|action| format!("  {action:?}")).collect();
                panic!(
                    "invariant 2 broken after {} steps:\n{}\n  last state: {last:?}",
                    steps.len(),
                    steps.join("\n")
                );
            }
            for property in checker.model().properties() {
                if property.name != INVARIANT_2 {
                    let found = checker.discovery(property.name).map(|path| path.into_actions().len());
                    println!(
                        "  example of {:?}: {}",
                        property.name,
                        found.map_or("not within the bound".to_owned(), |steps| format!("{steps} steps"))
                    );
                }
            }
            if replicas == 2 {
                // Not vacuous: every example is reached within the bound.
                checker.assert_properties();
            }
        }
        Some(mutant) => {
            let Some(path) = checker.discovery(INVARIANT_2) else {
                panic!("mutant {mutant:?} MISSED: no state breaks invariant 2");
            };
            let (actions, last) = checker.model().unsorted(&path);
            println!("mutant {mutant:?} caught: counterexample of {} steps", actions.len());
            for action in &actions {
                println!("  {action:?}");
            }
            println!("  last state: {last:?}");
        }
    }
}

// Millions of states: in the release profile only (`.ci/run` runs them so).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: cargo test -p fencing-claims-model --release --test claims_model"
)]
fn two_replicas() {
    check(2, TOKENS, 11);
}

/// Deeper, with two tokens: every mutant's counterexample fits in it.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: cargo test -p fencing-claims-model --release --test claims_model"
)]
fn two_replicas_two_tokens() {
    check(2, 2, 14);
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: cargo test -p fencing-claims-model --release --test claims_model"
)]
fn three_replicas() {
    check(3, TOKENS, 9);
}
