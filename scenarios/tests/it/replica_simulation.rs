//! Seeded simulation across three replicas of one resource on PostgreSQL, in
//! real time: the demo lock service and three `demo-resource` replicas run
//! in-process on 127.0.0.1 (real HTTP, one database). Four clients take
//! short leases, pause past their TTL now and then, and write through a replica
//! chosen at random, some writes stalling inside the handler (`?delay_ms`).
//! A checker then reads the logs back and verifies, per key, that no write was
//! applied after one with a higher token, that no refused write was applied,
//! and that every acknowledged write is there.
//!
//! With every write fenced in its own transaction (`serve --postgres`) the
//! checker must pass on every seed; with per-process marks only
//! (`--local-marks`) the same schedules must fail it: a paused holder's late
//! write lands on a replica that never saw the newer token.
//!
//! With shared marks (`serve --postgres URL --shared-marks`: replica claims,
//! admitted in memory; here a 1 s term) six clients write, more of them
//! stalling inside (30 %, up to 250 ms), and each replica reaches the database
//! through two stalling TCP proxies, one for its pool and one for its
//! background session (renewals, `LISTEN`). Every 0.1–0.6 s the replica last
//! written to loses its database for longer than the term: either all its
//! traffic stalls (1.2–2.2 s: renewals stop arriving, writes inside hang, the
//! session is given up), or its session is closed and cannot be reopened
//! (0.4–1.4 s) while its pool works. Its claims expire in the database and
//! raises get in elsewhere; the checker must pass on every seed. A write
//! answered 503 counts as of unknown outcome there: the layer stops a request
//! whose claim may lapse wherever its handler is, its commit perhaps sent.
//!
//! * `FENCING_REPLICA_SIM_SEEDS=N` — how many seeds (default 3), from 0.
//! * `FENCING_REPLICA_SIM_SEED=S` — only seed `S`, printing its history.
//!
//! Built with `--features mutants`, `FENCING_MUTANT=no-deadline-revoke` (a
//! replica does not stop its requests when a claim's renewals stop) or
//! `FENCING_MUTANT=session-claims` (a claim is freed when its replica's
//! session ends) must make the shared-marks test fail:
//! `scenarios/claims-sim-mutants.sh` runs both.
//!
//! The schedule (keys, pauses, routing, delays) is a function of the seed; the
//! interleaving is the machine's, since the servers and the database run in
//! real time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use demo_lock_service::LockService;
use demo_resource::{Config, Resource, Served, Storage};
use fencing_layer::claims::ClaimTiming;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use test_support::StallProxy;
use test_support::TestDb;
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_millis(150);
const RUN_FOR: Duration = Duration::from_millis(2500);
const CLIENTS: usize = 4;
const KEYS: usize = 2;
const REPLICAS: usize = 3;
/// With shared marks: how long the clients run, and the claims' timing (valid
/// 800 ms after a renewal is sent, renewed every 200 ms, expiring 1 s after
/// the database wrote it).
const SHARED_RUN_FOR: Duration = Duration::from_millis(6000);
const SHARED_CLIENTS: usize = 6;
const CLAIMS: ClaimTiming = ClaimTiming {
    term: Duration::from_secs(1),
    renew_every: Duration::from_millis(200),
    renew_timeout: Duration::from_millis(200),
    margin: Duration::from_millis(200),
};

/// How the replicas fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `--postgres`: each write fenced in its own transaction.
    InTransaction,
    /// `--local-marks`: per-process marks only.
    LocalMarks,
    /// `--shared-marks`, through stalling proxies: replica claims.
    SharedMarks,
}

#[derive(Debug, Clone)]
struct Write {
    key: usize,
    token: u64,
    value: String,
    replica: usize,
    /// `Some(true)` acknowledged, `Some(false)` refused (not applied), `None` unknown.
    acked: Option<bool>,
}

#[derive(Default)]
struct History {
    writes: Vec<Write>,
    events: Vec<String>,
}

struct World {
    mode: Mode,
    lock_url: String,
    replicas: Vec<String>,
    http: reqwest::Client,
    history: Mutex<History>,
}

impl World {
    fn event(&self, event: String) {
        self.history.lock().unwrap().events.push(event);
    }
}

