//! `ZkLockClient` and `Lease` against real ZooKeeper servers that the tests start
//! (standalone, `ZooKeeperServerMain`, on an ephemeral 127.0.0.1 port, data in a
//! temporary directory), with a real fenced resource (axum behind `FencingLayer`).
//!
//! Needs `java` and ZooKeeper's jar (Debian's `zookeeper` package:
//! /usr/share/java/zookeeper.jar, or `$ZOOKEEPER_JAR`). Without them these tests print
//! SKIPPED and pass, unless `CI=true`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{cancelled_at, fenced_resource, free_port, skip, write_doc};
use fencing_client::{Grant, LeaseOptions, LockBackend, LockBackendExt, LockError, LossReason, ZkLockClient};
use tokio::time::{Instant, sleep, timeout};

// ---------- a real ZooKeeper, killed on drop ----------

struct ZooKeeper {
    java: PathBuf,
    classpath: String,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        self.kill();
    }
}

fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

impl ZooKeeper {
    async fn start() -> Option<ZooKeeper> {
        let Some(java) = find("java") else { return skip("java not installed (ZooKeeper needs a JRE)") };
        let jar = std::env::var_os("ZOOKEEPER_JAR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/share/java/zookeeper.jar"));
        if !jar.is_file() {
            return skip(&format!("ZooKeeper not installed ({} missing; set ZOOKEEPER_JAR)", jar.display()));
        }
        // The jar's manifest names its dependencies; slf4j-nop, if there, silences logging.
        let mut classpath = jar.display().to_string();
        let nop = jar.with_file_name("slf4j-nop.jar");
        if nop.is_file() {
            classpath = format!("{classpath}:{}", nop.display());
        }
        let mut zk = ZooKeeper { java, classpath, dir: tempfile::tempdir().unwrap(), port: 0, child: None };
        for _ in 0..3 {
            zk.port = free_port();
            if zk.run().await {
                return Some(zk);
            }
        }
        let log = std::fs::read_to_string(zk.dir.path().join("zk.log")).unwrap_or_default();
        panic!("ZooKeeper did not start:\n{log}");
    }

    fn cluster(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts (or restarts on the same data and port) and waits (at most 60 s) for a session.
    async fn run(&mut self) -> bool {
        let dir = self.dir.path();
        let cfg = format!(
            "tickTime=100\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             maxSessionTimeout=60000\nadmin.enableServer=false\n",
            dir.join("data").display(),
            self.port
        );
        std::fs::write(dir.join("zoo.cfg"), cfg).unwrap();
        let log = std::fs::File::create(dir.join("zk.log")).unwrap();
        let child = Command::new(&self.java)
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", &self.classpath])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return false;
            }
            if let Ok(Ok(_)) = timeout(Duration::from_secs(2), ZkLockClient::connect(&self.cluster())).await {
                return true;
            }
            sleep(Duration::from_millis(100)).await;
        }
        self.kill();
        false
    }

    /// SIGKILL: no shutdown of any kind.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

