//! The `metrics` feature: every outcome, raises, waits, requests inside and
//! tracked keys, read back from a `DebuggingRecorder` installed for this
//! thread only (each test runs its requests on a current-thread runtime inside
//! `with_local_recorder`, so tests never share a recorder).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fencing_layer::{
    FencingLayer, InFlightPolicy, MarkStore,
    store::{MarkLog, StoreError},
    verify::{Verification, verify_fn},
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Semaphore;
use tower::{Service, ServiceExt};

type Body = Full<Bytes>;

/// Runs `test` on a current-thread runtime (its clock paused if `paused`) with
/// a recorder of its own; returns what was recorded.
fn recorded<F: Future<Output = ()>>(paused: bool, test: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().start_paused(paused).build().unwrap();
        runtime.block_on(test());
    });
    Recorded::from(&snapshotter)
}

/// One snapshot (reading resets the recorder's values, so each test reads once).
struct Recorded {
    /// (name, sorted labels) → value.
    values: BTreeMap<(String, Vec<(String, String)>), DebugValue>,
    units: BTreeMap<String, Unit>,
}

impl From<&Snapshotter> for Recorded {
    fn from(snapshotter: &Snapshotter) -> Self {
        let (mut values, mut units) = (BTreeMap::new(), BTreeMap::new());
        for (key, unit, _, value) in snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            let mut labels: Vec<_> =
                key.key().labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
            labels.sort();
            if let Some(unit) = unit {
                units.insert(name.clone(), unit);
            }
            values.insert((name, labels), value);
        }
        Self { values, units }
    }
}

