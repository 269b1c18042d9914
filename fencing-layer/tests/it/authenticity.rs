//! Token authenticity: the verifier is asked before a raise and only then; a
//! refused or unanswered raise leaves the mark as it was and admits nothing;
//! an operator's reset lowers a mark and the rules carry on from it. Time is
//! tokio's paused clock where a bound is measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{Event, Probe, Reply, post_token, spawn_post};
use axum::Router;
use axum::body::Body;
use fencing_layer::{
    FencingLayer, InFlightPolicy, MarkStore,
    store::{SharedPermit, SharedRefusal, SharedStore},
    verify::{Raise, Verification, verify_fn},
};
use http::{Request, StatusCode};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};
use tower::ServiceExt;

/// Counts the raises it is asked about and answers with `answer`.
fn counting(
    answer: impl Fn(&Raise<'_>) -> Verification + Send + Sync + 'static,
) -> (impl fencing_layer::verify::TokenVerifier, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let verifier = verify_fn(move |raise| {
        counter.fetch_add(1, Ordering::SeqCst);
        answer(raise)
    });
    (verifier, calls)
}

/// A counting verifier that takes tokens below 100 and refuses the rest as forged.
fn below_100() -> (impl fencing_layer::verify::TokenVerifier, Arc<AtomicUsize>) {
    counting(
        |raise| if raise.token() < 100 { Verification::valid() } else { Verification::refused("forged") },
    )
}

fn key(n: u64) -> String {
    format!("/r/{n}")
}

#[tokio::test]
async fn the_verifier_is_asked_only_before_a_raise() {
    let (verifier, calls) = counting(|_| Verification::valid());
    let store = MarkStore::in_memory();
    let router = Probe::default().router(FencingLayer::new().store(store.clone()).verifier(verifier));
    let mut statuses = Vec::new();
    for token in [5, 5, 5, 4, 6, 6, 5, 6] {
        statuses.push(post_token(&router, 0, token).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 409, 200, 200, 409, 200]);
    assert_eq!(calls.load(Ordering::SeqCst), 2, "asked about 5 and 6, never about equal or stale tokens");
    assert_eq!(store.mark(&key(0)), Some(6));
}

#[tokio::test]
async fn a_refused_raise_gets_403_and_leaves_the_mark_as_it_was() {
    let (verifier, calls) = counting(|raise| {
        if raise.token() <= 100 {
            Verification::valid()
        } else {
            Verification::refused(format!("token {} was never granted", raise.token()))
        }
    });
    let store = MarkStore::in_memory();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store.clone()).verifier(verifier));
    assert_eq!(post_token(&router, 0, 5).await.status, StatusCode::OK);

    let forged = post_token(&router, 0, u64::MAX).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let problem = forged.problem();
    assert_eq!(problem["type"], "urn:fencing:problem:unverified-token");
    assert_eq!(problem["presented_token"], u64::MAX);
    assert!(problem["detail"].as_str().unwrap().contains("was never granted"), "{problem}");
    assert_eq!(store.mark(&key(0)), Some(5), "a refused raise changed the mark");

    // The honest holder goes on, and the next genuine holder can still raise.
    assert_eq!(post_token(&router, 0, 5).await.status, StatusCode::OK);
    assert_eq!(post_token(&router, 0, 6).await.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(probe.events().iter().filter(|e| matches!(e, Event::Enter(..))).count(), 3);
}

#[tokio::test]
async fn a_verifier_that_cannot_answer_gets_503_and_admits_nothing() {
    let (verifier, _) = counting(|_| Verification::unavailable("the lock service is down"));
    let store = MarkStore::in_memory();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store.clone()).verifier(verifier));
    let reply = post_token(&router, 0, 3).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    let problem = reply.problem();
    assert_eq!(problem["type"], "urn:fencing:problem:verifier-unavailable");
    assert!(problem["detail"].as_str().unwrap().contains("the lock service is down"), "{problem}");
    assert_eq!(store.mark(&key(0)).unwrap_or(0), 0);
    assert!(probe.events().is_empty(), "a request got in unverified");
}

