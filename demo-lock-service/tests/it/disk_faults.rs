//! Disk faults under load, injected with libfiu into a real `demo-lock-service`
//! process (`fiu-run -x`, `fiu-ctrl`): failing fsync and fdatasync, failing
//! writes (EIO, ENOSPC) and short writes, each switched on at a random moment
//! while clients take grants, and off again after a random while.
//!
//! Checked: every acknowledged grant has a token no other grant had, tokens
//! only go up; `/healthz` stays 200 while `/readyz` reports the fault; after
//! the fault clears, grants work again within a bound, without a restart; after
//! `kill -9` and a restart every acknowledged grant is still held and the next
//! token is above every acknowledged one.
//!
//! `FENCING_FAULT_ROUNDS` (default 10: each fault twice) sets the injections;
//! `FENCING_FAULT_SEED` repeats a run's timing.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::fault_tools::rig::DiskFaultRig;
use crate::fault_tools::{DISK_FAULTS, rounds};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_demo-lock-service");
const CLIENTS: usize = 4;

/// A grant's token, or `None` when it was refused (any non-201 answer or a failed request).
async fn grant(http: &reqwest::Client, url: &str, name: &str, holder: &str) -> Option<u64> {
    let body = json!({"name": name, "holder": holder, "ttl_ms": 120_000});
    let response = http.post(format!("{url}/v1/leases")).json(&body).send().await.ok()?;
    if response.status() != 201 {
        return None;
    }
    let grant: Value = response.json().await.ok()?;
    grant["token"].as_u64()
}

#[derive(Default)]
struct Ledger {
    /// Every acknowledged grant, in the order its client saw it: (lock, token).
    acked: Vec<(String, u64)>,
    /// Per client, its acknowledged tokens in order.
    per_client: BTreeMap<usize, Vec<u64>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_stay_durable_and_unique_through_disk_faults_and_recover_without_restart() {
    let Some(rig) = DiskFaultRig::start(BIN, &["--listen", "127.0.0.1:0"]) else { return };
    let ledger = Arc::new(Mutex::new(Ledger::default()));

    let mut load = rig.load();
    for client in 0..CLIENTS {
        let ledger = Arc::clone(&ledger);
        load.spawn(|me| async move {
            let holder = format!("client-{client}");
            let mut n = 0usize;
            while me.running() {
                let name = format!("lock-{client}-{}", n % 2);
                n += 1;
                match grant(&me.http, &me.url, &name, &holder).await {
                    Some(token) => {
                        let mut ledger = ledger.lock().unwrap();
                        ledger.acked.push((name, token));
                        ledger.per_client.entry(client).or_default().push(token);
                    }
                    None => me.refused().await,
                }
            }
        });
    }

    let (http, url) = (&rig.http, &rig.service.url);
    let faults = rig
        .service
        .switch_disk_faults(http, rounds(2 * DISK_FAULTS.len()), load.refused(), || async {
            grant(http, url, "probe", "prober").await.is_some_and(|token| {
                ledger.lock().unwrap().acked.push(("probe".into(), token));
                true
            })
        })
        .await;
    let total_refused = load.stop().await;

    let ledger = Arc::try_unwrap(ledger).ok().unwrap().into_inner().unwrap();
    assert!(ledger.acked.len() > faults.rounds, "the load made too few grants: {}", ledger.acked.len());
    assert!(total_refused > 0, "no grant was refused: the faults did not reach the store");
    assert!(faults.not_ready_seen > 0, "/readyz never reported a fault");
    let mut seen = HashSet::new();
    for (name, token) in &ledger.acked {
        assert!(seen.insert(*token), "token {token} acknowledged twice (again for {name})");
    }
    for (client, tokens) in &ledger.per_client {
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "client {client}'s tokens went down: {tokens:?}");
    }

    // kill -9, then restart without faults: nothing acknowledged is lost.
    let rig = rig.restart();
    let (http, url) = (&rig.http, &rig.service.url);
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (name, token) in &ledger.acked {
        last.insert(name, *token);
    }
    for (name, token) in &last {
        let held: Value =
            http.get(format!("{url}/v1/locks/{name}")).send().await.unwrap().json().await.unwrap();
        let held = held["token"].as_u64().unwrap_or_else(|| panic!("{name}'s grant {token} lost: {held}"));
        assert!(held >= *token, "{name}: acknowledged grant {token} lost, the lock shows {held}");
    }
    let highest = ledger.acked.iter().map(|(_, t)| *t).max().unwrap();
    let next = grant(http, url, "after-restart", "prober").await.expect("a grant after the restart");
    assert!(next > highest, "token {next} after the restart is not above {highest}");

    faults.print("lock service", "grants");
    eprintln!(
        "lock service: {} injections, {} grants acknowledged, {total_refused} refused, 0 lost, 0 tokens \
         repeated; /readyz 503 in {} of {0}; next token after kill -9 {next} > {highest}",
        faults.rounds,
        ledger.acked.len(),
        faults.not_ready_seen
    );
}
