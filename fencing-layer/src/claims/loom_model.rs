//! Loom models of a claim's atomics: the code of `cell.rs` itself, with loom's
//! atomics (`store/sync`), run by a few threads under every interleaving loom
//! explores.
//!
//! The threads play what the store does with one claim: requests (`try_enter`,
//! then `leave`), the keeper's idle check (`release_if_idle`), a renewal
//! (`renewed`), a revocation (`revoke`), a raise heard (`overtake`), and an
//! install of a new grant of the same token (`Inner::install`: the backend
//! writes the new grant's row, then the claim is extended if it is still valid,
//! then entered). Every `Then::Release` is acted on as `Claim` does: the delete
//! of the row of `grant()` read then (of the new grant, for `extend`'s).
//!
//! A [`Ledger`] outside the model (plain std types) holds the backend's row of
//! this replica and key (one row, named by its grant: a new grant replaces it,
//! a delete names a grant and removes nothing else) and who is inside, and
//! checks at every step:
//!
//! - (a) nobody is admitted while the row is deleted, and no delete starts while
//!   somebody is inside;
//! - (b) the claim starts its release at most once, and only with nobody
//!   inside; an extend that finds the release started releases its new grant,
//!   once (a second delete of one grant's row deletes nothing: see below);
//! - (c) no request that starts after a `revoke` returned gets in, and a request
//!   inside that looks after it is no longer `held`;
//! - (d) no request that starts after anyone learned that the claim stopped
//!   admitting gets in, and at the end a claim that stopped is still stopped.
//!
//! At the end, once every thread is done, a late request must be refused by a
//! claim that stopped, and such a claim, empty, keeps no row (unless the install
//! found it stopped and the new grant went to a new claim, which owns the row).
//!
//! The model does not follow that new claim. It checks only that nobody is
//! inside the old one when it was `Releasing` (an idle claim: the earlier idle
//! release, which looked at the count and then moved the state, left a request
//! there). Requests inside an `Overtaken` or `Lost` claim that the install
//! replaces are let be.
//!
//! Every request asks, once inside, whether it is still `held`: besides being
//! what a response does, that look is where loom may run others while it is
//! inside (loom switches threads only at its own operations).
//!
//! The models (main thread, then the two it spawns):
//!
//! - `requests_against_the_idle_release`: the keeper's idle check, against two
//!   requests. Brings out the old bug (`Releasing` back to `Valid`).
//! - `revoke_against_requests_and_a_renewal`: a renewal then a revocation,
//!   against two requests; checks (c).
//! - `install_against_the_idle_release`: the idle check, against an install of
//!   `SECOND` and a request: the new grant's row goes too if the claim stopped.
//! - `raise_against_a_request_and_an_install`: a raise heard (`overtake`),
//!   against an install and a request.
//!
//! "At most once per grant" does not hold as such, and need not: when the
//! keeper starts the release and an extend then stores the new grant and finds
//! the release started, both delete the new grant's row (the keeper reads the
//! grant after its transition). The second delete deletes nothing.
//!
//! ```sh
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 \
//!     cargo test -p fencing-layer --lib --profile loom -- claims::loom_model
//! ```
//!
//! `fencing-layer/loom-mutants.sh` breaks `cell.rs` in each way the models must
//! catch (and `store/admission.rs` for the store's model) and checks that they do.
//!
//! Loom regards a `SeqCst` load as `AcqRel`, save that it never returns a store
//! older than the newest `SeqCst` one; an atomic's initial value is not a
//! `SeqCst` store, so each model first stores every atomic again with `SeqCst`
//! (`ClaimCell::seq_cst_stores`). From then on a `SeqCst` load returns the
//! newest store, so loom explores the sequentially consistent executions the
//! cell's rules rely on; without it, the install models fail on executions no
//! `SeqCst` program has (an extend reading `releasing` unset after the keeper
//! set it, while the keeper read the old grant).

use loom::sync::Arc;
use loom::thread;

use super::cell::{ClaimCell, State, Then};

/// The requests' clock: before every deadline in the models.
const NOW: u64 = 5;
/// The first grant: the claim's when the model starts.
const FIRST: u64 = 1;
/// A later grant of the same token (an install).
const SECOND: u64 = 2;
/// The raise's token.
const RAISE: u64 = 9;

/// Who started a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum By {
    /// The claim's own transitions (`try_enter`, `leave`, `overtake`,
    /// `release_if_idle`, `revoke`): of `grant()` read then.
    Claim,
    /// An `extend` that found the release started: of its new grant.
    Extend,
}

/// The checker's own state: plain std types, outside what loom explores.
#[derive(Default)]
struct Ledger {
    book: std::sync::Mutex<Book>,
}

#[derive(Default, Debug)]
struct Book {
    /// The backend's row of this replica and key: its grant, `None` once deleted.
    row: Option<u64>,
    /// Requests admitted and not yet left.
    inside: usize,
    /// The releases started, in order.
    releases: Vec<(u64, By)>,
    /// Somebody learned that the claim no longer admits.
    stopped: bool,
    /// A `revoke` returned.
    revoked: bool,
    /// The install found the claim stopped: the new grant (and the row) went to
    /// a new claim, not modelled.
    moved: bool,
    /// Requests admitted, in all.
    admitted: usize,
}

