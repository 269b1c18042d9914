//! `PgLockClient` and `Lease` against a real PostgreSQL, with a real fenced resource
//! (axum behind `FencingLayer`) taking the writes.
//!
//! Most tests use the local PostgreSQL (127.0.0.1:5432, user postgres, trust auth), each
//! in a database of its own, dropped at the end. The restart test starts a cluster of its
//! own (initdb in a temporary directory, an ephemeral port) so that it can kill -9 it.
//! Without PostgreSQL these tests print SKIPPED and pass, unless `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencing_client::{
    Grant, LeaseOptions, LockBackend, LockBackendExt, LockError, LossReason, PgLockClient,
    backend::LockStatus,
};
use test_support::{Proxy, TestDb, skip};
use tokio::time::sleep;
use tokio_postgres::NoTls;

use crate::common::{cancelled_at, lost_by_its_deadline};
use crate::conformance::{Backend, Restartable};

/// A migrated client of the test's database.
async fn client(db: &TestDb) -> PgLockClient {
    let client = PgLockClient::connect(&db.url()).unwrap();
    client.migrate().await.unwrap();
    client
}

/// A plain connection, to look at and change the tables behind the client's back.
async fn raw(db: &TestDb) -> tokio_postgres::Client {
    db.connect().await
}

// ---------- the backend, for the conformance suite ----------

impl Backend for TestDb {
    type Locks = PgLockClient;
    async fn start() -> Option<Self> {
        TestDb::create().await
    }
    async fn locks(&self) -> PgLockClient {
        client(self).await
    }
    async fn status(locks: &PgLockClient, name: &str) -> Option<LockStatus> {
        locks.lock_status(name).await.unwrap()
    }
    // Not `CONSECUTIVE_TOKENS`: racing acquires of a free lock may spend a value.
    const PAUSED: (Duration, Duration) = (Duration::from_millis(800), Duration::from_millis(700));
    async fn after_race(&self, locks: &PgLockClient, last: &Grant) {
        assert_eq!(last.lease_id, last.token.to_string());
        // Tokens come from one counter: another lock's token is higher still, and failed
        // attempts on a held lock spend no counter values.
        let other = locks.acquire("other", "a", Duration::from_secs(30)).await.unwrap();
        assert!(other.token > last.token);
        for _ in 0..5 {
            assert!(matches!(
                locks.acquire("other", "b", Duration::from_secs(30)).await,
                Err(LockError::Held { .. })
            ));
        }
        locks.release(&other).await.unwrap();
        let next = locks.acquire("other", "b", Duration::from_secs(30)).await.unwrap();
        assert_eq!(next.token, other.token + 1);
    }
}

impl Restartable for Cluster {
    type Locks = PgLockClient;
    const NAME: &'static str = "PostgreSQL";
    async fn start() -> Option<Self> {
        let mut cluster = Cluster::init()?;
        cluster.start().await;
        Some(cluster)
    }
    async fn locks(&self) -> PgLockClient {
        let locks = PgLockClient::connect(&self.url()).unwrap();
        locks.migrate().await.unwrap();
        locks
    }
    async fn kill_9_and_restart(&mut self) {
        self.kill();
        self.start().await;
    }
    /// The pool reconnects after the restart.
    const NEW_CLIENT_PER_LIFE: bool = false;
}

