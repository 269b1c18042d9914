//! A throwaway etcd cluster of several members on loopback, whose members can
//! be killed, restarted, frozen, and cut off from each other.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::{Instant, sleep, timeout};

use crate::etcd::healthy;
use crate::peer_gate::{Gate, Gates};
use crate::process::{binary_or_skip, find_binary, kill, log_tail, wait_until_serving};

/// How long a member may take to serve (start, restart, the cluster's first election).
const START_WITHIN: Duration = Duration::from_secs(20);

/// An etcd cluster on 127.0.0.1, each member in a directory of its own under
/// one temporary directory, every member SIGKILLed on drop (also on panic).
///
/// Members talk to each other through [gates](Self::partition): each
/// advertises as its peer URL a loopback port of this process that forwards to
/// its real peer listener, so that a member can be cut off from the others.
/// Clients reach the members directly ([`endpoints`](Self::endpoints)).
/// Heartbeat 100 ms, election timeout 1 s (etcd's defaults).
///
/// Without `etcd` on PATH (or in `$ETCD_BIN`), or `etcdctl` (or
/// `$ETCDCTL_BIN`): `None` after a loud SKIPPED line, or a failure when `CI=true`.
pub struct EtcdCluster {
    members: Vec<Member>,
    gates: Arc<Gates>,
    /// Member ids, by index, as etcd reports them.
    ids: Vec<u64>,
    etcdctl: PathBuf,
    _gates: Vec<Gate>,
    _dir: tempfile::TempDir,
}

/// One member: how to start it again, and its process.
struct Member {
    command: Vec<String>,
    log: PathBuf,
    client_port: u16,
    child: Option<Child>,
}

/// What `etcdctl endpoint status` says of one member.
#[derive(Debug, Clone, Copy)]
struct Status {
    member: u64,
    leader: u64,
    revision: i64,
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            kill(&mut member.child);
        }
    }
}

impl EtcdCluster {
    /// Starts `size` members and waits (at most 20 s a try) until each serves.
    pub async fn start(size: usize) -> Option<EtcdCluster> {
        let missing = "etcd not installed (put `etcd` and `etcdctl` on PATH or set ETCD_BIN and ETCDCTL_BIN)";
        let bin = binary_or_skip("ETCD_BIN", "etcd", missing)?;
        let etcdctl = find_binary("ETCDCTL_BIN", "etcdctl").or_else(|| crate::skip(missing))?;
        // A port picked by binding :0 can be taken again before etcd binds it: retry with new ports.
        for attempt in 1..=3 {
            let mut cluster = Self::spawn(&bin, etcdctl.clone(), size).await;
            if cluster.wait_all_serving().await {
                cluster.ids = cluster.member_ids().await;
                return Some(cluster);
            }
            let tails: Vec<String> = cluster.members.iter().map(|m| log_tail(&m.log, 5)).collect();
            eprintln!(
                "etcd cluster attempt {attempt} did not come up; last log lines:\n{}",
                tails.join("\n--\n")
            );
        }
        panic!("an etcd cluster did not start in 3 attempts");
    }

