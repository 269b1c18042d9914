//! A 3-member etcd cluster on ephemeral 127.0.0.1 ports losing its leader under
//! load: `kill -9` of the leader (then restarted on its data), and a member
//! partitioned by SIGSTOP (then SIGCONT). Writers take `EtcdLockClient` leases
//! and write with their tokens to a fenced resource (axum behind `FencingLayer`).
//!
//! Checked: each writer's tokens keep increasing and no token is handed out
//! twice; no fresh holder's write is refused; the resource's writes never go
//! back; a stale writer never gets in; and a holder cut off from the cluster is
//! cancelled by its lease keeper before anyone else is granted the lock. How
//! long writes stall is printed per fault.
//!
//! Without an `etcd` binary on PATH (or in `$ETCD_BIN`) these tests print a
//! SKIPPED line and pass, unless `CI=true`. `FENCING_FAULT_ROUNDS` (default 2)
//! is the number of leader kills.

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::put;
use fencing_client::drivers::etcd_client::{Client, ConnectOptions};
use fencing_client::{EtcdLockClient, LockBackendExt, LossReason};
use fencing_layer::{FencingLayer, FencingToken};
use tokio::time::{Instant, sleep, timeout};

const WRITERS: usize = 3;
const BOUND: Duration = Duration::from_secs(30);

fn kills() -> usize {
    std::env::var("FENCING_FAULT_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(2)
}

// ---------- three etcd members, killed on drop ----------

struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    child: Option<Child>,
}

struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    members: Vec<Member>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn etcd_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        return Some(PathBuf::from(bin));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("etcd")).find(|bin| bin.is_file())
}

fn options() -> ConnectOptions {
    // Short bounds: a request to a stopped member fails soon and is retried.
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2))
        .with_require_leader(true)
}

