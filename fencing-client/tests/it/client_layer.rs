//! `FencedClientLayer` through real servers on 127.0.0.1: hyper-util's legacy client and
//! reqwest against an axum app behind `FencingLayer` (with a proof verifier), and a tonic
//! `Channel` against a tonic server. Leases come from the demo lock service in process; a
//! lease is lost by releasing it, or by the lock service forgetting it (the next renewal
//! gets 404), as when it expires there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::middleware::{Next, from_fn};
use axum::routing::put;
use demo_lock_service::{Config, LockService, ProofSigner, RunningService};
use fencing_client::{
    DemoLockClient, FencedClientError, Lease, LeaseOptions, LockBackendExt, LockError, LossReason, Lost,
};
use fencing_layer::{FencingLayer, FencingToken, MarkStore, verify::Ed25519Verifier};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};
use tower::{Service, ServiceBuilder, ServiceExt};

const LIMIT: Duration = Duration::from_secs(5);

/// The demo lock service on 127.0.0.1:0, signing its grants.
struct Locks {
    service: RunningService,
    signer: ProofSigner,
    _dir: tempfile::TempDir,
}

impl Locks {
    async fn start() -> Locks {
        let dir = tempfile::tempdir().unwrap();
        let signer = ProofSigner::generate().unwrap();
        let config = Config::new(dir.path()).with_signer(signer.clone());
        let service = LockService::open(config).unwrap().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
        Locks { service, signer, _dir: dir }
    }

    /// A lease on `name`, renewed every 100 ms so that a loss is seen quickly.
    async fn lease(&self, name: &str) -> Lease {
        self.lease_renewed(name, Duration::from_millis(100)).await
    }

    /// A lease on `name`, renewed every `every`.
    async fn lease_renewed(&self, name: &str, every: Duration) -> Lease {
        let options = LeaseOptions::default().renew_every(every);
        let client = DemoLockClient::new(self.service.base_url()).unwrap();
        client.lease_with(name, "worker-1", Duration::from_secs(30), options).await.unwrap()
    }

    /// The lock service forgets the lease; the keeper's next renewal gets 404.
    async fn forget(&self, lease: &Lease) {
        assert!(self.service.service().release(lease.lease_id()).await.unwrap());
        timeout(LIMIT, lease.cancelled()).await.expect("the lease was not lost in time");
        assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));
    }
}

/// What the fenced resource saw: every request that reached the server, and the token
/// and proof of each one its handlers ran.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    fenced: Mutex<Vec<(u64, Option<String>)>>,
    // The slow handler reports its start, and its end or drop.
    slow_started: Mutex<Option<mpsc::UnboundedSender<()>>>,
}

/// Reports when the slow handler's future is dropped (its connection closed).
struct OnDrop(Option<oneshot::Sender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        let _ = self.0.take().map(|tx| tx.send(()));
    }
}

/// `PUT /docs/{name}` and `PUT /slow/{name}` (never answers) behind a `FencingLayer` that
/// checks the lock service's proof before a raise, and a counter outside it.
async fn resource(locks: &Locks) -> (String, Arc<Seen>, oneshot::Receiver<()>) {
    async fn store(State(seen): State<Arc<Seen>>, token: FencingToken, request: Request) -> &'static str {
        let proof = request.headers().get("fencing-proof").map(|p| p.to_str().unwrap().to_owned());
        seen.fenced.lock().unwrap().push((token.get(), proof));
        "stored"
    }
    let (dropped_tx, dropped_rx) = oneshot::channel();
    let dropped = Arc::new(Mutex::new(Some(dropped_tx)));
    let slow = move |State(seen): State<Arc<Seen>>| {
        let guard = OnDrop(dropped.lock().unwrap().take());
        async move {
            let _guard = guard;
            if let Some(started) = seen.slow_started.lock().unwrap().as_ref() {
                started.send(()).unwrap();
            }
            tokio::time::sleep(Duration::from_secs(600)).await;
            "too late"
        }
    };
    let lock_of = |key: &str| key.rsplit('/').next().map(str::to_owned);
    let verifier = Ed25519Verifier::new(locks.signer.public_key()).lock_for_key(lock_of);
    let seen = Arc::new(Seen::default());
    let counted = Arc::clone(&seen);
    // On each route's method router, as the README places it (not `Router::route_layer`,
    // which would also fence the routes' 405 fallbacks); the clones share one store.
    let fencing = FencingLayer::new().verifier(verifier);
    let app = Router::new()
        .route("/docs/{name}", put(store).route_layer(fencing.clone()))
        .route("/slow/{name}", put(slow).route_layer(fencing))
        .layer(from_fn(move |request: Request, next: Next| {
            counted.requests.fetch_add(1, Ordering::SeqCst);
            next.run(request)
        }))
        .with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen, dropped_rx)
}

