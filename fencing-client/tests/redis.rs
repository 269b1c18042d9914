//! `RedisLockClient` and `Lease` against real `redis-server`s that the tests start on
//! ephemeral 127.0.0.1 ports, each in a temporary directory (AOF, `appendfsync always`,
//! no RDB snapshots), with a real fenced resource (axum behind `FencingLayer`).
//!
//! Without `redis-server` on PATH (or in `$REDIS_SERVER_BIN`) these tests print
//! SKIPPED and pass, unless `CI=true`.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{cancelled_at, fenced_resource, free_port, skip, write_doc};
use fencing_client::{
    Grant, LeaseOptions, LockBackend, LockBackendExt, LockError, LossReason, RedisLockClient,
};
use tokio::time::{Instant, sleep, timeout};

// ---------- a real redis-server, killed on drop ----------

struct Redis {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    extra: Vec<String>,
    child: Option<Child>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Redis {
    /// A durable Redis (AOF, fsync on every write), or `None` after SKIPPED.
    async fn start() -> Option<Redis> {
        Self::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).await
    }

    async fn start_with(settings: &[&str]) -> Option<Redis> {
        let bin = match std::env::var_os("REDIS_SERVER_BIN") {
            Some(p) => PathBuf::from(p),
            None => {
                let path = std::env::var_os("PATH").unwrap_or_default();
                match std::env::split_paths(&path).map(|d| d.join("redis-server")).find(|p| p.is_file()) {
                    Some(p) => p,
                    None => {
                        return skip("redis-server not installed (put it on PATH or set REDIS_SERVER_BIN)");
                    }
                }
            }
        };
        let mut redis = Redis {
            bin,
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            extra: settings.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        redis.run().await;
        Some(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (or restarts, on the same directory and port) and waits for PING.
    async fn run(&mut self) {
        for _ in 0..3 {
            let log = std::fs::File::create(self.dir.path().join("redis.log")).unwrap();
            let child = Command::new(&self.bin)
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .arg("--dir")
                .arg(self.dir.path())
                .args(&self.extra)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            self.child = Some(child);
            if self.ready().await {
                return;
            }
            self.kill();
            self.port = free_port();
        }
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        panic!("redis-server did not start:\n{log}");
    }

    async fn ready(&mut self) -> bool {
        let client = redis::Client::open(self.url()).unwrap();
        for _ in 0..100 {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return false;
            }
            let ping = async {
                let mut c = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut c).await
            };
            if let Ok(Ok(_)) = timeout(Duration::from_millis(500), ping).await {
                return true;
            }
            sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// SIGKILL: no shutdown, no final AOF rewrite.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A plain connection, to look and poke behind the lock client's back.
    async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }
}

// ---------- tests ----------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_one_holder_each_later_holder_higher_and_stale_write_fenced() {
    let Some(server) = Redis::start().await else { return };
    let (resource, docs) = fenced_resource().await;
    // Several clients (connections), several tasks each.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(RedisLockClient::connect(&server.url()).await.unwrap());
    }
    let locks = clients[0].clone();

