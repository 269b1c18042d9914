//! Seeded fault simulation of the whole system: the lock service, the fenced
//! resource and several clients, with client pauses longer than the TTL, slow
//! links, held and reordered messages, partitions, and crashes with restarts of
//! both servers on their durable state. A checker over the recorded history
//! then verifies, per key, the project's promise (see `RELIABILITY.md`).
//!
//! How it runs: every seed gets a fresh current-thread tokio runtime on the
//! paused clock, so TTLs, pauses and delays cost no real time. The lock service
//! and the resource are the real routers (`LockService::router`,
//! `Resource::router`) driven in-process with `tower::ServiceExt::oneshot`; the
//! "network" between a client and a host is a task that delays, holds, drops or
//! delivers each request and its answer. A crash aborts every request inside
//! the host and drops it; a restart reopens the same redb files (in a temp dir,
//! on `/dev/shm` when it exists, so fsyncs are cheap).
//!
//! * `FENCING_SIM_SEEDS=N` — how many seeds (default 300), starting at 0.
//! * `FENCING_SIM_SEED=S` — run only seed `S` (replay a failure), printing its history;
//!   the unfenced test then runs only that seed too.
//! * `FENCING_SIM_TIMELINE=FILE.svg` — with `FENCING_SIM_SEED`, also draw the seed's
//!   history as a timeline (leases, pauses, writes and their answers, crashes and
//!   partitions), the operations the checker flags ringed in red: the fenced run to
//!   `FILE.svg`, the unfenced run (its first violation) to `FILE-unfenced.svg`.
//!
//! The schedule of faults, delays and client choices is a function of the seed.
//! The interleaving of the blocking threads (redb commits, the mark writer) with
//! the runtime is not, so a replay follows the same schedule but can differ in
//! details; every failure seen so far has replayed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Method, Request, StatusCode};
use demo_lock_service::LockService;
use demo_resource::{Config, Resource};
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep, timeout};
use tower::ServiceExt;

// The seed's history as a timeline picture; the checks of a rendered SVG.
mod picture;
use crate::svg_check;

/// The lease TTL the clients ask for.
const TTL: Duration = Duration::from_millis(600);
/// How long the clients run (simulated time).
const RUN_FOR: Duration = Duration::from_secs(8);
/// A client gives up on an answer after this long (the request may still arrive later).
const CLIENT_TIMEOUT: Duration = Duration::from_millis(800);
const CLIENTS: usize = 4;
const KEYS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HostId {
    Lock,
    Resource,
}

/// A server that can crash and restart on its data directory.
struct Host {
    id: HostId,
    dir: PathBuf,
    fencing: bool,
    state: Mutex<HostState>,
}

#[derive(Default)]
struct HostState {
    router: Option<Router>,
    lock: Option<LockService>,
    in_flight: Vec<AbortHandle>,
}

impl Host {
    /// Opens the durable state (retrying while a crashed incarnation's blocking
    /// work still holds the files) and starts answering.
    async fn start(&self) {
        for _ in 0..100_000 {
            let router = match self.id {
                HostId::Lock => {
                    match LockService::open(demo_lock_service::Config::new(self.dir.join("locks"))) {
                        Ok(service) => {
                            let router = service.router();
                            self.state.lock().unwrap().lock = Some(service);
                            Some(router)
                        }
                        Err(_) => None,
                    }
                }
                HostId::Resource => {
                    let config = Config::durable(self.dir.join("resource"));
                    let config = if self.fencing { config } else { config.without_fencing() };
                    Resource::open(config).ok().map(|resource| resource.router())
                }
            };
            if let Some(router) = router {
                self.state.lock().unwrap().router = Some(router);
                return;
            }
            // The old incarnation's last commit is still finishing on a blocking thread.
            std::thread::sleep(Duration::from_micros(200));
            tokio::task::yield_now().await;
        }
        panic!("{:?} could not reopen its data", self.id);
    }

    /// kill -9: every request inside is dropped where it stands, the state is
    /// what the files hold.
    fn crash(&self) {
        let mut state = self.state.lock().unwrap();
        state.router = None;
        for request in state.in_flight.drain(..) {
            request.abort();
        }
        if let Some(service) = state.lock.take() {
            // Releases the redb file; a grant being written finishes first, as
            // its fsync would have before a kill.
            service.close();
        }
    }

