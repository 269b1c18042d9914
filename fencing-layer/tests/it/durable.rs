//! Invariant 3 with the redb store: a raise is on disk before the raising
//! request is admitted, requests with a recorded token do no disk I/O, and a
//! restart never lowers a mark.
#![cfg(feature = "redb")]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::common::{Event, Probe, post_token, spawn_post};
use fencing_layer::{
    FencingLayer, InFlightPolicy, MarkStore,
    store::{MarkLog, RedbMarkLog, StoreError},
};
use http::StatusCode;

/// A redb log that counts writes and can be made to block until released.
#[derive(Clone)]
struct Watched {
    log: Arc<RedbMarkLog>,
    writes: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    gate: Arc<Mutex<Option<mpsc::Receiver<()>>>>,
}

impl Watched {
    fn open(path: &Path) -> Self {
        let log = Arc::new(RedbMarkLog::open(path).unwrap());
        Self { log, writes: Arc::default(), calls: Arc::default(), gate: Arc::default() }
    }

    fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// A log at `path` whose writes each wait for a send on the returned sender
    /// (dropping it fails the waiting write and opens the gate for good), and a
    /// router fenced over it, with the store and the probe.
    fn gated(path: &Path) -> (Self, mpsc::Sender<()>, MarkStore, Probe, axum::Router) {
        let log = Self::open(path);
        let (release, gate) = mpsc::channel();
        *log.gate.lock().unwrap() = Some(gate);
        let store = MarkStore::builder().durable(log.clone()).unwrap();
        let probe = Probe::default();
        let router = probe.router(FencingLayer::new().store(store.clone()));
        (log, release, store, probe, router)
    }
}

impl MarkLog for Watched {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.log.load()
    }

    fn record(&self, raises: &[(&str, u64)]) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let gate = self.gate.lock().unwrap().take();
        if let Some(gate) = gate {
            // A closed gate fails this write and opens for good.
            gate.recv().map_err(|_| StoreError::log(std::io::Error::other("gate closed")))?;
            *self.gate.lock().unwrap() = Some(gate);
        }
        self.log.record(raises)?;
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn a_restart_never_lowers_a_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    {
        let probe = Probe::default();
        let router = probe.router(FencingLayer::new().store(MarkStore::open(&path).unwrap()));
        for token in [5, 7, 7] {
            assert_eq!(post_token(&router, 1, token).await.status, StatusCode::OK);
        }
        assert_eq!(post_token(&router, 2, 3).await.status, StatusCode::OK);
        // Everything, store and writer thread included, goes away here.
    }
    let store = MarkStore::open(&path).unwrap();
    assert_eq!((store.mark("/r/1"), store.mark("/r/2"), store.len()), (Some(7), Some(3), 2));
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store));
    assert_eq!(post_token(&router, 1, 6).await.status, StatusCode::CONFLICT);
    assert_eq!(post_token(&router, 1, 7).await.status, StatusCode::OK);
    assert_eq!(post_token(&router, 2, 2).await.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn recorded_tokens_do_no_disk_io() {
    let dir = tempfile::tempdir().unwrap();
    let log = Watched::open(&dir.path().join("marks.redb"));
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(MarkStore::builder().durable(log.clone()).unwrap()));
    assert_eq!(post_token(&router, 1, 5).await.status, StatusCode::OK);
    assert_eq!(log.writes(), 1);
    for _ in 0..50 {
        assert_eq!(post_token(&router, 1, 5).await.status, StatusCode::OK);
    }
    assert_eq!(post_token(&router, 1, 4).await.status, StatusCode::CONFLICT);
    assert_eq!(log.writes(), 1, "equal and stale tokens wrote to disk");
    assert_eq!(post_token(&router, 1, 6).await.status, StatusCode::OK);
    assert_eq!(log.writes(), 2);
}

