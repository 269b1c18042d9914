//! `RedisLockClient` and `Lease` against real `redis-server`s that the tests start on
//! ephemeral 127.0.0.1 ports, each in a temporary directory (AOF, `appendfsync always`,
//! no RDB snapshots), with a real fenced resource (axum behind `FencingLayer`).
//!
//! Without `redis-server` on PATH (or in `$REDIS_SERVER_BIN`) these tests print
//! SKIPPED and pass, unless `CI=true`.

use std::time::Duration;

use fencing_client::{
    Grant, LeaseOptions, LockBackend, LockBackendExt, LockError, LossReason, RedisLockClient,
    backend::LockStatus,
};
use test_support::Redis;
use tokio::time::timeout;

use crate::common::{cancelled_at, lost_by_its_deadline};
use crate::conformance::{Backend, Restartable};

// ---------- the backend, for the conformance suite ----------

impl Backend for Redis {
    type Locks = RedisLockClient;
    async fn start() -> Option<Self> {
        Redis::start().await
    }
    async fn locks(&self) -> RedisLockClient {
        RedisLockClient::connect(&self.url()).await.unwrap()
    }
    async fn status(locks: &RedisLockClient, name: &str) -> Option<LockStatus> {
        locks.lock_status(name).await.unwrap()
    }
    /// Several clients (connections), several tasks each.
    const CLIENTS: usize = 4;
    /// The per-lock counter moves only for grants.
    const CONSECUTIVE_TOKENS: bool = true;
    const PAUSED: (Duration, Duration) = (Duration::from_millis(500), Duration::from_millis(400));
    const KEEPALIVE_TTL: Duration = Duration::from_millis(600);
    async fn after_race(&self, _: &RedisLockClient, last: &Grant) {
        // The keys, as documented.
        let mut raw = raw(self).await;
        let counter: u64 =
            redis::cmd("GET").arg("fencing:token:{report}").query_async(&mut raw).await.unwrap();
        assert_eq!(counter, last.token);
    }
}

impl Restartable for Redis {
    type Locks = RedisLockClient;
    const NAME: &'static str = "Redis";
    async fn start() -> Option<Self> {
        Redis::start().await
    }
    /// A new client per life of the server: its durability is checked again.
    async fn locks(&self) -> RedisLockClient {
        RedisLockClient::connect(&self.url()).await.unwrap()
    }
    async fn kill_9_and_restart(&mut self) {
        self.kill();
        self.run().await;
    }
    const RESTARTS: usize = 3;
    const GRANTS_PER_LIFE: usize = 5;
}

conformance!(Redis);
restart_conformance!(Redis);

/// A plain connection, to look and poke behind the lock client's back.
async fn raw(server: &Redis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

// ---------- tests ----------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_or_replaced_lock_key_cancels_the_handle_before_its_deadline() {
    let Some(server) = Redis::start().await else { return };
    let a = RedisLockClient::connect(&server.url()).await.unwrap();
    let mut raw = raw(&server).await;

    let lease = a.lease("job", "client-a", Duration::from_secs(6)).await.unwrap();
    let _: () = redis::cmd("DEL").arg(a.lock_key("job")).query_async(&mut raw).await.unwrap();
    let at = cancelled_at(&lease, Duration::from_secs(6)).await;
    assert!(at < lease.deadline(), "cancelled at the deadline, not on the renewal");
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));

    // Someone else's value in the key (an operator, another client library): not ours either.
    let lease = a.lease("job2", "client-a", Duration::from_secs(6)).await.unwrap();
    let _: () =
        redis::cmd("SET").arg(a.lock_key("job2")).arg("x 1 intruder").query_async(&mut raw).await.unwrap();
    let at = cancelled_at(&lease, Duration::from_secs(6)).await;
    assert!(at < lease.deadline());
    // Releasing must not delete the intruder's key.
    assert_eq!(a.release(lease.grant()).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.lock_status("job2").await.unwrap().unwrap().holder, "intruder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_server_cancels_the_handle_by_its_deadline() {
    let Some(mut server) = Redis::start().await else { return };
    let a = RedisLockClient::connect(&server.url()).await.unwrap();
    let options = LeaseOptions::default().request_timeout(Duration::from_millis(500));
    let lease = a.lease_with("job", "client-a", Duration::from_secs(3), options).await.unwrap();
    server.kill();
    lost_by_its_deadline(&lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_would_lose_the_counter_are_refused_unless_accepted() {
    let Some(everysec) = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"]).await
    else {
        return;
    };
    match RedisLockClient::connect(&everysec.url()).await {
        Err(LockError::NotDurable(e)) => {
            assert!(e.contains("appendfsync everysec") && e.contains("accept_volatile_counter"), "{e}")
        }
        other => panic!("expected NotDurable, got {other:?}"),
    }
    // The explicit opt-out connects, and locks work.
    let volatile =
        RedisLockClient::builder(everysec.url()).accept_volatile_counter(true).connect().await.unwrap();
    let grant = volatile.acquire("x", "a", Duration::from_secs(5)).await.unwrap();
    volatile.release(&grant).await.unwrap();

    let Some(no_aof) = Redis::start_with(&["--appendonly", "no"]).await else { return };
    match RedisLockClient::connect(&no_aof.url()).await {
        Err(LockError::NotDurable(e)) => assert!(e.contains("appendonly no"), "{e}"),
        other => panic!("expected NotDurable, got {other:?}"),
    }
    // CONFIG disabled (as on some managed services): the settings cannot be read, refused.
    let Some(hidden) = Redis::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--rename-command",
        "CONFIG",
        "",
    ])
    .await
    else {
        return;
    };
    match RedisLockClient::connect(&hidden.url()).await {
        Err(LockError::NotDurable(e)) => assert!(e.contains("cannot read"), "{e}"),
        other => panic!("expected NotDurable, got {other:?}"),
    }
    assert!(RedisLockClient::builder(hidden.url()).accept_volatile_counter(true).connect().await.is_ok());
}

/// The machine's shared Redis on 6379 keeps nothing on disk: the default check refuses
/// it. Read-only: only `CONFIG GET`, never a write, never a config change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_redis_on_6379_is_refused() {
    let probe = async {
        let mut c = redis::Client::open("redis://127.0.0.1:6379")?.get_multiplexed_async_connection().await?;
        let aof: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("appendonly").query_async(&mut c).await?;
        let fsync: Vec<String> =
            redis::cmd("CONFIG").arg("GET").arg("appendfsync").query_async(&mut c).await?;
        redis::RedisResult::Ok((aof.get(1).cloned(), fsync.get(1).cloned()))
    };
    let (appendonly, appendfsync) = match timeout(Duration::from_secs(3), probe).await {
        Ok(Ok(settings)) => settings,
        other => {
            // Not a failure in CI: CI starts its own servers and no shared one.
            eprintln!("\n*** SKIPPED: no Redis at 127.0.0.1:6379 to check ({other:?}) ***\n");
            return;
        }
    };
    let durable = appendonly.as_deref() == Some("yes") && appendfsync.as_deref() == Some("always");
    match RedisLockClient::connect("redis://127.0.0.1:6379").await {
        Ok(_) if durable => {}
        Err(LockError::NotDurable(e)) if !durable => {
            assert!(e.contains("appendonly"), "{e}");
            eprintln!("the shared Redis ({appendonly:?}, {appendfsync:?}) refused: {e}");
        }
        other => panic!("appendonly {appendonly:?}, appendfsync {appendfsync:?}: got {other:?}"),
    }
}