conformance!(TestDb);
restart_conformance!(Cluster);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_nobody_took_over_cannot_be_renewed() {
    let Some(db) = TestDb::create().await else { return };
    let a = client(&db).await;
    let c = a.acquire("idle", "client-c", Duration::from_millis(100)).await.unwrap();
    sleep(Duration::from_millis(300)).await;
    assert_eq!(a.keepalive(&c).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.lock_status("idle").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lease_row_cancels_the_handle_before_its_deadline() {
    let Some(db) = TestDb::create().await else { return };
    let a = client(&db).await;
    let lease = a.lease("job", "client-a", Duration::from_secs(6)).await.unwrap();
    let token = lease.cancellation_token();
    let deleted = raw(&db).await.execute("DELETE FROM fencing_leases WHERE name = 'job'", &[]).await.unwrap();
    assert_eq!(deleted, 1);
    // The next renewal (within TTL/3 = 2 s) finds no row, well before the 5.4 s deadline.
    let at = cancelled_at(&lease, Duration::from_secs(6)).await;
    assert!(token.is_cancelled() && !lease.is_valid());
    assert!(at < lease.deadline(), "cancelled at the deadline, not on the renewal");
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));
    let next = a.acquire("job", "client-b", Duration::from_secs(6)).await.unwrap();
    assert!(next.token > lease.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_cancels_the_handle_by_its_deadline() {
    let Some(db) = TestDb::create().await else { return };
    client(&db).await; // migrated
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=1",
        proxy.addr.port(),
        db.name()
    );
    let a = PgLockClient::connect(&url).unwrap();
    let options = LeaseOptions::default().request_timeout(Duration::from_millis(500));
    let lease = a.lease_with("job", "client-a", Duration::from_secs(3), options).await.unwrap();
    assert!(lease.is_valid());
    proxy.blackhole();
    lost_by_its_deadline(&lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_a_missing_table_are_clear_errors() {
    let Some(db) = TestDb::create().await else { return };
    let unmigrated = PgLockClient::connect(&db.url()).unwrap();
    match unmigrated.acquire("x", "a", Duration::from_secs(1)).await {
        Err(LockError::Rejected { detail, .. }) => assert!(detail.contains("migrate"), "{detail}"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    let locks = client(&db).await;
    locks.migrate().await.unwrap(); // idempotent
    for (name, holder, ttl) in [
        ("", "a", Duration::from_secs(1)),
        ("x", "", Duration::from_secs(1)),
        ("x", "a", Duration::ZERO),
        ("x\0y", "a", Duration::from_secs(1)),
        ("x", "a", Duration::MAX),
    ] {
        let result = locks.acquire(name, holder, ttl).await;
        assert!(
            matches!(result, Err(LockError::InvalidArgument(_))),
            "{name:?} {holder:?} {ttl:?}: {result:?}"
        );
    }
    let forged = Grant {
        lease_id: "1".into(),
        name: "x".into(),
        holder: "a".into(),
        token: u64::MAX,
        ttl: Duration::from_secs(1),
        proof: None,
    };
    assert!(matches!(locks.keepalive(&forged).await, Err(LockError::InvalidArgument(_))));
    assert!(matches!(locks.release(&forged).await, Err(LockError::InvalidArgument(_))));
    // Names are kept byte for byte, whatever they hold.
    let odd = locks.acquire("it's \"odd\"; DROP TABLE x; ✓", "h'", Duration::from_secs(5)).await.unwrap();
    assert_eq!(locks.lock_status("it's \"odd\"; DROP TABLE x; ✓").await.unwrap().unwrap().holder, "h'");
    locks.release(&odd).await.unwrap();
    // Another table, in another schema.
    raw(&db).await.batch_execute("CREATE SCHEMA ops").await.unwrap();
    let ops = PgLockClient::connect(&db.url()).unwrap().with_table("ops.locks").unwrap();
    ops.migrate().await.unwrap();
    let g = ops.acquire("x", "a", Duration::from_secs(5)).await.unwrap();
    assert_eq!(g.token, 1, "a table of its own has a counter of its own");
    assert_eq!(locks.lock_status("x").await.unwrap(), None);
}

// ---------- a PostgreSQL cluster of the test's own, to kill -9 ----------

struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    owner: Option<(u32, u32)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Cluster {
    /// initdb in a fresh temporary directory, or `None` (after SKIPPED) without the binaries.
    fn init() -> Option<Cluster> {
        let Some(bin) = pg_bin() else { return skip("PostgreSQL server binaries (initdb) not found") };
        let dir = tempfile::tempdir().unwrap();
        // PostgreSQL refuses to run as root: run it as the `postgres` user then.
        let owner = if is_root() {
            Some(postgres_user().expect("no `postgres` user to run PostgreSQL as"))
        } else {
            None
        };
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let status = run_as(Command::new(bin.join("initdb")), owner)
            .args(["-D", "data", "-U", "postgres", "--auth=trust", "--no-sync"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "initdb failed");
        Some(Cluster { bin, dir, port: test_support::free_port(), child: None, owner })
    }

    fn url(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2", self.port)
    }

    /// Starts the postmaster and waits (at most 30 s) until it accepts connections.
    async fn start(&mut self) {
        for _ in 0..60 {
            let log = std::fs::File::create(self.dir.path().join("pg.log")).unwrap();
            let child = run_as(Command::new(self.bin.join("postgres")), self.owner)
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1"])
                .args(["-c", "unix_socket_directories=", "-c", "fsync=on"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            self.child = Some(child);
            for _ in 0..20 {
                if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                    break; // exited: old backends still hold shared memory after a kill -9; retry
                }
                if tokio_postgres::connect(&self.url(), NoTls).await.is_ok() {
                    return;
                }
                sleep(Duration::from_millis(100)).await;
            }
            self.kill();
            sleep(Duration::from_millis(400)).await;
        }
        let log = std::fs::read_to_string(self.dir.path().join("pg.log")).unwrap_or_default();
        panic!("PostgreSQL did not start:\n{log}");
    }

    /// SIGKILL to the postmaster, no shutdown of any kind.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn run_as(mut command: Command, owner: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
    command
}

fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("postgres").is_file())
        .collect();
    found.sort();
    found.pop()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string(Path::new("/etc/passwd")).ok()?;
    let line = passwd.lines().find(|l| l.starts_with("postgres:"))?;
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
}
