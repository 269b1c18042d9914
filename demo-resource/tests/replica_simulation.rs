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
//! * `FENCING_REPLICA_SIM_SEEDS=N` — how many seeds (default 3), from 0.
//! * `FENCING_REPLICA_SIM_SEED=S` — only seed `S`, printing its history.
//!
//! The schedule (keys, pauses, routing, delays) is a function of the seed; the
//! interleaving is the machine's, since the servers and the database run in
//! real time.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestDb;
use demo_lock_service::LockService;
use demo_resource::{Config, Resource, Storage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_millis(150);
const RUN_FOR: Duration = Duration::from_millis(2500);
const CLIENTS: usize = 4;
const KEYS: usize = 2;
const REPLICAS: usize = 3;

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
            let delay = if rng.random_bool(0.2) {
                format!("?delay_ms={}", rng.random_range(1..80))
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
}

async fn run_seed(seed: u64, fence_in_transaction: bool) -> Option<SeedResult> {
    let db = TestDb::create().await?;
    let dir = tempfile::tempdir().unwrap();
    let lock = LockService::open(demo_lock_service::Config::new(dir.path().join("locks"))).unwrap();
    let lock = lock.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let mut running = Vec::new();
    for _ in 0..REPLICAS {
        let storage = Storage::Postgres { url: db.url(), fence_in_transaction, shared_marks: false };
        let resource = Resource::connect(Config {
            storage,
            fencing: true,
            verify_key: None,
            claim_timing: None,
            claims_session_url: None,
        })
        .await
        .unwrap();
        running.push(resource.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    let world = Arc::new(World {
        lock_url: lock.base_url(),
        replicas: running.iter().map(|r| r.base_url()).collect(),
        http: reqwest::Client::new(),
        history: Mutex::default(),
    });
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + RUN_FOR;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(Arc::clone(&world), id, StdRng::seed_from_u64(rng.random()), end)))
        .collect();
    for client in clients {
        client.await.unwrap();
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
        let Some(fenced) = run_seed(seed, true).await else { return };
        assert!(fenced.violations.is_empty(), "seed {seed}, --postgres: {:#?}", fenced.violations);
        assert!(fenced.acked > 0 && fenced.refused > 0, "seed {seed}: nothing was contested");
        for (total, n) in totals.iter_mut().zip([fenced.writes, fenced.acked, fenced.refused, fenced.pauses])
        {
            *total += n;
        }
        let local = run_seed(seed, false).await.expect("PostgreSQL went away");
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
    assert_eq!(local_failures, seeds.len(), "per-process marks passed on a schedule that needs shared ones");
}
