//! `EtcdLockClient` and `Lease` against a real etcd started on ephemeral 127.0.0.1 ports,
//! with a real fenced resource (axum behind `FencingLayer`) taking the writes.
//!
//! Without an `etcd` binary on PATH (or in `$ETCD_BIN`) these tests print
//! "SKIPPED: etcd not installed" and pass, unless `CI=true`, where that is a failure.

use std::time::Duration;

use fencing_client::{
    EtcdLockClient, LockBackendExt, LockError, LossReason, backend::LockStatus, verify::EtcdVerifier,
};
use fencing_layer::verify::{Raise, TokenVerifier, VerifyError};
use test_support::Etcd;
use tokio::time::{Instant, sleep};

use crate::common::{cancelled_at, fenced_resource, lost_by_its_deadline, write_doc};
use crate::conformance::Backend;

// ---------- the backend, for the conformance suite ----------

impl Backend for Etcd {
    type Locks = EtcdLockClient;
    async fn start() -> Option<Self> {
        Etcd::start().await
    }
    async fn locks(&self) -> EtcdLockClient {
        EtcdLockClient::connect([self.endpoint.as_str()]).await.unwrap()
    }
    async fn status(locks: &EtcdLockClient, name: &str) -> Option<LockStatus> {
        locks.lock_status(name).await.unwrap()
    }
    /// etcd's lease TTLs are whole seconds, at least 2 s by default.
    const PAUSED: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(1));
    const KEEPALIVE_TTL: Duration = Duration::from_secs(2);
}

conformance!(Etcd);

// ---------- tests ----------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_clients_release_then_stale_write_is_fenced() {
    let Some(etcd) = Etcd::start().await else { return };
    let (resource, docs) = fenced_resource().await;
    let a = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();
    let b = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();

    let lease_a = a.lease("report", "client-a", Duration::from_secs(10)).await.unwrap();
    assert_eq!(lease_a.holder(), "client-a");
    assert_eq!(lease_a.grant().ttl, Duration::from_secs(10));
    assert!(lease_a.is_valid());
    let token_a = lease_a.token();

    // The lock key is visible to anyone, with the holder and the token.
    let status = b.lock_status("report").await.unwrap().expect("held");
    assert_eq!((status.holder.as_str(), status.token), ("client-a", token_a));
    assert!(status.expires_in <= Duration::from_secs(10) && status.expires_in >= Duration::from_secs(8));
    let mut kv = b.client().clone();
    let raw = kv.get("fencing/locks/report", None).await.unwrap();
    assert_eq!(raw.kvs()[0].value_str().unwrap(), "client-a");
    assert_eq!(raw.kvs()[0].create_revision() as u64, token_a);

    // B contends: the same "held by another" error the demo backend gives.
    match b.lease("report", "client-b", Duration::from_secs(10)).await {
        Err(LockError::Held { holder, expires_in, .. }) => {
            assert_eq!(holder, "client-a");
            assert!(expires_in >= Duration::from_secs(8), "{expires_in:?}");
        }
        other => panic!("expected Held, got {other:?}"),
    }
    // The losing attempt left no lease behind: only A's lease exists.
    assert_eq!(kv.leases().await.unwrap().leases().len(), 1);

    assert_eq!(write_doc(&resource, "report", token_a, "from A, 1").await, 200);
    lease_a.release().await.unwrap();
    assert_eq!(b.lock_status("report").await.unwrap(), None);
    assert!(kv.leases().await.unwrap().leases().is_empty(), "release revokes the etcd lease");

    let lease_b = b.lease("report", "client-b", Duration::from_secs(10)).await.unwrap();
    assert!(lease_b.token() > token_a, "{} > {token_a}", lease_b.token());
    assert_eq!(write_doc(&resource, "report", lease_b.token(), "from B").await, 200);
    // A's late write (it believes it still holds the lock) is rejected by the resource.
    assert_eq!(write_doc(&resource, "report", token_a, "from A, late").await, 409);
    assert_eq!(docs.lock().unwrap()["report"], ("from B".to_owned(), lease_b.token()));

    // Revisions are cluster-wide: another lock's token is higher still.
    let other = a.lease("other", "client-a", Duration::from_secs(10)).await.unwrap();
    assert!(other.token() > lease_b.token());
    other.release().await.unwrap();
    lease_b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_hold_the_lock_past_its_ttl_sub_second_ttls_round_up() {
    let Some(etcd) = Etcd::start().await else { return };
    let a = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();
    let b = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();

    // 2 s TTL, renewed every 667 ms: still held after three TTLs.
    let lease = a.lease("held", "client-a", Duration::from_secs(2)).await.unwrap();
    sleep(Duration::from_secs(6)).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.loss_reason());
    assert_eq!(b.lock_status("held").await.unwrap().unwrap().token, lease.token());
    assert!(matches!(b.lease("held", "client-b", Duration::from_secs(2)).await, Err(LockError::Held { .. })));
    lease.release().await.unwrap();

    // 1500 ms asks etcd for 2 s (rounded up). The local deadline counts the 1500 ms the
    // caller asked for, and renewals (every 500 ms) keep it valid past the TTL.
    let sent = Instant::now();
    let rounded = a.lease("rounded", "client-a", Duration::from_millis(1500)).await.unwrap();
    assert_eq!(rounded.grant().ttl, Duration::from_secs(2));
    assert!(rounded.deadline() <= sent + Duration::from_millis(1500));
    sleep(Duration::from_secs(3)).await;
    assert!(rounded.is_valid(), "lost: {:?}", rounded.loss_reason());
    rounded.release().await.unwrap();

    // 500 ms asks for 1 s, which etcd raises to its minimum lease TTL (2 s by default);
    // the local deadline still counts 500 ms.
    let sent = Instant::now();
    let short = a.lease("short", "client-a", Duration::from_millis(500)).await.unwrap();
    let granted = short.grant().ttl;
    assert!(granted >= Duration::from_secs(1) && granted.subsec_nanos() == 0, "{granted:?}");
    assert!(short.deadline() <= sent + Duration::from_millis(500));
    short.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_etcd_lease_cancels_the_handle_before_its_deadline() {
    let Some(etcd) = Etcd::start().await else { return };
    let a = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();
    let admin = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();

    let lease = a.lease("job", "client-a", Duration::from_secs(6)).await.unwrap();
    let token = lease.cancellation_token();
    let id = i64::from_str_radix(lease.lease_id(), 16).unwrap();
    admin.client().clone().lease_revoke(id).await.unwrap();
    // The next renewal (within TTL/3 = 2 s) hears TTL 0 and gives the lease up,
    // well before the local deadline (5.4 s after the acquire).
    let at = cancelled_at(&lease, Duration::from_secs(6)).await;
    assert!(token.is_cancelled());
    assert!(!lease.is_valid());
    assert!(at < lease.deadline(), "cancelled at the deadline, not on the renewal");
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));
    // Revoking deleted the key: the lock is free, and the next grant's token is higher.
    let next = admin.lease("job", "client-b", Duration::from_secs(6)).await.unwrap();
    assert!(next.token() > lease.token());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lock_key_is_loss_even_while_the_etcd_lease_lives() {
    let Some(etcd) = Etcd::start().await else { return };
    let a = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();
    let admin = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();

    let lease = a.lease("job", "client-a", Duration::from_secs(6)).await.unwrap();
    admin.client().clone().delete("fencing/locks/job", None).await.unwrap();
    let at = cancelled_at(&lease, Duration::from_secs(6)).await;
    assert!(at < lease.deadline());
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_etcd_cancels_the_handle_by_its_deadline() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let a = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();
    let lease = a.lease("job", "client-a", Duration::from_secs(3)).await.unwrap();
    assert!(lease.is_valid());
    etcd.stop();
    lost_by_its_deadline(&lease).await;
}

