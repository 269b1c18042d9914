//! Token authenticity, client and resource side, against the real demo lock service on
//! 127.0.0.1: signed grants and `Fencing-Proof`, and `DemoLockVerifier` (the online check)
//! alone and behind a real `FencingLayer`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{Next, from_fn};
use axum::routing::{get, put};
use demo_lock_service::{Config, LockService, ProofSigner, RunningService};
use fencing_client::{DemoLockClient, LockBackendExt, verify::DemoLockVerifier};
use fencing_layer::{
    FencingLayer,
    verify::{Ed25519Verifier, Raise, TokenVerifier, VerifyError},
};
use http::HeaderMap;

async fn start(config: Config) -> RunningService {
    LockService::open(config).unwrap().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// Serves `app` on 127.0.0.1:0; the task ends when the returned handle is aborted.
async fn serve(app: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), task)
}

/// The lock service's routes behind a counter of the requests that reach them.
async fn counted(service: &LockService) -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let app = service.router().layer(from_fn(move |req: Request, next: Next| {
        let c = Arc::clone(&c);
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            next.run(req).await
        }
    }));
    let (base, task) = serve(app).await;
    (base, count, task)
}

/// `PUT /logs/{name}`, fenced per path, with `verifier` consulted before a raise.
async fn fenced_resource(verifier: impl TokenVerifier) -> (String, tokio::task::JoinHandle<()>) {
    let app = Router::new().route(
        "/logs/{name}",
        put(|| async { "stored" })
            .route_layer(FencingLayer::new().verifier(verifier).verify_timeout(Duration::from_secs(3))),
    );
    serve(app).await
}

fn logs_lock(key: &str) -> Option<String> {
    key.strip_prefix("/logs/").map(str::to_owned)
}

