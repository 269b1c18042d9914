//! A loom model of the admission rule: the code of `admission.rs` itself, with
//! loom's atomics, mutex and a model of `Notify` (`store/sync`), run by a few
//! threads under every interleaving loom explores.
//!
//! Each thread plays requests as `MarkStore::find` and the response future do:
//! the fast path first, then `admit` in a loop — waiting when told to, writing
//! when given the duty (a write that succeeds, fails or is abandoned as by a
//! panic or a dropped future), entering, leaving. A [`Ledger`] outside the model
//! checks invariants 1–3 at every entry; a waiter nobody wakes leaves its thread
//! parked for good, which loom reports as a deadlock.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p fencing-layer --lib --profile loom -- loom_model
//! ```
//!
//! `fencing-layer/loom-mutants.sh` breaks the rule in each way the model must
//! catch and checks that it does.

use std::sync::Arc;

use loom::future::block_on;
use loom::thread;

use super::admission::{Admission, DURABLE, InsideGuard, KeyState, LOCAL, Rules};

/// The checker's own state: plain std types, outside what loom explores.
#[derive(Default)]
struct Ledger {
    state: std::sync::Mutex<LedgerState>,
}

#[derive(Default)]
struct LedgerState {
    /// The token inside and how many carry it.
    inside: (u64, usize),
    /// The highest token admitted so far.
    last: u64,
    /// The highest token the "disk" holds.
    durable: u64,
    admitted: Vec<u64>,
}

impl Ledger {
    fn enter(&self, token: u64, durable: bool) {
        let mut s = self.state.lock().unwrap();
        let (inside, count) = s.inside;
        assert!(count == 0 || inside == token, "invariant 2: {token} entered while {inside} was inside");
        assert!(token >= s.last, "invariant 1: {token} admitted after {}", s.last);
        assert!(!durable || token <= s.durable, "invariant 3: {token} admitted, {} on disk", s.durable);
        s.inside = (token, count + 1);
        s.last = token;
        s.admitted.push(token);
    }

    fn leave(&self) {
        self.state.lock().unwrap().inside.1 -= 1;
    }

    fn wrote(&self, token: u64) {
        let mut s = self.state.lock().unwrap();
        s.durable = s.durable.max(token);
    }

    fn admitted(&self) -> Vec<u64> {
        self.state.lock().unwrap().admitted.clone()
    }
}

/// What a request does when it is given the duty to record its raise.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Write {
    Succeeds,
    Fails,
    /// The request panics or is dropped holding the duty.
    Abandoned,
}

/// What a request does once inside.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inside {
    Leaves,
    /// The cancel policy: stays until a higher token overtakes it.
    WatchedUntilOvertaken,
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Cancelled,
    Stale,
    WriteFailed,
    Abandoned,
}

struct Model {
    state: Arc<KeyState>,
    ledger: Arc<Ledger>,
    durable: bool,
}

impl Clone for Model {
    fn clone(&self) -> Self {
        Self { state: Arc::clone(&self.state), ledger: Arc::clone(&self.ledger), durable: self.durable }
    }
}

impl Model {
    fn new(durable: bool) -> Self {
        Self { state: Arc::new(KeyState::new(0)), ledger: Arc::default(), durable }
    }

    /// A request with the default write and stay: it writes if asked, and leaves.
    fn request(&self, token: u64) -> Outcome {
        self.request_with(token, Write::Succeeds, Inside::Leaves)
    }

    /// One request's life, as `Fencing::call` and the response future live it.
    fn request_with(&self, token: u64, write: Write, stay: Inside) -> Outcome {
        if let Some(guard) = self.state.try_enter(token) {
            return self.inside(guard, token, stay);
        }
        loop {
            match self.state.admit("k", token, Rules { durable: self.durable, verify: false }) {
                Admission::Enter(guard) => return self.inside(guard, token, stay),
                Admission::Stale { highest } => {
                    assert!(highest > token);
                    return Outcome::Stale;
                }
                Admission::Wait(notified, _) => block_on(notified),
                Admission::Record(mut duty) => match write {
                    Write::Succeeds => {
                        self.ledger.wrote(duty.token());
                        duty.succeeded();
                    }
                    Write::Fails => return Outcome::WriteFailed,
                    Write::Abandoned => return Outcome::Abandoned,
                },
                // Only asked for when the rules name a verifier; the model's do not.
                Admission::Verify { .. } => unreachable!("the model admits without a verifier"),
            }
        }
    }

    fn inside(&self, guard: InsideGuard, token: u64, stay: Inside) -> Outcome {
        self.ledger.enter(token, self.durable);
        let outcome = match stay {
            Inside::Leaves => Outcome::Admitted,
            Inside::WatchedUntilOvertaken => loop {
                match guard.state().watch(token) {
                    Ok(overtaken) => block_on(overtaken),
                    Err(highest) => {
                        assert!(highest > token);
                        break Outcome::Cancelled;
                    }
                }
            },
        };
        // Out of the ledger before the guard lets anyone else in.
        self.ledger.leave();
        drop(guard);
        outcome
    }

    fn spawn(&self, run: impl FnOnce(&Model) -> Outcome + Send + 'static) -> thread::JoinHandle<Outcome> {
        let model = self.clone();
        thread::spawn(move || run(&model))
    }
}

