//! Stress on the lock-free fast path (`KeyState::try_enter` and the `gate`
//! word): concurrent requests carrying a key's *current* token (the fast path)
//! race raises, `MarkStore::seed` raises and stale tokens, under the drain and
//! the cancel policy, on tokio worker threads and on plain OS threads.
//!
//! The handler reports its entry and exit to a per-key checker, which asserts:
//! - invariant 2: never two different tokens inside the handler at once per key;
//! - invariant 1: per key, admitted tokens never decrease in admission order;
//! - no stale admission: a request whose sender already *knew* the mark had
//!   reached `k` (from a 200, a 409 naming the mark, or `seed`'s return) and
//!   carrying a token below `k` never reaches the handler.
//!
//! Every request must finish: the drain timeout is an hour, so a lost wake-up
//! hangs a request, and each run's own bound turns that into a failure. Workers
//! meet at a barrier between bursts, so traffic stops completely many times per
//! run and a waiter that only a later request would have woken stays asleep.
//! After each run a raise on every key must enter at once (the in-flight count
//! is back to zero, nothing is left waiting).
//!
//! Three workloads:
//! - `mixed`: 20 workers, 3 keys, bursts of mostly-current tokens with some
//!   raises, `seed`s and stale tokens;
//! - `duel`: per key one raiser (every request a raise) and two hammers (always
//!   the current token), so the fast path closes and reopens thousands of times;
//! - `spin_duel`: one raiser and one hammer on one key, each on its own OS
//!   thread, released together by a spinning barrier and each delayed by a
//!   random spin, so their gate operations overlap at varying offsets in real
//!   parallel (where the protocol's narrowest windows are hit most often).
//!
//! The tests take a file-wide lock so they run one at a time (about 14 s in all
//! on 2 cores). Set `GATE_STRESS_MS` to soak each run for longer.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fencing_layer::{FencingLayer, FencingToken, InFlightPolicy, MarkStore, Rejection};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt, service_fn};

const KEYS: usize = 3;
/// How long, after the load stops, every in-flight request has to finish.
const FINISH_WITHIN: Duration = Duration::from_secs(10);

/// How long each run keeps sending requests: `GATE_STRESS_MS`, or 1.5 s.
fn load_for() -> Duration {
    let ms = std::env::var("GATE_STRESS_MS").ok().and_then(|ms| ms.parse().ok()).unwrap_or(1500);
    Duration::from_millis(ms)
}

/// One run at a time: the runs are timing-sensitive and the machine may have 2 cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A small deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct KeyCheck {
    /// The token of those inside the handler, and how many they are.
    inside: Option<(u64, usize)>,
    /// The highest token admitted so far.
    last: u64,
    entered: u64,
}

/// What the handler reports to.
struct Checker {
    keys: Vec<Mutex<KeyCheck>>,
    violations: Mutex<Vec<String>>,
    calls: AtomicU64,
}

impl Checker {
    fn new() -> Self {
        Self {
            keys: (0..KEYS).map(|_| Mutex::default()).collect(),
            violations: Mutex::default(),
            calls: AtomicU64::new(0),
        }
    }

    fn violation(&self, message: String) {
        let mut violations = self.violations.lock().unwrap();
        if violations.len() < 20 {
            violations.push(message);
        }
    }

    fn enter(&self, key: usize, token: u64, known: u64) {
        let mut k = self.keys[key].lock().unwrap();
        if token < known {
            self.violation(format!(
                "key {key}: stale token {token} admitted, sent when the mark was known to be {known}"
            ));
        }
        if token < k.last {
            self.violation(format!("key {key}: invariant 1: admitted {token} after {}", k.last));
        }
        k.last = k.last.max(token);
        k.entered += 1;
        k.inside = match k.inside {
            None => Some((token, 1)),
            Some((t, n)) if t == token => Some((t, n + 1)),
            Some((t, n)) => {
                self.violation(format!(
                    "key {key}: invariant 2: token {token} entered while {n} of token {t} inside"
                ));
                Some((t.max(token), n + 1))
            }
        };
    }