/// What a request knew before it tried to enter.
#[derive(Clone, Copy)]
struct Before {
    stopped: bool,
    revoked: bool,
}

impl Ledger {
    fn new(grant: u64) -> Self {
        Self { book: std::sync::Mutex::new(Book { row: Some(grant), ..Book::default() }) }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // A failed check panics with the book locked: later ones read it anyway.
        self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn before_entry(&self) -> Before {
        let book = self.book();
        Before { stopped: book.stopped, revoked: book.revoked }
    }

    fn enter(&self, before: Before) {
        let mut book = self.book();
        assert!(book.row.is_some(), "(a) admitted under a claim whose row is deleted: {book:?}");
        assert!(!before.revoked, "(c) admitted by a try_enter that began after revoke returned: {book:?}");
        assert!(!before.stopped, "(d) admitted after the claim was seen to stop admitting: {book:?}");
        book.inside += 1;
        book.admitted += 1;
    }

    fn leave(&self) {
        self.book().inside -= 1;
    }

    /// Somebody saw the claim out of `Valid` (all deadlines are after `NOW`).
    fn stopped(&self) {
        self.book().stopped = true;
    }

    fn revoked(&self) {
        let mut book = self.book();
        book.revoked = true;
        book.stopped = true;
    }

    fn revoked_now(&self) -> bool {
        self.book().revoked
    }

    /// The backend granted `grant`: it writes the row of this replica and key.
    fn granted(&self, grant: u64) {
        self.book().row = Some(grant);
    }

    /// The install found the claim stopped (in `seen`): a new claim takes the
    /// new grant, and the row with it. Nobody may be inside a `Releasing` claim
    /// then: the store stops watching it, and the new claim does not count them.
    fn moved(&self, seen: State) {
        let mut book = self.book();
        assert!(
            book.inside == 0 || seen != State::Releasing,
            "(a) the install gave the row to a new claim with a request inside this {seen:?} one: {book:?}"
        );
        book.moved = true;
        book.stopped = true;
    }

    /// A release of `grant`'s row starts: the delete names the grant.
    fn release(&self, grant: u64, by: By) {
        let mut book = self.book();
        assert_eq!(book.inside, 0, "(a) the release of grant {grant} started with requests inside: {book:?}");
        if by == By::Claim {
            let again = book.releases.iter().any(|&(_, by)| by == By::Claim);
            assert!(!again, "(b) the claim started its release twice (now of {grant}): {book:?}");
        } else {
            assert_eq!(grant, SECOND, "(b) an extend released another grant than its own");
            let again = book.releases.contains(&(grant, By::Extend));
            assert!(!again, "(b) an extend released grant {grant} twice: {book:?}");
        }
        book.releases.push((grant, by));
        if book.row == Some(grant) {
            book.row = None;
        }
    }
}

struct Model {
    cell: Arc<ClaimCell>,
    ledger: std::sync::Arc<Ledger>,
}

impl Clone for Model {
    fn clone(&self) -> Self {
        Self { cell: Arc::clone(&self.cell), ledger: std::sync::Arc::clone(&self.ledger) }
    }
}

impl Model {
    /// A valid claim on `FIRST`, nobody inside; `idle`: the keeper's idle check
    /// already ran once (it clears `touched`, so the next one may release).
    fn new(idle: bool) -> Self {
        let cell = ClaimCell::new(FIRST, 10);
        cell.seq_cst_stores();
        if idle {
            assert_eq!(cell.release_if_idle(), Then::Nothing, "a new claim counts as touched");
        }
        Self { cell: Arc::new(cell), ledger: std::sync::Arc::new(Ledger::new(FIRST)) }
    }

    /// Acts on a transition's `Then` as `Claim::then` does.
    fn then(&self, then: Then) {
        if then == Then::Release {
            self.ledger.release(self.cell.grant(), By::Claim);
        }
    }

    /// One request: in if the claim admits; inside, it asks whether it is
    /// still `held` (as a response does); out again (as `Entered`'s drop).
    fn request(&self) -> bool {
        let before = self.ledger.before_entry();
        match self.cell.try_enter(NOW) {
            Ok(()) => {
                self.inside(before);
                true
            }
            Err(then) => {
                self.ledger.stopped();
                self.then(then);
                false
            }
        }
    }

    fn inside(&self, before: Before) {
        self.ledger.enter(before);
        // The look is also what keeps the request inside while others run:
        // without an atomic between the ledger's enter and leave, loom would
        // never run anyone else in between.
        let revoked = self.ledger.revoked_now();
        let held = self.cell.held(NOW);
        assert!(!(revoked && held), "(c) a request inside is still held after revoke returned");
        // Out of the ledger before the count goes down.
        self.ledger.leave();
        self.then(self.cell.leave());
    }

    /// The keeper's idle check.
    fn idle_check(&self) {
        let then = self.cell.release_if_idle();
        if then == Then::Release {
            self.ledger.stopped();
        }
        self.then(then);
    }