impl Recorded {
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> &DebugValue {
        let mut labels: Vec<_> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        labels.sort();
        self.values
            .get(&(name.to_owned(), labels.clone()))
            .unwrap_or_else(|| panic!("no {name}{labels:?} in {:?}", self.values.keys()))
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.get(name, labels) {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.get(name, labels) {
            DebugValue::Gauge(v) => v.into_inner(),
            other => panic!("{name} is {other:?}"),
        }
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.get(name, labels) {
            DebugValue::Histogram(v) => v.iter().map(|x| x.into_inner()).collect(),
            other => panic!("{name} is {other:?}"),
        }
    }

    /// `fencing_requests_total` by outcome, for requests of the layer labelled `layer`.
    fn outcomes(&self, layer: Option<&str>) -> BTreeMap<String, u64> {
        let mut outcomes = BTreeMap::new();
        for ((name, labels), value) in &self.values {
            let this_layer = labels.iter().find(|(k, _)| k == "layer").map(|(_, v)| v.as_str());
            if name != "fencing_requests_total" || this_layer != layer {
                continue;
            }
            let outcome = labels.iter().find(|(k, _)| k == "outcome").expect("an outcome label");
            let DebugValue::Counter(n) = value else { panic!("a counter") };
            outcomes.insert(outcome.1.clone(), *n);
        }
        outcomes
    }
}

/// The outcomes that the test saw, with every other outcome at 0.
fn expect(seen: &[(&str, u64)]) -> BTreeMap<String, u64> {
    let all = [
        "admitted",
        "stale",
        "missing",
        "invalid",
        "unverified",
        "verifier-unavailable",
        "key-table-full",
        "drain-timeout",
        "store-unavailable",
        "claim-lost",
        "unfenced",
    ];
    let mut outcomes: BTreeMap<String, u64> = all.iter().map(|o| (o.to_string(), 0)).collect();
    for (outcome, n) in seen {
        *outcomes.get_mut(*outcome).unwrap_or_else(|| panic!("unknown outcome {outcome}")) = *n;
    }
    outcomes
}

/// An inner service answering 200; a request to `/held` first waits for a permit of `gate`.
fn inner(
    gate: Arc<Semaphore>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(move |request: Request<Body>| {
        let gate = Arc::clone(&gate);
        async move {
            if request.uri().path() == "/held" {
                gate.acquire().await.unwrap().forget();
            }
            Ok::<_, Infallible>(Response::new(Body::default()))
        }
    })
}

fn post(path: &str, token: Option<&str>) -> Request<Body> {
    let mut request = Request::builder().method(Method::POST).uri(path);
    if let Some(token) = token {
        request = request.header("fencing-token", token);
    }
    request.body(Body::default()).unwrap()
}

async fn send<S, RB>(service: &S, request: Request<Body>) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<RB>, Error = Infallible> + Clone,
{
    service.clone().oneshot(request).await.unwrap().status()
}

#[test]
fn every_refusal_and_admission_is_counted_by_outcome() {
    let recorded = recorded(false, || async {
        let verifier = verify_fn(|raise| match raise.token() {
            100 => Verification::refused("not this lock's"),
            101 => Verification::unavailable("lock service down"),
            _ => Verification::valid(),
        });
        let store = MarkStore::builder().max_keys(2).in_memory();
        let layer = FencingLayer::new().store(store).verifier(verifier);
        let fenced = tower::Layer::layer(&layer, inner(Arc::new(Semaphore::new(0))));
        assert_eq!(send(&fenced, post("/a", Some("5"))).await, StatusCode::OK);
        assert_eq!(send(&fenced, post("/a", Some("5"))).await, StatusCode::OK);
        assert_eq!(send(&fenced, post("/a", Some("4"))).await, StatusCode::CONFLICT);
        assert_eq!(send(&fenced, post("/a", None)).await, StatusCode::PRECONDITION_REQUIRED);
        assert_eq!(send(&fenced, post("/a", Some("05"))).await, StatusCode::BAD_REQUEST);
        assert_eq!(send(&fenced, post("/a", Some("100"))).await, StatusCode::FORBIDDEN);
        assert_eq!(send(&fenced, post("/a", Some("101"))).await, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(send(&fenced, post("/b", Some("1"))).await, StatusCode::OK);
        assert_eq!(send(&fenced, post("/c", Some("1"))).await, StatusCode::SERVICE_UNAVAILABLE);
        // Unfenced methods are not counted.
        let get = Request::get("/a").body(Body::default()).unwrap();
        assert_eq!(send(&fenced, get).await, StatusCode::OK);
    });
    assert_eq!(
        recorded.outcomes(None),
        expect(&[
            ("admitted", 3),
            ("stale", 1),
            ("missing", 1),
            ("invalid", 1),
            ("unverified", 1),
            ("verifier-unavailable", 1),
            ("key-table-full", 1),
        ])
    );
    // /a to 5, /b to 1; the refused and unverifiable raises raised nothing.
    assert_eq!(recorded.counter("fencing_raises_total", &[]), 2);
    assert_eq!(recorded.gauge("fencing_tracked_keys", &[]), 2.0);
    assert_eq!(recorded.gauge("fencing_requests_inside", &[]), 0.0);
    // No drain or durable write happened.
    assert!(recorded.histogram("fencing_drain_wait_seconds", &[]).is_empty());
    assert!(recorded.histogram("fencing_durable_record_seconds", &[]).is_empty());
    // Never a label per key: only `outcome` (and `layer` when set) ever appear.
    for (_, labels) in recorded.values.keys() {
        assert!(labels.iter().all(|(k, _)| k == "outcome"), "{labels:?}");
    }
    assert_eq!(recorded.units["fencing_requests_total"], Unit::Count);
    assert_eq!(recorded.units["fencing_drain_wait_seconds"], Unit::Seconds);
    assert_eq!(recorded.units["fencing_durable_record_seconds"], Unit::Seconds);
}

/// A drain that times out, with the older request still inside, under the label `layer="orders"`.
#[test]
fn a_drain_timeout_is_timed_and_the_request_inside_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    let recorded = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let gate = Arc::new(Semaphore::new(0));
            let layer = FencingLayer::new()
                .key_extractor(fencing_layer::key::GlobalKey)
                .drain_timeout(Duration::from_millis(250))
                .metrics_label("orders");
            let fenced = tower::Layer::layer(&layer, inner(Arc::clone(&gate)));
            let held = tokio::spawn(fenced.clone().oneshot(post("/held", Some("5"))));
            tokio::task::yield_now().await;
            let started = tokio::time::Instant::now();
            assert_eq!(send(&fenced, post("/other", Some("6"))).await, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(started.elapsed(), Duration::from_millis(250));
            // Read while token 5 is still inside.
            let recorded = Recorded::from(&snapshotter);
            gate.add_permits(1);
            assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
            recorded
        })
    });
    let orders = [("layer", "orders")];
    assert_eq!(recorded.outcomes(Some("orders")), expect(&[("admitted", 1), ("drain-timeout", 1)]));
    assert!(recorded.outcomes(None).is_empty(), "every series carries the layer's label");
    // 5 raised the mark from 0, 6 from 5 (it stays raised after the timeout).
    assert_eq!(recorded.counter("fencing_raises_total", &orders), 2);
    assert_eq!(recorded.gauge("fencing_requests_inside", &orders), 1.0);
    assert_eq!(recorded.gauge("fencing_tracked_keys", &orders), 1.0);
    assert_eq!(recorded.histogram("fencing_drain_wait_seconds", &orders), vec![0.25]);
    // The request left after the read: down by one from what was read.
    assert_eq!(Recorded::from(&snapshotter).gauge("fencing_requests_inside", &orders), -1.0);
}