    /// Hands `request` to the running incarnation; `None` if the host is down.
    fn dispatch(&self, request: Request<Body>) -> Option<tokio::task::JoinHandle<(StatusCode, Bytes)>> {
        let mut state = self.state.lock().unwrap();
        let router = state.router.clone()?;
        let task = tokio::spawn(async move {
            let response = router.oneshot(request).await.expect("routers are infallible");
            let status = response.status();
            let body = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            (status, body)
        });
        state.in_flight.retain(|t| !t.is_finished());
        state.in_flight.push(task.abort_handle());
        Some(task)
    }
}

/// What a client learned from one request.
#[derive(Debug)]
enum Outcome {
    Answer(StatusCode, Bytes),
    /// No answer in time: the request may or may not have been applied.
    Unknown,
}

#[derive(Debug, Clone)]
struct WriteRecord {
    client: usize,
    /// Sent by the client; reached the resource (if it did); answered or given up on.
    sent: Instant,
    arrived: Option<Instant>,
    answered: Option<Instant>,
    key: usize,
    token: u64,
    value: String,
    /// `Some(true)`: acknowledged (2xx); `Some(false)`: refused (not applied); `None`: unknown.
    acked: Option<bool>,
    status: Option<u16>,
}

#[derive(Debug, Clone)]
struct GrantRecord {
    client: usize,
    key: usize,
    token: u64,
    invoked: Instant,
    completed: Instant,
    /// When the client stopped using the lease (released it, or gave up on it).
    ended: Option<Instant>,
}

/// A span of a fault, for the timeline: a pause, a crash, a partition.
#[derive(Debug, Clone)]
struct Span {
    from: Instant,
    to: Instant,
    /// A client's pause: which client; a crash or partition: `None`.
    client: Option<usize>,
    what: String,
}

#[derive(Debug, Default, Clone)]
struct History {
    writes: Vec<WriteRecord>,
    grants: Vec<GrantRecord>,
    events: Vec<String>,
    /// Pauses, crashes and partitions, for the timeline.
    faults: Vec<Span>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    grants: usize,
    writes: usize,
    acked: usize,
    refused_stale: usize,
    unknown: usize,
    pauses: usize,
    held: usize,
    partitions: usize,
    lock_crashes: usize,
    resource_crashes: usize,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.grants += o.grants;
        self.writes += o.writes;
        self.acked += o.acked;
        self.refused_stale += o.refused_stale;
        self.unknown += o.unknown;
        self.pauses += o.pauses;
        self.held += o.held;
        self.partitions += o.partitions;
        self.lock_crashes += o.lock_crashes;
        self.resource_crashes += o.resource_crashes;
    }
}

struct World {
    lock: Host,
    resource: Host,
    /// `(client, host)` pairs that cannot reach each other now.
    cut: Mutex<HashSet<(usize, HostId)>>,
    history: Mutex<History>,
    stats: Mutex<Stats>,
    start: Instant,
}

impl World {
    fn host(&self, id: HostId) -> &Host {
        match id {
            HostId::Lock => &self.lock,
            HostId::Resource => &self.resource,
        }
    }

    fn is_cut(&self, client: usize, host: HostId) -> bool {
        self.cut.lock().unwrap().contains(&(client, host))
    }

    fn event(&self, what: String) {
        let at = self.start.elapsed().as_millis();
        self.history.lock().unwrap().events.push(format!("{at:>6} ms  {what}"));
    }

    /// One link delay: usually short, sometimes slow, occasionally held past the TTL.
    fn link_delay(&self, rng: &mut StdRng) -> Duration {
        let roll: f64 = rng.random();
        if roll < 0.03 {
            self.stats.lock().unwrap().held += 1;
            Duration::from_millis(rng.random_range(TTL.as_millis() as u64..3 * TTL.as_millis() as u64))
        } else if roll < 0.13 {
            Duration::from_millis(rng.random_range(20..200))
        } else {
            Duration::from_micros(rng.random_range(0..3000))
        }
    }

