//! `DemoLockClient` and `Lease` against the real lock service on 127.0.0.1 (real time).

use std::time::Duration;

use demo_lock_service::{Config, LockService, RunningService};
use fencing_client::{DemoLockClient, LockBackendExt, LockError, LossReason};
use test_support::Proxy;
use tokio::time::Instant;

async fn start(dir: &std::path::Path) -> RunningService {
    LockService::open(Config::new(dir)).unwrap().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// Waits for the lease's cancellation, at most `limit`.
async fn wait_cancelled(lease: &fencing_client::Lease, limit: Duration) {
    tokio::time::timeout(limit, lease.cancelled()).await.expect("lease not cancelled in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_status_conflict_release() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let client = DemoLockClient::new(svc.base_url()).unwrap();

    let lease = client.lease("jobs/billing", "worker-1", Duration::from_secs(30)).await.unwrap();
    assert_eq!(lease.name(), "jobs/billing");
    assert_eq!(lease.holder(), "worker-1");
    assert_eq!(lease.lease_id().len(), 32);
    assert_eq!(lease.grant().ttl, Duration::from_secs(30));
    assert!(lease.is_valid());

    let status = client.lock_status("jobs/billing").await.unwrap().expect("held");
    assert_eq!(status.holder, "worker-1");
    assert_eq!(status.token, lease.token());
    assert!(status.expires_in <= Duration::from_secs(30));

    match client.lease("jobs/billing", "worker-2", Duration::from_secs(5)).await {
        Err(LockError::Held { holder, expires_in, retry_after }) => {
            assert_eq!(holder, "worker-1");
            assert!(expires_in > Duration::from_secs(20));
            assert!(retry_after.unwrap() >= expires_in);
        }
        other => panic!("expected Held, got {other:?}"),
    }

    // Release frees the lock at once; the next grant has a higher token.
    let first_token = lease.token();
    let token = lease.cancellation_token();
    lease.release().await.unwrap();
    assert!(token.is_cancelled());
    assert_eq!(client.lock_status("jobs/billing").await.unwrap(), None);
    let next = client.lease("jobs/billing", "worker-2", Duration::from_secs(5)).await.unwrap();
    assert!(next.token() > first_token);

    // Bad input surfaces as Rejected with the service's detail.
    match client.lease("", "worker-3", Duration::from_secs(5)).await {
        Err(LockError::Rejected { status: 400, detail }) => assert!(detail.contains("name")),
        other => panic!("expected Rejected, got {other:?}"),
    }
    drop(next);
    drop(client);
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_hold_the_lock_past_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let client = DemoLockClient::new(svc.base_url()).unwrap();
    let lease = client.lease("l", "a", Duration::from_millis(1500)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.loss_reason());
    let status = client.lock_status("l").await.unwrap().expect("still held");
    assert_eq!(status.token, lease.token());
    assert!(matches!(client.lease("l", "b", Duration::from_millis(1500)).await, Err(LockError::Held { .. })));
    // Dropping the handle stops renewals: the lock lapses within one TTL.
    drop(lease);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(client.lock_status("l").await.unwrap(), None);
    drop(client);
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_service_is_loss() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let client = DemoLockClient::new(svc.base_url()).unwrap();
    let lease = client.lease("l", "a", Duration::from_secs(3)).await.unwrap();
    let deadline = lease.deadline();
    drop(client);
    svc.shutdown().await.unwrap();
    wait_cancelled(&lease, Duration::from_secs(5)).await;
    assert!(Instant::now() < deadline);
    assert!(!lease.is_valid());
    assert!(
        matches!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::Transport(_)))),
        "{:?}",
        lease.loss_reason()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_stops_answering_is_loss_before_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let proxy = Proxy::start(svc.addr()).await;
    // No idle pooling: every request opens a connection, so after `blackhole` each
    // renewal hangs instead of failing on a closed pooled connection.
    let http = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build().unwrap();
    let client = DemoLockClient::with_client(http, format!("http://{}", proxy.addr));
    let lease = client.lease("l", "a", Duration::from_secs(3)).await.unwrap();
    // A couple of renewals go through.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(lease.is_valid());
    proxy.blackhole();
    let deadline_when_cut = lease.deadline();
    let work = lease.run(tokio::time::sleep(Duration::from_secs(60)));
    let lost = tokio::time::timeout(Duration::from_secs(10), work).await.expect("work not stopped");
    let fired = Instant::now();
    assert!(lost.is_err());
    // A renewal timed out (ttl/3), and that happened before the local deadline.
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::Timeout)));
    assert!(fired < lease.deadline(), "cancelled at the deadline, not before it");
    assert!(lease.deadline() >= deadline_when_cut);
    drop(lease);
    drop(client);
    drop(proxy);
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_fences_outgoing_requests() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let client = DemoLockClient::new(svc.base_url()).unwrap();
    let lease = client.lease("doc", "w", Duration::from_secs(30)).await.unwrap();
    let mut req = http::Request::builder().method("PUT").uri("/docs/doc").body(()).unwrap();
    lease.fence(&mut req);
    assert_eq!(req.headers()["Fencing-Token"], lease.token().to_string().as_str());
    let built =
        lease.fence_reqwest(reqwest::Client::new().put("http://127.0.0.1:9/docs/doc")).build().unwrap();
    assert_eq!(built.headers()["fencing-token"], lease.token().to_string().as_str());
    lease.release().await.unwrap();
    drop(client);
    svc.shutdown().await.unwrap();
}

/// Two holders of one lock, one after the other: their operations carry their own
/// tokens and the same idempotency key, so a provider can tell them for one operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successive_holders_send_their_token_and_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let client = DemoLockClient::new(svc.base_url()).unwrap();
    let a = client.lease("billing", "A", Duration::from_secs(30)).await.unwrap();
    let a_op = a.operation("billing-2026-12", "charge:cus_3");
    a.release().await.unwrap();
    let b = client.lease("billing", "B", Duration::from_secs(30)).await.unwrap();
    let b_op = b.operation("billing-2026-12", "charge:cus_3");
    assert!(b_op.token() > a_op.token());
    assert_eq!(b_op.token(), b.token());
    assert_eq!(b_op.key(), a_op.key());
    assert_ne!(b.operation("billing-2026-12", "charge:cus_4").key(), a_op.key());
    for (op, lease) in [(&a_op, "A"), (&b_op, "B")] {
        let built = op.reqwest(reqwest::Client::new().post("http://127.0.0.1:9/v1/charges")).build().unwrap();
        assert_eq!(built.headers()["fencing-token"], op.token().to_string().as_str(), "{lease}");
        assert_eq!(built.headers()["idempotency-key"], a_op.key().as_str(), "{lease}");
    }
    b.release().await.unwrap();
    drop(client);
    svc.shutdown().await.unwrap();
}