async fn verify(v: &impl TokenVerifier, key: &str, token: u64) -> Result<(), VerifyError> {
    let headers = HeaderMap::new();
    v.verify(&Raise::new(key, token, 0, &headers)).await
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_send_the_grants_proof_and_a_proof_verifier_admits_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let signer = ProofSigner::generate().unwrap();
    let svc = start(Config::new(dir.path()).with_signer(signer.clone())).await;
    let client = DemoLockClient::new(svc.base_url()).unwrap();
    let lease = client.lease("billing", "worker-1", Duration::from_secs(30)).await.unwrap();
    let proof = lease.grant().proof.clone().expect("a signed grant");
    assert_eq!(proof, signer.sign("billing", lease.token()));

    // Both helpers send the proof beside the token.
    let req = lease.fence_reqwest(http().put("http://127.0.0.1:9/logs/billing")).build().unwrap();
    assert_eq!(req.headers()["fencing-token"], lease.token().to_string().as_str());
    assert_eq!(req.headers().get_all("fencing-proof").iter().collect::<Vec<_>>(), vec![proof.as_str()]);
    let mut req = http::Request::builder().header("Fencing-Proof", "old").body(()).unwrap();
    lease.fence(&mut req);
    assert_eq!(req.headers().get_all("fencing-proof").iter().collect::<Vec<_>>(), vec![proof.as_str()]);

    // A resource that checks proofs: the lease's writes go in, forgeries do not.
    let verifier = Ed25519Verifier::new(signer.public_key()).lock_for_key(logs_lock);
    let (resource, _task) = fenced_resource(verifier).await;
    let url = format!("{resource}/logs/billing");
    let status = |r: reqwest::RequestBuilder| async move { r.send().await.unwrap().status().as_u16() };
    assert_eq!(status(lease.fence_reqwest(http().put(&url))).await, 200);
    let forged = u64::MAX.to_string();
    assert_eq!(status(http().put(&url).header("Fencing-Token", &forged)).await, 403);
    let higher = (lease.token() + 1).to_string();
    assert_eq!(
        status(http().put(&url).header("Fencing-Token", &higher).header("Fencing-Proof", &proof)).await,
        403
    );
    // The proof for billing cannot raise another lock's mark.
    let other = format!("{resource}/logs/payroll");
    assert_eq!(status(lease.fence_reqwest(http().put(&other))).await, 403);
    // The honest holder carries on.
    assert_eq!(status(lease.fence_reqwest(http().put(&url))).await, 200);
    lease.release().await.unwrap();

    // A lock service without a key: no proof, and `fence` drops a leftover one.
    let dir = tempfile::tempdir().unwrap();
    let plain = start(Config::new(dir.path())).await;
    let lease = DemoLockClient::new(plain.base_url())
        .unwrap()
        .lease("billing", "worker-1", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(lease.grant().proof, None);
    let mut req = http::Request::builder().header("Fencing-Proof", "old").body(()).unwrap();
    lease.fence(&mut req);
    assert!(req.headers().get("fencing-proof").is_none());
    let req = lease.fence_reqwest(http().put("http://127.0.0.1:9/x")).build().unwrap();
    assert!(req.headers().get("fencing-proof").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_verifier_admits_only_the_live_grant_and_caches_positive_answers() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(Config::new(dir.path())).await;
    let (base, requests, _task) = counted(svc.service()).await;
    let verifier = DemoLockVerifier::new(&base).unwrap().lock_for_key(logs_lock);
    let client = DemoLockClient::new(svc.base_url()).unwrap();
    let lease = client.lease("billing", "worker-1", Duration::from_secs(30)).await.unwrap();
    let t = lease.token();

    assert_eq!(verify(&verifier, "/logs/billing", t).await, Ok(()));
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    // The cache answers the second raise with this token.
    assert_eq!(verify(&verifier, "/logs/billing", t).await, Ok(()));
    assert_eq!(requests.load(Ordering::SeqCst), 1, "a cached answer asked again");
    assert_eq!(verifier.cached_answers(), 1);

    // Forged higher token, unknown lock, key guarded by no lock, an impossible lock name.
    let refused = |r: Result<(), VerifyError>| matches!(r, Err(VerifyError::Refused(_)));
    assert!(refused(verify(&verifier, "/logs/billing", t + 1).await));
    assert!(refused(verify(&verifier, "/logs/billing", t + 1).await), "refusals are not cached");
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    assert!(refused(verify(&verifier, "/logs/nobody", t).await));
    assert!(refused(verify(&verifier, "/other", t).await));
    assert_eq!(requests.load(Ordering::SeqCst), 4, "no lock, no question");
    let long = format!("/logs/{}", "n".repeat(300));
    let answer = verify(&verifier, &long, t).await;
    assert!(refused(answer.clone()), "{answer:?}");

    // Released: refused at once without the cache; the cached answer lasts its TTL.
    let uncached = DemoLockVerifier::new(&base).unwrap().lock_for_key(logs_lock).cache(0, Duration::ZERO);
    assert_eq!(verify(&uncached, "/logs/billing", t).await, Ok(()));
    lease.release().await.unwrap();
    let answer = verify(&uncached, "/logs/billing", t).await;
    assert!(refused(answer.clone()), "{answer:?}");
    let short =
        DemoLockVerifier::new(&base).unwrap().lock_for_key(logs_lock).cache(16, Duration::from_millis(200));
    let lease = client.lease("billing", "worker-1", Duration::from_secs(30)).await.unwrap();
    let t = lease.token();
    assert_eq!(verify(&short, "/logs/billing", t).await, Ok(()));
    lease.release().await.unwrap();
    assert_eq!(verify(&short, "/logs/billing", t).await, Ok(()), "within the cache TTL");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(refused(verify(&short, "/logs/billing", t).await), "after the cache TTL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_cannot_raise() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(Config::new(dir.path())).await;
    let grant = svc.service().acquire("billing", "w", Duration::from_millis(300)).await.unwrap();
    let verifier = DemoLockVerifier::new(svc.base_url()).unwrap().cache(0, Duration::ZERO);
    assert_eq!(verify(&verifier, "billing", grant.token).await, Ok(()));
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(matches!(verify(&verifier, "billing", grant.token).await, Err(VerifyError::Refused(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_verifier_is_unavailable_when_the_lock_service_is_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(Config::new(dir.path())).await;
    let grant = svc.service().acquire("billing", "w", Duration::from_secs(30)).await.unwrap();
    let verifier = DemoLockVerifier::new(svc.base_url()).unwrap().lock_for_key(logs_lock);
    // A resource behind the layer with this verifier.
    let (resource, _task) = fenced_resource(verifier.clone()).await;
    let url = format!("{resource}/logs/billing");
    let put = |token: u64| {
        let url = url.clone();
        async move {
            let r = http().put(url).header("Fencing-Token", token.to_string()).send().await.unwrap();
            (r.status().as_u16(), r.headers().get("retry-after").is_some())
        }
    };
    assert_eq!(put(u64::MAX).await.0, 403, "a forged token");

    svc.shutdown().await.unwrap();
    let answer = verify(&verifier, "/logs/billing", grant.token).await;
    assert!(matches!(answer, Err(VerifyError::Unavailable(_))), "{answer:?}");
    assert_eq!(put(grant.token).await, (503, true), "nothing admitted, retry later");

    // A failing (5xx) or slow lock service: unavailable too.
    let failing = Router::new().route(
        "/v1/locks/{name}/tokens/{token}",
        get(|| async { (http::StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
    );
    let (base, _t) = serve(failing).await;
    let answer = verify(&DemoLockVerifier::new(&base).unwrap(), "billing", 1).await;
    assert!(matches!(answer, Err(VerifyError::Unavailable(_))), "{answer:?}");
    let slow = Router::new().route(
        "/v1/locks/{name}/tokens/{token}",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            "late"
        }),
    );
    let (base, _t) = serve(slow).await;
    let quick = reqwest::Client::builder().no_proxy().timeout(Duration::from_millis(200)).build().unwrap();
    let answer = verify(&DemoLockVerifier::with_client(quick, &base), "billing", 1).await;
    assert!(matches!(answer, Err(VerifyError::Unavailable(_))), "{answer:?}");
}