    /// Sends `request` from `client` to `host` over the simulated network; when
    /// it is the write `history.writes[write]`, notes when it reaches the host.
    async fn call(
        self: &Arc<Self>,
        client: usize,
        host: HostId,
        request: Request<Body>,
        rng: &mut StdRng,
        write: Option<usize>,
    ) -> Outcome {
        let (there, back) = (self.link_delay(rng), self.link_delay(rng));
        let world = Arc::clone(self);
        // The network is its own task: a client that gives up does not take back a
        // request already on the wire, which can still arrive, late and reordered.
        let wire = tokio::spawn(async move {
            sleep(there).await;
            if world.is_cut(client, host) {
                return None;
            }
            let inside = world.host(host).dispatch(request)?;
            if let Some(index) = write {
                world.history.lock().unwrap().writes[index].arrived = Some(Instant::now());
            }
            let answer = inside.await.ok()?;
            sleep(back).await;
            if world.is_cut(client, host) {
                return None;
            }
            Some(answer)
        });
        match timeout(CLIENT_TIMEOUT, wire).await {
            Ok(Ok(Some((status, body)))) => Outcome::Answer(status, body),
            _ => Outcome::Unknown,
        }
    }
}

fn post_json(uri: &str, body: Value) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn bare(method: Method, uri: &str) -> Request<Body> {
    Request::builder().method(method).uri(uri).body(Body::empty()).unwrap()
}

/// One client: acquire a key's lock, write tagged values with the token, renew
/// between writes, release; sometimes pause (GC, SIGSTOP) for longer than the TTL.
async fn client(world: Arc<World>, id: usize, mut rng: StdRng, end: Instant) {
    let mut seq = 0u64;
    while Instant::now() < end {
        let key = rng.random_range(0..KEYS);
        let invoked = Instant::now();
        let body =
            json!({"name": format!("k{key}"), "holder": format!("c{id}"), "ttl_ms": TTL.as_millis() as u64});
        let grant = match world.call(id, HostId::Lock, post_json("/v1/leases", body), &mut rng, None).await {
            Outcome::Answer(StatusCode::CREATED, body) => serde_json::from_slice::<Value>(&body).unwrap(),
            _ => {
                sleep(Duration::from_millis(rng.random_range(10..300))).await;
                continue;
            }
        };
        let token = grant["token"].as_u64().unwrap();
        let lease_id = grant["lease_id"].as_str().unwrap().to_owned();
        let grant_index = {
            let mut history = world.history.lock().unwrap();
            history.grants.push(GrantRecord {
                client: id,
                key,
                token,
                invoked,
                completed: Instant::now(),
                ended: None,
            });
            history.grants.len() - 1
        };
        world.stats.lock().unwrap().grants += 1;
        world.event(format!("c{id} granted k{key} token {token}"));
        for _ in 0..rng.random_range(1..=4) {
            if rng.random_bool(0.12) {
                // A pause: nothing runs, keepalives included.
                let pause = TTL.mul_f64(rng.random_range(1.0..3.0));
                world.stats.lock().unwrap().pauses += 1;
                world.event(format!("c{id} paused {} ms holding token {token}", pause.as_millis()));
                let from = Instant::now();
                sleep(pause).await;
                let what = format!("c{id} paused");
                world.history.lock().unwrap().faults.push(Span {
                    from,
                    to: Instant::now(),
                    client: Some(id),
                    what,
                });
            }
            seq += 1;
            let value = format!("c{id}:t{token}:n{seq}");
            let delay = if rng.random_bool(0.1) {
                format!("?delay_ms={}", rng.random_range(1..200))
            } else {
                String::new()
            };
            let request = Request::builder()
                .method(Method::POST)
                .uri(format!("/logs/k{key}{delay}"))
                .header("fencing-token", token)
                .body(Body::from(value.clone()))
                .unwrap();
            let index = {
                let mut history = world.history.lock().unwrap();
                history.writes.push(WriteRecord {
                    client: id,
                    sent: Instant::now(),
                    arrived: None,
                    answered: None,
                    key,
                    token,
                    value: value.clone(),
                    acked: None,
                    status: None,
                });
                history.writes.len() - 1
            };
            let outcome = world.call(id, HostId::Resource, request, &mut rng, Some(index)).await;
            let (acked, status) = match &outcome {
                Outcome::Answer(status, _) if status.is_success() => (Some(true), Some(status.as_u16())),
                // The layer's and the store's refusals: nothing was applied.
                Outcome::Answer(status, _) if matches!(status.as_u16(), 400 | 409 | 428 | 503) => {
                    (Some(false), Some(status.as_u16()))
                }
                Outcome::Answer(status, _) => (None, Some(status.as_u16())),
                Outcome::Unknown => (None, None),
            };
            {
                let mut history = world.history.lock().unwrap();
                history.writes[index].acked = acked;
                history.writes[index].status = status;
                history.writes[index].answered = status.map(|_| Instant::now());
                let mut stats = world.stats.lock().unwrap();
                stats.writes += 1;
                match (acked, status) {
                    (Some(true), _) => stats.acked += 1,
                    (Some(false), Some(409)) => stats.refused_stale += 1,
                    (None, _) => stats.unknown += 1,
                    _ => {}
                }
            }
            world.event(format!("c{id} write {value} -> {status:?}"));
            if status == Some(409) {
                break;
            }
            let renew = bare(Method::POST, &format!("/v1/leases/{lease_id}/keepalive"));
            match world.call(id, HostId::Lock, renew, &mut rng, None).await {
                Outcome::Answer(StatusCode::OK, _) => {}
                _ => break,
            }
        }
        world.history.lock().unwrap().grants[grant_index].ended = Some(Instant::now());
        if rng.random_bool(0.8) {
            let release = bare(Method::DELETE, &format!("/v1/leases/{lease_id}"));
            let _ = world.call(id, HostId::Lock, release, &mut rng, None).await;
        }
    }
}

