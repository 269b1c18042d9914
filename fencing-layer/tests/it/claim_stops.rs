//! The second stop of a replica claim: each request inside checks its claim's
//! deadline itself (at every poll, with a timer armed for it), so a yielding
//! handler is stopped at the deadline even when the keeper is stuck.
//!
//! The engine here is an in-memory one whose renewal blocks the thread that
//! asks for it: the keeper's own thread, stuck from its first renewal on, as a
//! keeper blocked on anything would be. It never renews, never revokes. (The
//! contract across replicas is tested on real engines in fencing-postgres and
//! fencing-etcd, and the keeper's stop alone in demo-resource's `log_pipe`.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use fencing_layer::FencingLayer;
use fencing_layer::claims::{
    BoxFuture, ClaimBackend, ClaimRenewer, ClaimReply, ClaimRequest, ClaimSession, ClaimStore, ClaimTiming,
    Renewal,
};
use fencing_layer::store::StoreError;
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::ServiceExt;

/// Grants every claim; its renewer blocks the keeper's thread until the test ends.
#[derive(Clone, Default)]
struct StuckKeeper {
    /// Held by the test: the keeper's renewal waits on it.
    stuck: Arc<Mutex<()>>,
}

impl ClaimBackend for StuckKeeper {
    fn claim(&self, _: ClaimRequest<'_>) -> BoxFuture<'static, Result<ClaimReply, StoreError>> {
        Box::pin(async { Ok(ClaimReply::Granted { raised: true }) })
    }

    fn release(&self, _: &str, _: &str, _: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn open_session(&self) -> BoxFuture<'static, Result<ClaimSession, StoreError>> {
        let (_events, events) = tokio::sync::broadcast::channel(1);
        // The sender lives in the renewer: the session stays open.
        let renewer = Box::new(Blocking { stuck: Arc::clone(&self.stuck), _events });
        Box::pin(async move { Ok(ClaimSession { renewer, events }) })
    }
}

struct Blocking {
    stuck: Arc<Mutex<()>>,
    _events: tokio::sync::broadcast::Sender<fencing_layer::claims::ClaimEvent>,
}

impl ClaimRenewer for Blocking {
    fn renew(
        &self,
        _: &str,
        _: Vec<(String, u64)>,
        _: Duration,
    ) -> BoxFuture<'static, Result<Renewal, StoreError>> {
        // Called on the keeper's thread: it stops here, as a keeper blocked in a write would.
        drop(self.stuck.lock());
        Box::pin(async { Ok(Renewal::default()) })
    }

    fn read_marks(&self, _: Vec<String>) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn sweep(&self) -> BoxFuture<'static, Result<u64, StoreError>> {
        Box::pin(async { Ok(0) })
    }
}

/// A 1 s term (valid 900 ms after its grant was sent here). The handler makes
/// an effect every 10 ms for 3 s. The keeper is stuck before the grant: the
/// request must stop itself at the deadline: 503 `claim-lost`, no effect
/// after the deadline (10 ms of polling slack, and 50 ms of scheduling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the switch that keeps the keeper stuck: held across the test on purpose.
#[allow(clippy::await_holding_lock)]
async fn a_yielding_handler_is_stopped_at_its_deadline_while_the_keeper_is_stuck() {
    let engine = StuckKeeper::default();
    let stuck = engine.stuck.lock().unwrap();
    let timing = ClaimTiming::for_term(Duration::from_secs(1));
    let claims = ClaimStore::with_timing(engine.clone(), timing).unwrap();
    // The store's metrics are built where it starts, with the recorder in effect there.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let recording = metrics::set_default_local_recorder(&recorder);
    claims.ready().await.expect("the session opens");
    drop(recording);
    let effects = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let made = Arc::clone(&effects);
    let handler = move || {
        let made = Arc::clone(&made);
        async move {
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                made.lock().unwrap().push(Instant::now());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            StatusCode::OK
        }
    };
    let router =
        Router::new().route("/r/1", post(handler)).layer(FencingLayer::new().shared_store(claims.clone()));
    let sent = Instant::now();
    let request = Request::post("/r/1").header("Fencing-Token", "7").body(axum::body::Body::empty()).unwrap();
    let response = router.oneshot(request).await.unwrap();
    let answered = sent.elapsed();
    let deadline = timing.valid_for();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "answered after {answered:?}");
    let last = effects.lock().unwrap().last().copied().expect("the handler ran");
    let last = last.duration_since(sent);
    eprintln!(
        "answered 503 after {answered:?}; last effect at {last:?}; deadline {deadline:?} after sending"
    );
    assert!(
        last <= deadline + Duration::from_millis(60),
        "an effect at {last:?}, past the deadline {deadline:?}"
    );
    assert!(answered <= deadline + Duration::from_millis(100), "stopped only after {answered:?}");
    assert_eq!(claims.revocations().by_request, 1, "{:?}", claims.revocations());
    assert_eq!(claims.revocations().at_deadline, 0, "the keeper was stuck: {:?}", claims.revocations());
    let revoked = |cause: &str| {
        let found = snapshotter.snapshot().into_vec().into_iter().find(|(key, ..)| {
            key.key().name() == "fencing_claims_revoked_total"
                && key.key().labels().any(|label| label.key() == "cause" && label.value() == cause)
        });
        match found {
            Some((.., DebugValue::Counter(n))) => n,
            other => panic!("fencing_claims_revoked_total{{cause={cause}}}: {other:?}"),
        }
    };
    // Every cause's series exists from the start, at zero until it happens.
    assert_eq!((revoked("request"), revoked("deadline"), revoked("gone")), (1, 0, 0));
    drop(stuck);
}