async fn client(world: Arc<World>, id: usize, mut rng: StdRng, end: Instant) {
    let mut seq = 0;
    while Instant::now() < end {
        let key = rng.random_range(0..KEYS);
        let body =
            json!({"name": format!("k{key}"), "holder": format!("c{id}"), "ttl_ms": TTL.as_millis() as u64});
        let grant = world.http.post(format!("{}/v1/leases", world.lock_url)).json(&body).send().await;
        let grant: Value = match grant {
            Ok(response) if response.status() == 201 => response.json().await.unwrap(),
            _ => {
                sleep(Duration::from_millis(rng.random_range(5..60))).await;
                continue;
            }
        };
        let token = grant["token"].as_u64().unwrap();
        world.event(format!("c{id} granted k{key} token {token}"));
        for _ in 0..rng.random_range(1..=3) {
            if rng.random_bool(0.35) {
                // Paused past the TTL: another client may hold the lock by now.
                let pause = TTL.mul_f64(rng.random_range(1.2..2.5));
                world.event(format!("c{id} paused {} ms holding token {token}", pause.as_millis()));
                sleep(pause).await;
            }
            seq += 1;
            let value = format!("c{id}:t{token}:n{seq}");
            let replica = rng.random_range(0..REPLICAS);
            // With shared marks, more and longer writes inside while replicas lose their sessions.
            let (slow, longest) = if world.mode == Mode::SharedMarks { (0.3, 250) } else { (0.2, 80) };
            let delay = if rng.random_bool(slow) {
                format!("?delay_ms={}", rng.random_range(1..longest))
            } else {
                String::new()
            };
            let index = {
                let mut history = world.history.lock().unwrap();
                history.writes.push(Write { key, token, value: value.clone(), replica, acked: None });
                history.writes.len() - 1
            };
            let url = format!("{}/logs/k{key}{delay}", world.replicas[replica]);
            let sent = world.http.post(url).header("fencing-token", token).body(value.clone()).send();
            let status = match tokio::time::timeout(Duration::from_secs(10), sent).await {
                Ok(Ok(response)) => Some(response.status().as_u16()),
                _ => None,
            };
            let acked = match status {
                Some(200..=299) => Some(true),
                // The layer stops a request whose claim may lapse, wherever its handler is.
                Some(503) if world.mode == Mode::SharedMarks => None,
                Some(400 | 409 | 428 | 503) => Some(false),
                _ => None,
            };
            world.history.lock().unwrap().writes[index].acked = acked;
            world.event(format!("c{id} write {value} via r{replica} -> {status:?}"));
            if status == Some(409) {
                break;
            }
        }
        if rng.random_bool(0.7) {
            let release = format!("{}/v1/leases/{}", world.lock_url, grant["lease_id"].as_str().unwrap());
            let _ = world.http.delete(release).send().await;
        }
    }
}

/// Per key: writes applied in non-decreasing token order, nothing refused applied,
/// every acknowledged write present.
fn check(history: &History, logs: &HashMap<usize, Vec<(u64, String)>>) -> Vec<String> {
    let mut violations = Vec::new();
    let written: HashMap<&str, &Write> = history.writes.iter().map(|w| (w.value.as_str(), w)).collect();
    for key in 0..KEYS {
        let entries = logs.get(&key).map(Vec::as_slice).unwrap_or_default();
        let mut seen = HashSet::new();
        let mut highest: Option<(u64, &str)> = None;
        for (index, (token, value)) in entries.iter().enumerate() {
            let Some(write) = written.get(value.as_str()) else {
                violations.push(format!("k{key}[{index}]: {value:?} was never written"));
                continue;
            };
            seen.insert(value.as_str());
            if write.token != *token {
                violations.push(format!("k{key}[{index}]: {value:?} stored with token {token}"));
            }
            if write.acked == Some(false) {
                violations.push(format!("k{key}[{index}]: {value:?} applied though refused"));
            }
            if let Some((high, by)) = highest
                && *token < high
            {
                violations.push(format!(
                    "k{key}[{index}]: {value:?} (token {token}, via r{}) applied after {by:?} (token {high})",
                    write.replica
                ));
            }
            if highest.is_none_or(|(high, _)| *token > high) {
                highest = Some((*token, value.as_str()));
            }
        }
        for write in history.writes.iter().filter(|w| w.key == key && w.acked == Some(true)) {
            if !seen.contains(write.value.as_str()) {
                violations.push(format!("k{key}: acknowledged write {:?} is missing", write.value));
            }
        }
    }
    violations
}

struct SeedResult {
    violations: Vec<String>,
    writes: usize,
    acked: usize,
    refused: usize,
    pauses: usize,
    stalls: usize,
    severed: usize,
    unknown: usize,
}

/// A replica's two routes to the database: its pool's, and its background
/// session's (renewals, `LISTEN`).
struct Routes {
    data: StallProxy,
    session: StallProxy,
}