    /// The keeper revokes the claim (deadline passed, or a renewal found it gone).
    fn revoke(&self) {
        let (first, then) = self.cell.revoke();
        assert!(first, "the model revokes once");
        self.ledger.revoked();
        self.then(then);
    }

    /// A raise to `RAISE` was heard.
    fn overtake(&self) {
        let then = self.cell.overtake(RAISE);
        self.ledger.stopped();
        self.then(then);
    }

    /// `Inner::install` of `SECOND` (same token), after the backend granted it,
    /// then a request under it.
    fn install(&self) {
        self.ledger.granted(SECOND);
        let seen = self.cell.state();
        if seen != State::Valid {
            self.ledger.moved(seen);
            return;
        }
        if self.cell.extend(SECOND, 30) == Then::Release {
            self.ledger.release(SECOND, By::Extend);
        }
        let before = self.ledger.before_entry();
        match self.cell.try_enter(NOW) {
            Ok(()) => self.inside(before),
            Err(then) => {
                self.ledger.stopped();
                self.then(then);
            }
        }
    }

    fn spawn(&self, run: impl FnOnce(&Model) + Send + 'static) -> thread::JoinHandle<()> {
        let model = self.clone();
        thread::spawn(move || run(&model))
    }

    /// Once every thread is done: a late request, then the end state.
    fn finish(&self) {
        let admitted = self.request();
        let state = self.cell.state();
        let book = self.ledger.book();
        assert_eq!(self.cell.inside(), 0, "everyone left: {book:?}");
        assert_eq!(book.inside, 0);
        assert_eq!(admitted, state == State::Valid, "(d) a late request in {state:?}: {book:?}");
        assert!(!book.stopped || state != State::Valid, "(d) the claim stopped, then admits again: {book:?}");
        let by_claim = book.releases.iter().filter(|&&(_, by)| by == By::Claim).count();
        if state == State::Valid {
            assert!(book.releases.is_empty(), "(b) a valid claim was released: {book:?}");
            assert!(book.row.is_some(), "(a) a valid claim has no row: {book:?}");
        } else {
            assert_eq!(by_claim, 1, "(b) a stopped claim, empty, was never released: {book:?}");
            assert!(book.moved || book.row.is_none(), "a stopped claim, empty, kept its row: {book:?}");
        }
    }
}

/// Runs `test` under every interleaving loom explores (at most three
/// preemptions unless `LOOM_MAX_PREEMPTIONS` says otherwise) and prints how
/// many it ran.
fn explore(test: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&runs);
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        test();
    });
    let bound = builder.preemption_bound.unwrap_or(usize::MAX);
    eprintln!("{} interleavings (preemption bound {bound})", runs.load(Ordering::Relaxed));
}

/// Two requests against the keeper's idle check: either the check finds the
/// claim busy and it stays valid, or it stops it and the row goes once, with
/// nobody inside, never to admit again. The old bug (`Releasing` back to
/// `Valid`) lets a request that saw `Releasing` leave and delete the row, then
/// admits the late request under no row.
#[test]
fn loom_model_requests_against_the_idle_release() {
    explore(|| {
        let model = Model::new(true);
        let first = model.spawn(|m| {
            m.request();
        });
        let second = model.spawn(|m| {
            m.request();
        });
        model.idle_check();
        first.join().unwrap();
        second.join().unwrap();
        model.finish();
    });
}

/// A revocation (after a renewal) against two requests that look whether they
/// are still held: nobody gets in after it, nobody inside is held after it,
/// and the row goes once the last one is out.
#[test]
fn loom_model_revoke_against_requests_and_a_renewal() {
    explore(|| {
        let model = Model::new(false);
        let first = model.spawn(|m| {
            m.request();
        });
        let second = model.spawn(|m| {
            m.request();
        });
        model.cell.renewed(FIRST, 20);
        model.revoke();
        first.join().unwrap();
        second.join().unwrap();
        model.finish();
        assert_eq!(model.cell.state(), State::Lost);
    });
}

/// An install of a new grant of the same token against the keeper's idle
/// check and a request: if the claim stops meanwhile, the new grant's row goes
/// too (the extend releases it, or the release reads it).
#[test]
fn loom_model_install_against_the_idle_release() {
    explore(|| {
        let model = Model::new(true);
        let install = model.spawn(Model::install);
        let request = model.spawn(|m| {
            m.request();
        });
        model.idle_check();
        install.join().unwrap();
        request.join().unwrap();
        model.finish();
    });
}

/// A raise heard against a request and an install: the claim admits nobody
/// after the raise and its row (whichever grant it is by then) goes once the
/// last one is out.
#[test]
fn loom_model_raise_against_a_request_and_an_install() {
    explore(|| {
        let model = Model::new(false);
        let install = model.spawn(Model::install);
        let request = model.spawn(|m| {
            m.request();
        });
        model.overtake();
        install.join().unwrap();
        request.join().unwrap();
        model.finish();
        assert_eq!(model.cell.state(), State::Overtaken);
        assert_eq!(model.cell.overtaken_by(), RAISE);
    });
}