    fn exit(&self, key: usize, token: u64) {
        let mut k = self.keys[key].lock().unwrap();
        k.inside = match k.inside {
            Some((_, 1)) => None,
            Some((t, n)) => Some((t, n - 1)),
            None => {
                self.violation(format!("key {key}: token {token} left, but nobody was inside"));
                None
            }
        };
    }
}

/// Reports the exit when the handler returns or is dropped (the cancel policy).
struct Exit {
    checker: Arc<Checker>,
    key: usize,
    token: u64,
}

impl Drop for Exit {
    fn drop(&mut self) {
        self.checker.exit(self.key, self.token);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One multi-thread runtime with 3 worker threads runs every role as a task.
    Tasks,
    /// This many OS threads, each with its own current-thread runtime, share the roles.
    Threads(usize),
    /// One OS thread per role, one request per burst, a spinning barrier and a
    /// random spin before every request.
    Spin,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// Bursts of 1 to 12 requests on any key: mostly the current token, some
    /// raises, some `seed` raises, some stale tokens.
    Mixed,
    /// Bursts of 1 to 4 requests on one key, always its current token: the fast path.
    Hammer(usize),
    /// One request per burst on one key, always a raise: the fast path for the
    /// old token closes and opens for the new one as often as possible.
    Raiser(usize),
}

#[derive(Default, Debug)]
struct Tally {
    ok: u64,
    stale: u64,
    cancelled: u64,
    raises: u64,
    seeds: u64,
    rounds: u64,
    other: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        self.stale += other.stale;
        self.cancelled += other.cancelled;
        self.raises += other.raises;
        self.seeds += other.seeds;
        self.rounds = self.rounds.max(other.rounds);
        self.other.extend(other.other);
    }
}

/// A barrier whose waiters spin (then yield), so that all of them are on a CPU
/// and leave it within a few hundred nanoseconds of each other.
struct SpinBarrier {
    arrived: AtomicUsize,
    generation: AtomicUsize,
    parties: usize,
}

impl SpinBarrier {
    fn new(parties: usize) -> Self {
        Self { arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0), parties }
    }

    /// Whether this caller was the last to arrive.
    fn wait(&self) -> bool {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            spins += 1;
            if spins < 20_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        false
    }
}

/// What every worker shares: the fenced service, the store, the per-key
/// current token the workers send, and the per-key mark known to be reached.
struct World<S> {
    service: S,
    store: MarkStore,
    current: Vec<AtomicU64>,
    known: Vec<AtomicU64>,
    barrier: tokio::sync::Barrier,
    spin: SpinBarrier,
    stop: AtomicBool,
    until: Instant,
    /// Admitted requests and raises so far, over all workers.
    admitted: AtomicU64,
    raised: AtomicU64,
}

fn path(key: usize) -> String {
    format!("/k{key}")
}

fn request(key: usize, token: u64, known: u64) -> Request<()> {
    Request::post(path(key)).header("fencing-token", token).header("x-known", known).body(()).unwrap()
}

fn burst(role: Role, mode: Mode, rng: &mut Rng) -> u64 {
    match (role, mode) {
        (_, Mode::Spin) | (Role::Raiser(_), _) => 1,
        (Role::Mixed, _) => 1 + rng.below(12),
        (Role::Hammer(_), _) => 1 + rng.below(4),
    }
}

/// Sends bursts of requests; between bursts every worker meets the others at
/// the barrier, so traffic stops completely many times per run.
async fn worker<S>(world: Arc<World<S>>, role: Role, mode: Mode, seed: u64) -> Tally
where
    S: tower::Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone,
{
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    loop {
        for _ in 0..burst(role, mode, &mut rng) {
            send_one(&world, role, None, &mut rng, &mut tally).await;
        }
        // Past the load time, go on until the workload checks below can hold
        // (within a grace), so that a busy machine does not fail them.
        let now = Instant::now();
        let enough = (world.admitted.load(Ordering::Relaxed) > 1000
            && world.raised.load(Ordering::Relaxed) > 100)
            || now >= world.until + GRACE;
        if world.barrier.wait().await.is_leader() && now >= world.until && enough {
            world.stop.store(true, Ordering::Release);
        }
        world.barrier.wait().await;
        if world.stop.load(Ordering::Acquire) {
            return tally;
        }
        tally.rounds += 1;
    }
}

