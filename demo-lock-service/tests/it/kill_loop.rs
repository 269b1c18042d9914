//! kill -9 the real `demo-lock-service` binary in a loop while clients acquire,
//! restarting it on the same data directory each time: every token ever
//! acknowledged is distinct, and tokens strictly increase across every restart
//! and in real time (a grant acknowledged before another was asked for has the
//! lower token). Invariant 4 of DESIGN.md.
//!
//! `FENCING_KILL_CYCLES=N` sets the number of kill/restart cycles (default 50);
//! `FENCING_KILL_SEED=S` the seed of the kill moments and the clients' choices.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::ChildServer;

use crate::fault_tools::kill_cycles_and_seed;

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap()
}

/// A child `demo-lock-service` (test-support's child server, SIGKILLed when dropped).
fn start(dir: &std::path::Path) -> ChildServer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_demo-lock-service"));
    command.args(["--listen", "127.0.0.1:0", "--data-dir"]).arg(dir).env("RUST_LOG", "error");
    ChildServer::start(command.stdin(Stdio::null()).stderr(Stdio::null()))
}

/// A small xorshift generator: the kill moments and names follow the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy)]
struct Granted {
    cycle: usize,
    token: u64,
    invoked: Instant,
    completed: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_kill_9_restarts() {
    let (cycles, seed) = kill_cycles_and_seed("FENCING_KILL_CYCLES");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let granted: Arc<Mutex<Vec<Granted>>> = Arc::default();
    let started = Instant::now();
    let (mut refused, mut cut_off) = (0usize, 0usize);

    for cycle in 0..cycles {
        let proc = start(dir.path());
        let mut clients = Vec::new();
        for id in 0..3 {
            let (http, base, granted) = (http.clone(), proc.base(), Arc::clone(&granted));
            let mut rng = Rng(rng.next() | 1);
            clients.push(tokio::spawn(async move {
                let mut refused = 0usize;
                loop {
                    let name = format!("lock{}", rng.below(6));
                    let invoked = Instant::now();
                    let sent = http
                        .post(format!("{base}/v1/leases"))
                        .json(&json!({"name": name, "holder": format!("c{id}"), "ttl_ms": 300}))
                        .send()
                        .await;
                    let Ok(response) = sent else { return (refused, true) };
                    match response.status() {
                        StatusCode::CREATED => {
                            let Ok(body) = response.json::<Value>().await else { return (refused, true) };
                            let token = body["token"].as_u64().unwrap();
                            let completed = Instant::now();
                            granted.lock().unwrap().push(Granted { cycle, token, invoked, completed });
                        }
                        StatusCode::CONFLICT => refused += 1,
                        other => panic!("cycle {cycle}: unexpected {other}"),
                    }
                }
            }));
        }
        // Kill at a seeded moment while the clients are acquiring.
        tokio::time::sleep(Duration::from_millis(20 + rng.below(150))).await;
        let mut proc = proc;
        proc.kill_9();
        for c in clients {
            let (r, cut) = c.await.unwrap();
            refused += r;
            cut_off += usize::from(cut);
        }
    }

    let granted = granted.lock().unwrap().clone();
    let mut by_token = granted.clone();
    by_token.sort_by_key(|g| g.token);
    for pair in by_token.windows(2) {
        assert!(pair[0].token != pair[1].token, "token {} granted twice", pair[0].token);
        // Sorted by token, the cycles must not go backwards: every token of a later
        // incarnation is above every token of an earlier one.
        assert!(
            pair[0].cycle <= pair[1].cycle,
            "token {} (cycle {}) is below token {} of the earlier cycle {}",
            pair[1].token,
            pair[1].cycle,
            pair[0].token,
            pair[0].cycle
        );
    }
    for a in &granted {
        for b in &granted {
            assert!(
                !(a.completed < b.invoked && a.token >= b.token),
                "grant {} was acknowledged before grant {} was asked for",
                a.token,
                b.token
            );
        }
    }
    let cycles_with_grants = (0..cycles).filter(|c| granted.iter().any(|g| g.cycle == *c)).count();
    eprintln!(
        "{cycles} kill -9 cycles in {:.1?}: {} grants ({} cycles with grants), {refused} refused as held, \
         {cut_off} requests cut off by the kill; tokens {}..={}",
        started.elapsed(),
        granted.len(),
        cycles_with_grants,
        by_token.first().map_or(0, |g| g.token),
        by_token.last().map_or(0, |g| g.token),
    );
    assert!(cycles_with_grants * 2 > cycles, "most cycles must grant something before the kill");
}