/// Partitions, crashes and restarts, on the seed's schedule.
async fn nemesis(world: Arc<World>, mut rng: StdRng, end: Instant) {
    while Instant::now() < end {
        sleep(Duration::from_millis(rng.random_range(100..1500))).await;
        match rng.random_range(0..4) {
            0 => {
                let client = rng.random_range(0..CLIENTS);
                let host = if rng.random_bool(0.5) { HostId::Lock } else { HostId::Resource };
                let heal_after = Duration::from_millis(rng.random_range(200..2000));
                world.cut.lock().unwrap().insert((client, host));
                let (from, what) = (Instant::now(), format!("c{client} cut from {host:?}"));
                let span = Span { from, to: from + heal_after, client: None, what };
                world.history.lock().unwrap().faults.push(span);
                world.stats.lock().unwrap().partitions += 1;
                world.event(format!("partition c{client} | {host:?} for {} ms", heal_after.as_millis()));
                let w = Arc::clone(&world);
                tokio::spawn(async move {
                    sleep(heal_after).await;
                    w.cut.lock().unwrap().remove(&(client, host));
                });
            }
            n @ (1 | 2) => {
                let id = if n == 1 { HostId::Lock } else { HostId::Resource };
                let down = Duration::from_millis(rng.random_range(0..800));
                world.event(format!("crash {id:?}, down {} ms", down.as_millis()));
                world.host(id).crash();
                {
                    let mut stats = world.stats.lock().unwrap();
                    if id == HostId::Lock { stats.lock_crashes += 1 } else { stats.resource_crashes += 1 }
                }
                let from = Instant::now();
                sleep(down).await;
                world.host(id).start().await;
                world.event(format!("restarted {id:?}"));
                let span = Span { from, to: Instant::now(), client: None, what: format!("{id:?} down") };
                world.history.lock().unwrap().faults.push(span);
            }
            _ => {}
        }
    }
}

/// What the resource holds at the end: key → entries `(token field, value)` in log order.
type Logs = BTreeMap<usize, Vec<(Option<u64>, String)>>;

/// One thing the checker found wrong, and the writes (by value) it involves.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    what: String,
    writes: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

/// The violations found so far; `push(what, writes)` adds one.
#[derive(Default)]
struct Violations(Vec<Violation>);

impl Violations {
    fn push(&mut self, what: String, writes: &[&str]) {
        self.0.push(Violation { what, writes: writes.iter().map(|w| (*w).to_owned()).collect() });
    }
}