/// [`worker`] for [`Mode::Spin`], on its own OS thread.
fn spin_worker<S>(world: &World<S>, role: Role, seed: u64) -> Tally
where
    S: tower::Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone,
{
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    loop {
        // The hammer picks its token as the round starts, before the raiser
        // (after its own random delay) raises: its fast-path attempt lands at
        // any offset around the raise, also between the raise opening the
        // fast path for the new token and anyone leaving.
        let current = matches!(role, Role::Hammer(_)).then(|| world.current[0].load(Ordering::Acquire));
        for _ in 0..rng.below(3_000) {
            std::hint::spin_loop();
        }
        runtime.block_on(send_one(world, role, current, &mut rng, &mut tally));
        // Spinning threads crawl on a busy machine: past the load time, go on
        // until the duel has had its rounds (within a grace), so that the
        // workload checks below hold on a slow machine too.
        let now = Instant::now();
        let enough = tally.rounds >= SPIN_ROUNDS || now >= world.until + GRACE;
        if world.spin.wait() && now >= world.until && enough {
            world.stop.store(true, Ordering::Release);
        }
        world.spin.wait();
        if world.stop.load(Ordering::Acquire) {
            return tally;
        }
        tally.rounds += 1;
    }
}

/// Sends one request as `role` would; `current` is the key's current token
/// as the caller saw it, if it already looked.
async fn send_one<S>(world: &World<S>, role: Role, current: Option<u64>, rng: &mut Rng, tally: &mut Tally)
where
    S: tower::Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone,
{
    let key = match role {
        Role::Mixed => rng.below(KEYS as u64) as usize,
        Role::Hammer(key) | Role::Raiser(key) => key,
    };
    let current = current.unwrap_or_else(|| world.current[key].load(Ordering::Acquire));
    let roll = match role {
        Role::Mixed => rng.below(1000),
        Role::Hammer(_) => 1000,
        Role::Raiser(_) => 0,
    };
    let token = if roll < 25 {
        // A raise: everybody moves on to the new token at once, while
        // requests with the old one are still inside or on the fast path.
        world.current[key].fetch_max(current + 1, Ordering::AcqRel);
        tally.raises += 1;
        world.raised.fetch_add(1, Ordering::Relaxed);
        current + 1
    } else if roll < 32 {
        // An operator raise: the mark rises without waiting for anyone.
        let mark = world.store.seed(&path(key), current + 1).unwrap();
        world.known[key].fetch_max(mark, Ordering::AcqRel);
        world.current[key].fetch_max(current + 1, Ordering::AcqRel);
        tally.seeds += 1;
        return;
    } else if roll < 110 {
        current.saturating_sub(1 + rng.below(3))
    } else {
        current
    };
    let known = world.known[key].load(Ordering::Acquire);
    let response = world.service.clone().oneshot(request(key, token, known)).await.unwrap();
    let rejection = response.extensions().get::<Rejection>();
    match (response.status(), rejection) {
        (StatusCode::OK, None) => {
            tally.ok += 1;
            world.admitted.fetch_add(1, Ordering::Relaxed);
            world.known[key].fetch_max(token, Ordering::AcqRel);
        }
        (StatusCode::CONFLICT, Some(Rejection::Stale { highest, .. })) => {
            tally.stale += 1;
            world.known[key].fetch_max(*highest, Ordering::AcqRel);
        }
        (StatusCode::CONFLICT, Some(Rejection::Cancelled { highest, .. })) => {
            tally.cancelled += 1;
            world.known[key].fetch_max(*highest, Ordering::AcqRel);
        }
        (status, rejection) => {
            if tally.other.len() < 5 {
                tally.other.push(format!("key {key} token {token}: {status} {rejection:?}"));
            }
        }
    }
}