// ---------- the online check: EtcdVerifier ----------

async fn verify(v: &EtcdVerifier, key: &str, token: u64) -> Result<(), VerifyError> {
    let headers = http::HeaderMap::new();
    v.verify(&Raise::new(key, token, 0, &headers)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_verifier_admits_only_the_live_grant() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let locks = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap().with_prefix("app/locks/");
    let verifier = EtcdVerifier::from_lock_client(&locks)
        .lock_for_key(|key| key.strip_prefix("/docs/").map(str::to_owned))
        .cache(0, Duration::ZERO);
    let cached = EtcdVerifier::from_lock_client(&locks);
    let refused = |r: Result<(), VerifyError>| matches!(r, Err(VerifyError::Refused(_)));

    let lease = locks.lease("report", "client-a", Duration::from_secs(5)).await.unwrap();
    let t = lease.token();
    assert_eq!(verify(&verifier, "/docs/report", t).await, Ok(()));
    assert!(refused(verify(&verifier, "/docs/report", t + 1).await), "a forged higher token");
    assert!(refused(verify(&verifier, "/docs/report", u64::MAX).await), "not even a revision");
    assert!(refused(verify(&verifier, "/docs/other", t).await), "a lock nobody holds");
    assert!(refused(verify(&verifier, "/elsewhere", t).await), "no lock guards the key");
    // The default prefix does not see this client's keys.
    let wrong_prefix = EtcdVerifier::new(locks.client().clone()).cache(0, Duration::ZERO);
    assert!(refused(verify(&wrong_prefix, "report", t).await));
    assert_eq!(verify(&cached, "report", t).await, Ok(()));
    assert_eq!(cached.cached_answers(), 1);

    // Released, then re-acquired: the old token is no longer the live grant.
    lease.release().await.unwrap();
    assert!(refused(verify(&verifier, "/docs/report", t).await));
    let again = locks.lease("report", "client-b", Duration::from_secs(5)).await.unwrap();
    assert!(again.token() > t);
    assert!(refused(verify(&verifier, "/docs/report", t).await));
    assert_eq!(verify(&verifier, "/docs/report", again.token()).await, Ok(()));
    // The cache still answers for t within its TTL (it was genuine a moment ago).
    assert_eq!(verify(&cached, "report", t).await, Ok(()));

    // etcd stopped: unavailable, never refused or admitted.
    etcd.stop();
    let answer =
        tokio::time::timeout(Duration::from_secs(10), verify(&verifier, "/docs/report", again.token()))
            .await
            .expect("etcd-client's own timeout answers first");
    assert!(matches!(answer, Err(VerifyError::Unavailable(_))), "{answer:?}");
}