/// Until `end`, 0.1–0.6 s after the last fault ended, the replica the last
/// write was sent to loses its database for longer
/// than the claim term, one of two ways at random:
/// - (3 in 5) a *stall*: no byte moves on either route for 1.2–2.2 s (nothing is closed);
/// - (2 in 5) a *severed session*: its background session is closed and cannot be
///   reopened for 0.4–1.4 s; its pool's route keeps working.
async fn faults(world: Arc<World>, routes: Arc<Vec<Routes>>, mut rng: StdRng, end: Instant) {
    loop {
        sleep(Duration::from_millis(rng.random_range(100..600))).await;
        if Instant::now() >= end {
            return;
        }
        // The replica the last write was sent to: one likely to hold claims.
        let last = world.history.lock().unwrap().writes.last().map(|write| write.replica);
        let replica = last.unwrap_or_else(|| rng.random_range(0..routes.len()));
        let routes = &routes[replica];
        if rng.random_bool(0.6) {
            let stall = Duration::from_millis(rng.random_range(1200..2200));
            world.event(format!("r{replica} database traffic stalled for {} ms", stall.as_millis()));
            routes.data.stall();
            routes.session.stall();
            sleep(stall).await;
            routes.data.resume();
            routes.session.resume();
            world.event(format!("r{replica} database traffic resumed"));
        } else {
            let severed = Duration::from_millis(rng.random_range(400..1400));
            world.event(format!("r{replica} session severed for {} ms", severed.as_millis()));
            routes.session.sever();
            sleep(severed).await;
            routes.session.restore();
            world.event(format!("r{replica} session route restored"));
        }
    }
}

