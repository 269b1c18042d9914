//! A model of the replica-claims protocol (`src/claims/`, carried on
//! PostgreSQL by `fencing-postgres/src/claims.rs`), checked by
//! [stateright](https://docs.rs/stateright)'s breadth-first search: every
//! state of 2 and of 3 replicas sharing one key, tokens 1 to 3, reachable in
//! up to 12 steps (2 replicas) or 8 steps (3 replicas), under lost sessions,
//! delayed and lost messages and drifting clocks. The bounds keep each run
//! near 15 s in the release profile on 2 cores; each step more multiplies the
//! states by two to three (14 steps of 2 replicas: 9.9 million states, 79 s;
//! 9 steps of 3: 6.1 million, 67 s). Every mutant below is caught within 9
//! steps.
//!
//! ```sh
//! cargo test -p fencing-claims-model --release --test claims_model -- --nocapture
//! CLAIMS_STEPS=14 cargo test ...   # another bound (0: none; 2 replicas then ran past 3 min and 6 GB)
//! fencing-layer/claims-model/claims-mutants.sh  # each mutant below must be caught
//! ```
//!
//! **Invariant 2**, checked in every state reached: while a request with
//! token `t` is inside on any replica, no request with a higher token is
//! inside anywhere (all tokens inside are equal). `sometimes` properties
//! check that the model is not vacuous: requests inside on every replica at
//! once, token 3 inside while a replica has not heard of it, a claim
//! overtaken with a request inside, a claim lost while a higher token is
//! inside elsewhere (all four reached with 2 replicas; with 3 replicas the
//! first needs 9 steps).
//!
//! # What is modelled, and where it is in the code
//!
//! The database: the key's mark and one claim row per replica
//! (`token`, `grant`, time left before it expires on the database's clock).
//! Each replica: its claim in the map (token, grant, state `Valid` /
//! `Overtaken` / `Releasing` / `Lost`, time left before its local deadline,
//! requests inside, release started), claims replaced in the map that still
//! have requests inside, the highest mark it heard of, its claim in flight,
//! its background session (up or down), its renewal in flight, the raises
//! queued on its session (`NOTIFY`), and its releases in flight.
//!
//! | action | code |
//! |---|---|
//! | [`Action::Request`]: a request arrives; enters a valid claim in memory, or is refused in memory, or overtakes a lower claim and sends a claim | `ClaimStore::try_admit` (`claims/mod.rs`), `admit::look` and `admit::admit` (`claims/admit.rs`), `Claim::try_enter`, `Claim::overtake` (`claims/claim.rs`) |
//! | [`Action::ClaimAtDb`]: the claim transaction, atomic: raise the mark if lower (queue the raise on every session listening), delete expired lower rows, grant if the mark equals the token and no lower row is left. A refusal (`Stale`, `Wait`) is taken in at once: it notes the mark and overtakes a lower claim, and the request may claim again at any later time | `PgClaims::claim` (`fencing-postgres/src/claims.rs`: `raise`, `lock_mark`, `lock_lower`, `drop_expired`, `grant` in one transaction); `admit::admit`, `Inner::raised` |
//! | [`Action::ClaimReply`]: a grant's reply arrives (any time later): the claim is installed (or extended) with its deadline counted from when the claim was *sent*, and the request enters | `admit::admit`, `Inner::install`, `Inner::deadline_from` |
//! | [`Action::Leave`]: a request leaves; the last one out of a claim that no longer admits starts its release | `Entered::drop`, `Claim::leave` |
//! | [`Action::ReleaseIdle`]: a valid claim nobody is inside is released | `Inner::release_idle`, `Claim::release_if_idle` (keeper tick) |
//! | [`Action::ReleaseAtDb`] / [`Action::ReleaseFails`]: the delete of one grant's row runs (or fails: the row expires by itself), then the replica forgets the claim | `Claim::release`, `Inner::release`, `Inner::forget`; `PgClaims::release` |
//! | [`Action::RenewSend`], [`Action::RenewAtDb`], [`Action::RenewReply`]: a renewal is sent on the session; at the database it extends the row only if it is still that grant's and live; the reply notes a higher mark (a missed raise), extends the local deadline from when the renewal was sent, or revokes a claim found gone | `keeper::renew`, `Inner::renewed`, `Claim::renewed`; `Renewer::renew` (`renew` statement) |
//! | [`Action::Notify`]: a raise queued on the session is heard | `keeper::serve` (`ClaimEvent::Raised`), `Inner::raised` |
//! | [`Action::Revoke`]: the local deadline passed: every request inside is stopped (inner futures dropped) and the claim admits nobody more | `keeper::revoke_expired`, `Claim::revoke` |
//! | [`Action::SessionLost`]: the background session breaks: queued raises and the renewal in flight (sent or not, answered or not) are lost; the rows stay | `keeper::serve` returning, `keeper::run` |
//! | [`Action::SessionOpen`]: a new session listens again | `keeper::run` (`open_session`) |
//! | [`Action::Tick`]: one unit of time passes on every clock | — |
//!
//! `Released` notifications are left out: they only wake a waiting raise,
//! and here every request may be retried at any time anyway (the drain bound
//! and its 503 are liveness, not safety).
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
//! Within one instant, events happen in any order; a deadline reached must be
//! acted on before time moves on: this is the assumption that **no process is
//! paused for longer than the term** (the documented residual: nobody can
//! stop a process that is not running).
//!
//! # Assumptions and bounds
//!
//! - clocks drift by less than the margin over a term; no pause longer than
//!   the term (above);
//! - one key (keys are independent: every statement and message names one);
//! - tokens 1 to 3, at most [`MAX_INSIDE`] request inside per claim, one claim
//!   in flight per replica (requests with the same token that find no valid
//!   claim wait for it in the code too: `Claiming`);
//! - grant ids are reused once nothing (row, claim, message) names them any
//!   more, which keeps them finite without changing any comparison;
//! - a release's delete and the replica's `forget` that follows it are one
//!   step; a claim replaced in the map with nobody inside is dropped (the code
//!   drops its `Arc`; an old renewal's reply could still revoke it, which only
//!   deletes that grant's row);
//! - a refused claim's reply is taken in by the transaction's step: a later
//!   reply would only keep the replica less informed for longer, as a
//!   delayed notification does; a request that goes away before its grant's
//!   reply is not modelled (its row only blocks raises until it expires);
//! - renewals may be sent at any time, and replies take any time (the code
//!   renews every `renew_every` and gives up on a reply after that long):
//!   more behaviours than the code has, never fewer.
//!
//! # Mutants
//!
//! `CLAIMS_MUTANT` breaks the protocol; the test then passes only if the
//! checker finds a state that breaks invariant 2, and prints the shortest
//! path to it:
//!
//! - `no-cancel`: a replica that cannot renew does not stop its requests at
//!   its local deadline (no [`Action::Revoke`]);
//! - `session-frees-claims`: the database drops a replica's claim rows when
//!   its session is lost (a claim held by a connection, which the design
//!   forbids);
//! - `drift-at-margin`: the clocks may drift by as much as the margin (the
//!   assumption the proof needs, shown to be needed).

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