/// A drain that ends: the higher token waited exactly as long as the lower one stayed inside.
#[test]
fn a_drain_that_ends_records_the_wait_and_both_leave() {
    let recorded = recorded(true, || async {
        let gate = Arc::new(Semaphore::new(0));
        let layer = FencingLayer::new().key_extractor(fencing_layer::key::GlobalKey);
        let fenced = tower::Layer::layer(&layer, inner(Arc::clone(&gate)));
        let held = tokio::spawn(fenced.clone().oneshot(post("/held", Some("5"))));
        tokio::task::yield_now().await;
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            gate.add_permits(1);
        });
        assert_eq!(send(&fenced, post("/other", Some("6"))).await, StatusCode::OK);
        assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
        release.await.unwrap();
    });
    assert_eq!(recorded.outcomes(None), expect(&[("admitted", 2)]));
    assert_eq!(recorded.histogram("fencing_drain_wait_seconds", &[]), vec![0.04]);
    assert_eq!(recorded.gauge("fencing_requests_inside", &[]), 0.0);
}

/// The cancel policy's 409 counts as stale; a token-less request let through counts as unfenced.
#[test]
fn cancelled_requests_count_as_stale_and_unfenced_ones_as_unfenced() {
    let recorded = recorded(false, || async {
        let layer = FencingLayer::new()
            .key_extractor(fencing_layer::key::GlobalKey)
            .in_flight_policy(InFlightPolicy::Cancel)
            .allow_unfenced(true);
        let fenced = tower::Layer::layer(&layer, inner(Arc::new(Semaphore::new(0))));
        let held = tokio::spawn(fenced.clone().oneshot(post("/held", Some("5"))));
        tokio::task::yield_now().await;
        assert_eq!(send(&fenced, post("/other", Some("6"))).await, StatusCode::OK);
        assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::CONFLICT);
        assert_eq!(send(&fenced, post("/other", None)).await, StatusCode::OK);
    });
    assert_eq!(recorded.outcomes(None), expect(&[("admitted", 2), ("stale", 1), ("unfenced", 1)]));
    assert_eq!(recorded.gauge("fencing_requests_inside", &[]), 0.0);
}

/// A durable log whose writes take `delay` (on the paused clock: exactly), and fail from `fail_from` on.
struct Log {
    fail_from: u64,
    written: Mutex<Vec<(String, u64)>>,
}

impl MarkLog for Log {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(Vec::new())
    }

    fn record(&self, raises: &[(&str, u64)]) -> Result<(), StoreError> {
        if raises.iter().any(|(_, token)| *token >= self.fail_from) {
            return Err(StoreError::log(std::io::Error::other("disk full")));
        }
        self.written.lock().unwrap().extend(raises.iter().map(|(k, t)| (k.to_string(), *t)));
        Ok(())
    }
}

#[test]
fn durable_writes_are_timed_and_a_failed_one_counts_as_store_unavailable() {
    let mark = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&mark);
    let recorded = recorded(false, || async move {
        let log = Log { fail_from: 9, written: Mutex::default() };
        let store = MarkStore::builder().durable(log).unwrap();
        let layer = FencingLayer::new().store(store.clone());
        let fenced = tower::Layer::layer(&layer, inner(Arc::new(Semaphore::new(0))));
        assert_eq!(send(&fenced, post("/k", Some("3"))).await, StatusCode::OK);
        assert_eq!(send(&fenced, post("/k", Some("3"))).await, StatusCode::OK);
        assert_eq!(send(&fenced, post("/k", Some("9"))).await, StatusCode::SERVICE_UNAVAILABLE);
        seen.store(store.mark("/k").unwrap(), Ordering::Relaxed);
    });
    assert_eq!(recorded.outcomes(None), expect(&[("admitted", 2), ("store-unavailable", 1)]));
    // One write per raise, the failed one included; the second 3 wrote nothing.
    let times = recorded.histogram("fencing_durable_record_seconds", &[]);
    assert_eq!(times.len(), 2, "{times:?}");
    assert!(times.iter().all(|t| (0.0..5.0).contains(t)), "{times:?}");
    // The raise to 9 happened in memory before its write failed: it is counted.
    assert_eq!(recorded.counter("fencing_raises_total", &[]), 2);
    assert_eq!(mark.load(Ordering::Relaxed), 9);
}

