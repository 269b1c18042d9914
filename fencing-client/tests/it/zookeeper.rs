//! `ZkLockClient` and `Lease` against real ZooKeeper servers that the tests start
//! (standalone, `ZooKeeperServerMain`, on an ephemeral 127.0.0.1 port, data in a
//! temporary directory), with a real fenced resource (axum behind `FencingLayer`).
//!
//! Needs `java` and ZooKeeper's jar (Debian's `zookeeper` package:
//! /usr/share/java/zookeeper.jar, or `$ZOOKEEPER_JAR`). Without them these tests print
//! SKIPPED and pass, unless `CI=true`.

use std::time::Duration;

use fencing_client::{
    Grant, LeaseOptions, LockBackend, LockBackendExt, LockError, LossReason, ZkLockClient,
    backend::LockStatus,
};
use test_support::ZooKeeper;

use crate::common::{cancelled_at, lost_by_its_deadline};
use crate::conformance::{Backend, Restartable};

// ---------- the backend, for the conformance suite ----------

impl Backend for ZooKeeper {
    type Locks = ZkLockClient;
    async fn start() -> Option<Self> {
        ZooKeeper::start().await
    }
    async fn locks(&self) -> ZkLockClient {
        ZkLockClient::connect(&self.cluster()).await.unwrap()
    }
    async fn status(locks: &ZkLockClient, name: &str) -> Option<LockStatus> {
        locks.lock_status(name).await.unwrap()
    }
    const RACERS: usize = 8;
    const RACE_TTL: Duration = Duration::from_secs(10);
    /// ZooKeeper does not say when another session will expire.
    const TELLS_TIME_LEFT: bool = false;
    /// A session of 600 ms (6 ticks of 100 ms) that is never renewed.
    const PAUSED: (Duration, Duration) = (Duration::from_millis(600), Duration::from_millis(500));
    async fn after_race(&self, locks: &ZkLockClient, last: &Grant) {
        // The lock znode is where the docs say, a token is its czxid.
        let other = locks.acquire("a/b", "x", Duration::from_secs(10)).await.unwrap();
        let (_, stat) = locks.client().get_data("/fencing/locks/a%2Fb").await.unwrap();
        assert_eq!(stat.czxid as u64, other.token);
        assert!(other.token > last.token);
        locks.release(&other).await.unwrap();
    }
}

impl Restartable for ZooKeeper {
    type Locks = ZkLockClient;
    const NAME: &'static str = "ZooKeeper";
    async fn start() -> Option<Self> {
        ZooKeeper::start().await
    }
    async fn locks(&self) -> ZkLockClient {
        ZkLockClient::connect(&self.cluster()).await.unwrap()
    }
    async fn kill_9_and_restart(&mut self) {
        self.kill();
        assert!(self.data_dir().join("data").is_dir());
        assert!(self.run().await, "ZooKeeper did not restart");
    }
    /// Locks are ephemeral znodes of sessions that a restart may or may not keep: not promised.
    const HELD_SURVIVES: bool = false;
}

conformance!(ZooKeeper);
restart_conformance!(ZooKeeper);

// ---------- tests ----------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_znode_or_a_stopped_server_is_loss() {
    let Some(mut server) = ZooKeeper::start().await else { return };
    let a = ZkLockClient::connect(&server.cluster()).await.unwrap();
    let lease = a.lease("held", "client-a", Duration::from_millis(900)).await.unwrap();

    // The lock znode deleted behind the holder's back: loss at the next renewal.
    a.client().delete(&a.lock_path("held"), None).await.unwrap();
    let at = cancelled_at(&lease, Duration::from_secs(2)).await;
    assert!(at < lease.deadline(), "cancelled at the deadline, not on the renewal");
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));

    // The server stopped: loss by the local deadline at the latest.
    let options = LeaseOptions::default().request_timeout(Duration::from_millis(500));
    let lease = a.lease_with("job", "client-a", Duration::from_secs(3), options).await.unwrap();
    server.kill();
    lost_by_its_deadline(&lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error() {
    let Some(server) = ZooKeeper::start().await else { return };
    let locks = ZkLockClient::connect(&server.cluster()).await.unwrap();
    for (name, holder, ttl) in [
        ("", "a", Duration::from_secs(1)),
        ("x", "", Duration::from_secs(1)),
        ("x", "a", Duration::ZERO),
        ("x", "a", Duration::MAX),
    ] {
        let result = locks.acquire(name, holder, ttl).await;
        assert!(
            matches!(result, Err(LockError::InvalidArgument(_))),
            "{name:?} {holder:?} {ttl:?}: {result:?}"
        );
    }
    for bad in ["", "/", "locks", "/a/", "/a//b", "/a/../b", "/a/./b"] {
        assert!(matches!(locks.clone().with_prefix(bad), Err(LockError::InvalidArgument(_))), "{bad:?}");
    }
    // Odd names are one znode each, under another prefix too.
    let app = locks.clone().with_prefix("/app/locks").unwrap();
    for name in ["..", ".", "a/b/../c", "zwölf ✓", "x\0y"] {
        let grant = app.acquire(name, "h", Duration::from_secs(5)).await.unwrap();
        assert_eq!(app.lock_status(name).await.unwrap().unwrap().token, grant.token);
        app.release(&grant).await.unwrap();
    }
    // A grant this client never issued is not a lease it can renew.
    let forged = Grant {
        lease_id: "1-1".into(),
        name: "x".into(),
        holder: "a".into(),
        token: 1,
        ttl: Duration::from_secs(1),
        proof: None,
    };
    assert_eq!(locks.keepalive(&forged).await, Err(LockError::LeaseNotFound));
    assert_eq!(locks.release(&forged).await, Err(LockError::LeaseNotFound));
}