    async fn spawn(bin: &Path, etcdctl: PathBuf, size: usize) -> EtcdCluster {
        let dir = tempfile::tempdir().unwrap();
        let gates = Gates::new(size);
        let peer_ports: Vec<u16> = (0..size).map(|_| crate::free_port()).collect();
        let mut opened = Vec::new();
        for (i, port) in peer_ports.iter().enumerate() {
            opened.push(gates.open(i, ([127, 0, 0, 1], *port).into()).await);
        }
        let initial: Vec<String> =
            opened.iter().enumerate().map(|(i, gate)| format!("m{i}=http://{}", gate.addr)).collect();
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let token = format!("fencing-{}-{nanos}", std::process::id());
        let mut members = Vec::new();
        for (i, gate) in opened.iter().enumerate() {
            let client_port = crate::free_port();
            let client = format!("http://127.0.0.1:{client_port}");
            let command = [
                bin.to_string_lossy().as_ref(),
                "--name",
                &format!("m{i}"),
                "--data-dir",
                &dir.path().join(format!("m{i}")).to_string_lossy(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", peer_ports[i]),
                "--initial-advertise-peer-urls",
                &format!("http://{}", gate.addr),
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &token,
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
            ]
            .map(str::to_owned);
            let log = dir.path().join(format!("m{i}.log"));
            members.push(Member { command: command.to_vec(), log, client_port, child: None });
        }
        let mut cluster = EtcdCluster { members, gates, ids: Vec::new(), etcdctl, _gates: opened, _dir: dir };
        for i in 0..size {
            cluster.launch(i);
        }
        cluster
    }

    /// Starts member `i`'s process (its log appended to).
    fn launch(&mut self, i: usize) {
        let member = &mut self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&member.log).unwrap();
        let child = Command::new(&member.command[0])
            .args(&member.command[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", member.command[0]));
        self.gates.set_pid(i, Some(child.id()));
        member.child = Some(child);
    }

    async fn wait_all_serving(&mut self) -> bool {
        for i in 0..self.members.len() {
            if !self.wait_serving(i).await {
                return false;
            }
        }
        true
    }

    /// Polls member `i`'s `/health` until it says it serves (it has a leader
    /// and answers reads); false if it exited or never did within 20 s.
    async fn wait_serving(&mut self, i: usize) -> bool {
        let (per_try, pause) = (Duration::from_millis(500), Duration::from_millis(100));
        let member = &mut self.members[i];
        let port = member.client_port;
        wait_until_serving(&mut member.child, START_WITHIN, per_try, pause, || healthy(port)).await
    }

    async fn member_ids(&self) -> Vec<u64> {
        let mut ids = Vec::new();
        for i in 0..self.members.len() {
            ids.push(self.status(i).await.expect("a member that serves answers its status").member);
        }
        ids
    }

    /// How many members the cluster has.
    #[must_use]
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s client URL, `http://127.0.0.1:{port}`.
    #[must_use]
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL, by index.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The index of the leader: the member that says it leads, named by a
    /// majority of the members (each asked with a 1 s bound: a frozen or dead
    /// member names none, and the others still name a dead leader until they
    /// elect another).
    pub async fn leader(&self) -> Option<usize> {
        let mut statuses = Vec::new();
        for i in 0..self.members.len() {
            statuses.push(self.status(i).await);
        }
        let majority = self.members.len() / 2 + 1;
        (0..self.members.len()).find(|&i| {
            let named = statuses.iter().flatten().filter(|status| status.leader == self.ids[i]).count();
            statuses[i].is_some_and(|status| status.leader == status.member) && named >= majority
        })
    }

    /// Waits (at most `within`) until a majority names a leader; its index.
    pub async fn wait_leader(&self, within: Duration) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(leader) = self.leader().await {
                return Some(leader);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs member `i` (no shutdown of any kind) and reaps it.
    pub fn kill9(&mut self, i: usize) {
        kill(&mut self.members[i].child);
        self.gates.set_pid(i, None);
    }

    /// Starts member `i` again, on its data directory and ports (killing it
    /// first if it runs), and waits until it serves.
    ///
    /// # Panics
    ///
    /// It did not serve within 20 s.
    pub async fn restart(&mut self, i: usize) {
        self.kill9(i);
        self.launch(i);
        if !self.wait_serving(i).await {
            panic!("etcd member {i} did not serve again: {}", log_tail(&self.members[i].log, 5));
        }
    }

    /// Freezes member `i` (SIGSTOP): its sockets stay open, nothing answers.
    pub fn sigstop(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaws member `i` (SIGCONT).
    pub fn sigcont(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.members[i].child.as_ref().expect("the member runs").id();
        let sent = Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
        assert!(sent.success(), "kill {signal} {pid} failed");
    }

    /// Cuts member `i` off from the other members: every peer connection to
    /// or from it closes now, and new ones are refused until [`heal`](Self::heal).
    /// Clients still reach it (and it answers what it can without a leader).
    pub fn partition(&self, i: usize) {
        self.gates.partition(i);
    }

    /// Lets member `i` reach the other members again.
    pub fn heal(&self, i: usize) {
        self.gates.heal(i);
    }

    /// Compacts the key-value history up to the current revision (read from
    /// the leader); that revision.
    ///
    /// # Panics
    ///
    /// No leader within 5 s, or etcd refused the compaction.
    pub async fn compact(&self) -> i64 {
        let leader = self.wait_leader(Duration::from_secs(5)).await.expect("a leader to compact through");
        let revision = self.status(leader).await.expect("the leader's status").revision;
        let done = self.etcdctl(leader, &["compact", &revision.to_string()], Duration::from_secs(5)).await;
        done.unwrap_or_else(|e| panic!("compacting to {revision}: {e}"));
        revision
    }

    /// Runs `etcdctl` against member `i` alone with `args`, bounded by
    /// `within` (its dial and command timeouts too): its output, or why not.
    pub async fn etcdctl(&self, i: usize, args: &[&str], within: Duration) -> Result<String, String> {
        let bound = format!("{}ms", within.as_millis());
        let run = tokio::process::Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint(i)))
            .args([format!("--dial-timeout={bound}"), format!("--command-timeout={bound}")])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = timeout(within + Duration::from_secs(1), run)
            .await
            .map_err(|_| format!("etcdctl {args:?} took over {within:?}"))?
            .map_err(|e| e.to_string())?;
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        if output.status.success() { Ok(text(&output.stdout)) } else { Err(text(&output.stderr)) }
    }

    async fn status(&self, i: usize) -> Option<Status> {
        let fields =
            self.etcdctl(i, &["endpoint", "status", "-w", "fields"], Duration::from_secs(1)).await.ok()?;
        let field = |name: &str| {
            let prefix = format!("\"{name}\" : ");
            fields.lines().find_map(|line| line.strip_prefix(prefix.as_str()).map(str::to_owned))
        };
        // etcd prints member ids as unsigned decimals.
        let id = |name: &str| field(name)?.parse::<u64>().ok();
        Some(Status {
            member: id("MemberID")?,
            leader: id("Leader")?,
            revision: field("Revision")?.parse().ok()?,
        })
    }
}