/// [`resource`], and a receiver told each time a `PUT /slow/...` handler has started.
async fn slow_resource(
    locks: &Locks,
) -> (String, Arc<Seen>, oneshot::Receiver<()>, mpsc::UnboundedReceiver<()>) {
    let (base, seen, handler_dropped) = resource(locks).await;
    let (started_tx, started) = mpsc::unbounded_channel();
    *seen.slow_started.lock().unwrap() = Some(started_tx);
    (base, seen, handler_dropped, started)
}

type HyperClient = Client<HttpConnector, Full<Bytes>>;
type HyperError = FencedClientError<hyper_util::client::legacy::Error>;

fn hyper_client() -> HyperClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A PUT that already carries a wrong token and proof (the layer must replace both).
fn put_request(url: String) -> http::Request<Full<Bytes>> {
    http::Request::put(url)
        .header("fencing-token", "999999")
        .header("fencing-proof", "forged")
        .body(Full::new(Bytes::from_static(b"v1")))
        .unwrap()
}

fn assert_lost_by_renewal(lost: Option<&Lost>) {
    assert_eq!(lost, Some(&Lost(LossReason::RenewalFailed(LockError::LeaseNotFound))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_util_requests_carry_the_lease_and_none_is_sent_once_it_is_lost() {
    let locks = Locks::start().await;
    let (base, seen, _) = resource(&locks).await;
    let lease = locks.lease("report").await;
    let proof = lease.grant().proof.clone().expect("a signed grant");
    let mut client = ServiceBuilder::new().layer(lease.layer()).service(hyper_client());

    for _ in 0..2 {
        let response =
            client.ready().await.unwrap().call(put_request(format!("{base}/docs/report"))).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "stored");
    }
    // The verifier admitted the raise, so the proof was the grant's; the handler saw both.
    let expected = (lease.token(), Some(proof));
    assert_eq!(*seen.fenced.lock().unwrap(), [expected.clone(), expected]);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);

    locks.forget(&lease).await;
    let error =
        client.ready().await.unwrap().call(put_request(format!("{base}/docs/report"))).await.unwrap_err();
    assert!(matches!(error, HyperError::NotSent(_)), "{error:?}");
    assert_lost_by_renewal(error.lost());
    assert_eq!(
        error.to_string(),
        "request not sent: lease lost: renewal failed: lease expired, released or unknown"
    );
    // Give a request that had been sent after all the time to arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2, "a refused request reached the server");
    assert_eq!(seen.fenced.lock().unwrap().len(), 2);

    // A clone made after the loss refuses too, and so does every client once the handle is dropped.
    let mut other = ServiceBuilder::new().layer(lease.layer()).service(hyper_client());
    let error = other.ready().await.unwrap().call(put_request(format!("{base}/docs/b"))).await.unwrap_err();
    assert!(matches!(error, HyperError::NotSent(_)), "{error:?}");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_is_cancelled_when_the_lease_is_lost() {
    let locks = Locks::start().await;
    let (base, seen, handler_dropped, mut started) = slow_resource(&locks).await;
    let lease = locks.lease("slow-report").await;
    let client = ServiceBuilder::new().layer(lease.layer()).service(hyper_client());

    let call = tokio::spawn(async move {
        let result = client.oneshot(put_request(format!("{base}/slow/slow-report"))).await.map(drop);
        (result, Instant::now())
    });
    timeout(LIMIT, started.recv()).await.expect("the slow handler never started").unwrap();

    locks.forget(&lease).await;
    let lost_at = Instant::now();
    let (result, ended_at) = timeout(LIMIT, call).await.expect("the request was not cancelled").unwrap();
    let error = result.unwrap_err();
    assert!(matches!(error, HyperError::Cancelled(_)), "{error:?}");
    assert_lost_by_renewal(error.lost());
    // Prompt: the loss wakes the request; no timeout of the client is involved.
    let late = ended_at.saturating_duration_since(lost_at);
    assert!(late < Duration::from_secs(2), "cancelled {late:?} after the loss");
    // Dropping the future closed the connection: the server dropped the handler.
    timeout(LIMIT, handler_dropped).await.expect("the server's handler still runs").unwrap();
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reqwest_client_is_a_tower_service_the_layer_wraps() {
    let locks = Locks::start().await;
    let (base, seen, _) = resource(&locks).await;
    let lease = locks.lease("notes").await;
    let http = reqwest::Client::builder().no_proxy().timeout(LIMIT).build().unwrap();
    let mut client = ServiceBuilder::new().layer(lease.layer()).service(http);

    let request = client.get_ref().put(format!("{base}/docs/notes")).header("fencing-token", "1").body("v1");
    let response = client.ready().await.unwrap().call(request.build().unwrap()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(*seen.fenced.lock().unwrap(), [(lease.token(), lease.grant().proof.clone())]);

    drop(lease);
    let request = client.get_ref().put(format!("{base}/docs/notes")).body("v2").build().unwrap();
    let error = client.ready().await.unwrap().call(request).await.unwrap_err();
    assert!(matches!(error, FencedClientError::NotSent(Lost(LossReason::Dropped))), "{error:?}");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
}

/// The fencing layer's stale refusal ends the lease for the client layer; the
/// application's own 409 does not.
mod stale {
    use axum::http::StatusCode;
    use axum::routing::post;

    use super::*;

    /// `PUT /docs/{name}` stores; `POST /docs/{name}/conflict` answers the application's
    /// own `409`; both fenced by one in-memory store. Counts every request that arrives.
    async fn resource() -> (String, Arc<AtomicUsize>) {
        let arrived = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&arrived);
        let fencing = FencingLayer::new();
        let app = Router::new()
            .route("/docs/{name}", put(|| async { "stored" }).route_layer(fencing.clone()))
            .route(
                "/docs/{name}/conflict",
                post(|| async { (StatusCode::CONFLICT, "version conflict") }).route_layer(fencing),
            )
            .layer(from_fn(move |request: Request, next: Next| {
                counted.fetch_add(1, Ordering::SeqCst);
                next.run(request)
            }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), arrived)
    }

    fn request(method: &str, url: String) -> http::Request<Full<Bytes>> {
        http::Request::builder().method(method).uri(url).body(Full::new(Bytes::from_static(b"v"))).unwrap()
    }

    /// A newer holder writes `path` with `token`, without the layer.
    async fn newer_holder_writes(url: String, token: u64) {
        let mut request = request("PUT", url);
        request.headers_mut().insert("fencing-token", token.into());
        assert_eq!(hyper_client().request(request).await.unwrap().status(), 200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_refusal_stops_every_request_of_the_layer_and_an_application_409_does_not() {
        let locks = Locks::start().await;
        let (base, arrived) = resource().await;
        let lease = locks.lease("report").await;
        let layer = lease.layer();
        let mut client = ServiceBuilder::new().layer(layer.clone()).service(hyper_client());

        // The application's 409: a response like any other, and the layer goes on.
        let conflict = format!("{base}/docs/report/conflict");
        let response = client.ready().await.unwrap().call(request("POST", conflict)).await.unwrap();
        assert_eq!(response.status(), 409);
        assert!(response.headers().get("fencing-problem").is_none());
        let report = format!("{base}/docs/report");
        let response = client.ready().await.unwrap().call(request("PUT", report.clone())).await.unwrap();
        assert_eq!(response.status(), 200);

        // The lease is still valid here; the resource has seen a newer token all the same.
        let newer = lease.token() + 1;
        newer_holder_writes(report.clone(), newer).await;
        assert_eq!(arrived.load(Ordering::SeqCst), 3);
        let error = client.ready().await.unwrap().call(request("PUT", report.clone())).await.unwrap_err();
        assert!(matches!(error, HyperError::Refused(_)), "{error:?}");
        assert_eq!(error.lost(), Some(&Lost(LossReason::Superseded { highest: Some(newer) })));
        assert_eq!(
            error.to_string(),
            format!("request refused as stale: lease lost: the resource has seen a newer token ({newer})")
        );
        assert_eq!(arrived.load(Ordering::SeqCst), 4);
        assert!(lease.is_valid(), "the proof stops the layer, not the lease");

        // Nothing more leaves through this layer: not on this client, not on another
        // client it wraps, not to another key.
        let error = client.ready().await.unwrap().call(request("PUT", report)).await.unwrap_err();
        assert!(matches!(error, HyperError::NotSent(Lost(LossReason::Superseded { .. }))), "{error:?}");
        let mut other = ServiceBuilder::new().layer(layer).service(hyper_client());
        let elsewhere = format!("{base}/docs/elsewhere");
        let error = other.ready().await.unwrap().call(request("PUT", elsewhere)).await.unwrap_err();
        assert!(matches!(error, HyperError::NotSent(_)), "{error:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(arrived.load(Ordering::SeqCst), 4, "a request was sent after the proof");

        // A fresh layer of the same lease still sends (and is refused in its turn).
        let mut fresh = ServiceBuilder::new().layer(lease.layer()).service(hyper_client());
        let elsewhere = format!("{base}/docs/elsewhere");
        let response = fresh.ready().await.unwrap().call(request("PUT", elsewhere)).await.unwrap();
        assert_eq!(response.status(), 200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reqwest_client_stops_at_the_proof_too() {
        let locks = Locks::start().await;
        let (base, arrived) = resource().await;
        let lease = locks.lease("notes").await;
        let http = reqwest::Client::builder().no_proxy().timeout(LIMIT).build().unwrap();
        let mut client = ServiceBuilder::new().layer(lease.layer()).service(http);
        let url = format!("{base}/docs/notes");

        newer_holder_writes(url.clone(), lease.token() + 5).await;
        let request = client.get_ref().put(&url).body("v1").build().unwrap();
        let error = client.ready().await.unwrap().call(request).await.unwrap_err();
        let superseded = Lost(LossReason::Superseded { highest: Some(lease.token() + 5) });
        assert!(matches!(&error, FencedClientError::Refused(lost) if *lost == superseded), "{error:?}");
        let request = client.get_ref().put(&url).body("v2").build().unwrap();
        let error = client.ready().await.unwrap().call(request).await.unwrap_err();
        assert!(matches!(&error, FencedClientError::NotSent(lost) if *lost == superseded), "{error:?}");
        assert_eq!(arrived.load(Ordering::SeqCst), 2);
    }
}

mod grpc {
    use super::*;
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Channel, Server};
    use tonic::{Code, Status};
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    /// Every call's `fencing-token` and `fencing-proof` metadata, as the server received it.
    type Metadata = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

    /// Set: the next call's response is held back until the call is dropped.
    #[derive(Default)]
    struct Stall {
        started: Mutex<Option<mpsc::UnboundedSender<()>>>,
        dropped: Mutex<Option<oneshot::Sender<()>>>,
    }

    /// tonic's health service behind `FencingLayer` (keyed by path), with an interceptor
    /// outside it that records the metadata of every call, and `stall` inside it.
    async fn serve(store: MarkStore, stall: Arc<Stall>) -> (String, Metadata) {
        let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = incoming.local_addr().unwrap();
        let seen = Metadata::default();
        let record = Arc::clone(&seen);
        let interceptor = move |request: tonic::Request<()>| {
            let value = |name| request.metadata().get(name).map(|v| v.to_str().unwrap().to_owned());
            record.lock().unwrap().push((value("fencing-token"), value("fencing-proof")));
            Ok(request)
        };
        let stall = move |response| {
            let dropped = stall.dropped.lock().unwrap().take().map(|tx| OnDrop(Some(tx)));
            let started = stall.started.lock().unwrap().clone();
            async move {
                if let Some(_guard) = dropped {
                    started.unwrap().send(()).unwrap();
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        };
        let (_reporter, health) = tonic_health::server::health_reporter();
        tokio::spawn(async move {
            Server::builder()
                .layer(tonic::service::InterceptorLayer::new(interceptor))
                .layer(FencingLayer::new().store(store))
                .layer(tower::util::AndThenLayer::new(stall))
                .add_service(health)
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
        (format!("http://{addr}"), seen)
    }

    async fn check<T>(client: &mut HealthClient<T>) -> Result<(), Status>
    where
        T: tonic::client::GrpcService<tonic::body::Body>,
        T::Error: Into<tonic::codegen::StdError>,
        T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
        <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
    {
        client.check(HealthCheckRequest { service: String::new() }).await.map(drop)
    }

    /// The layer's error, as tonic keeps it: the `Status`'s source.
    fn fenced_error(status: &Status) -> &FencedClientError<tonic::transport::Error> {
        let source = std::error::Error::source(status).expect("a status with a source");
        source.downcast_ref().expect("the source is the layer's error")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tonic_channel_sends_the_lease_as_metadata_and_refuses_once_it_is_lost() {
        let locks = Locks::start().await;
        let store = MarkStore::in_memory();
        let (url, seen) = serve(store.clone(), Arc::default()).await;
        let lease = locks.lease("ledger").await;
        let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
        let mut client = HealthClient::new(ServiceBuilder::new().layer(lease.layer()).service(channel));

        check(&mut client).await.unwrap();
        check(&mut client).await.unwrap();
        let metadata = (Some(lease.token().to_string()), lease.grant().proof.clone());
        assert_eq!(*seen.lock().unwrap(), [metadata.clone(), metadata]);
        // The server's fencing layer read the metadata as the token.
        assert_eq!(store.mark("/grpc.health.v1.Health/Check"), Some(lease.token()));

        locks.forget(&lease).await;
        let status = check(&mut client).await.unwrap_err();
        assert_eq!(status.code(), Code::Unknown, "{status:?}");
        assert!(status.message().starts_with("request not sent: lease lost: renewal failed"), "{status:?}");
        let error = fenced_error(&status);
        assert!(matches!(error, FencedClientError::NotSent(_)), "{error:?}");
        assert_lost_by_renewal(error.lost());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(seen.lock().unwrap().len(), 2, "a refused call reached the server");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_in_flight_is_cancelled_when_the_lease_is_lost() {
        let locks = Locks::start().await;
        let stall = Arc::new(Stall::default());
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let (dropped_tx, dropped) = oneshot::channel();
        *stall.started.lock().unwrap() = Some(started_tx);
        *stall.dropped.lock().unwrap() = Some(dropped_tx);
        let (url, seen) = serve(MarkStore::in_memory(), stall).await;
        let lease = locks.lease("slow-ledger").await;
        let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
        let mut client = HealthClient::new(ServiceBuilder::new().layer(lease.layer()).service(channel));

        let call = tokio::spawn(async move { check(&mut client).await });
        timeout(LIMIT, started.recv()).await.expect("the call never reached the server").unwrap();
        locks.forget(&lease).await;
        let status = timeout(LIMIT, call).await.expect("the call was not cancelled").unwrap().unwrap_err();
        let error = fenced_error(&status);
        assert!(matches!(error, FencedClientError::Cancelled(_)), "{error:?}");
        assert_lost_by_renewal(error.lost());
        // HTTP/2: the stream is reset, and the server drops the call.
        timeout(LIMIT, dropped).await.expect("the server still runs the call").unwrap();
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_aborted_status_with_the_fencing_reason_stops_the_channel() {
        let locks = Locks::start().await;
        let store = MarkStore::in_memory();
        let (url, seen) = serve(store.clone(), Arc::default()).await;
        let lease = locks.lease("ledger-stale").await;
        let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
        let mut client = HealthClient::new(ServiceBuilder::new().layer(lease.layer()).service(channel));
        check(&mut client).await.unwrap();

        // A newer holder's token reaches the service (the lease itself is still valid).
        let newer = lease.token() + 1;
        store.seed("/grpc.health.v1.Health/Check", newer).unwrap();
        let status = check(&mut client).await.unwrap_err();
        assert_eq!(status.code(), Code::Unknown, "{status:?}");
        let error = fenced_error(&status);
        assert!(matches!(error, FencedClientError::Refused(_)), "{error:?}");
        assert_eq!(error.lost(), Some(&Lost(LossReason::Superseded { highest: Some(newer) })));
        assert!(lease.is_valid(), "the proof stops the layer, not the lease");

        let status = check(&mut client).await.unwrap_err();
        assert!(matches!(fenced_error(&status), FencedClientError::NotSent(_)), "{status:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(seen.lock().unwrap().len(), 2, "a call was sent after the proof");
    }

    #[tokio::test]
    async fn a_channel_error_reaches_tonic_as_it_would_without_the_layer() {
        let locks = Locks::start().await;
        let lease = locks.lease("nowhere").await;
        // A port nobody listens on any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect_lazy();

        let bare = check(&mut HealthClient::new(channel.clone())).await.unwrap_err();
        let fenced_channel = ServiceBuilder::new().layer(lease.layer()).service(channel);
        let fenced = check(&mut HealthClient::new(fenced_channel)).await.unwrap_err();
        assert_eq!(fenced.code(), bare.code(), "bare: {bare:?}, fenced: {fenced:?}");
        assert_eq!(fenced.code(), Code::Unavailable, "{fenced:?}");
        assert_eq!(fenced.message(), bare.message());
        assert!(fenced_error(&fenced).inner().is_some(), "{fenced:?}");
    }
}

/// The local deadline, on tokio's paused clock: a backend that renews (or stops
/// answering renewals) on command, and an inner service that takes its time.
mod deadline {
    use std::future::pending;
    use std::sync::atomic::AtomicBool;

    use fencing_client::{Grant, LockBackend, backend::BoxFuture};
    use tower::service_fn;

    use super::*;

    /// Grants token 7; answers keepalives until `hang` is set, then never again.
    #[derive(Default)]
    struct Backend {
        hang: AtomicBool,
    }

    impl LockBackend for Backend {
        fn acquire<'a>(
            &'a self,
            name: &'a str,
            holder: &'a str,
            ttl: Duration,
        ) -> BoxFuture<'a, Result<Grant, LockError>> {
            let grant = Grant {
                lease_id: "l".into(),
                name: name.into(),
                holder: holder.into(),
                token: 7,
                ttl,
                proof: None,
            };
            Box::pin(async move { Ok(grant) })
        }

        fn keepalive<'a>(&'a self, _grant: &'a Grant) -> BoxFuture<'a, Result<(), LockError>> {
            Box::pin(async move {
                if self.hang.load(Ordering::SeqCst) {
                    pending::<()>().await;
                }
                Ok(())
            })
        }

        fn release<'a>(&'a self, _grant: &'a Grant) -> BoxFuture<'a, Result<(), LockError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// An inner client that answers after `delay` with the token it was sent.
    fn slow_client(
        delay: Duration,
    ) -> impl Service<http::Request<()>, Response = http::Response<String>, Error = std::io::Error> + Clone
    {
        service_fn(move |request: http::Request<()>| async move {
            tokio::time::sleep(delay).await;
            Ok(http::Response::new(request.headers()["fencing-token"].to_str().unwrap().to_owned()))
        })
    }

    const TTL: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn renewals_keep_a_long_request_going_past_the_first_deadline() {
        let backend = Arc::new(Backend::default());
        let lease = Lease::acquire(backend, "job", "me", TTL).await.unwrap();
        let first_deadline = lease.deadline();
        let start = Instant::now();
        let client = ServiceBuilder::new().layer(lease.layer()).service(slow_client(Duration::from_secs(10)));
        assert_eq!(client.oneshot(http::Request::new(())).await.unwrap().body(), "7");
        assert!(Instant::now() > first_deadline, "the request outlived the deadline it started with");
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
        assert!(lease.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_after_poll_ready_is_refused_in_call() {
        let lease = Lease::acquire(Arc::new(Backend::default()), "job", "me", TTL).await.unwrap();
        let mut client = ServiceBuilder::new().layer(lease.layer()).service(slow_client(Duration::ZERO));
        let ready = client.ready().await.unwrap();
        lease.release().await.unwrap();
        let error = ready.call(http::Request::new(())).await.unwrap_err();
        assert!(matches!(error, FencedClientError::NotSent(Lost(LossReason::Released))), "{error:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_stops_at_the_deadline_when_renewals_stop_answering() {
        let backend = Arc::new(Backend::default());
        // Renewals that hang longer than the TTL: the deadline, not a timeout, ends the lease.
        let options = LeaseOptions::default().request_timeout(Duration::from_secs(10));
        let lease = Lease::acquire_with(backend.clone(), "job", "me", TTL, options).await.unwrap();
        backend.hang.store(true, Ordering::SeqCst);
        let deadline = lease.deadline();
        let client = ServiceBuilder::new().layer(lease.layer()).service(slow_client(Duration::from_secs(10)));
        let error = client.clone().oneshot(http::Request::new(())).await.unwrap_err();
        assert!(matches!(error, FencedClientError::Cancelled(Lost(LossReason::DeadlinePassed))), "{error:?}");
        assert_eq!(Instant::now(), deadline, "stopped at the deadline (TTL - TTL/10 after the acquire)");
        let error = client.oneshot(http::Request::new(())).await.unwrap_err();
        assert!(matches!(error, FencedClientError::NotSent(Lost(LossReason::DeadlinePassed))), "{error:?}");
    }
}

/// `FencedMiddleware` in a reqwest-middleware chain, with the builder's `.send()`.
#[cfg(feature = "reqwest-middleware")]
mod middleware {
    use fencing_client::layer::FencedMiddleware;
    use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

    use super::*;

    fn client(lease: &Lease) -> ClientWithMiddleware {
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().unwrap();
        ClientBuilder::new(http).with(FencedMiddleware::new(lease)).build()
    }

    /// The layer's error inside reqwest-middleware's.
    fn stopped(error: reqwest_middleware::Error) -> FencedClientError<reqwest::Error> {
        match error {
            reqwest_middleware::Error::Middleware(error) => error.downcast().unwrap(),
            other => panic!("not the layer's error: {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn send_is_fenced_and_stops_once_the_lease_is_lost() {
        let locks = Locks::start().await;
        let (base, seen, handler_dropped, mut started) = slow_resource(&locks).await;
        let lease = locks.lease("mw").await;
        let http = client(&lease);

        let sent =
            http.put(format!("{base}/docs/mw")).header("fencing-token", "1").body("v1").send().await.unwrap();
        assert_eq!(sent.status(), 200);
        assert_eq!(*seen.fenced.lock().unwrap(), [(lease.token(), lease.grant().proof.clone())]);

        let slow = tokio::spawn(http.put(format!("{base}/slow/mw")).body("v2").send());
        timeout(LIMIT, started.recv()).await.expect("the slow handler never started").unwrap();
        locks.forget(&lease).await;
        let error = stopped(timeout(LIMIT, slow).await.expect("not cancelled").unwrap().unwrap_err());
        assert!(matches!(error, FencedClientError::Cancelled(_)), "{error:?}");
        assert_lost_by_renewal(error.lost());
        timeout(LIMIT, handler_dropped).await.expect("the server's handler still runs").unwrap();

        let error = stopped(http.put(format!("{base}/docs/mw")).body("v3").send().await.unwrap_err());
        assert!(matches!(error, FencedClientError::NotSent(_)), "{error:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(seen.requests.load(Ordering::SeqCst), 2, "a refused request reached the server");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn send_stops_at_a_stale_refusal() {
        let locks = Locks::start().await;
        let (base, seen, _) = resource(&locks).await;
        // Renewed every 20 s: the older holder does not learn of its loss from its keeper.
        let older = locks.lease_renewed("mw-stale", Duration::from_secs(20)).await;
        let http = client(&older);
        // The lock service forgets the older lease (as when a pause outlasts its TTL)
        // and a newer holder writes.
        assert!(locks.service.service().release(older.lease_id()).await.unwrap());
        let newer = locks.lease("mw-stale").await;
        let sent = client(&newer).put(format!("{base}/docs/mw-stale")).body("new").send().await.unwrap();
        assert_eq!(sent.status(), 200);

        let error = stopped(http.put(format!("{base}/docs/mw-stale")).body("old").send().await.unwrap_err());
        let superseded = Lost(LossReason::Superseded { highest: Some(newer.token()) });
        assert!(matches!(&error, FencedClientError::Refused(lost) if *lost == superseded), "{error:?}");
        assert!(older.is_valid(), "the keeper has not noticed: the refusal is what stopped the request");
        let error = stopped(http.put(format!("{base}/docs/mw-stale")).body("old").send().await.unwrap_err());
        assert!(matches!(error, FencedClientError::NotSent(_)), "{error:?}");
        // The older holder's write never ran.
        assert_eq!(
            seen.fenced.lock().unwrap().iter().filter(|(token, _)| *token == older.token()).count(),
            0
        );
    }
}