/// Runs `test` under every interleaving loom explores (at most two preemptions
/// unless `LOOM_MAX_PREEMPTIONS` says otherwise) and prints how many it ran.
fn explore(test: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        test();
    });
    let bound = builder.preemption_bound.unwrap_or(usize::MAX);
    eprintln!("{} interleavings (preemption bound {bound})", runs.load(Ordering::Relaxed));
}

/// The holder's repeated token on the fast path, against a raise chain: the
/// raise closes the fast path, waits for the old token to drain, reopens it.
#[test]
fn loom_model_fast_path_against_a_raise_chain() {
    explore(|| {
        let model = Model::new(false);
        assert_eq!(model.request(1), Outcome::Admitted);
        let old = model.spawn(|m| m.request(1));
        let raise = model.spawn(|m| {
            assert!(matches!(m.request(2), Outcome::Admitted | Outcome::Stale));
            m.request(3)
        });
        let again = model.request(1);
        assert_eq!(raise.join().unwrap(), Outcome::Admitted, "3 is the highest: it always gets in");
        let old = old.join().unwrap();
        assert!(matches!(old, Outcome::Admitted | Outcome::Stale));
        assert!(matches!(again, Outcome::Admitted | Outcome::Stale));
        assert_eq!(model.state.mark(), 3);
    });
}

/// Equal tokens share the inside while a higher one waits for both.
#[test]
fn loom_model_equal_tokens_share_a_raise_waits_for_all() {
    explore(|| {
        let model = Model::new(false);
        let first = model.spawn(|m| m.request(1));
        let second = model.spawn(|m| m.request(1));
        let raise = model.request(2);
        assert_eq!(raise, Outcome::Admitted);
        for other in [first, second] {
            assert!(matches!(other.join().unwrap(), Outcome::Admitted | Outcome::Stale));
        }
        let admitted = model.ledger.admitted();
        assert_eq!(admitted.last(), Some(&2), "{admitted:?}");
    });
}

/// A waiter abandoned (its future dropped) wakes nobody and blocks nobody.
#[test]
fn loom_model_abandoned_waiters_block_nobody() {
    explore(|| {
        let model = Model::new(false);
        let inside = model.state.admit("k", 1, LOCAL);
        let Admission::Enter(guard) = inside else { panic!("an idle key admits") };
        let abandoned = model.spawn(|m| {
            if let Admission::Wait(notified, _) = m.state.admit("k", 2, LOCAL) {
                drop(notified);
            }
            Outcome::Abandoned
        });
        let raise = model.spawn(|m| m.request(3));
        drop(guard);
        assert_eq!(raise.join().unwrap(), Outcome::Admitted);
        abandoned.join().unwrap();
    });
}

/// Durable raises: one duty per token; a failed or abandoned write hands it back
/// and the next request with the token writes; nobody enters before the disk has it.
#[test]
fn loom_model_durable_writes_that_fail_or_are_abandoned() {
    explore(|| {
        let model = Model::new(true);
        let failing = model.spawn(|m| m.request_with(2, Write::Fails, Inside::Leaves));
        let abandoning = model.spawn(|m| m.request_with(2, Write::Abandoned, Inside::Leaves));
        let last = model.request(2);
        assert_eq!(last, Outcome::Admitted, "a healthy write always gets 2 in");
        for other in [failing, abandoning] {
            assert!(matches!(
                other.join().unwrap(),
                Outcome::Admitted | Outcome::WriteFailed | Outcome::Abandoned
            ));
        }
    });
}

/// A durable raise overtaken while it writes: the higher one waits for nobody
/// who is not inside, and the lower one never enters after it.
#[test]
fn loom_model_durable_raise_chain() {
    explore(|| {
        let model = Model::new(true);
        let two = model.spawn(|m| m.request(2));
        let three = model.request(3);
        assert_eq!(three, Outcome::Admitted);
        assert!(matches!(two.join().unwrap(), Outcome::Admitted | Outcome::Stale));
    });
}

/// The cancel policy: the holder inside is told the moment a higher token
/// arrives, leaves, and the higher token enters.
#[test]
fn loom_model_cancel_policy_overtakes_the_holder_inside() {
    explore(|| {
        let model = Model::new(false);
        let Admission::Enter(guard) = model.state.admit("k", 1, LOCAL) else { panic!("an idle key admits") };
        let holder = model.spawn(move |m| m.inside(guard, 1, Inside::WatchedUntilOvertaken));
        assert_eq!(model.request(2), Outcome::Admitted);
        assert_eq!(holder.join().unwrap(), Outcome::Cancelled);
    });
}

/// A seed that makes a pending token durable lets its waiters in, though the
/// request with the duty has not finished its write.
#[test]
fn loom_model_a_seed_wakes_the_waiters_of_a_pending_write() {
    explore(|| {
        let model = Model::new(true);
        let Admission::Record(duty) = model.state.admit("k", 4, DURABLE) else { panic!("4 is a raise") };
        let waiter = model.spawn(|m| m.request(4));
        model.ledger.wrote(4);
        assert_eq!(model.state.seed(4), 4);
        // The writer finishes only after the waiter got in: if the seed woke
        // nobody, the waiter sleeps for good and loom reports the deadlock.
        assert_eq!(waiter.join().unwrap(), Outcome::Admitted);
        drop(duty);
    });
}