/// Every series exists at zero once the layer wraps a service, before any
/// request: an alert on `increase(...) > 0` then sees the first stale write
/// after a start (a series born at 1 has no increase). A durable store's
/// loaded keys are tracked from the start too.
#[test]
fn every_series_exists_at_zero_before_the_first_request() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (before, after) = metrics::with_local_recorder(&recorder, || {
        let log = Log { fail_from: u64::MAX, written: Mutex::default() };
        let store = MarkStore::builder().durable(log).unwrap();
        let layer = FencingLayer::new().store(store).metrics_label("orders");
        let before = Recorded::from(&snapshotter);
        let _fenced = tower::Layer::layer(&layer, inner(Arc::new(Semaphore::new(0))));
        (before, Recorded::from(&snapshotter))
    });
    assert!(
        before.values.is_empty(),
        "a layer not yet wrapping a service reports nothing: {:?}",
        before.values
    );
    let orders = [("layer", "orders")];
    assert_eq!(after.outcomes(Some("orders")), expect(&[]));
    assert!(after.outcomes(None).is_empty(), "every series carries the layer's label");
    assert_eq!(after.counter("fencing_raises_total", &orders), 0);
    assert_eq!(after.gauge("fencing_requests_inside", &orders), 0.0);
    assert_eq!(after.gauge("fencing_tracked_keys", &orders), 0.0);
    assert!(after.histogram("fencing_drain_wait_seconds", &orders).is_empty());
    assert!(after.histogram("fencing_durable_record_seconds", &orders).is_empty());
    assert_eq!(after.units["fencing_requests_total"], Unit::Count);
}

/// A durable store that loaded marks: its keys count from the start.
#[test]
fn keys_a_durable_store_loaded_are_tracked_before_any_raise() {
    struct Loaded;
    impl MarkLog for Loaded {
        fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
            Ok(vec![("/a".into(), 3), ("/b".into(), 7)])
        }
        fn record(&self, _: &[(&str, u64)]) -> Result<(), StoreError> {
            Ok(())
        }
    }
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let layer = FencingLayer::new().store(MarkStore::builder().durable(Loaded).unwrap());
        let _fenced = tower::Layer::layer(&layer, inner(Arc::new(Semaphore::new(0))));
    });
    let recorded = Recorded::from(&snapshotter);
    assert_eq!(recorded.gauge("fencing_tracked_keys", &[]), 2.0);
    assert_eq!(recorded.outcomes(None), expect(&[]));
}

/// A shared store that admits every request after a raise that waited 30 ms,
/// with a permit revoked when `revoke` fires.
struct RevokingStore(Arc<tokio::sync::Notify>);

impl fencing_layer::store::SharedStore for RevokingStore {
    fn admit(&self, _key: &str, _token: u64, _drain: Duration) -> fencing_layer::store::SharedAdmission {
        let revoke = Arc::clone(&self.0);
        Box::pin(async move {
            let revoked = async move { revoke.notified().await };
            let permit = fencing_layer::store::SharedPermit::revocable((), revoked);
            Ok(permit.with_raise(true, Some(Duration::from_millis(30))))
        })
    }
}

/// Through a shared store: the raise and the drain wait the store reports are
/// counted, and a request whose permit is revoked counts as `claim-lost`
/// (503), its inner future dropped.
#[test]
fn a_shared_store_reports_raises_drains_and_lost_claims() {
    let recorded = recorded(false, || async {
        let revoke = Arc::new(tokio::sync::Notify::new());
        let layer = FencingLayer::new().shared_store(RevokingStore(Arc::clone(&revoke)));
        let gate = Arc::new(Semaphore::new(0));
        let fenced = tower::Layer::layer(&layer, inner(Arc::clone(&gate)));
        let held = tokio::spawn(fenced.clone().oneshot(post("/held", Some("5"))));
        tokio::task::yield_now().await;
        revoke.notify_waiters();
        let response = held.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(matches!(
            response.extensions().get::<fencing_layer::Rejection>(),
            Some(fencing_layer::Rejection::ClaimLost { .. })
        ));
        gate.add_permits(1);
        assert_eq!(send(&fenced, post("/other", Some("6"))).await, StatusCode::OK);
    });
    assert_eq!(recorded.outcomes(None), expect(&[("admitted", 2), ("claim-lost", 1)]));
    assert_eq!(recorded.counter("fencing_raises_total", &[]), 2);
    assert_eq!(recorded.histogram("fencing_drain_wait_seconds", &[]), vec![0.03, 0.03]);
    assert_eq!(recorded.gauge("fencing_requests_inside", &[]), 0.0);
}
