//! Invariant 3 with the redb store: a raise is on disk before the raising
//! request is admitted, requests with a recorded token do no disk I/O, and a
//! restart never lowers a mark.
#![cfg(feature = "redb")]

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::{Event, Probe, post_token};
use fencing_layer::{FencingLayer, MarkLog, MarkStore, RedbMarkLog, StoreError};
use http::StatusCode;

/// A redb log that counts writes and can be made to block until released.
#[derive(Clone)]
struct Watched {
    log: Arc<RedbMarkLog>,
    writes: Arc<AtomicUsize>,
    gate: Arc<Mutex<Option<mpsc::Receiver<()>>>>,
}

impl Watched {
    fn open(path: &Path) -> Self {
        let log = Arc::new(RedbMarkLog::open(path).unwrap());
        Self { log, writes: Arc::default(), gate: Arc::default() }
    }

    fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }
}

impl MarkLog for Watched {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.log.load()
    }

    fn record(&self, raises: &[(&str, u64)]) -> Result<(), StoreError> {
        if let Some(gate) = self.gate.lock().unwrap().as_ref() {
            gate.recv().unwrap();
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
    let log = Watched::open(&path);
    let (release, gate) = mpsc::channel();
    *log.gate.lock().unwrap() = Some(gate);
    let store = MarkStore::builder().durable(log.clone()).unwrap();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store.clone()));

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
async fn many_raises_share_writes_and_all_survive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let log = Watched::open(&path);
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(MarkStore::builder().durable(log.clone()).unwrap()));
    let raises: Vec<_> = (0..64)
        .map(|key| {
            let router = router.clone();
            tokio::spawn(async move { post_token(&router, key, key + 1).await.status })
        })
        .collect();
    for raise in raises {
        assert_eq!(raise.await.unwrap(), StatusCode::OK);
    }
    assert!(log.writes() <= 64);
    drop((router, log));
    let store = MarkStore::open(&path).unwrap();
    for key in 0..64 {
        assert_eq!(store.mark(&format!("/r/{key}")), Some(key + 1));
    }
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