#[tokio::test]
async fn a_raise_is_on_disk_before_anyone_with_its_token_enters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let (log, release, store, probe, router) = Watched::gated(&path);

    let raises: Vec<_> = (0..2)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move { post_token(&router, 1, 9).await.status })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The write is blocked: the mark is raised in memory, nobody has entered.
    assert_eq!(store.mark("/r/1"), Some(9));
    assert_eq!(probe.events(), []);
    assert_eq!(post_token(&router, 1, 8).await.status, StatusCode::CONFLICT);
    release.send(()).unwrap();
    for raise in raises {
        assert_eq!(raise.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(probe.events().iter().filter(|e| matches!(e, Event::Enter(1, 9))).count(), 2);
    assert_eq!(log.writes(), 1, "two requests with one new token wrote it twice");
    // And it is on disk: a second reader sees it.
    drop(router);
    drop(store);
    drop(log);
    assert_eq!(MarkStore::open(&path).unwrap().mark("/r/1"), Some(9));
}

#[tokio::test]
async fn raises_queued_behind_a_write_share_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let (log, release, store, _, router) = Watched::gated(&path);
    let raises: Vec<_> = (0..64)
        .map(|key| {
            let router = router.clone();
            tokio::spawn(async move { post_token(&router, key, key + 1).await.status })
        })
        .collect();
    // On this single-threaded runtime, a raised mark means its request has also
    // queued its write: both happen in one synchronous `call`.
    while (0..64).any(|key| store.mark(&format!("/r/{key}")).is_none()) {
        tokio::task::yield_now().await;
    }
    // The writer holds the first raise; the other 63 wait behind it.
    release.send(()).unwrap();
    release.send(()).unwrap();
    for raise in raises {
        assert_eq!(raise.await.unwrap(), StatusCode::OK);
    }
    // The first write took whatever was queued when the writer woke; the rest share the second.
    assert!(log.writes() <= 2, "64 queued raises took {} writes", log.writes());
    drop((router, store, log));
    let store = MarkStore::open(&path).unwrap();
    for key in 0..64 {
        assert_eq!(store.mark(&format!("/r/{key}")), Some(key + 1));
    }
}

/// A log that takes `delay` per write, and can be told to fail or panic.
struct Slow {
    delay: Duration,
    fail: Arc<Mutex<Option<&'static str>>>,
}

impl MarkLog for Slow {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(Vec::new())
    }

    fn record(&self, _: &[(&str, u64)]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        let mode = *self.fail.lock().unwrap();
        match mode {
            Some("panic") => panic!("the disk caught fire"),
            Some(_) => Err(StoreError::log(std::io::Error::other("disk full"))),
            None => Ok(()),
        }
    }
}

#[tokio::test]
async fn the_write_has_its_own_bound_apart_from_the_drain() {
    let log = Slow { delay: Duration::from_millis(100), fail: Arc::default() };
    let store = MarkStore::builder().write_timeout(Duration::from_secs(10)).durable(log).unwrap();
    let probe = Probe::default();
    // A drain bound far shorter than the write: raises on an idle key must still succeed.
    let router = probe.router(FencingLayer::new().store(store).drain_timeout(Duration::ZERO));
    for token in 1..=3 {
        assert_eq!(post_token(&router, 1, token).await.status, StatusCode::OK);
    }
    let log = Slow { delay: Duration::from_millis(300), fail: Arc::default() };
    let store = MarkStore::builder().write_timeout(Duration::from_millis(50)).durable(log).unwrap();
    let router = probe.router(FencingLayer::new().store(store));
    let reply = post_token(&router, 1, 1).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.problem()["type"], "urn:fencing:problem:store-unavailable");
    assert!(reply.problem()["detail"].as_str().unwrap().contains("did not confirm"));
}