/// How long a row lasts after the database writes it, in time units.
const TERM: u8 = 3;
/// How long before `TERM` (counted from the send) a replica stops its requests.
const MARGIN: u8 = 2;
/// How far a replica's deadline may drift, on the database's clock, from
/// `sent + TERM − MARGIN` (strictly less than `MARGIN`).
const DRIFT: u8 = MARGIN - 1;
/// The highest token.
const TOKENS: u8 = 3;
/// Requests inside under one claim, at most.
const MAX_INSIDE: u8 = 1;
/// Grant ids per replica in use at once, at most (the model panics if it needs more).
const GRANTS: u8 = 6;

/// How far the search goes under a mutant: each one is caught in fewer steps.
const MUTANT_STEPS: usize = 10;

/// The property every reachable state must have.
const INVARIANT_2: &str = "invariant 2: one token inside";

/// A way to break the protocol that the checker must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutant {
    /// No revoke at the local deadline.
    NoCancel,
    /// The database deletes a replica's rows when its session is lost.
    SessionFreesClaims,
    /// The clocks drift by as much as the margin.
    DriftAtMargin,
}

impl Mutant {
    fn from_env() -> Option<Self> {
        let name = std::env::var("CLAIMS_MUTANT").ok().filter(|name| !name.is_empty())?;
        Some(match name.as_str() {
            "no-cancel" => Self::NoCancel,
            "session-frees-claims" => Self::SessionFreesClaims,
            "drift-at-margin" => Self::DriftAtMargin,
            other => panic!("unknown CLAIMS_MUTANT {other:?}"),
        })
    }
}