// ---------- tests ----------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_one_holder_each_later_holder_higher_and_stale_write_fenced() {
    let Some(server) = ZooKeeper::start().await else { return };
    let (resource, docs) = fenced_resource().await;
    let locks = ZkLockClient::connect(&server.cluster()).await.unwrap();

    let mut previous: Option<Grant> = None;
    for round in 0..3 {
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    let holder = format!("client-{round}-{i}");
                    locks.acquire("report", &holder, Duration::from_secs(10)).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut held = 0;
        for racer in racers {
            match timeout(Duration::from_secs(30), racer).await.unwrap().unwrap() {
                Ok(grant) => winners.push(grant),
                Err(LockError::Held { .. }) => held += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one holder");
        assert_eq!(held, 7);
        let grant = winners.pop().unwrap();
        assert_eq!(grant.ttl, Duration::from_secs(10));
        let status = locks.lock_status("report").await.unwrap().expect("held");
        assert_eq!((status.holder.as_str(), status.token), (grant.holder.as_str(), grant.token));
        match locks.acquire("report", "late", Duration::from_secs(10)).await {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, grant.holder),
            other => panic!("expected Held, got {other:?}"),
        }
        assert_eq!(write_doc(&resource, "report", grant.token, &grant.holder).await, 200);
        if let Some(old) = &previous {
            assert!(grant.token > old.token, "{:#x} > {:#x}", grant.token, old.token);
            assert_eq!(write_doc(&resource, "report", old.token, &old.holder).await, 409);
            assert_eq!(locks.keepalive(old).await, Err(LockError::LeaseNotFound));
            assert_eq!(locks.release(old).await, Err(LockError::LeaseNotFound));
        }
        assert_eq!(docs.lock().unwrap()["report"], (grant.holder.clone(), grant.token));
        locks.release(&grant).await.unwrap();
        assert_eq!(locks.lock_status("report").await.unwrap(), None);
        previous = Some(grant);
    }
    // The lock znode is where the docs say, a token is its czxid.
    let other = locks.acquire("a/b", "x", Duration::from_secs(10)).await.unwrap();
    let (_, stat) = locks.client().get_data("/fencing/locks/a%2Fb").await.unwrap();
    assert_eq!(stat.czxid as u64, other.token);
    assert!(other.token > previous.unwrap().token);
    locks.release(&other).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_session_frees_the_lock_and_the_stale_write_is_fenced() {
    let Some(server) = ZooKeeper::start().await else { return };
    let (resource, docs) = fenced_resource().await;
    let a = ZkLockClient::connect(&server.cluster()).await.unwrap();
    let b = ZkLockClient::connect(&server.cluster()).await.unwrap();

    // A takes a raw grant and never renews it: a holder paused past its TTL.
    let grant_a = a.acquire("ledger", "client-a", Duration::from_millis(600)).await.unwrap();
    let taken = Instant::now();
    assert_eq!(grant_a.ttl, Duration::from_millis(600));
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A before the pause").await, 200);
    let lease_b = loop {
        match b.lease("ledger", "client-b", Duration::from_secs(5)).await {
            Ok(lease) => break lease,
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, "client-a"),
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(taken.elapsed() < Duration::from_secs(10), "A's session never expired");
        sleep(Duration::from_millis(25)).await;
    };
    assert!(taken.elapsed() >= Duration::from_millis(500), "acquired after {:?}", taken.elapsed());
    assert!(lease_b.token() > grant_a.token);
    assert_eq!(write_doc(&resource, "ledger", lease_b.token(), "B").await, 200);

    // A wakes up: its session expired; it cannot renew, nor release B's lock.
    assert_eq!(a.keepalive(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.release(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A after the pause").await, 409);
    assert_eq!(docs.lock().unwrap()["ledger"].0, "B");
    assert_eq!(b.lock_status("ledger").await.unwrap().unwrap().token, lease_b.token());
    lease_b.release().await.unwrap();
    assert_eq!(b.lock_status("ledger").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_hold_the_lock_past_its_ttl_and_loss_is_detected() {
    let Some(mut server) = ZooKeeper::start().await else { return };
    let a = ZkLockClient::connect(&server.cluster()).await.unwrap();

    let lease = a.lease("held", "client-a", Duration::from_millis(900)).await.unwrap();
    sleep(Duration::from_secs(3)).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.loss_reason());
    assert!(matches!(
        a.acquire("held", "client-b", Duration::from_secs(1)).await,
        Err(LockError::Held { .. })
    ));

    // The lock znode deleted behind the holder's back: loss at the next renewal.
    a.client().delete(&a.lock_path("held"), None).await.unwrap();
    let at = cancelled_at(&lease, Duration::from_secs(2)).await;
    assert!(at < lease.deadline(), "cancelled at the deadline, not on the renewal");
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));

    // The server stopped: loss by the local deadline at the latest.
    let options = LeaseOptions::default().request_timeout(Duration::from_millis(500));
    let lease = a.lease_with("job", "client-a", Duration::from_secs(3), options).await.unwrap();
    server.kill();
    let at = cancelled_at(&lease, Duration::from_secs(4)).await;
    assert!(at <= lease.deadline() + Duration::from_millis(50), "{:?} after", at - lease.deadline());
    match lease.loss_reason() {
        Some(LossReason::RenewalFailed(LockError::Transport(_) | LockError::Timeout))
        | Some(LossReason::DeadlinePassed) => {}
        other => panic!("unexpected loss reason {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_kill_9_restarts() {
    let Some(mut server) = ZooKeeper::start().await else { return };
    let mut last = 0;
    for restart in 0..2 {
        let locks = ZkLockClient::connect(&server.cluster()).await.unwrap();
        for _ in 0..3 {
            let grant = locks.acquire("job", "a", Duration::from_secs(10)).await.unwrap();
            assert!(grant.token > last, "life {restart}: {:#x} after {last:#x}", grant.token);
            last = grant.token;
            locks.release(&grant).await.unwrap();
        }
        server.kill();
        assert!(server.data_dir().join("data").is_dir());
        assert!(server.run().await, "ZooKeeper did not restart");
        let locks = ZkLockClient::connect(&server.cluster()).await.unwrap();
        let after = locks.acquire("job", "a", Duration::from_secs(10)).await.unwrap();
        assert!(after.token > last, "after kill -9 #{restart}: {:#x} after {last:#x}", after.token);
        eprintln!(
            "ZooKeeper kill -9 #{restart}: last token before {last:#x}, first after {:#x}",
            after.token
        );
        last = after.token;
        locks.release(&after).await.unwrap();
    }
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