async fn run_seed(seed: u64, mode: Mode) -> Option<SeedResult> {
    let db = TestDb::create().await?;
    let dir = tempfile::tempdir().unwrap();
    let lock = LockService::open(demo_lock_service::Config::new(dir.path().join("locks"))).unwrap();
    let lock = lock.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let mut running = Vec::new();
    let mut routes = Vec::new();
    for _ in 0..REPLICAS {
        let (url, session) = match mode {
            Mode::SharedMarks => {
                let postgres = ([127, 0, 0, 1], 5432).into();
                let (data, session) = (StallProxy::start(postgres).await, StallProxy::start(postgres).await);
                let urls = (db.url_via(data.addr.port()), Some(db.url_via(session.addr.port())));
                routes.push(Routes { data, session });
                urls
            }
            Mode::InTransaction | Mode::LocalMarks => (db.url(), None),
        };
        let storage = Storage::Postgres {
            url,
            fence_in_transaction: mode == Mode::InTransaction,
            shared_marks: mode == Mode::SharedMarks,
        };
        let config = Config {
            storage,
            fencing: true,
            verify_key: None,
            claim_timing: Some(CLAIMS),
            claims_session_url: session,
            transaction_pooling: false,
            etcd_marks: None,
            accept_volatile_commits: false,
        };
        let resource = Resource::connect(config).await.unwrap();
        running.push(resource.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    let routes = Arc::new(routes);
    let world = Arc::new(World {
        mode,
        lock_url: lock.base_url(),
        replicas: running.iter().map(|r| r.base_url()).collect(),
        http: reqwest::Client::new(),
        history: Mutex::default(),
    });
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + if mode == Mode::SharedMarks { SHARED_RUN_FOR } else { RUN_FOR };
    let clients = if mode == Mode::SharedMarks { SHARED_CLIENTS } else { CLIENTS };
    let clients: Vec<_> = (0..clients)
        .map(|id| tokio::spawn(client(Arc::clone(&world), id, StdRng::seed_from_u64(rng.random()), end)))
        .collect();
    let faults = (mode == Mode::SharedMarks).then(|| {
        tokio::spawn(faults(Arc::clone(&world), Arc::clone(&routes), StdRng::seed_from_u64(seed), end))
    });
    for client in clients {
        client.await.unwrap();
    }
    if let Some(faults) = faults {
        faults.await.unwrap();
    }
    let mut logs = HashMap::new();
    for key in 0..KEYS {
        let url = format!("{}/logs/k{key}", world.replicas[0]);
        let response = world.http.get(url).send().await.unwrap();
        let entries = if response.status() == 404 {
            Vec::new()
        } else {
            let body: Value = response.json().await.unwrap();
            let entries = body["entries"].as_array().unwrap().iter();
            entries.map(|e| (e["token"].as_u64().unwrap(), e["value"].as_str().unwrap().to_owned())).collect()
        };
        logs.insert(key, entries);
    }
    let history = world.history.lock().unwrap();
    let violations = check(&history, &logs);
    if std::env::var("FENCING_REPLICA_SIM_SEED").is_ok() {
        for event in &history.events {
            eprintln!("  {event}");
        }
    }
    let count = |f: &dyn Fn(&Write) -> bool| history.writes.iter().filter(|w| f(w)).count();
    Some(SeedResult {
        writes: history.writes.len(),
        acked: count(&|w| w.acked == Some(true)),
        refused: count(&|w| w.acked == Some(false)),
        pauses: history.events.iter().filter(|e| e.contains("paused")).count(),
        stalls: history.events.iter().filter(|e| e.contains("stalled for")).count(),
        severed: history.events.iter().filter(|e| e.contains("severed for")).count(),
        unknown: count(&|w| w.acked.is_none()),
        violations,
    })
}

fn seeds() -> Vec<u64> {
    let env = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match env("FENCING_REPLICA_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env("FENCING_REPLICA_SIM_SEEDS").unwrap_or(3)).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_fenced_in_the_database_pass_the_checker_and_local_marks_fail_it() {
    let (mut totals, mut local_failures) = ([0; 4], 0);
    let seeds = seeds();
    for &seed in &seeds {
        let Some(fenced) = run_seed(seed, Mode::InTransaction).await else { return };
        assert!(fenced.violations.is_empty(), "seed {seed}, --postgres: {:#?}", fenced.violations);
        assert!(fenced.acked > 0 && fenced.refused > 0, "seed {seed}: nothing was contested");
        for (total, n) in totals.iter_mut().zip([fenced.writes, fenced.acked, fenced.refused, fenced.pauses])
        {
            *total += n;
        }
        let local = run_seed(seed, Mode::LocalMarks).await.expect("PostgreSQL went away");
        eprintln!(
            "seed {seed}: --postgres {} writes, {} acked, {} refused, 0 violations; --local-marks {} violations, first: {}",
            fenced.writes,
            fenced.acked,
            fenced.refused,
            local.violations.len(),
            local.violations.first().map_or("-", String::as_str)
        );
        local_failures += usize::from(!local.violations.is_empty());
    }
    let [writes, acked, refused, pauses] = totals;
    eprintln!(
        "{} seeds: --postgres {writes} writes, {acked} acked, {refused} refused, {pauses} pauses, 0 violations; \
         --local-marks failed the checker on {local_failures}",
        seeds.len()
    );
    // Real time on a shared machine: a loaded run may, rarely, schedule one seed's
    // writes so that per-process marks happen to pass (seen once at load 5). The
    // control must fail on most seeds, and the fenced mode passed on every one above.
    assert!(
        local_failures * 2 > seeds.len(),
        "per-process marks passed on {} of {} schedules that need shared ones",
        seeds.len() - local_failures,
        seeds.len()
    );
}

/// Shared marks (replica claims) while replicas lose their database at random
/// moments, for longer than the claim term (stalls, severed sessions): 0
/// violations on every seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_with_shared_marks_pass_the_checker_through_lost_sessions() {
    let seeds = seeds();
    let (mut totals, mut failed) = ([0; 7], Vec::new());
    for &seed in &seeds {
        let Some(run) = run_seed(seed, Mode::SharedMarks).await else { return };
        let counts = [run.writes, run.acked, run.refused, run.unknown, run.pauses, run.stalls, run.severed];
        let [writes, acked, refused, unknown, pauses, stalls, severed] = counts;
        let first = run.violations.first().map_or(String::new(), |first| format!(", first: {first}"));
        eprintln!(
            "seed {seed}: --shared-marks {writes} writes, {acked} acked, {refused} refused, {unknown} unknown, \
             {pauses} pauses, {stalls} stalls, {severed} severed sessions, {} violations{first}",
            run.violations.len()
        );
        for (total, n) in totals.iter_mut().zip(counts) {
            *total += n;
        }
        assert!(acked > 0, "seed {seed}: nothing was acknowledged");
        if !run.violations.is_empty() {
            failed.push((seed, run.violations));
        }
    }
    let [writes, acked, refused, unknown, pauses, stalls, severed] = totals;
    eprintln!(
        "{} seeds: --shared-marks {writes} writes, {acked} acked, {refused} refused, {unknown} unknown, \
         {pauses} pauses, {stalls} stalls, {severed} severed sessions; violations on {} seeds",
        seeds.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "VIOLATIONS with shared marks: {failed:#?}");
}
