//! PostgreSQL restarts and failovers under load, on servers of the test's own
//! (test-support's `OwnPg`: `initdb`, `pg_basebackup -R`, `pg_ctl promote`), never
//! the shared one.
//!
//! Three writers each loop: a `PgLockClient` lease (its token), a `PgFence`d
//! transaction writing a row with that token, a request with it to a replica
//! fenced by `PgSharedStore`. A stale writer keeps trying each key's oldest
//! acknowledged token meanwhile. Then the fault: a crash and restart, a fast
//! restart, or the primary crashing and a synchronous standby promoted. After
//! it, on the server that is primary then: every acknowledged token, row and
//! mark is there, no token was handed out twice, and no stale write got in.
//!
//! With an asynchronous standby that stopped receiving, the promotion loses
//! what the primary acknowledged: a test shows the loss step by step, and
//! that the crates refuse that setup unless told to accept it.
//!
//! `FENCING_FAULT_ROUNDS` (default 1) repeats each fault; RELIABILITY.md has
//! the figures of longer runs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::replicas::{PgReplica, Probe, Replica};
use crate::common::{BOUND, TestDb, connect_to, mark};
use deadpool_postgres::Pool;
use fencing_client::{LockBackendExt, LockError, PgLockClient};
use fencing_layer::FencingLayer;
use fencing_postgres::{FenceError, PgFence, PoolLimits};
use test_support::OwnPg;
use tokio::time::Instant;
use tokio_postgres::Config;
use tokio_postgres::config::TargetSessionAttrs;

const WRITERS: u64 = 3;