/// The model: how many replicas, and which mutant (if any).
#[derive(Clone, Debug)]
struct Claims {
    replicas: usize,
    mutant: Option<Mutant>,
}

impl Claims {
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
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum ClaimState {
    Valid,
    Overtaken,
    Releasing,
    Lost,
}

/// A claim as a replica holds it (`claims/claim.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct LocalClaim {
    token: u8,
    grant: u8,
    state: ClaimState,
    /// Time left before the local deadline, on the database's clock.
    deadline_in: u8,
    inside: u8,
    /// The release was started (once per claim).
    releasing: bool,
}

/// A claim row in the database.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Row {
    token: u8,
    grant: u8,
    /// Time left before it expires; 0: expired.
    expires_in: u8,
}

/// A claim in flight.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Renewal {
    grant: u8,
    age: u8,
    /// Once run: `Some(higher)` if the row was extended (`higher`: the key's
    /// mark if above the claim's token, else 0), `None` if it was gone or expired.
    reply: Option<Option<u8>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Replica {
    /// The claim in the map.
    claim: Option<LocalClaim>,
    /// Claims replaced in the map while requests were still inside.
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
    ClaimAtDb { replica: usize },
    ClaimReply { replica: usize, drift: i8 },
    Leave { replica: usize, which: Which },
    ReleaseIdle { replica: usize },
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

impl LocalClaim {
    /// `Claim::release`: hands the grant to the store for its row to be deleted, once.
    fn release(&mut self, releases: &mut Vec<u8>) {
        if !self.releasing {
            self.releasing = true;
            releases.push(self.grant);
        }
    }

    /// `Claim::overtake`.
    fn overtake(&mut self, releases: &mut Vec<u8>) {
        if self.state == ClaimState::Valid {
            self.state = ClaimState::Overtaken;
            if self.inside == 0 {
                self.release(releases);
            }
        }
    }

    /// `Claim::revoke`: everyone inside is stopped.
    fn revoke(&mut self, releases: &mut Vec<u8>) {
        self.state = ClaimState::Lost;
        self.inside = 0;
        self.release(releases);
    }

    fn watched(&self) -> bool {
        matches!(self.state, ClaimState::Valid | ClaimState::Overtaken)
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

    /// A grant id nothing names any more.
    fn fresh_grant(&self, row: Option<Row>) -> u8 {
        let used = |grant: u8| {
            row.is_some_and(|row| row.grant == grant)
                || self.claim.as_ref().is_some_and(|claim| claim.grant == grant)
                || self.orphans.iter().any(|claim| claim.grant == grant)
                || self.pending.is_some_and(|pending| pending.grant == grant)
                || self.renewal.is_some_and(|renewal| renewal.grant == grant)
                || self.releases.contains(&grant)
        };
        (1..=GRANTS).find(|&grant| !used(grant)).expect("more grant ids in use than GRANTS")
    }

    fn claim_mut(&mut self, which: Which) -> &mut LocalClaim {
        match which {
            Which::Current => self.claim.as_mut().expect("a current claim"),
            Which::Orphan(index) => &mut self.orphans[index],
        }
    }

    /// The claim object a message about `grant` refers to.
    fn by_grant(&mut self, grant: u8) -> Option<&mut LocalClaim> {
        self.claim.iter_mut().chain(self.orphans.iter_mut()).find(|claim| claim.grant == grant)
    }

    /// Drops replaced claims that nobody is inside any more.
    fn tidy(&mut self) {
        self.orphans.retain(|claim| claim.inside > 0);
    }

    /// Clears what no step reads any more, so that states which differ only
    /// there are one state: the deadline of a claim that is not watched (a
    /// stopped claim, `Releasing` or `Lost`, behaves alike in every step), the
    /// age of a renewal that found its row gone.
    fn forget_what_no_step_reads(&mut self) {
        for claim in self.claim.iter_mut().chain(self.orphans.iter_mut()) {
            if !claim.watched() {
                claim.deadline_in = 0;
                claim.state = ClaimState::Lost;
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
        let mut names: Vec<u8> = Vec::with_capacity(usize::from(GRANTS));
        let mut rename = |grant: &mut u8| {
            let index = names.iter().position(|&name| name == *grant).unwrap_or_else(|| {
                names.push(*grant);
                names.len() - 1
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
    fn inside(&self) -> impl Iterator<Item = u8> + '_ {
        self.replicas
            .iter()
            .flat_map(|replica| replica.claim.iter().chain(replica.orphans.iter()))
            .filter(|claim| claim.inside > 0)
            .map(|claim| claim.token)
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
        let mut blocked = false;
        for (replica, r) in state.replicas.iter().enumerate() {
            for token in 1..=TOKENS {
                if request(r, token).is_some() {
                    actions.push(Action::Request { replica, token });
                }
            }
            match r.pending {
                Some(Pending { granted: false, .. }) => actions.push(Action::ClaimAtDb { replica }),
                Some(Pending { granted: true, .. }) => {
                    actions.extend(self.drifts().map(|drift| Action::ClaimReply { replica, drift }));
                }
                None => {}
            }
            if r.claim.as_ref().is_some_and(|claim| claim.inside > 0) {
                actions.push(Action::Leave { replica, which: Which::Current });
            }
            for index in 0..r.orphans.len() {
                actions.push(Action::Leave { replica, which: Which::Orphan(index) });
            }
            if r.claim.as_ref().is_some_and(|claim| claim.state == ClaimState::Valid && claim.inside == 0) {
                actions.push(Action::ReleaseIdle { replica });
            }
            for &grant in &r.releases {
                actions.push(Action::ReleaseAtDb { replica, grant });
                actions.push(Action::ReleaseFails { replica, grant });
            }
            match r.renewal {
                None if r.session && r.claim.as_ref().is_some_and(LocalClaim::watched) => {
                    actions.push(Action::RenewSend { replica });
                }
                None => {}
                Some(Renewal { reply: None, .. }) => actions.push(Action::RenewAtDb { replica }),
                Some(Renewal { reply: Some(Some(_)), .. }) => {
                    actions.extend(self.drifts().map(|drift| Action::RenewReply { replica, drift }));
                }
                Some(Renewal { reply: Some(None), .. }) => {
                    actions.push(Action::RenewReply { replica, drift: 0 });
                }
            }
            if !r.raises.is_empty() {
                actions.push(Action::Notify { replica });
            }
            let due = r.claim.as_ref().is_some_and(|claim| claim.watched() && claim.deadline_in == 0);
            if due && self.mutant != Some(Mutant::NoCancel) {
                actions.push(Action::Revoke { replica });
                blocked = true;
            }
            actions.push(if r.session {
                Action::SessionLost { replica }
            } else {
                Action::SessionOpen { replica }
            });
        }
        if !blocked {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::Request { replica, token } => {
                let row = s.rows[replica];
                let r = &mut s.replicas[replica];
                match request(r, token)? {
                    Arrival::Enter => {
                        r.claim.as_mut().expect("checked").inside += 1;
                    }
                    Arrival::Ask => {
                        // `look`: a lower claim takes nobody more from now on.
                        if let Some(claim) = r.claim.as_mut().filter(|claim| claim.token < token) {
                            claim.overtake(&mut r.releases);
                        }
                        let grant = r.fresh_grant(row);
                        r.pending = Some(Pending { token, grant, age: 0, granted: false });
                    }
                }
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
                {
                    {
                        let token = pending.token;
                        r.known = r.known.max(token);
                        let deadline_in = self.deadline_in(pending.age, drift);
                        // `Inner::install`.
                        match r.claim.as_mut() {
                            Some(claim) if claim.token == token && claim.state == ClaimState::Valid => {
                                claim.grant = pending.grant;
                                claim.deadline_in = claim.deadline_in.max(deadline_in);
                            }
                            _ => {
                                if let Some(old) = r.claim.take() {
                                    r.orphans.push(LocalClaim { deadline_in: 0, ..old });
                                }
                                r.claim = Some(LocalClaim {
                                    token,
                                    grant: pending.grant,
                                    state: ClaimState::Valid,
                                    deadline_in,
                                    inside: 0,
                                    releasing: false,
                                });
                            }
                        }
                        let claim = r.claim.as_mut().expect("installed");
                        if claim.state == ClaimState::Valid
                            && claim.deadline_in > 0
                            && claim.inside < MAX_INSIDE
                        {
                            claim.inside += 1;
                            r.tidy();
                        }
                    }
                }
                s.replicas[replica].tidy();
            }
            Action::Leave { replica, which } => {
                let r = &mut s.replicas[replica];
                let mut releases = std::mem::take(&mut r.releases);
                let claim = r.claim_mut(which);
                claim.inside -= 1;
                if claim.inside == 0 && claim.state != ClaimState::Valid {
                    claim.release(&mut releases);
                }
                r.releases = releases;
                r.tidy();
            }
            Action::ReleaseIdle { replica } => {
                let r = &mut s.replicas[replica];
                let claim = r.claim.as_mut().expect("checked");
                claim.state = ClaimState::Releasing;
                claim.release(&mut r.releases);
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
                let mark = r.raises.remove(0);
                r.raised(mark);
            }
            Action::Revoke { replica } => {
                let r = &mut s.replicas[replica];
                let claim = r.claim.as_mut().expect("checked");
                claim.revoke(&mut r.releases);
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
            Action::SessionOpen { replica } => s.replicas[replica].session = true,
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

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(INVARIANT_2, |_, s: &State| {
                let mut inside = s.inside();
                inside.next().is_none_or(|first| inside.all(|token| token == first))
            }),
            // Not vacuous: the interesting states are reached.
            Property::sometimes("requests inside on every replica", |_, s: &State| {
                s.replicas.iter().all(|r| r.claim.as_ref().is_some_and(|claim| claim.inside > 0))
            }),
            Property::sometimes("token 3 inside after a lower one", |_, s: &State| {
                s.inside().any(|token| token == TOKENS) && s.replicas.iter().any(|r| r.known < TOKENS)
            }),
            Property::sometimes("a claim overtaken with a request inside", |_, s: &State| {
                s.replicas.iter().any(|r| {
                    r.claim.as_ref().is_some_and(|c| c.state == ClaimState::Overtaken && c.inside > 0)
                })
            }),
            Property::sometimes("a claim lost while another replica holds a higher one", |_, s: &State| {
                s.replicas.iter().any(|r| r.claim.as_ref().is_some_and(|c| c.state == ClaimState::Lost))
                    && s.inside().any(|token| token > 1)
            }),
        ]
    }
}

/// What a request arriving with `token` does, if it changes anything.
enum Arrival {
    /// Enters the valid claim in memory.
    Enter,
    /// Claims through the database (overtaking a lower claim first).
    Ask,
}

/// `try_admit`, then `look`: `None` if the request is refused in memory
/// (409, nothing changes) or must wait for this replica's claim in flight.
fn request(r: &Replica, token: u8) -> Option<Arrival> {
    if r.known > token {
        return None;
    }
    match r.claim.as_ref() {
        Some(claim) if claim.token > token => None,
        Some(claim) if claim.token == token => {
            if claim.state == ClaimState::Valid && claim.deadline_in > 0 {
                (claim.inside < MAX_INSIDE).then_some(Arrival::Enter)
            } else if claim.state == ClaimState::Overtaken {
                None
            } else {
                r.pending.is_none().then_some(Arrival::Ask)
            }
        }
        _ => r.pending.is_none().then_some(Arrival::Ask),
    }
}

/// Checks the model with `replicas` replicas: every state reachable in at
/// most `steps` steps (`MUTANT_STEPS` under a mutant; `CLAIMS_STEPS`
/// overrides both; 0: every reachable state), and reports what it saw.
fn check(replicas: usize, steps: usize) {
    let mutant = Mutant::from_env();
    let model = Claims { replicas, mutant };
    let started = Instant::now();
    let steps = if mutant.is_some() { MUTANT_STEPS } else { steps };
    let steps = std::env::var("CLAIMS_STEPS").ok().and_then(|steps| steps.parse().ok()).unwrap_or(steps);
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
        "claims model, {replicas} replicas{}{}: {} states ({} unique), max depth {}, {:.1} s",
        mutant.map_or(String::new(), |mutant| format!(", mutant {mutant:?}")),
        if steps > 0 { format!(", paths of up to {steps} steps") } else { String::new() },
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        elapsed.as_secs_f64(),
    );
    match mutant {
        None => {
            checker.assert_no_discovery(INVARIANT_2);
            for property in checker.model().properties() {
                let found = checker.discovery(property.name).is_some();
                if property.name != INVARIANT_2 {
                    println!(
                        "  example of {:?}: {}",
                        property.name,
                        if found { "found" } else { "not within the bound" }
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
            let actions = path.clone().into_actions();
            println!("mutant {mutant:?} caught: counterexample of {} steps", actions.len());
            for action in &actions {
                println!("  {action:?}");
            }
            println!("  last state: {:?}", path.last_state());
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
    check(2, 12);
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: cargo test -p fencing-claims-model --release --test claims_model"
)]
fn three_replicas() {
    check(3, 8);
}
