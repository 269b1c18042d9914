//! kill -9 a real `demo-resource serve` process at seeded moments while writers
//! append with rising (and some stale) tokens, and restart it on the same data
//! directory: after each restart every acknowledged write is there, the logs are
//! in non-decreasing token order, and every stale token is refused.
//!
//! `FENCING_RESOURCE_KILL_CYCLES=N` (default 50) and `FENCING_KILL_SEED=S`.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Client;
use serde_json::Value;
use test_support::ChildServer;

use crate::fault_tools::kill_cycles_and_seed;

const KEYS: usize = 3;

/// A running `demo-resource serve` (test-support's child server, SIGKILLed when dropped).
fn start(data_dir: &Path) -> ChildServer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data_dir).env("RUST_LOG", "error");
    ChildServer::start(command.stderr(Stdio::null()))
}

/// What the writers know: per key the current holder's token, the highest
/// acknowledged token, and every acknowledged value with its token.
#[derive(Default)]
struct Shared {
    current: [u64; KEYS],
    highest_acked: [u64; KEYS],
    acked: Vec<(usize, u64, String)>,
    stale_acked: Vec<String>,
    stale_refused: usize,
}

async fn append(http: &Client, base: &str, key: usize, token: u64, value: &str) -> Option<u16> {
    let response = http
        .post(format!("{base}/logs/k{key}"))
        .header("Fencing-Token", token)
        .body(value.to_owned())
        .send()
        .await
        .ok()?;
    Some(response.status().as_u16())
}

async fn read_log(http: &Client, base: &str, key: usize) -> Vec<(u64, String)> {
    let response = http.get(format!("{base}/logs/k{key}")).send().await.unwrap();
    if response.status() == 404 {
        return Vec::new();
    }
    let body: Value = response.json().await.unwrap();
    body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["token"].as_u64().unwrap(), e["value"].as_str().unwrap().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_and_marks_survive_kill_9_under_writes() {
    let (cycles, seed) = kill_cycles_and_seed("FENCING_RESOURCE_KILL_CYCLES");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let http = Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap();
    let shared = Arc::new(Mutex::new(Shared { current: [1; KEYS], ..Shared::default() }));
    let started = Instant::now();
    let mut cut_off = 0usize;

    for cycle in 0..cycles {
        let server = start(dir.path());
        let base = server.base();
        // After the restart (cycle > 0): every acknowledged write is there, in
        // non-decreasing token order, and a stale token is refused.
        for key in 0..KEYS {
            let log = read_log(&http, &base, key).await;
            let present: HashSet<&str> = log.iter().map(|(_, v)| v.as_str()).collect();
            for pair in log.windows(2) {
                assert!(pair[0].0 <= pair[1].0, "cycle {cycle} k{key}: {:?} then {:?}", pair[0], pair[1]);
            }
            let highest = {
                let state = shared.lock().unwrap();
                for (k, _, value) in state.acked.iter().filter(|(k, ..)| *k == key) {
                    assert!(
                        present.contains(value.as_str()),
                        "cycle {cycle} k{k}: acknowledged {value:?} lost"
                    );
                }
                state.highest_acked[key]
            };
            if highest > 1 {
                let status = append(&http, &base, key, highest - 1, "stale after restart").await;
                assert_eq!(status, Some(409), "cycle {cycle} k{key}: token {} after restart", highest - 1);
            }
        }
        let mut writers = Vec::new();
        for id in 0..4 {
            let (http, base, shared) = (http.clone(), base.clone(), Arc::clone(&shared));
            let mut rng = StdRng::seed_from_u64(rng.random());
            writers.push(tokio::spawn(async move {
                for n in 0.. {
                    let key = rng.random_range(0..KEYS);
                    let (token, stale) = {
                        let mut state = shared.lock().unwrap();
                        if rng.random_bool(0.1) {
                            state.current[key] += 1; // a new holder
                        }
                        let current = state.current[key];
                        if rng.random_bool(0.15) && current > 1 {
                            (current - rng.random_range(1..current), true)
                        } else {
                            (current, false)
                        }
                    };
                    let value = format!("c{cycle}w{id}n{n}t{token}");
                    let highest_before = shared.lock().unwrap().highest_acked[key];
                    let Some(status) = append(&http, &base, key, token, &value).await else {
                        return true; // the kill cut this request off
                    };
                    let mut state = shared.lock().unwrap();
                    match status {
                        201 => {
                            if token < highest_before {
                                state.stale_acked.push(value.clone());
                            }
                            state.highest_acked[key] = state.highest_acked[key].max(token);
                            state.acked.push((key, token, value));
                        }
                        409 if stale || token < state.highest_acked[key] => state.stale_refused += 1,
                        409 | 503 => {}
                        other => panic!("{value}: unexpected status {other}"),
                    }
                }
                false
            }));
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(30..250))).await;
        let mut server = server;
        server.kill_9();
        for w in writers {
            cut_off += usize::from(w.await.unwrap());
        }
    }
    let state = shared.lock().unwrap();
    assert!(state.stale_acked.is_empty(), "stale writes acknowledged: {:?}", state.stale_acked);
    let per_key: BTreeMap<usize, usize> = state.acked.iter().fold(BTreeMap::new(), |mut m, (k, ..)| {
        *m.entry(*k).or_default() += 1;
        m
    });
    eprintln!(
        "{cycles} kill -9 cycles in {:.1?}: {} acknowledged writes {per_key:?}, {} stale refused, \
         {cut_off} writers cut off by the kill, final tokens {:?}",
        started.elapsed(),
        state.acked.len(),
        state.stale_refused,
        state.current
    );
    assert!(state.acked.len() > cycles && state.stale_refused > 0);
}
