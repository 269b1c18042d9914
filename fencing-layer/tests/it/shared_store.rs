//! The layer's side of a `SharedStore`: each refusal becomes its rejection,
//! the permit is held exactly while the request is inside, the token reaches
//! the handler, and a store that never answers is bounded. (The contract kept
//! across replicas on PostgreSQL is tested in fencing-postgres.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Probe, post_token};
use fencing_layer::{
    FencingLayer, MarkStore,
    store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore, StoreError},
};
use http::StatusCode;

/// Answers with `answer`, counting the permits alive.
#[derive(Clone, Default)]
struct Scripted {
    answer: Arc<Mutex<Option<SharedRefusal>>>,
    hang: Arc<Mutex<bool>>,
    alive: Arc<AtomicUsize>,
    asked: Arc<Mutex<Vec<(String, u64, Duration)>>>,
}

struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SharedStore for Scripted {
    fn admit(&self, key: &str, token: u64, drain: Duration) -> SharedAdmission {
        self.asked.lock().unwrap().push((key.to_owned(), token, drain));
        let (answer, hang, alive) =
            (self.answer.lock().unwrap().clone(), *self.hang.lock().unwrap(), self.alive.clone());
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            match answer {
                Some(refusal) => Err(refusal),
                None => {
                    alive.fetch_add(1, Ordering::SeqCst);
                    Ok(SharedPermit::new(Alive(alive)))
                }
            }
        })
    }
}

#[tokio::test]
async fn the_permit_is_held_while_inside_and_the_token_reaches_the_handler() {
    let store = Scripted::default();
    let probe = Probe::default();
    let layer = FencingLayer::new().drain_timeout(Duration::from_secs(3)).shared_store(store.clone());
    let local = layer.mark_store().clone();
    let router = probe.router(layer);
    let inside = probe.spawn_held(&router, 1, 4).await;
    assert_eq!(store.alive.load(Ordering::SeqCst), 1);
    probe.release(4);
    assert_eq!(inside.await.unwrap().status, StatusCode::OK);
    assert_eq!(store.alive.load(Ordering::SeqCst), 0, "the permit outlived the request");
    assert_eq!(*store.asked.lock().unwrap(), [("/r/1".to_owned(), 4, Duration::from_secs(3))]);
    assert_eq!(local.len(), 0, "the in-process table was used");
}

#[tokio::test]
async fn each_refusal_is_its_rejection() {
    let store = Scripted::default();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().shared_store(store.clone()));
    let cases = [
        (SharedRefusal::Stale { highest: 9 }, 409, "stale-token"),
        (SharedRefusal::DrainTimeout, 503, "drain-timeout"),
        (SharedRefusal::KeyTooLong { limit: 8 }, 400, "key-too-long"),
        (SharedRefusal::InvalidKey("no NULs"), 400, "missing-key"),
        (SharedRefusal::Unavailable(StoreError::Closed), 503, "store-unavailable"),
    ];
    for (refusal, status, kind) in cases {
        *store.answer.lock().unwrap() = Some(refusal);
        let reply = post_token(&router, 1, 5).await;
        assert_eq!(reply.status.as_u16(), status, "{kind}");
        assert_eq!(reply.problem()["type"], format!("urn:fencing:problem:{kind}"));
        if status == 503 {
            assert!(reply.headers.contains_key("retry-after"), "{kind}");
        }
    }
    assert_eq!(probe.events(), [], "a refused request reached the handler");
}

#[tokio::test(start_paused = true)]
async fn a_store_that_never_answers_is_bounded_by_drain_plus_write_bounds() {
    let store = Scripted::default();
    *store.hang.lock().unwrap() = true;
    let probe = Probe::default();
    let marks = MarkStore::builder().write_timeout(Duration::from_secs(2)).in_memory();
    let layer = FencingLayer::new().store(marks).drain_timeout(Duration::from_secs(1)).shared_store(store);
    let router = probe.router(layer);
    let started = tokio::time::Instant::now();
    let reply = post_token(&router, 1, 5).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.problem()["type"], "urn:fencing:problem:store-unavailable");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}