    let mut previous: Option<Grant> = None;
    for round in 0..3 {
        let racers: Vec<_> = (0..16)
            .map(|i| {
                let locks = clients[i % clients.len()].clone();
                tokio::spawn(async move {
                    let holder = format!("client-{round}-{i}");
                    locks.acquire("report", &holder, Duration::from_secs(30)).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut held = 0;
        for racer in racers {
            match timeout(Duration::from_secs(20), racer).await.unwrap().unwrap() {
                Ok(grant) => winners.push(grant),
                Err(LockError::Held { .. }) => held += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one holder");
        assert_eq!(held, 15);
        let grant = winners.pop().unwrap();
        assert_eq!(grant.ttl, Duration::from_secs(30));
        let status = locks.lock_status("report").await.unwrap().expect("held");
        assert_eq!((status.holder.as_str(), status.token), (grant.holder.as_str(), grant.token));
        assert!(status.expires_in > Duration::from_secs(25) && status.expires_in <= Duration::from_secs(30));
        match locks.acquire("report", "late", Duration::from_secs(30)).await {
            Err(LockError::Held { holder, expires_in, .. }) => {
                assert_eq!(holder, grant.holder);
                assert!(expires_in > Duration::from_secs(25), "{expires_in:?}");
            }
            other => panic!("expected Held, got {other:?}"),
        }
        assert_eq!(write_doc(&resource, "report", grant.token, &grant.holder).await, 200);
        if let Some(old) = &previous {
            // The counter moved only for grants: one per round.
            assert_eq!(grant.token, old.token + 1);
            assert_eq!(write_doc(&resource, "report", old.token, &old.holder).await, 409);
            assert_eq!(locks.keepalive(old).await, Err(LockError::LeaseNotFound));
            assert_eq!(locks.release(old).await, Err(LockError::LeaseNotFound));
        }
        assert_eq!(docs.lock().unwrap()["report"], (grant.holder.clone(), grant.token));
        locks.release(&grant).await.unwrap();
        assert_eq!(locks.lock_status("report").await.unwrap(), None);
        previous = Some(grant);
    }
    // The keys, as documented.
    let mut raw = server.raw().await;
    let counter: u64 = redis::cmd("GET").arg("fencing:token:{report}").query_async(&mut raw).await.unwrap();
    assert_eq!(counter, previous.unwrap().token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_is_replaced_on_the_server_clock_and_fenced() {
    let Some(server) = Redis::start().await else { return };
    let (resource, docs) = fenced_resource().await;
    let a = RedisLockClient::connect(&server.url()).await.unwrap();
    let b = RedisLockClient::connect(&server.url()).await.unwrap();

    // A takes a raw grant and never renews it: a holder paused past its TTL.
    let grant_a = a.acquire("ledger", "client-a", Duration::from_millis(500)).await.unwrap();
    let taken = Instant::now();
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A before the pause").await, 200);
    let lease_b = loop {
        match b.lease("ledger", "client-b", Duration::from_secs(5)).await {
            Ok(lease) => break lease,
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, "client-a"),
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(taken.elapsed() < Duration::from_secs(10), "A's lease never expired");
        sleep(Duration::from_millis(25)).await;
    };
    assert!(taken.elapsed() >= Duration::from_millis(400), "acquired after {:?}", taken.elapsed());
    assert!(lease_b.token() > grant_a.token);
    assert_eq!(write_doc(&resource, "ledger", lease_b.token(), "B").await, 200);

    assert_eq!(a.keepalive(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.release(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A after the pause").await, 409);
    assert_eq!(docs.lock().unwrap()["ledger"].0, "B");
    assert_eq!(b.lock_status("ledger").await.unwrap().unwrap().token, lease_b.token());
    lease_b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_hold_the_lock_past_its_ttl() {
    let Some(server) = Redis::start().await else { return };
    let a = RedisLockClient::connect(&server.url()).await.unwrap();
    let lease = a.lease("held", "client-a", Duration::from_millis(600)).await.unwrap();
    sleep(Duration::from_secs(2)).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.loss_reason());
    assert!(matches!(
        a.acquire("held", "client-b", Duration::from_secs(1)).await,
        Err(LockError::Held { .. })
    ));
    lease.release().await.unwrap();
    assert_eq!(a.lock_status("held").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_or_replaced_lock_key_cancels_the_handle_before_its_deadline() {
    let Some(server) = Redis::start().await else { return };
    let a = RedisLockClient::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;

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
    let at = cancelled_at(&lease, Duration::from_secs(4)).await;
    assert!(!lease.is_valid());
    assert!(at <= lease.deadline() + Duration::from_millis(50), "{:?} after", at - lease.deadline());
    match lease.loss_reason() {
        Some(LossReason::RenewalFailed(LockError::Transport(_) | LockError::Timeout))
        | Some(LossReason::DeadlinePassed) => {}
        other => panic!("unexpected loss reason {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_kill_9_restarts() {
    let Some(mut server) = Redis::start().await else { return };
    let mut last = 0;
    for restart in 0..3 {
        // A new client per life of the server: its durability is checked again.
        let locks = RedisLockClient::connect(&server.url()).await.unwrap();
        for _ in 0..5 {
            let grant = locks.acquire("job", "a", Duration::from_secs(30)).await.unwrap();
            assert!(grant.token > last, "life {restart}: {} after {last}", grant.token);
            last = grant.token;
            locks.release(&grant).await.unwrap();
        }
        // A lease held at the crash is still held after it (its key and expiry are in the AOF).
        let held = locks.acquire("held", "holder", Duration::from_secs(30)).await.unwrap();
        server.kill();
        server.run().await;
        let locks = RedisLockClient::connect(&server.url()).await.unwrap();
        let after = locks.acquire("job", "a", Duration::from_secs(30)).await.unwrap();
        assert!(after.token > last, "after kill -9 #{restart}: {} after {last}", after.token);
        eprintln!("Redis kill -9 #{restart}: last token before {last}, first after {}", after.token);
        last = after.token;
        locks.release(&after).await.unwrap();
        match locks.acquire("held", "other", Duration::from_secs(30)).await {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, "holder"),
            other => panic!("the lease held at the crash was lost: {other:?}"),
        }
        locks.release(&held).await.unwrap();
    }
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