#[tokio::test(start_paused = true)]
async fn a_verifier_that_does_not_answer_in_time_gets_503_at_the_bound() {
    let (verifier, _) = counting(|_| Verification::later(std::future::pending()));
    let store = MarkStore::in_memory();
    let probe = Probe::default();
    let layer =
        FencingLayer::new().store(store.clone()).verifier(verifier).verify_timeout(Duration::from_secs(3));
    let router = probe.router(layer);
    let started = Instant::now();
    let reply = post_token(&router, 0, 3).await;
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.problem()["type"], "urn:fencing:problem:verifier-unavailable");
    assert_eq!(store.mark(&key(0)).unwrap_or(0), 0);
    assert!(probe.events().is_empty());
}

/// A verifier whose answers the test gives, one raise at a time, by token.
#[derive(Clone, Default)]
struct Answers(Arc<std::sync::Mutex<std::collections::HashMap<u64, oneshot::Receiver<bool>>>>);

impl Answers {
    fn expect(&self, token: u64) -> oneshot::Sender<bool> {
        let (answer, asked) = oneshot::channel();
        self.0.lock().unwrap().insert(token, asked);
        answer
    }

    fn verifier(&self) -> impl fencing_layer::verify::TokenVerifier {
        let answers = self.clone();
        verify_fn(move |raise| match answers.0.lock().unwrap().remove(&raise.token()) {
            Some(asked) => Verification::later(async move {
                match asked.await {
                    Ok(true) => Ok(()),
                    _ => Err(fencing_layer::verify::VerifyError::Refused("refused by the test".into())),
                }
            }),
            None => Verification::valid(),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn the_holder_carries_on_while_a_raise_is_verified_and_the_raise_then_drains() {
    let answers = Answers::default();
    let answer = answers.expect(7);
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().verifier(answers.verifier()));
    assert_eq!(post_token(&router, 0, 5).await.status, StatusCode::OK);
    let inside = probe.spawn_held(&router, 0, 5).await;

    let raise = spawn_post(&router, 0, 7);
    sleep(Duration::from_millis(500)).await;
    // Not raised yet: the holder's requests are still admitted while 7 is verified.
    let again = spawn_post(&router, 0, 5);
    probe.wait_for(Event::Enter(0, 5)).await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(probe.events().iter().filter(|e| **e == Event::Enter(0, 5)).count(), 3);

    answer.send(true).unwrap();
    sleep(Duration::from_millis(500)).await;
    // Verified and raised: 5 is stale now, and 7 waits for the two inside.
    assert_eq!(post_token(&router, 0, 5).await.status, StatusCode::CONFLICT);
    assert!(!probe.events().contains(&Event::Enter(0, 7)), "7 entered while 5 was inside");
    probe.release(5);
    assert_eq!(inside.await.unwrap().status, StatusCode::OK);
    assert_eq!(again.await.unwrap().status, StatusCode::OK);
    assert_eq!(raise.await.unwrap().status, StatusCode::OK);
    let events = probe.events();
    let first_seven = events.iter().position(|e| *e == Event::Enter(0, 7)).unwrap();
    assert!(events[..first_seven].iter().filter(|e| matches!(e, Event::Exit(0, 5))).count() == 3);
}

#[tokio::test(start_paused = true)]
async fn a_raise_overtaken_while_it_was_verified_is_stale() {
    let answers = Answers::default();
    let answer = answers.expect(7);
    let store = MarkStore::in_memory();
    let router =
        Probe::default().router(FencingLayer::new().store(store.clone()).verifier(answers.verifier()));
    let slow = spawn_post(&router, 0, 7);
    sleep(Duration::from_millis(100)).await;
    assert_eq!(post_token(&router, 0, 9).await.status, StatusCode::OK);
    answer.send(true).unwrap();
    let reply = slow.await.unwrap();
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(reply.problem()["highest_token"], 9);
    assert_eq!(store.mark(&key(0)), Some(9));
}

#[tokio::test(start_paused = true)]
async fn under_the_cancel_policy_a_refused_raise_cancels_nobody() {
    let (verifier, _) = below_100();
    let probe = Probe::default();
    let router =
        probe.router(FencingLayer::new().in_flight_policy(InFlightPolicy::Cancel).verifier(verifier));
    let inside = probe.spawn_held(&router, 0, 5).await;
    assert_eq!(post_token(&router, 0, 1000).await.status, StatusCode::FORBIDDEN);
    sleep(Duration::from_millis(100)).await;
    probe.release(5);
    assert_eq!(inside.await.unwrap().status, StatusCode::OK, "the forged token cancelled the holder");
    assert_eq!(probe.events(), [Event::Enter(0, 5), Event::Exit(0, 5)]);
    // A genuine raise still cancels, as the policy says.
    let inside = probe.spawn_held(&router, 0, 5).await;
    assert_eq!(post_token(&router, 0, 6).await.status, StatusCode::OK);
    assert_eq!(inside.await.unwrap().status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn after_a_reset_the_rules_carry_on_from_the_new_mark() {
    let store = MarkStore::in_memory();
    let router = Probe::default().router(FencingLayer::new().store(store.clone()));
    // A token from nowhere got in before there was a verifier: the key is bricked.
    assert_eq!(post_token(&router, 0, u64::MAX - 1).await.status, StatusCode::OK);
    assert_eq!(post_token(&router, 0, 41).await.status, StatusCode::CONFLICT);

    assert_eq!(store.reset(&key(0), 40).unwrap(), Some(u64::MAX - 1));
    assert_eq!(store.mark(&key(0)), Some(40));
    assert_eq!(store.marks(), [(key(0), 40)]);
    assert_eq!(post_token(&router, 0, 39).await.status, StatusCode::CONFLICT, "below the new mark");
    assert_eq!(post_token(&router, 0, u64::MAX - 1).await.status, StatusCode::OK, "above it: a raise");
    assert_eq!(store.reset(&key(0), 41).unwrap(), Some(u64::MAX - 1));
    assert_eq!(post_token(&router, 0, 41).await.status, StatusCode::OK, "equal to it");
    assert_eq!(post_token(&router, 0, 40).await.status, StatusCode::CONFLICT);
    // A key never seen: reset makes it, and says there was none.
    assert_eq!(store.reset(&key(1), 7).unwrap(), None);
    assert_eq!(post_token(&router, 1, 6).await.status, StatusCode::CONFLICT);
}

#[tokio::test(start_paused = true)]
async fn a_reset_keeps_holders_apart_from_those_inside() {
    let store = MarkStore::in_memory();
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().store(store.clone()));
    let inside = probe.spawn_held(&router, 0, 10).await;
    store.reset(&key(0), 3).unwrap();
    // 4 is above the new mark, but 10 is still inside: 4 waits for it to leave.
    let next = spawn_post(&router, 0, 4);
    sleep(Duration::from_secs(1)).await;
    assert!(!probe.events().contains(&Event::Enter(0, 4)), "two holders were inside at once");
    assert_eq!(store.mark(&key(0)), Some(4), "4 raised the reset mark and waits");
    assert_eq!(post_token(&router, 0, 3).await.status, StatusCode::CONFLICT);
    probe.release(10);
    assert_eq!(inside.await.unwrap().status, StatusCode::OK);
    assert_eq!(next.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        probe.events(),
        [Event::Enter(0, 10), Event::Exit(0, 10), Event::Enter(0, 4), Event::Exit(0, 4)]
    );
}

#[cfg(feature = "redb")]
#[tokio::test]
async fn a_reset_is_durable_and_waits_for_a_raise_being_recorded() {
    use fencing_layer::store::{MarkLog, RedbMarkLog, StoreError};

    /// A redb log whose writes wait for the test.
    struct Gated(RedbMarkLog, std::sync::Mutex<std::sync::mpsc::Receiver<()>>);
    impl MarkLog for Gated {
        fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
            self.0.load()
        }
        fn record(&self, raises: &[(&str, u64)]) -> Result<(), StoreError> {
            let _ = self.1.lock().unwrap().recv();
            self.0.record(raises)
        }
        fn reset(&self, key: &str, to: u64) -> Result<(), StoreError> {
            self.0.reset(key, to)
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let (open, gate) = std::sync::mpsc::channel();
    let log = Gated(RedbMarkLog::open(&path).unwrap(), std::sync::Mutex::new(gate));
    let store = MarkStore::builder().durable(log).unwrap();
    let router = Probe::default().router(FencingLayer::new().store(store.clone()));
    let writing = spawn_post(&router, 0, 9);
    sleep(Duration::from_millis(100)).await;
    assert_eq!(store.reset(&key(0), 2), Err(StoreError::Busy), "reset while 9 is being written");
    open.send(()).unwrap();
    assert_eq!(writing.await.unwrap().status, StatusCode::OK);
    assert_eq!(store.reset(&key(0), 2).unwrap(), Some(9));
    drop((router, store));

    let store = MarkStore::open(&path).unwrap();
    assert_eq!(store.mark(&key(0)), Some(2), "the reset did not survive a restart");
}

/// A shared store that admits every request it is asked about, and counts them.
#[derive(Clone, Default)]
struct AdmitAll(Arc<AtomicUsize>);

impl SharedStore for AdmitAll {
    fn admit(&self, _key: &str, _token: u64, _drain: Duration) -> fencing_layer::store::SharedAdmission {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok::<_, SharedRefusal>(SharedPermit::new(())) })
    }
}

#[tokio::test]
async fn with_a_shared_store_each_replica_verifies_a_token_once() {
    let (verifier, calls) = below_100();
    let shared = AdmitAll::default();
    let router = Probe::default().router(FencingLayer::new().shared_store(shared.clone()).verifier(verifier));
    let mut statuses = Vec::new();
    for token in [5, 5, 4, 6, 6, 1000, 6] {
        statuses.push(post_token(&router, 0, token).await.status.as_u16());
    }
    // This stand-in store admits everything; the refused token never reached it.
    assert_eq!(statuses, [200, 200, 200, 200, 200, 403, 200]);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "asked about 5, 6 and 1000 only");
    assert_eq!(shared.0.load(Ordering::SeqCst), 6);
}

#[cfg(feature = "ed25519")]
mod signed {
    use super::*;
    use fencing_layer::verify::{Ed25519Verifier, ProofSigner};

    async fn post(router: &Router, path: &str, token: u64, proof: Option<&str>) -> Reply {
        let mut request = Request::post(path).header("fencing-token", token);
        if let Some(proof) = proof {
            request = request.header("fencing-proof", proof);
        }
        Reply::read(router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap()).await
    }

    #[tokio::test]
    async fn forged_raises_get_403_and_the_honest_holder_goes_on() {
        let lock_service = ProofSigner::generate().unwrap();
        let stranger = ProofSigner::generate().unwrap();
        let verifier = Ed25519Verifier::new(lock_service.public_key())
            .lock_for_key(|key| key.strip_prefix("/r/").map(|n| format!("lock-{n}")));
        let store = MarkStore::in_memory();
        let router = Probe::default().router(FencingLayer::new().store(store.clone()).verifier(verifier));

        let honest = lock_service.sign("lock-0", 7);
        assert_eq!(post(&router, "/r/0", 7, Some(&honest)).await.status, StatusCode::OK);
        let forgeries = [
            ("no proof", None),
            ("not base64", Some("not a proof!".to_owned())),
            ("a bad signature", Some(honest.replace(&honest[..4], "AAAA"))),
            ("a proof for another lock", Some(lock_service.sign("lock-1", 8))),
            ("the proof of a lower token", Some(honest.clone())),
            ("a proof from another key pair", Some(stranger.sign("lock-0", 8))),
        ];
        for (what, proof) in forgeries {
            let reply = post(&router, "/r/0", 8, proof.as_deref()).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{what}: {reply:?}");
            assert_eq!(reply.problem()["type"], "urn:fencing:problem:unverified-token", "{what}");
            assert_eq!(store.mark("/r/0"), Some(7), "{what} moved the mark");
            // The honest holder's next write is admitted, with or without its proof.
            assert_eq!(post(&router, "/r/0", 7, None).await.status, StatusCode::OK, "after {what}");
        }
        let next = lock_service.sign("lock-0", 8);
        assert_eq!(post(&router, "/r/0", 8, Some(&next)).await.status, StatusCode::OK);
        assert_eq!(store.mark("/r/0"), Some(8));
    }
}