/// The checker. Returns every violation found (empty: the history is fine).
fn check(history: &History, logs: &Logs, fenced: bool) -> Vec<Violation> {
    let mut violations = Violations::default();
    let invoked: HashMap<&str, &WriteRecord> = history.writes.iter().map(|w| (w.value.as_str(), w)).collect();
    for key in 0..KEYS {
        let entries = logs.get(&key).map(Vec::as_slice).unwrap_or_default();
        let mut seen = HashSet::new();
        let mut highest: Option<(u64, &str)> = None;
        for (index, (field, value)) in entries.iter().enumerate() {
            let Some(write) = invoked.get(value.as_str()) else {
                violations.push(format!("k{key}[{index}]: {value:?} was never written"), &[]);
                continue;
            };
            if write.key != key {
                violations
                    .push(format!("k{key}[{index}]: {value:?} was written to k{}", write.key), &[value]);
            }
            if !seen.insert(value.as_str()) {
                violations.push(format!("k{key}[{index}]: {value:?} applied twice"), &[value]);
            }
            if write.acked == Some(false) {
                let what = format!("k{key}[{index}]: {value:?} applied though refused ({:?})", write.status);
                violations.push(what, &[value]);
            }
            if fenced && *field != Some(write.token) {
                violations.push(format!("k{key}[{index}]: {value:?} stored with token {field:?}"), &[value]);
            }
            // Entries in non-decreasing token order: no write with token t is
            // applied after a write with a higher token.
            if let Some((high, by)) = highest
                && write.token < high
            {
                let what = format!(
                    "k{key}[{index}]: {value:?} (token {}) applied after {by:?} (token {high})",
                    write.token
                );
                violations.push(what, &[value, by]);
            }
            if highest.is_none_or(|(high, _)| write.token > high) {
                highest = Some((write.token, value.as_str()));
            }
        }
        // Every acknowledged write is present.
        for write in history.writes.iter().filter(|w| w.key == key && w.acked == Some(true)) {
            if !seen.contains(write.value.as_str()) {
                violations.push(
                    format!("k{key}: acknowledged write {:?} is missing", write.value),
                    &[&write.value],
                );
            }
        }
    }
    // Tokens never repeat across grants, and a grant that completed before another
    // was asked for has the lower token.
    let mut tokens = HashMap::new();
    for grant in &history.grants {
        if let Some(other) = tokens.insert(grant.token, grant) {
            let what = format!(
                "token {} granted twice: c{} on k{} and c{} on k{}",
                grant.token, other.client, other.key, grant.client, grant.key
            );
            violations.push(what, &[]);
        }
    }
    for a in &history.grants {
        for b in &history.grants {
            if a.completed < b.invoked && a.token >= b.token {
                let what = format!("grant {} completed before grant {} was asked for", a.token, b.token);
                violations.push(what, &[]);
            }
        }
    }
    violations.0
}

fn temp_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap()
}

struct SeedResult {
    violations: Vec<Violation>,
    stats: Stats,
    history: History,
    /// When the run started: the timeline's zero.
    start: Instant,
}