#[tokio::test]
async fn a_panicking_log_fails_the_raise_and_the_next_one_tries_again() {
    let fail = Arc::new(Mutex::new(Some("panic")));
    let store = MarkStore::builder().durable(Slow { delay: Duration::ZERO, fail: fail.clone() }).unwrap();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store));
    let reply = post_token(&router, 1, 5).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(reply.problem()["detail"].as_str().unwrap().contains("panicked"));
    *fail.lock().unwrap() = None;
    assert_eq!(post_token(&router, 1, 5).await.status, StatusCode::OK);
    assert_eq!(probe.events(), [Event::Enter(1, 5), Event::Exit(1, 5)]);
}

#[tokio::test]
async fn a_raise_overtaken_while_its_write_fails_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let (log, release, store, probe, router) = Watched::gated(&dir.path().join("marks.redb"));
    let five = spawn_post(&router, 1, 5);
    // Wait until the writer is inside the write of 5, so 7 gets a write of its own.
    while log.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let seven = spawn_post(&router, 1, 7);
    while store.mark("/r/1") != Some(7) {
        tokio::task::yield_now().await;
    }
    // Close the gate: the blocked write of 5 fails; 7's own write then succeeds.
    drop(release);
    let five = five.await.unwrap();
    assert_eq!(five.status, StatusCode::CONFLICT, "{:?}", five.body);
    assert_eq!(five.problem()["highest_token"], 7);
    assert_eq!(seven.await.unwrap().status, StatusCode::OK);
    assert_eq!(probe.events(), [Event::Enter(1, 7), Event::Exit(1, 7)]);
}

// Real time: a paused clock would jump past the write bound while the writer thread works.
#[tokio::test]
async fn the_cancel_policy_works_with_a_durable_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = MarkStore::open(dir.path().join("marks.redb")).unwrap();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store).in_flight_policy(InFlightPolicy::Cancel));
    let first = probe.spawn_held(&router, 0, 1).await;
    assert_eq!(post_token(&router, 0, 2).await.status, StatusCode::OK);
    assert_eq!(first.await.unwrap().status, StatusCode::CONFLICT);
    assert_eq!(
        probe.events(),
        [Event::Enter(0, 1), Event::Dropped(0, 1), Event::Enter(0, 2), Event::Exit(0, 2)]
    );
}

#[test]
fn loaded_marks_count_toward_the_limit_and_are_all_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let store = MarkStore::open(&path).unwrap();
    for key in ["a", "b", "c"] {
        store.seed(key, 3).unwrap();
    }
    assert_eq!(store.seed("a", 2), Ok(3), "seeding lowered a mark");
    drop(store);
    let store = MarkStore::builder().max_keys(2).open(&path).unwrap();
    assert_eq!(store.len(), 3);
    assert_eq!(store.mark("c"), Some(3));
    assert_eq!(store.seed("d", 1), Err(StoreError::KeyTableFull { limit: 2 }));
    assert_eq!(store.seed("c", 4), Ok(4));
}

#[test]
fn reopening_while_any_clone_lives_names_the_path_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let store = MarkStore::open(&path).unwrap();
    let layer = FencingLayer::new().store(store.clone());
    drop(store);

    // The layer's clone still holds the file's lock.
    let error = MarkStore::open(&path).expect_err("the file is locked while a clone lives");
    assert_eq!(error, StoreError::AlreadyOpen { path: path.clone() });
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("cannot open the mark store {}: it is already open", path.display())),
        "{message}"
    );
    assert!(
        message.contains("in this process")
            && message.contains("any clone")
            && message.contains("another process"),
        "{message}"
    );
    assert_eq!(RedbMarkLog::open(&path).err(), Some(StoreError::AlreadyOpen { path: path.clone() }));

    // Once the last clone is gone, the file opens again.
    drop(layer);
    MarkStore::open(&path).unwrap();
}

#[test]
fn an_open_error_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("marks.redb");
    let error = MarkStore::open(&path).expect_err("the directory does not exist");
    assert!(matches!(&error, StoreError::Open { path: p, .. } if *p == path), "{error:?}");
    let message = error.to_string();
    assert!(message.starts_with(&format!("cannot open the mark store {}: ", path.display())), "{message}");
    assert!(std::error::Error::source(&error).is_some());
}
