//! Invariant 6 on the durable path: no panic, dropped future or failed write
//! leaves a token that nobody will record, every duration a user can set is
//! safe up to `Duration::MAX`, and each wait has the bound the contract names.
//! (Regressions from the review of 8b11eed; issue 17.)

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::common::{Probe, post_token, spawn_post};
use axum::body::Body;
use fencing_layer::{
    FencingLayer, MarkStore,
    store::{MarkLog, StoreError},
};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};

const HOUR: Duration = Duration::from_secs(3600);
/// Longer than any of these tests needs when it works, far shorter than the bounds.
const HANG: Duration = Duration::from_secs(10);

/// What the next write does.
enum Step {
    /// Blocks until the sender sends (then succeeds) or is dropped (then fails).
    Hold(mpsc::Receiver<()>),
    Delay(Duration),
}

/// An in-memory mark log that plays a script, one step per write; unscripted writes succeed.
#[derive(Clone, Default)]
struct ScriptedLog {
    script: Arc<Mutex<VecDeque<Step>>>,
    calls: Arc<AtomicUsize>,
}

impl ScriptedLog {
    fn then(&self, step: Step) -> &Self {
        self.script.lock().unwrap().push_back(step);
        self
    }

    /// The next write blocks until the returned sender sends or is dropped.
    fn hold(&self) -> mpsc::Sender<()> {
        let (release, gate) = mpsc::channel();
        self.then(Step::Hold(gate));
        release
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn store(&self, write_timeout: Duration) -> MarkStore {
        MarkStore::builder().write_timeout(write_timeout).durable(self.clone()).unwrap()
    }
}

impl MarkLog for ScriptedLog {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(Vec::new())
    }