impl Cluster {
    async fn start() -> Option<Cluster> {
        let Some(bin) = etcd_binary() else {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "etcd not installed, and CI=true");
            eprintln!("\n*** SKIPPED: etcd not installed (put `etcd` on PATH or set ETCD_BIN) ***\n");
            return None;
        };
        // A port picked by binding :0 can be taken before etcd binds it: new ports, a new try.
        for attempt in 1..=3 {
            let members = (0..3)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_url: format!("http://127.0.0.1:{}", free_port()),
                    peer_url: format!("http://127.0.0.1:{}", free_port()),
                    child: None,
                })
                .collect();
            let mut cluster = Cluster { bin: bin.clone(), dir: tempfile::tempdir().unwrap(), members };
            for i in 0..3 {
                cluster.spawn(i);
            }
            let ready = timeout(BOUND, async {
                for i in 0..3 {
                    cluster.wait_ready(i).await;
                }
            });
            if ready.await.is_ok() {
                return Some(cluster);
            }
            eprintln!("etcd cluster attempt {attempt} did not come up:\n{}", cluster.log_tail());
        }
        panic!("a 3-member etcd cluster did not start in 3 attempts");
    }

    /// The last lines of each member's log.
    fn log_tail(&self) -> String {
        let tail = |i: usize| {
            let log = std::fs::read_to_string(self.dir.path().join(format!("m{i}.log"))).unwrap_or_default();
            log.lines().rev().take(4).collect::<Vec<_>>().join("\n")
        };
        (0..3).map(|i| format!("m{i}:\n{}", tail(i))).collect::<Vec<_>>().join("\n")
    }

    /// Starts member `i` (again, on its data directory if it has one).
    fn spawn(&mut self, i: usize) {
        let initial: Vec<String> =
            self.members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect();
        let member = &self.members[i];
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", member.name)))
            .unwrap();
        let child = Command::new(&self.bin)
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &member.client_url, "--advertise-client-urls", &member.client_url])
            .args(["--listen-peer-urls", &member.peer_url, "--initial-advertise-peer-urls", &member.peer_url])
            .args(["--initial-cluster", &initial.join(","), "--initial-cluster-token", "fencing-leader-test"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` answers and knows a leader (unbounded: callers bound it).
    async fn wait_ready(&self, i: usize) {
        while self.status(i).await.is_none_or(|(_, leader)| leader == 0) {
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// (this member's id, the leader's id as it sees it), if it answers within 1 s.
    async fn status(&self, i: usize) -> Option<(u64, u64)> {
        let url = self.members[i].client_url.as_str();
        let asked = async {
            let mut client = Client::connect([url], Some(options())).await.ok()?;
            let status = client.status().await.ok()?;
            Some((status.header()?.member_id(), status.leader()))
        };
        timeout(Duration::from_secs(1), asked).await.ok().flatten()
    }

    /// The member that says it is the leader.
    async fn leader(&self, except: Option<usize>) -> usize {
        let found = async {
            loop {
                for i in (0..3).filter(|i| Some(*i) != except) {
                    if self.status(i).await.is_some_and(|(me, leader)| me == leader) {
                        return i;
                    }
                }
                sleep(Duration::from_millis(50)).await;
            }
        };
        timeout(BOUND, found).await.expect("no leader elected")
    }

    /// `kill -9`, and waits for it to end.
    fn kill(&mut self, i: usize) {
        let mut child = self.members[i].child.take().expect("a running member");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.members[i].child.as_ref().expect("a running member").id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    fn endpoints(&self, members: &[usize]) -> Vec<String> {
        members.iter().map(|i| self.members[*i].client_url.clone()).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

// ---------- a fenced resource recording every write it took ----------

type Log = Arc<Mutex<Vec<(String, u64)>>>;

async fn fenced_resource() -> (String, Log) {
    async fn write(State(log): State<Log>, Path(name): Path<String>, token: FencingToken) -> &'static str {
        log.lock().unwrap().push((name, token.get()));
        "stored"
    }
    let log = Log::default();
    let app = Router::new()
        .route("/docs/{name}", put(write).route_layer(FencingLayer::new())) // per route, as the README says
        .with_state(Arc::clone(&log));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, log)
}

async fn write_doc(base: &str, name: &str, token: u64) -> u16 {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let request = fencing_client::header::fence_reqwest(http.put(format!("{base}/docs/{name}")), token);
    request.send().await.unwrap().status().as_u16()
}

// ---------- the load ----------

#[derive(Default)]
struct Acked {
    tokens: HashMap<usize, Vec<u64>>,
    /// Each writer's first token whose write the resource acknowledged, once a higher one
    /// of its has been acknowledged too: from then on the resource's mark is above it. (A
    /// token only granted is no proof: until the new holder writes, the mark is still the
    /// previous token, and a write with it is rightly admitted.)
    stale: HashMap<usize, u64>,
    first_written: HashMap<usize, u64>,
    /// When each write was acknowledged (200): the longest gap is the stall.
    writes: Vec<Instant>,
    fresh_refused: u64,
    /// Writes tried with a stale token (each must get 409).
    stale_tried: u64,
}

struct Load {
    acked: Arc<Mutex<Acked>>,
    stale_admitted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(locks: &EtcdLockClient, resource: &str) -> Load {
        let acked = Arc::new(Mutex::new(Acked::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let stale_admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for writer in 0..WRITERS {
            let (locks, resource) = (locks.clone(), resource.to_owned());
            let (acked, stop) = (Arc::clone(&acked), Arc::clone(&stop));
            tasks.push(tokio::spawn(async move {
                let name = format!("job-{writer}");
                while !stop.load(Ordering::Relaxed) {
                    let Ok(lease) = locks.lease(&name, "writer", Duration::from_secs(3)).await else {
                        sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let token = lease.token();
                    acked.lock().unwrap().tokens.entry(writer).or_default().push(token);
                    let status = write_doc(&resource, &name, token).await;
                    match status {
                        200 => {
                            let mut acked = acked.lock().unwrap();
                            acked.writes.push(Instant::now());
                            let first = *acked.first_written.entry(writer).or_insert(token);
                            if token > first {
                                acked.stale.entry(writer).or_insert(first);
                            }
                        }
                        _ => acked.lock().unwrap().fresh_refused += 1,
                    }
                    let _ = lease.release().await;
                }
            }));
        }
        let (acked_, stop_, admitted) = (Arc::clone(&acked), Arc::clone(&stop), Arc::clone(&stale_admitted));
        let resource = resource.to_owned();
        tasks.push(tokio::spawn(async move {
            while !stop_.load(Ordering::Relaxed) {
                for writer in 0..WRITERS {
                    let stale = acked_.lock().unwrap().stale.get(&writer).copied();
                    if stale.is_some() {
                        acked_.lock().unwrap().stale_tried += 1;
                    }
                    if let Some(stale) = stale
                        && write_doc(&resource, &format!("job-{writer}"), stale).await != 409
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                sleep(Duration::from_millis(10)).await;
            }
        }));
        Load { acked, stale_admitted, stop, tasks }
    }

    fn writes(&self) -> usize {
        self.acked.lock().unwrap().writes.len()
    }

    /// Waits until `more` writes are acknowledged after now; returns how long that took.
    async fn progress(&self, more: usize) -> Duration {
        let (since, target) = (Instant::now(), self.writes() + more);
        let waited = timeout(BOUND, async {
            while self.writes() < target {
                sleep(Duration::from_millis(5)).await;
            }
        });
        waited.await.unwrap_or_else(|_| panic!("writes stalled for {BOUND:?} ({} so far)", self.writes()));
        since.elapsed()
    }

    /// How long after `from` the first write was acknowledged.
    fn first_write_since(&self, from: Instant) -> Duration {
        let acked = self.acked.lock().unwrap();
        acked.writes.iter().find(|t| **t >= from).map_or(Duration::MAX, |t| *t - from)
    }

    /// The longest time without an acknowledged write since `from`.
    fn stall_since(&self, from: Instant) -> Duration {
        let acked = self.acked.lock().unwrap();
        let mut times: Vec<Instant> = acked.writes.iter().copied().filter(|t| *t >= from).collect();
        times.insert(0, from);
        times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }

    async fn stop(self) -> (Acked, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            timeout(BOUND, task).await.expect("a writer hung").unwrap();
        }
        (
            Arc::into_inner(self.acked).unwrap().into_inner().unwrap(),
            self.stale_admitted.load(Ordering::Relaxed),
        )
    }
}

// ---------- tests ----------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_kills_and_a_stopped_leader_keep_tokens_increasing_and_writes_forward() {
    let Some(mut cluster) = Cluster::start().await else { return };
    let (resource, log) = fenced_resource().await;
    let locks = EtcdLockClient::connect_with(cluster.endpoints(&[0, 1, 2]), options()).await.unwrap();
    let load = Load::start(&locks, &resource);
    load.progress(10).await;

    for kill in 0..kills() {
        let leader = cluster.leader(None).await;
        let since = Instant::now();
        cluster.kill(leader);
        let next = cluster.leader(Some(leader)).await;
        let seen = since.elapsed();
        load.progress(10).await;
        eprintln!(
            "kill -9 {kill}: leader m{leader} killed, m{next} seen leading after {seen:?}, first write \
             after {:?}, longest stall {:?}",
            load.first_write_since(since),
            load.stall_since(since)
        );
        cluster.spawn(leader);
        let back = timeout(BOUND, cluster.wait_ready(leader)).await;
        back.unwrap_or_else(|_| panic!("m{leader} did not come back:\n{}", cluster.log_tail()));
    }

    let leader = cluster.leader(None).await;
    let since = Instant::now();
    cluster.signal(leader, "STOP");
    load.progress(1).await;
    sleep(Duration::from_secs(3).saturating_sub(since.elapsed())).await;
    let stopped = since.elapsed();
    cluster.signal(leader, "CONT");
    load.progress(10).await;
    eprintln!(
        "SIGSTOP: leader m{leader} stopped for {stopped:?}, first write after {:?}, longest stall {:?}",
        load.first_write_since(since),
        load.stall_since(since)
    );

    let (acked, stale_admitted) = load.stop().await;
    let mut all = HashSet::new();
    for (writer, tokens) in &acked.tokens {
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "writer {writer}'s tokens went back: {tokens:?}");
        assert!(tokens.iter().all(|token| all.insert(*token)), "a token was handed out twice");
    }
    assert_eq!(acked.fresh_refused, 0, "a fresh holder's write was refused: a token went back");
    assert!(acked.stale_tried > 0, "no stale write was tried");
    assert_eq!(stale_admitted, 0, "a stale write got in");
    let mut last: HashMap<String, u64> = HashMap::new();
    for (name, token) in log.lock().unwrap().iter() {
        let previous = last.insert(name.clone(), *token).unwrap_or(0);
        assert!(*token >= previous, "{name}: a write with {token} after one with {previous}");
    }
    eprintln!(
        "{} leases, {} writes acknowledged, 0 of {} stale writes admitted",
        all.len(),
        acked.writes.len(),
        acked.stale_tried
    );
}

/// A holder talks to one member only, which is stopped (SIGSTOP): its renewals
/// cannot arrive, its keeper cancels it by its deadline, and only after that
/// does a client of the other two members get the lock, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_cut_off_by_a_stopped_member_is_cancelled_before_the_next_grant() {
    let Some(cluster) = Cluster::start().await else { return };
    let (resource, _) = fenced_resource().await;
    let leader = cluster.leader(None).await;
    let cut = (leader + 1) % 3;
    let rest: Vec<usize> = (0..3).filter(|i| *i != cut).collect();
    let holder_client = EtcdLockClient::connect_with(cluster.endpoints(&[cut]), options()).await.unwrap();
    let others = EtcdLockClient::connect_with(cluster.endpoints(&rest), options()).await.unwrap();

    let held = holder_client.lease("report", "cut-off", Duration::from_secs(3)).await.unwrap();
    assert_eq!(write_doc(&resource, "report", held.token()).await, 200);
    let cancellation = held.cancellation_token();
    let cancelled = tokio::spawn(async move {
        cancellation.cancelled().await;
        Instant::now()
    });
    let stopped_at = Instant::now();
    cluster.signal(cut, "STOP");
    let granted = loop {
        match others.lease("report", "next", Duration::from_secs(3)).await {
            Ok(lease) => break lease,
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    };
    let granted_at = Instant::now();
    let cancelled_at = timeout(Duration::from_secs(1), cancelled).await.expect("never cancelled").unwrap();
    assert!(cancelled_at <= granted_at, "cancelled {:?} after the next grant", cancelled_at - granted_at);
    assert!(cancelled_at <= held.deadline() + Duration::from_millis(50), "cancelled after its deadline");
    assert!(matches!(held.loss_reason(), Some(LossReason::DeadlinePassed | LossReason::RenewalFailed(_))));
    assert!(granted.token() > held.token());
    assert_eq!(write_doc(&resource, "report", granted.token()).await, 200);
    assert_eq!(write_doc(&resource, "report", held.token()).await, 409, "the cut-off holder's late write");
    eprintln!(
        "cut-off holder cancelled {:?} after the SIGSTOP ({:?}); next grant {:?} after it",
        cancelled_at - stopped_at,
        held.loss_reason(),
        granted_at - stopped_at
    );
    cluster.signal(cut, "CONT");
    granted.release().await.unwrap();
}