/// Runs one seed of the workload and checks its history.
fn run_seed(seed: u64, fenced: bool) -> SeedResult {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    let dir = temp_dir();
    runtime.block_on(async move {
        let start = Instant::now();
        let world = Arc::new(World {
            lock: Host {
                id: HostId::Lock,
                dir: dir.path().into(),
                fencing: fenced,
                state: Default::default(),
            },
            resource: Host {
                id: HostId::Resource,
                dir: dir.path().into(),
                fencing: fenced,
                state: Default::default(),
            },
            cut: Mutex::default(),
            history: Mutex::default(),
            stats: Mutex::default(),
            start,
        });
        world.lock.start().await;
        world.resource.start().await;
        let mut master = StdRng::seed_from_u64(seed);
        let end = Instant::now() + RUN_FOR;
        let mut tasks = Vec::new();
        for id in 0..CLIENTS {
            let rng = StdRng::seed_from_u64(master.random());
            tasks.push(tokio::spawn(client(Arc::clone(&world), id, rng, end)));
        }
        let rng = StdRng::seed_from_u64(master.random());
        tasks.push(tokio::spawn(nemesis(Arc::clone(&world), rng, end)));
        for task in tasks {
            task.await.unwrap();
        }
        // Let every held message land, heal, then one last crash and restart:
        // what is checked is what the files hold.
        sleep(Duration::from_secs(10)).await;
        world.cut.lock().unwrap().clear();
        world.resource.crash();
        world.resource.start().await;
        let mut logs = Logs::new();
        for key in 0..KEYS {
            let read = world.resource.dispatch(bare(Method::GET, &format!("/logs/k{key}"))).unwrap();
            let (status, body) = read.await.unwrap();
            let entries = match status {
                StatusCode::OK => serde_json::from_slice::<Value>(&body).unwrap()["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| (e["token"].as_u64(), e["value"].as_str().unwrap().to_owned()))
                    .collect(),
                StatusCode::NOT_FOUND => Vec::new(),
                other => panic!("reading k{key}: {other}"),
            };
            logs.insert(key, entries);
        }
        world.resource.crash();
        world.lock.crash();
        let history = std::mem::take(&mut *world.history.lock().unwrap());
        let violations = check(&history, &logs, fenced);
        let stats = *world.stats.lock().unwrap();
        SeedResult { violations, stats, history, start }
    })
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

fn seeds(default: u64) -> Vec<u64> {
    match env_u64("FENCING_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("FENCING_SIM_SEEDS").unwrap_or(default)).collect(),
    }
}

#[test]
fn fenced_histories_pass_the_checker() {
    let seeds = seeds(300);
    let replay = seeds.len() == 1;
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    let mut failed = Vec::new();
    for &seed in &seeds {
        let result = run_seed(seed, true);
        total.add(&result.stats);
        if replay {
            for line in &result.history.events {
                eprintln!("{line}");
            }
            write_timeline(seed, true, &result);
        }
        if !result.violations.is_empty() {
            eprintln!("seed {seed}: {} violation(s):", result.violations.len());
            for v in result.violations.iter().take(10) {
                eprintln!("  {v}");
            }
            failed.push(seed);
        }
    }
    eprintln!(
        "fenced simulation: {} seeds in {:.1?}, {} failed; {total:?}",
        seeds.len(),
        started.elapsed(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "the checker failed on seeds {failed:?}; replay one with FENCING_SIM_SEED={} cargo test -p scenarios --all-features --test it simulation::fenced -- --nocapture",
        failed[0]
    );
    // The faults the checker is meant to survive did happen.
    if !replay {
        assert!(total.refused_stale > 0 && total.pauses > 0 && total.held > 0, "{total:?}");
        assert!(total.lock_crashes > 0 && total.resource_crashes > 0 && total.partitions > 0, "{total:?}");
    }
}

/// The same workload against the resource without fencing: the checker must
/// catch stale writes applied after newer ones, or it proves nothing.
/// (`FENCING_SIM_SEED=S` replays one seed here too: it prints the seed's first
/// violation, draws its timeline if asked, and asserts nothing.)
#[test]
fn unfenced_histories_fail_the_checker() {
    if let Some(seed) = env_u64("FENCING_SIM_SEED") {
        let result = run_seed(seed, false);
        match result.violations.first() {
            Some(first) => eprintln!(
                "unfenced seed {seed}: {} violation(s), the first: {first}",
                result.violations.len()
            ),
            None => eprintln!("unfenced seed {seed}: no violation"),
        }
        write_timeline(seed, false, &result);
        return;
    }
    let count = env_u64("FENCING_SIM_UNFENCED_SEEDS").unwrap_or(20);
    let mut failed = Vec::new();
    for seed in 0..count {
        let result = run_seed(seed, false);
        if stale_write_applied(&result).is_some() {
            if failed.is_empty() {
                eprintln!("unfenced seed {seed}: {}", result.violations[0]);
            }
            failed.push(seed);
        }
    }
    eprintln!("unfenced simulation: the checker failed on {} of {count} seeds", failed.len());
    assert!(
        !failed.is_empty(),
        "without fencing no seed out of {count} broke the checker: the harness is blind"
    );
}

/// The first violation of the seed's promise that fencing exists for: a stale write applied after a newer one.
fn stale_write_applied(result: &SeedResult) -> Option<&Violation> {
    result.violations.iter().find(|v| v.what.contains("applied after"))
}

/// With `FENCING_SIM_TIMELINE=FILE.svg`, draws the seed's history to FILE.svg
/// (the fenced run) or FILE-unfenced.svg.
fn write_timeline(seed: u64, fenced: bool, result: &SeedResult) {
    let Some(path) = std::env::var_os("FENCING_SIM_TIMELINE").map(PathBuf::from) else {
        return;
    };
    let path = if fenced {
        path
    } else {
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        path.with_file_name(format!("{stem}-unfenced.svg"))
    };
    let svg = picture::timeline(seed, fenced, result).to_svg();
    std::fs::write(&path, svg).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    eprintln!("timeline of seed {seed} ({}): {}", if fenced { "fenced" } else { "unfenced" }, path.display());
}

/// The picture of an unfenced seed that breaks the checker shows the stale
/// write, flagged, with the violation's words; and it renders to something.
#[test]
fn the_timeline_of_an_unfenced_seed_shows_its_flagged_write() {
    // The first violating seed (seed 0 so far): a replay can differ in details, so look for one.
    let (seed, result, violation) = (0..20)
        .find_map(|seed| {
            let result = run_seed(seed, false);
            let violation = stale_write_applied(&result)?.clone();
            Some((seed, result, violation))
        })
        .expect("an unfenced seed below 20 breaks the checker");
    let svg = picture::timeline(seed, false, &result).to_svg();
    let texts = svg_check::texts(&svg);
    let stale = &violation.writes[0];
    let flag = texts.iter().find(|t| t.starts_with("✗ ") && t.contains(stale.as_str()));
    assert!(flag.is_some(), "no flag naming {stale:?} among {texts:?}");
    assert!(texts.iter().any(|t| t.contains("applied after")), "{texts:?}");
    for client in 0..CLIENTS {
        assert!(texts.contains(&format!("c{client}")), "lane c{client} missing: {texts:?}");
    }
    let pixels = svg_check::render(&svg);
    eprintln!("{pixels:?}");
    // About 6 % for seed 0: at least 2 %.
    assert!(pixels.inked > pixels.total / 50, "{pixels:?}");
    // Two rings of radius 10 (the legend's small one alone is under 100 pixels).
    assert!(pixels.flag_red > 150, "the red rings of the flagged writes are drawn: {pixels:?}");
}

/// Each of the checker's properties fails on a history that breaks it: a
/// checker that cannot fail proves nothing.
#[test]
fn the_checker_catches_each_kind_of_violation() {
    let t0 = Instant::now();
    let write = |key, token, value: &str, acked| WriteRecord {
        client: 0,
        sent: t0,
        arrived: None,
        answered: None,
        key,
        token,
        value: value.into(),
        acked,
        status: acked.map(|a| if a { 201 } else { 409 }),
    };
    let grant = |client, token, at: u64| GrantRecord {
        client,
        key: 0,
        token,
        invoked: t0 + Duration::from_millis(at),
        completed: t0 + Duration::from_millis(at + 1),
        ended: None,
    };
    let good = History {
        writes: vec![write(0, 1, "a", Some(true)), write(0, 2, "b", Some(true)), write(0, 1, "late", None)],
        grants: vec![grant(0, 1, 0), grant(1, 2, 10)],
        events: Vec::new(),
        faults: Vec::new(),
    };
    let entries = |values: &[(u64, &str)]| -> Logs {
        [(0, values.iter().map(|(t, v)| (Some(*t), (*v).to_owned())).collect())].into()
    };
    assert_eq!(check(&good, &entries(&[(1, "a"), (2, "b")]), true), Vec::<Violation>::new());
    let cases: [(&str, History, Logs); 6] = [
        ("applied after", good.clone(), entries(&[(1, "a"), (2, "b"), (1, "late")])),
        ("is missing", good.clone(), entries(&[(1, "a")])),
        ("never written", good.clone(), entries(&[(1, "a"), (2, "b"), (2, "ghost")])),
        ("applied twice", good.clone(), entries(&[(1, "a"), (1, "a"), (2, "b")])),
        ("stored with token", good.clone(), entries(&[(1, "a"), (3, "b")])),
        (
            "granted twice",
            History { grants: vec![grant(0, 1, 0), grant(1, 1, 10)], ..good.clone() },
            entries(&[(1, "a"), (2, "b")]),
        ),
    ];
    for (expected, history, logs) in cases {
        let violations = check(&history, &logs, true);
        assert!(violations.iter().any(|v| v.what.contains(expected)), "{expected}: {violations:?}");
    }
    // A stale write names itself and the newer write it followed: the timeline flags both.
    let stale = check(&good, &entries(&[(1, "a"), (2, "b"), (1, "late")]), true);
    assert_eq!(stale[0].writes, ["late", "b"], "{stale:?}");
    let backwards = History { grants: vec![grant(0, 2, 0), grant(1, 1, 10)], ..good.clone() };
    let violations = check(&backwards, &entries(&[(1, "a"), (2, "b")]), true);
    assert!(violations.iter().any(|v| v.what.contains("completed before")), "{violations:?}");
    let refused = History { writes: vec![write(0, 1, "a", Some(false))], ..good };
    let violations = check(&refused, &entries(&[(1, "a")]), true);
    assert!(violations.iter().any(|v| v.what.contains("though refused")), "{violations:?}");
}