    fn record(&self, _: &[(&str, u64)]) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let step = self.script.lock().unwrap().pop_front();
        match step {
            Some(Step::Hold(gate)) => {
                gate.recv().map_err(|_| StoreError::log(std::io::Error::other("disk full")))
            }
            Some(Step::Delay(delay)) => {
                std::thread::sleep(delay);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(HANG, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

#[tokio::test]
async fn a_retried_write_with_an_unbounded_write_timeout_neither_panics_nor_strands() {
    let log = ScriptedLog::default();
    let release = log.hold();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(log.store(Duration::MAX)).drain_timeout(HOUR));
    let first = spawn_post(&router, 1, 5);
    wait_until("the first write started", || log.calls() == 1).await;
    let second = spawn_post(&router, 1, 5);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The held write fails: the first request gets 503, the second one writes again.
    drop(release);
    assert_eq!(first.await.unwrap().status, StatusCode::SERVICE_UNAVAILABLE);
    let second =
        tokio::time::timeout(HANG, second).await.expect("the retry hung").expect("the retry panicked");
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(log.calls(), 2);
    assert_eq!(post_token(&router, 1, 5).await.status, StatusCode::OK);
}

#[tokio::test]
async fn an_unbounded_drain_timeout_after_a_durable_write_does_not_panic() {
    let log = ScriptedLog::default();
    let probe = Probe::default();
    let layer = FencingLayer::new().store(log.store(Duration::MAX)).drain_timeout(Duration::MAX);
    let router = probe.router(layer.retry_after(Duration::MAX));
    let one = probe.spawn_held(&router, 1, 1).await;
    // 2 is written, then waits for 1 to drain: the drain bound starts after the write.
    let two = spawn_post(&router, 1, 2);
    wait_until("2 was written", || log.calls() == 2).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!two.is_finished(), "2 entered while 1 was inside");
    probe.release(1);
    assert_eq!(one.await.unwrap().status, StatusCode::OK);
    assert_eq!(tokio::time::timeout(HANG, two).await.unwrap().unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn an_unbounded_retry_after_is_sent_as_the_largest_number_of_seconds() {
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().drain_timeout(Duration::ZERO).retry_after(Duration::MAX));
    let one = probe.spawn_held(&router, 1, 1).await;
    let two = post_token(&router, 1, 2).await;
    assert_eq!(two.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(two.headers["retry-after"], u64::MAX.to_string());
    probe.release(1);
    assert_eq!(one.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn waiting_on_another_requests_write_is_bounded_by_the_write_bound() {
    let log = ScriptedLog::default();
    log.then(Step::Delay(Duration::from_millis(200)));
    let probe = Probe::default();
    // Nobody is inside: a 50 ms drain bound has nothing to do with a 200 ms write.
    let layer =
        FencingLayer::new().store(log.store(Duration::from_secs(5))).drain_timeout(Duration::from_millis(50));
    let router = probe.router(layer);
    let writer = spawn_post(&router, 1, 3);
    wait_until("the write started", || log.calls() == 1).await;
    let waiter = post_token(&router, 1, 3).await;
    assert_eq!(waiter.status, StatusCode::OK, "{:?}", waiter.body);
    assert_eq!(writer.await.unwrap().status, StatusCode::OK);

    // And the write bound does apply to it: a stuck write answers the waiter 503 store-unavailable.
    let release = log.hold();
    let layer = FencingLayer::new().store(log.store(Duration::from_millis(100))).drain_timeout(HOUR);
    let router = probe.router(layer);
    let writer = spawn_post(&router, 2, 3);
    wait_until("the write started", || log.calls() == 2).await;
    let waiter = post_token(&router, 2, 3).await;
    assert_eq!(waiter.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(waiter.problem()["type"], "urn:fencing:problem:store-unavailable");
    assert_eq!(writer.await.unwrap().status, StatusCode::SERVICE_UNAVAILABLE);
    drop(release);
}

#[tokio::test]
async fn seeding_a_token_that_is_being_written_lets_its_waiters_in() {
    let log = ScriptedLog::default();
    let release = log.hold();
    let store = log.store(HOUR);
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store.clone()).drain_timeout(HOUR));
    let writer = spawn_post(&router, 1, 4);
    wait_until("the write started", || log.calls() == 1).await;
    let waiter = spawn_post(&router, 1, 4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    // An operator (or a migration) makes 4 durable by another way.
    let seeded = store.clone();
    tokio::task::spawn_blocking(move || seeded.seed("/r/1", 4)).await.unwrap().unwrap();
    let waiter = tokio::time::timeout(HANG, waiter).await.expect("the seed woke nobody").unwrap();
    assert_eq!(waiter.status, StatusCode::OK);
    release.send(()).unwrap();
    assert_eq!(writer.await.unwrap().status, StatusCode::OK);
}

/// An inner service whose `Clone` panics while armed.
struct PanicOnClone {
    armed: Arc<AtomicBool>,
}

impl Clone for PanicOnClone {
    fn clone(&self) -> Self {
        assert!(!self.armed.load(Ordering::SeqCst), "the inner service's clone panicked (on purpose)");
        Self { armed: Arc::clone(&self.armed) }
    }
}

impl Service<Request<Body>> for PanicOnClone {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
}

fn fenced_post(token: u64) -> Request<Body> {
    Request::post("/r/1").header("fencing-token", token).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn a_panic_after_being_told_to_record_hands_the_write_back() {
    quiet_deliberate_panics();
    let log = ScriptedLog::default();
    let armed = Arc::new(AtomicBool::new(true));
    let layer = FencingLayer::new().store(log.store(HOUR)).drain_timeout(HOUR);
    let mut service = layer.layer(PanicOnClone { armed: Arc::clone(&armed) });
    let ready = service.ready().await.unwrap();
    // `call` is told to record 5, then panics cloning the inner service before it submits.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ready.call(fenced_post(5))));
    assert!(panicked.is_err());
    assert_eq!(log.calls(), 0);
    armed.store(false, Ordering::SeqCst);
    let response = tokio::time::timeout(HANG, service.ready().await.unwrap().call(fenced_post(5)))
        .await
        .expect("token 5 was stranded")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(log.calls(), 1);
}

#[tokio::test]
async fn a_raising_request_dropped_mid_write_leaves_nothing_stranded() {
    let log = ScriptedLog::default();
    log.then(Step::Delay(Duration::from_millis(100)));
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(log.store(HOUR)).drain_timeout(HOUR));
    // The client goes away while its raise is being written; the write finishes anyway.
    let gone = spawn_post(&router, 1, 6);
    wait_until("the write started", || log.calls() == 1).await;
    gone.abort();
    let next = tokio::time::timeout(HANG, post_token(&router, 1, 6)).await.expect("token 6 was stranded");
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(log.calls(), 1, "the dropped request's write counted");
}

/// Per key: the token inside the handler and how many carry it, and the last token admitted.
#[derive(Default)]
struct Ledger {
    keys: Mutex<HashMap<u64, (u64, usize, u64)>>,
    violations: Mutex<Vec<String>>,
}

impl Ledger {
    fn enter(&self, key: u64, token: u64) {
        let mut keys = self.keys.lock().unwrap();
        let (inside, count, last) = keys.entry(key).or_default();
        if *count > 0 && *inside != token {
            self.violations.lock().unwrap().push(format!("key {key}: {token} entered while {inside} inside"));
        }
        if token < *last {
            self.violations.lock().unwrap().push(format!("key {key}: {token} admitted after {last}"));
        }
        (*inside, *count, *last) = (token, *count + 1, token.max(*last));
    }

    fn leave(&self, key: u64) {
        self.keys.lock().unwrap().get_mut(&key).unwrap().1 -= 1;
    }
}

struct Leave<'a>(&'a Ledger, u64);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

/// Random seeds of a small xorshift, so that a failing run can be replayed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

// Both bounds are an hour, so any 503 or hang is a liveness bug; handlers panic,
// requests are dropped at random points (waiting, writing, inside), writes are slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_path_stress_with_drops_and_panics_never_strands_a_token() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("DURABLE_STRESS_SEED").unwrap_or(0x5eed);
    let rounds = env("DURABLE_STRESS_ROUNDS").unwrap_or(60);
    let log = ScriptedLog::default();
    let mut rng = seed;
    for _ in 0..200 {
        log.then(Step::Delay(Duration::from_micros(next(&mut rng) % 2000)));
    }
    quiet_deliberate_panics();
    let ledger = Arc::new(Ledger::default());
    let (handler_ledger, chaos, calls) =
        (Arc::clone(&ledger), Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
    let handler_chaos = Arc::clone(&chaos);
    let handler = move |axum::extract::Path(key): axum::extract::Path<u64>,
                        token: fencing_layer::FencingToken| {
        let (ledger, chaos, calls) =
            (Arc::clone(&handler_ledger), Arc::clone(&handler_chaos), Arc::clone(&calls));
        async move {
            ledger.enter(key, token.get());
            let _leave = Leave(&ledger, key);
            let call = calls.fetch_add(1, Ordering::SeqCst) as u64;
            tokio::time::sleep(Duration::from_micros(call % 13 * 100)).await;
            assert!(call % 7 != 3 || !chaos.load(Ordering::SeqCst), "the handler panicked (on purpose)");
            "ok"
        }
    };
    let layer = FencingLayer::new().store(log.store(HOUR)).drain_timeout(HOUR);
    let router = axum::Router::new().route("/r/{key}", axum::routing::post(handler)).route_layer(layer);

    let mut tasks = Vec::new();
    for worker in 0..16_u64 {
        let router = router.clone();
        let mut rng = seed ^ (worker + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
        tasks.push(tokio::spawn(async move {
            let (mut seen, mut counts) = (Vec::new(), [0_u64; 4]);
            for round in 0..rounds {
                let key = next(&mut rng) % 3;
                // Mostly the current holder, sometimes a raise, sometimes stale.
                let token = round / 4 + next(&mut rng) % 3;
                let request = tokio::spawn(post_token_owned(router.clone(), key, token));
                if next(&mut rng).is_multiple_of(5) {
                    tokio::time::sleep(Duration::from_micros(next(&mut rng) % 3000)).await;
                    request.abort();
                    counts[3] += 1;
                    continue;
                }
                match tokio::time::timeout(HANG, request).await {
                    Err(_) => seen.push(format!("key {key} token {token}: hung")),
                    Ok(Err(join)) if join.is_panic() => counts[2] += 1, // the handler's own panic
                    Ok(Err(join)) => seen.push(format!("key {key} token {token}: {join}")),
                    Ok(Ok(StatusCode::OK)) => counts[0] += 1,
                    Ok(Ok(StatusCode::CONFLICT)) => counts[1] += 1,
                    Ok(Ok(status)) => seen.push(format!("key {key} token {token}: {status}")),
                }
            }
            (seen, counts)
        }));
    }
    let (mut failures, mut counts) = (Vec::new(), [0_u64; 4]);
    for task in tasks {
        let (seen, some) = task.await.unwrap();
        failures.extend(seen);
        counts.iter_mut().zip(some).for_each(|(all, n)| *all += n);
    }
    failures.extend(ledger.violations.lock().unwrap().iter().cloned());
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
    let [admitted, stale, panicked, dropped] = counts;
    eprintln!(
        "seed {seed}: {admitted} admitted, {stale} stale, {panicked} handler panics, {dropped} dropped, {} writes",
        log.calls()
    );
    assert!(admitted > rounds, "seed {seed}: only {admitted} requests were admitted");
    assert!(panicked > 0 && dropped > 0, "seed {seed}: the chaos did not happen");
    // Every key still takes a raise, and its holder's requests after it.
    chaos.store(false, Ordering::SeqCst);
    for key in 0..3 {
        for _ in 0..2 {
            assert_eq!(post_token_owned(router.clone(), key, u64::MAX - 1).await, StatusCode::OK);
        }
    }
}

/// Keeps the handlers' deliberate panics out of the test output; any other panic prints as usual.
fn quiet_deliberate_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or(payload.downcast_ref::<String>().map(String::as_str));
            let message = message.unwrap_or_default();
            if !message.contains("(on purpose)") {
                default(info);
            }
        }));
    });
}

async fn post_token_owned(router: axum::Router, key: u64, token: u64) -> StatusCode {
    let request =
        Request::post(format!("/r/{key}")).header("fencing-token", token).body(Body::empty()).unwrap();
    router.oneshot(request).await.unwrap().status()
}