fn rounds() -> usize {
    std::env::var("FENCING_FAULT_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(1)
}

/// Both servers, the read-write one chosen at connect: clients follow a promotion.
fn either(primary: &OwnPg, standby: &OwnPg) -> Config {
    let mut config = primary.config();
    config.host("127.0.0.1").port(standby.port);
    config.target_session_attrs(TargetSessionAttrs::ReadWrite);
    config
}

/// Runs `sql` on `pg`.
async fn exec(pg: &OwnPg, sql: &str) {
    connect_to(&pg.config()).await.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
}

/// Waits until `standby` has replayed all the WAL `primary` has written so far.
async fn caught_up(primary: &OwnPg, standby: &OwnPg) {
    let row = connect_to(&primary.config()).await.query_one("SELECT pg_current_wal_lsn()::text", &[]).await;
    let lsn: String = row.unwrap().get(0);
    let replayed = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
    let client = connect_to(&standby.config()).await;
    let waited = tokio::time::timeout(BOUND, async {
        while !client.query_one(&replayed, &[]).await.unwrap().get::<_, bool>(0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    waited.await.expect("the standby never caught up");
}

/// Waits until the primary reports standby `name` in `state` (`sync`, `async`).
async fn standby_is(primary: &OwnPg, name: &str, state: &str) {
    let sql = format!("SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'");
    let waited = tokio::time::timeout(BOUND, async {
        let client = connect_to(&primary.config()).await;
        loop {
            let row = client.query_opt(&sql, &[]).await.unwrap();
            if row.is_some_and(|row| row.get::<_, String>(0) == state) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    waited.await.unwrap_or_else(|_| panic!("standby {name} never became {state}"));
}

/// What was acknowledged, per writer, in order.
#[derive(Default)]
struct Acked {
    tokens: HashMap<u64, Vec<u64>>,
    marks: HashMap<u64, Vec<u64>>,
    posts: HashMap<u64, Vec<u64>>,
    /// When each fenced row was acknowledged: the longest gap is the stall.
    at: Vec<Instant>,
}

/// The clients every writer shares, all on one config.
#[derive(Clone)]
struct Clients {
    locks: PgLockClient,
    fence: PgFence,
    pool: Pool,
    replica: Arc<Replica>,
}

impl Clients {
    async fn new(config: &Config, limits: PoolLimits, accept_volatile: bool) -> Self {
        let locks =
            PgLockClient::connect_with(config.clone()).unwrap().accept_volatile_counter(accept_volatile);
        locks.migrate().await.unwrap();
        let pool = fencing_postgres::pool(config.clone(), limits).unwrap();
        let fence = PgFence::new();
        let client = pool.get().await.unwrap();
        fence.migrate(&client).await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS fenced_writes (key TEXT, token INT8, PRIMARY KEY (key, token))",
            )
            .await
            .unwrap();
        let layer = FencingLayer::new().drain_timeout(Duration::from_secs(2));
        let replica = Arc::new(Replica::start(&Probe::default(), config.clone(), layer, limits).await);
        Clients { locks, fence, pool, replica }
    }

    async fn lease_token(&self, writer: u64) -> Result<u64, LockError> {
        let lease = self.locks.lease(&format!("lock-{writer}"), "writer", Duration::from_secs(2)).await?;
        let token = lease.token();
        // A release lost in the fault leaves the lease to expire: the next acquire waits.
        let _ = lease.release().await;
        Ok(token)
    }

    /// A `PgFence`d transaction writing one row: `Ok` once it committed.
    async fn fenced_write(&self, key: &str, token: u64) -> Result<(), FenceError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        self.fence.fence(&tx, key, token).await?;
        tx.execute(
            "INSERT INTO fenced_writes VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&key, &(token as i64)],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Load on `clients` until `stop`: writers plus a stale writer. Returns what
/// was acknowledged and how many stale writes got in.
struct Load {
    acked: Arc<Mutex<Acked>>,
    stale_admitted: Arc<AtomicU64>,
    stale_refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(clients: &Clients) -> Self {
        let acked = Arc::new(Mutex::new(Acked::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (stale_admitted, stale_refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = Vec::new();
        for writer in 0..WRITERS {
            let (clients, acked, stop) = (clients.clone(), Arc::clone(&acked), Arc::clone(&stop));
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(token) = clients.lease_token(writer).await else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    acked.lock().unwrap().tokens.entry(writer).or_default().push(token);
                    if clients.fenced_write(&format!("pg-{writer}"), token).await.is_ok() {
                        let mut acked = acked.lock().unwrap();
                        acked.marks.entry(writer).or_default().push(token);
                        acked.at.push(Instant::now());
                    }
                    if clients.replica.post(writer, token).await.0 == 200 {
                        acked.lock().unwrap().posts.entry(writer).or_default().push(token);
                    }
                }
            }));
        }
        let (clients, acked_, stop_) = (clients.clone(), Arc::clone(&acked), Arc::clone(&stop));
        let (admitted, refused) = (Arc::clone(&stale_admitted), Arc::clone(&stale_refused));
        tasks.push(tokio::spawn(async move {
            let mut writer = 0;
            while !stop_.load(Ordering::Relaxed) {
                writer = (writer + 1) % WRITERS;
                // The oldest acknowledged token of a key with a newer one acknowledged.
                let stale = |tokens: Option<&Vec<u64>>| {
                    tokens.filter(|t| t.len() > 1 && t[0] < t[t.len() - 1]).map(|t| t[0])
                };
                let (mark, post) = {
                    let acked = acked_.lock().unwrap();
                    (stale(acked.marks.get(&writer)), stale(acked.posts.get(&writer)))
                };
                if let Some(token) = mark {
                    match clients.fenced_write(&format!("pg-{writer}"), token).await {
                        Ok(()) => admitted.fetch_add(1, Ordering::Relaxed),
                        Err(FenceError::Stale { .. }) => refused.fetch_add(1, Ordering::Relaxed),
                        Err(_) => 0,
                    };
                }
                if let Some(token) = post {
                    match clients.replica.post(writer, token).await.0 {
                        200 => admitted.fetch_add(1, Ordering::Relaxed),
                        409 => refused.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
        Load { acked, stale_admitted, stale_refused, stop, tasks }
    }

    fn fenced_rows(&self) -> usize {
        self.acked.lock().unwrap().at.len()
    }

    /// Waits until `more` fenced rows were acknowledged after now.
    async fn progress(&self, more: usize) {
        let target = self.fenced_rows() + more;
        let waited = tokio::time::timeout(BOUND * 2, async {
            while self.fenced_rows() < target {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        waited.await.unwrap_or_else(|_| panic!("the load made no progress ({} rows)", self.fenced_rows()));
    }

    async fn stop(self) -> (Acked, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            tokio::time::timeout(BOUND * 2, task).await.expect("a writer hung").unwrap();
        }
        let acked = Arc::into_inner(self.acked).unwrap().into_inner().unwrap();
        (acked, self.stale_admitted.load(Ordering::Relaxed), self.stale_refused.load(Ordering::Relaxed))
    }
}

impl Acked {
    /// The longest time without an acknowledged fenced row.
    fn stall(&self) -> Duration {
        self.at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

/// Checks, on the primary `pg`, that nothing acknowledged was lost and no token repeated.
async fn assert_nothing_lost(pg: &OwnPg, acked: &Acked) {
    let client = connect_to(&pg.config()).await;
    let mut all = HashSet::new();
    for (writer, tokens) in &acked.tokens {
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "writer {writer}'s tokens went back: {tokens:?}");
        for token in tokens {
            assert!(all.insert(*token), "token {token} was handed out twice");
        }
    }
    let counter: i64 =
        client.query_one("SELECT last_token FROM fencing_leases_token", &[]).await.unwrap().get(0);
    let highest = all.iter().max().copied().unwrap_or(0);
    assert!(counter as u64 >= highest, "the counter is {counter}, below the acknowledged token {highest}");
    for (writer, tokens) in &acked.marks {
        let key = format!("pg-{writer}");
        let rows = client.query("SELECT token FROM fenced_writes WHERE key = $1", &[&key]).await.unwrap();
        let stored: HashSet<i64> = rows.iter().map(|row| row.get(0)).collect();
        for token in tokens {
            assert!(
                stored.contains(&(*token as i64)),
                "{key}: the acknowledged row of token {token} is gone"
            );
        }
        let held: u64 = mark(&client, &key).await.unwrap().parse().unwrap();
        assert!(held >= *tokens.last().unwrap(), "{key}: mark {held} below an acknowledged {tokens:?}");
    }
    for (writer, tokens) in &acked.posts {
        let key = format!("/r/{writer}");
        let held: u64 = mark(&client, &key).await.unwrap().parse().unwrap();
        assert!(held >= *tokens.last().unwrap(), "{key}: mark {held} below an admitted {tokens:?}");
    }
}

fn report(what: &str, acked: &Acked, stale: (u64, u64), recovered: Duration) {
    let count = |m: &HashMap<u64, Vec<u64>>| m.values().map(Vec::len).sum::<usize>();
    eprintln!(
        "{what}: {} tokens, {} fenced rows, {} shared-store requests acknowledged; stale writes \
         {} admitted, {} refused; longest write stall {:?}; first row after the fault {:?}",
        count(&acked.tokens),
        count(&acked.marks),
        count(&acked.posts),
        stale.0,
        stale.1,
        acked.stall(),
        recovered,
    );
}

/// Runs the load, applies `fault` (blocking: `pg_ctl`), waits for the load to
/// go on, and checks on `primary_after`.
async fn under_load(what: &str, primary_after: &OwnPg, clients: &Clients, fault: impl FnOnce()) {
    let load = Load::start(clients);
    load.progress(20).await;
    let since = Instant::now();
    tokio::task::block_in_place(fault);
    // An upper bound: pg_ctl's own time (the restart, the promotion) is in it.
    load.progress(1).await;
    let recovered = since.elapsed();
    load.progress(20).await;
    let (acked, admitted, refused) = load.stop().await;
    report(what, &acked, (admitted, refused), recovered);
    assert_eq!(admitted, 0, "{what}: stale writes were admitted");
    assert_nothing_lost(primary_after, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_under_load_loses_nothing_and_admits_no_stale_token() {
    let Some(pg) = OwnPg::start() else { return };
    let clients = Clients::new(&pg.config(), PoolLimits::default(), false).await;
    for round in 0..rounds() {
        under_load("crash and restart", &pg, &clients, || {
            pg.crash();
            pg.start_again();
        })
        .await;
        under_load("fast restart", &pg, &clients, || pg.restart()).await;
        eprintln!("round {round} done");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_to_a_synchronous_standby_loses_nothing_and_admits_no_stale_token() {
    for _ in 0..rounds() {
        let Some(primary) = OwnPg::start() else { return };
        // One statement each: ALTER SYSTEM cannot run in a transaction block.
        exec(&primary, "ALTER SYSTEM SET synchronous_standby_names = 's1'").await;
        exec(&primary, "SELECT pg_reload_conf()").await;
        let standby = primary.standby("s1");
        standby_is(&primary, "s1", "sync").await;
        // `local` waits for no standby: refused while one streams.
        let mut local = either(&primary, &standby);
        local.options("-c synchronous_commit=local");
        match PgLockClient::connect_with(local).unwrap().check_durability().await {
            Err(LockError::NotDurable(reason)) => assert!(reason.contains("local"), "{reason}"),
            other => panic!("expected NotDurable, got {other:?}"),
        }
        // Default settings: the durability check accepts a synchronous standby.
        let clients = Clients::new(&either(&primary, &standby), PoolLimits::default(), false).await;
        under_load("failover to a synchronous standby", &standby, &clients, || {
            primary.crash();
            standby.promote();
        })
        .await;
    }
}

/// The standby stops receiving (stopped), the primary acknowledges a grant,
/// a raise and an admitted request, crashes, and the standby is promoted:
/// all three are gone, the token is handed out again, and a stale write gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_to_an_asynchronous_standby_loses_acknowledged_writes() {
    let Some(primary) = OwnPg::start() else { return };
    let standby = primary.standby("s1");
    standby_is(&primary, "s1", "async").await;
    let config = either(&primary, &standby);

    // By default both crates refuse this setup.
    let refused = PgLockClient::connect_with(config.clone()).unwrap();
    match refused.lease("lock-0", "writer", Duration::from_secs(2)).await {
        Err(LockError::NotDurable(reason)) => {
            assert!(reason.contains("standby s1 streams asynchronously"), "{reason}");
            eprintln!("PgLockClient: {}", LockError::NotDurable(reason));
        }
        other => panic!("expected NotDurable, got {other:?}"),
    }
    let pool = fencing_postgres::pool(config.clone(), PoolLimits::default()).unwrap();
    match pool.get().await.map_err(FenceError::from) {
        Err(error @ FenceError::Pool(_)) => {
            assert!(error.to_string().contains("streams asynchronously"), "{error}");
            eprintln!("fencing_postgres::pool: {error}");
        }
        other => panic!("expected a refused connection, got {:?}", other.map(|_| ())),
    }

    // A role that may not read the standbys' state cannot tell: refused too.
    exec(&primary, "CREATE ROLE plain LOGIN").await;
    let mut plain = config.clone();
    plain.user("plain");
    let client = fencing_postgres::pool(plain, PoolLimits::default()).unwrap().get().await;
    match client.map_err(FenceError::from) {
        Err(error) => assert!(error.to_string().contains("cannot read their sync_state"), "{error}"),
        Ok(_) => panic!("a role without pg_monitor was not refused"),
    }

    // Told to accept it, they work, and lose what follows.
    let volatile = PoolLimits::default().accept_volatile_commits(true);
    let clients = Clients::new(&config, volatile, true).await;
    let old = clients.lease_token(0).await.unwrap();
    clients.fenced_write("pg-0", old).await.unwrap();
    assert_eq!(clients.replica.post(0, old).await.0, 200);
    caught_up(&primary, &standby).await;

    standby.stop();
    let new = clients.lease_token(0).await.unwrap();
    assert!(new > old);
    clients.fenced_write("pg-0", new).await.unwrap();
    assert_eq!(clients.replica.post(0, new).await.0, 200, "the raise to {new} was not admitted");

    primary.crash();
    standby.start_again();
    standby.promote();

    let client = connect_to(&standby.config()).await;
    let again = clients.lease_token(0).await.unwrap();
    assert_eq!(again, new, "token {new} was acknowledged, then handed out again as {again}");
    assert_eq!(
        mark(&client, "pg-0").await.as_deref(),
        Some(old.to_string().as_str()),
        "the raise to {new} survived"
    );
    let lost = "SELECT 1 FROM fenced_writes WHERE key = 'pg-0' AND token = $1";
    let row = client.query_opt(lost, &[&(new as i64)]).await.unwrap();
    assert!(row.is_none(), "the acknowledged row of token {new} survived");
    assert_eq!(mark(&client, "/r/0").await.as_deref(), Some(old.to_string().as_str()));
    // The stale token `old` is admitted although `new` was acknowledged, in the
    // transaction and by a replica (started after the failover, as a restarted one would be).
    clients.fenced_write("pg-0", old).await.expect("the stale write was refused");
    let layer = FencingLayer::new();
    let fresh = Replica::start(&Probe::default(), config, layer, volatile).await;
    assert_eq!(fresh.post(0, old).await.0, 200, "the stale request was refused");
    eprintln!(
        "async failover: grant {new}, raise to {new} and an admitted request lost; {new} handed out again; stale {old} admitted twice"
    );
}

/// `synchronous_commit = off` in the crates' sessions is refused even without
/// standbys (a crash loses the last commits); `local` without standbys is the
/// same as `on` and accepted. Session settings only: the shared server is not changed.
#[tokio::test]
async fn sessions_without_synchronous_commit_are_refused() {
    let Some(db) = TestDb::create().await else { return };
    let mut off = db.config();
    off.options("-c synchronous_commit=off");
    let locks = PgLockClient::connect_with(off.clone()).unwrap();
    match locks.migrate().await {
        Err(LockError::NotDurable(reason)) => {
            assert!(reason.contains("synchronous_commit is off"), "{reason}")
        }
        other => panic!("expected NotDurable, got {other:?}"),
    }
    assert!(locks.clone().accept_volatile_counter(true).migrate().await.is_ok());
    let pool = fencing_postgres::pool(off.clone(), PoolLimits::default()).unwrap();
    assert!(matches!(pool.get().await.map_err(FenceError::from), Err(FenceError::Pool(_))));
    let accepted = fencing_postgres::pool(off, PoolLimits::default().accept_volatile_commits(true)).unwrap();
    assert!(accepted.get().await.is_ok());
    let mut local = db.config();
    local.options("-c synchronous_commit=local");
    PgLockClient::connect_with(local.clone()).unwrap().check_durability().await.unwrap();
    let pool = fencing_postgres::pool(local, PoolLimits::default()).unwrap();
    let client = pool.get().await.unwrap();
    assert!(fencing_postgres::check_durability(&client).await.unwrap().is_none());
}
