//! `PgLockClient` and `Lease` against a real PostgreSQL, with a real fenced resource
//! (axum behind `FencingLayer`) taking the writes.
//!
//! Most tests use the local PostgreSQL (127.0.0.1:5432, user postgres, trust auth), each
//! in a database of its own, dropped at the end. The restart test starts a cluster of its
//! own (initdb in a temporary directory, an ephemeral port) so that it can kill -9 it.
//! Without PostgreSQL these tests print SKIPPED and pass, unless `CI=true`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Proxy, cancelled_at, fenced_resource, skip, write_doc};
use fencing_client::{Grant, LeaseOptions, LockBackend, LockBackendExt, LockError, LossReason, PgLockClient};
use tokio::time::{Instant, sleep, timeout};
use tokio_postgres::NoTls;

const SERVER: &str = "host=127.0.0.1 port=5432 user=postgres connect_timeout=3";

/// A database of its own for one test; dropped (connections and all) on drop.
struct TestDb {
    name: String,
}

impl TestDb {
    async fn create() -> Option<TestDb> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let admin = match admin().await {
            Ok(client) => client,
            Err(e) => return skip(&format!("PostgreSQL not reachable at 127.0.0.1:5432 as postgres: {e}")),
        };
        let name =
            format!("fencing_locks_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        Some(TestDb { name })
    }

    fn url(&self) -> String {
        format!("{SERVER} dbname={}", self.name)
    }

    /// A migrated client of this database.
    async fn client(&self) -> PgLockClient {
        let client = PgLockClient::connect(&self.url()).unwrap();
        client.migrate().await.unwrap();
        client
    }