fn run(mode: Mode, policy: InFlightPolicy, roles: &[Role], seed: u64) {
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let checker = Arc::new(Checker::new());
    let store = MarkStore::in_memory();
    let layer = FencingLayer::new()
        .store(store.clone())
        .in_flight_policy(policy)
        // A lost wake-up must hang, not turn into a 503 after a few seconds.
        .drain_timeout(Duration::from_secs(3600));
    let handler_checker = Arc::clone(&checker);
    let handler = service_fn(move |request: Request<()>| {
        let checker = Arc::clone(&handler_checker);
        let key: usize = request.uri().path()[2..].parse().unwrap();
        let known: u64 = request.headers()["x-known"].to_str().unwrap().parse().unwrap();
        async move {
            // Read in the future, which the layer polls with the admitted token.
            let token = FencingToken::current().expect("a fenced request").get();
            checker.enter(key, token, known);
            let _exit = Exit { checker: Arc::clone(&checker), key, token };
            // Stay inside a little, across task switches, OS yields and spins.
            let mut rng = Rng::new(checker.calls.fetch_add(1, Ordering::Relaxed));
            for _ in 0..rng.below(4) {
                match rng.below(3) {
                    0 => tokio::task::yield_now().await,
                    1 => std::thread::yield_now(),
                    _ => (0..rng.below(2_000)).for_each(|_| std::hint::spin_loop()),
                }
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let started = Instant::now();
    let world = Arc::new(World {
        service: layer.layer(handler),
        store: store.clone(),
        current: (0..KEYS).map(|_| AtomicU64::new(1)).collect(),
        known: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        barrier: tokio::sync::Barrier::new(roles.len()),
        spin: SpinBarrier::new(roles.len()),
        stop: AtomicBool::new(false),
        until: started + load_for(),
        admitted: AtomicU64::new(0),
        raised: AtomicU64::new(0),
    });

    let (done, finished) = mpsc::channel::<Tally>();
    let runtimes = match mode {
        Mode::Tasks => 1,
        Mode::Threads(threads) => threads,
        Mode::Spin => roles.len(),
    };
    let mut threads = Vec::new();
    for r in 0..runtimes {
        let world = Arc::clone(&world);
        let done = done.clone();
        let mine: Vec<(usize, Role)> = roles.iter().copied().enumerate().skip(r).step_by(runtimes).collect();
        threads.push(std::thread::spawn(move || {
            let runtime = match mode {
                Mode::Spin => {
                    let (i, role) = mine[0];
                    let _ = done.send(spin_worker(&world, role, seed * 1000 + i as u64));
                    return;
                }
                Mode::Tasks => {
                    tokio::runtime::Builder::new_multi_thread().worker_threads(3).enable_all().build()
                }
                Mode::Threads(_) => tokio::runtime::Builder::new_current_thread().enable_all().build(),
            }
            .unwrap();
            runtime.block_on(async {
                let workers: Vec<_> = mine
                    .into_iter()
                    .map(|(i, role)| {
                        tokio::spawn(worker(Arc::clone(&world), role, mode, seed * 1000 + i as u64))
                    })
                    .collect();
                for w in workers {
                    let _ = done.send(w.await.unwrap());
                }
            });
        }));
    }
    drop(done);
    let mut tally = Tally::default();
    for _ in 0..roles.len() {
        let left = (world.until + FINISH_WITHIN).saturating_duration_since(Instant::now());
        match finished.recv_timeout(left) {
            Ok(t) => tally.add(t),
            Err(_) => panic!(
                "{mode:?}/{policy:?}: requests still unfinished {FINISH_WITHIN:?} after the load stopped \
                 (a lost wake-up or a leaked in-flight count); violations so far: {:?}",
                checker.violations.lock().unwrap()
            ),
        }
    }
    for thread in threads {
        thread.join().unwrap();
    }
    let elapsed = started.elapsed();

    let violations = checker.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{mode:?}/{policy:?}: {violations:#?}");
    assert!(tally.other.is_empty(), "{mode:?}/{policy:?}: unexpected responses: {:?}", tally.other);
    let entered: u64 = checker.keys.iter().map(|k| k.lock().unwrap().entered).sum();
    for (key, k) in checker.keys.iter().enumerate() {
        assert_eq!(k.lock().unwrap().inside, None, "key {key}: somebody never left the handler");
    }
    match policy {
        InFlightPolicy::Drain => {
            assert_eq!(tally.cancelled, 0);
            assert_eq!(entered, tally.ok, "every 200, and only those, ran the handler");
        }
        _ => assert!((tally.ok..=tally.ok + tally.cancelled).contains(&entered)),
    }
    // The workload did what it is for: plenty of same-token traffic, raises, stale tokens.
    // (A spin duel is two requests a round; on a busy machine it may stop short of SPIN_ROUNDS.)
    let (ok, raises) = if mode == Mode::Spin { (500, 250) } else { (1000, 100) };
    assert!(tally.ok > ok && tally.raises > raises, "{tally:?}");
    if roles.contains(&Role::Mixed) {
        assert!(tally.seeds > 5 && tally.stale > 50, "{tally:?}");
    }

    // Afterwards every key's count is back to zero and nobody waits: a raise
    // enters at once, and then its token again (the fast path).
    let check = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    check.block_on(async {
        for key in 0..KEYS {
            let mark = store.mark(&path(key)).unwrap_or(0);
            for token in [mark + 1, mark + 1] {
                let call = world.service.clone().oneshot(request(key, token, 0));
                let response = tokio::time::timeout(Duration::from_secs(5), call)
                    .await
                    .unwrap_or_else(|_| panic!("key {key}: a raise to {token} after the run never entered"))
                    .unwrap();
                let rejection = response.extensions().get::<Rejection>();
                assert_eq!(response.status(), StatusCode::OK, "key {key}: {rejection:?}");
            }
        }
    });
    let marks: BTreeMap<_, _> = (0..KEYS).map(|k| (k, store.mark(&path(k)).unwrap_or(0))).collect();
    eprintln!("{mode:?}/{policy:?}: {elapsed:?}, {entered} entered, marks {marks:?}, {tally:?}");
}

const MIXED: [Role; 20] = [Role::Mixed; 20];
/// Per key (two of them): one raiser, two hammers of the current token.
const DUEL: [Role; 6] =
    [Role::Raiser(0), Role::Hammer(0), Role::Hammer(0), Role::Raiser(1), Role::Hammer(1), Role::Hammer(1)];
/// One key, two OS threads: as many truly parallel collisions as 2 cores allow.
const SPIN_DUEL: [Role; 2] = [Role::Raiser(0), Role::Hammer(0)];
/// Rounds a spin duel runs at least (each is about two admitted requests and a raise)...
const SPIN_ROUNDS: u64 = 700;
/// ...unless this long past the load time (within [`FINISH_WITHIN`]); the other
/// modes' grace to reach their volume too.
const GRACE: Duration = Duration::from_secs(6);

#[test]
fn mixed_drain_tasks() {
    run(Mode::Tasks, InFlightPolicy::Drain, &MIXED, 1);
}

#[test]
fn mixed_drain_os_threads() {
    run(Mode::Threads(5), InFlightPolicy::Drain, &MIXED, 2);
}

#[test]
fn mixed_cancel_tasks() {
    run(Mode::Tasks, InFlightPolicy::Cancel, &MIXED, 3);
}

#[test]
fn mixed_cancel_os_threads() {
    run(Mode::Threads(5), InFlightPolicy::Cancel, &MIXED, 4);
}

#[test]
fn duel_drain_tasks() {
    run(Mode::Tasks, InFlightPolicy::Drain, &DUEL, 5);
}

#[test]
fn duel_drain_os_threads() {
    run(Mode::Threads(6), InFlightPolicy::Drain, &DUEL, 6);
}

#[test]
fn duel_cancel_os_threads() {
    run(Mode::Threads(6), InFlightPolicy::Cancel, &DUEL, 7);
}

#[test]
fn spin_duel_drain() {
    run(Mode::Spin, InFlightPolicy::Drain, &SPIN_DUEL, 8);
}

#[test]
fn spin_duel_cancel() {
    run(Mode::Spin, InFlightPolicy::Cancel, &SPIN_DUEL, 9);
}