    /// A plain connection, to look at and change the tables behind the client's back.
    async fn raw(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(), NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop cannot await and may run inside the test's runtime: a thread with a
        // runtime of its own drops the database.
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let admin = admin().await.map_err(|e| e.to_string())?;
                admin.batch_execute(&sql).await.map_err(|e| e.to_string())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}

async fn admin() -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(&format!("{SERVER} dbname=postgres"), NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_one_holder_each_later_holder_higher_and_stale_write_fenced() {
    let Some(db) = TestDb::create().await else { return };
    let (resource, docs) = fenced_resource().await;
    let locks = db.client().await;

    // 16 clients race for one free lock, 3 rounds: exactly one wins each round.
    let mut previous: Option<(Grant, String)> = None;
    for round in 0..3 {
        let racers: Vec<_> = (0..16)
            .map(|i| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    let holder = format!("client-{round}-{i}");
                    (holder.clone(), locks.acquire("report", &holder, Duration::from_secs(30)).await)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut held = 0;
        for racer in racers {
            let (holder, result) = timeout(Duration::from_secs(20), racer).await.unwrap().unwrap();
            match result {
                Ok(grant) => winners.push((grant, holder)),
                Err(LockError::Held { .. }) => held += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one holder");
        assert_eq!(held, 15);
        let (grant, holder) = winners.pop().unwrap();
        assert_eq!(grant.holder, holder);
        assert_eq!(grant.lease_id, grant.token.to_string());
        assert_eq!(grant.ttl, Duration::from_secs(30));
        let status = locks.lock_status("report").await.unwrap().expect("held");
        assert_eq!((status.holder.as_str(), status.token), (holder.as_str(), grant.token));
        assert!(status.expires_in > Duration::from_secs(25) && status.expires_in <= Duration::from_secs(30));
        // A loser hears who holds it.
        match locks.acquire("report", "late", Duration::from_secs(30)).await {
            Err(LockError::Held { holder: h, expires_in, .. }) => {
                assert_eq!(h, holder);
                assert!(expires_in > Duration::from_secs(25), "{expires_in:?}");
            }
            other => panic!("expected Held, got {other:?}"),
        }
        assert_eq!(write_doc(&resource, "report", grant.token, &holder).await, 200);
        if let Some((old, old_holder)) = &previous {
            assert!(grant.token > old.token, "{} > {}", grant.token, old.token);
            // The previous holder's late write is refused by the resource.
            assert_eq!(write_doc(&resource, "report", old.token, old_holder).await, 409);
            // And it cannot renew or release the new holder's lease.
            assert_eq!(locks.keepalive(old).await, Err(LockError::LeaseNotFound));
            assert_eq!(locks.release(old).await, Err(LockError::LeaseNotFound));
        }
        assert_eq!(docs.lock().unwrap()["report"], (holder.clone(), grant.token));
        locks.release(&grant).await.unwrap();
        assert_eq!(locks.lock_status("report").await.unwrap(), None);
        previous = Some((grant, holder));
    }

    // Tokens come from one counter: another lock's token is higher still, and failed
    // attempts on a held lock spend no counter values.
    let (last, _) = previous.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_is_replaced_on_the_database_clock_and_fenced() {
    let Some(db) = TestDb::create().await else { return };
    let (resource, docs) = fenced_resource().await;
    let a = db.client().await;
    let b = db.client().await;

    // A takes a raw grant and never renews it: a holder paused past its TTL.
    let grant_a = a.acquire("ledger", "client-a", Duration::from_millis(800)).await.unwrap();
    let taken = Instant::now();
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A before the pause").await, 200);

    let lease_b = loop {
        match b.lease("ledger", "client-b", Duration::from_secs(5)).await {
            Ok(lease) => break lease,
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, "client-a"),
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(taken.elapsed() < Duration::from_secs(10), "A's lease never expired");
        sleep(Duration::from_millis(50)).await;
    };
    // The database's clock decided; ours only bounds it from below (minus scheduling).
    assert!(taken.elapsed() >= Duration::from_millis(700), "acquired after {:?}", taken.elapsed());
    assert!(lease_b.token() > grant_a.token);
    assert_eq!(write_doc(&resource, "ledger", lease_b.token(), "B").await, 200);

    // A wakes up: its lease is gone, it cannot renew or release B's, its write is refused.
    assert_eq!(a.keepalive(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.release(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A after the pause").await, 409);
    assert_eq!(docs.lock().unwrap()["ledger"].0, "B");
    assert_eq!(b.lock_status("ledger").await.unwrap().unwrap().token, lease_b.token());

    // An expired lease nobody took over cannot be renewed either.
    let c = a.acquire("idle", "client-c", Duration::from_millis(100)).await.unwrap();
    sleep(Duration::from_millis(300)).await;
    assert_eq!(a.keepalive(&c).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.lock_status("idle").await.unwrap(), None);
    lease_b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_hold_the_lock_past_its_ttl() {
    let Some(db) = TestDb::create().await else { return };
    let a = db.client().await;
    let b = db.client().await;
    let lease = a.lease("held", "client-a", Duration::from_millis(900)).await.unwrap();
    sleep(Duration::from_secs(3)).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.loss_reason());
    assert!(matches!(
        b.acquire("held", "client-b", Duration::from_secs(1)).await,
        Err(LockError::Held { .. })
    ));
    let status = b.lock_status("held").await.unwrap().unwrap();
    assert_eq!(status.token, lease.token());
    lease.release().await.unwrap();
    assert_eq!(b.lock_status("held").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lease_row_cancels_the_handle_before_its_deadline() {
    let Some(db) = TestDb::create().await else { return };
    let a = db.client().await;
    let lease = a.lease("job", "client-a", Duration::from_secs(6)).await.unwrap();
    let token = lease.cancellation_token();
    let deleted = db.raw().await.execute("DELETE FROM fencing_leases WHERE name = 'job'", &[]).await.unwrap();
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
    db.client().await; // migrated
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=1",
        proxy.addr.port(),
        db.name
    );
    let a = PgLockClient::connect(&url).unwrap();
    let options = LeaseOptions::default().request_timeout(Duration::from_millis(500));
    let lease = a.lease_with("job", "client-a", Duration::from_secs(3), options).await.unwrap();
    assert!(lease.is_valid());
    proxy.blackhole();
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
async fn bad_input_and_a_missing_table_are_clear_errors() {
    let Some(db) = TestDb::create().await else { return };
    let unmigrated = PgLockClient::connect(&db.url()).unwrap();
    match unmigrated.acquire("x", "a", Duration::from_secs(1)).await {
        Err(LockError::Rejected { detail, .. }) => assert!(detail.contains("migrate"), "{detail}"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    let locks = db.client().await;
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
    db.raw().await.batch_execute("CREATE SCHEMA ops").await.unwrap();
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
        Some(Cluster { bin, dir, port: common::free_port(), child: None, owner })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_kill_9_restarts() {
    let Some(mut cluster) = Cluster::init() else { return };
    cluster.start().await;
    let locks = PgLockClient::connect(&cluster.url()).unwrap();
    locks.migrate().await.unwrap();

    let mut last = 0;
    for restart in 0..2 {
        for _ in 0..3 {
            let grant = locks.acquire("job", "a", Duration::from_secs(30)).await.unwrap();
            assert!(grant.token > last, "restart {restart}: {} after {last}", grant.token);
            last = grant.token;
            locks.release(&grant).await.unwrap();
        }
        // A lease held at the crash is still held after it: its row is durable too.
        let held = locks.acquire("held", "holder", Duration::from_secs(30)).await.unwrap();
        assert!(held.token > last);
        last = held.token;
        cluster.kill();
        cluster.start().await;
        // The pool's connections died with the server: the first uses may fail.
        let after = timeout(Duration::from_secs(20), async {
            loop {
                match locks.acquire("job", "a", Duration::from_secs(30)).await {
                    Ok(grant) => break grant,
                    Err(LockError::Transport(_)) => sleep(Duration::from_millis(100)).await,
                    Err(e) => panic!("unexpected error after restart: {e}"),
                }
            }
        })
        .await
        .expect("no grant within 20 s of the restart");
        assert!(after.token > last, "after kill -9 #{restart}: {} after {last}", after.token);
        eprintln!("PostgreSQL kill -9 #{restart}: last token before {last}, first after {}", after.token);
        last = after.token;
        locks.release(&after).await.unwrap();
        match locks.acquire("held", "other", Duration::from_secs(30)).await {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, "holder"),
            other => panic!("the lease held at the crash was lost: {other:?}"),
        }
        locks.release(&held).await.unwrap();
    }
}
