//! Disk faults under load, injected with libfiu into a real `demo-resource
//! serve --data-dir` process (`fiu-run -x`, `fiu-ctrl`): failing fsync and
//! fdatasync, failing writes (EIO, ENOSPC) and short writes, each switched on
//! at a random moment while clients append with rising tokens, and off again
//! after a random while. Both redb files take the faults: the layer's marks
//! (`marks.redb`) and the data (`data.redb`).
//!
//! Checked: no stale token is ever admitted; `/healthz` stays 200 while
//! `/readyz` reports the fault; once the fault clears, writes work again within
//! a bound without a restart; after `kill -9` and a restart every acknowledged
//! append is there, and every acknowledged token's raise is durable (a token
//! just below it is refused).
//!
//! `FENCING_FAULT_ROUNDS` (default 10: each fault twice) sets the injections;
//! `FENCING_FAULT_SEED` repeats a run's timing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::fault_tools::rig::DiskFaultRig;
use crate::fault_tools::{DISK_FAULTS, rounds};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_demo-resource");
const CLIENTS: usize = 4;

/// Appends `value` to log `name` with `token`; the status (0 when the request failed).
async fn append(http: &reqwest::Client, url: &str, name: &str, token: u64, value: &str) -> u16 {
    let request =
        http.post(format!("{url}/logs/{name}")).header("Fencing-Token", token).body(value.to_owned());
    request.send().await.map_or(0, |r| r.status().as_u16())
}

#[derive(Default)]
struct Ledger {
    /// Every acknowledged append: log → (token, value), in order.
    acked: BTreeMap<String, Vec<(u64, String)>>,
    /// Appends refused (503 while the disk failed).
    refused: u64,
    /// Stale tokens sent, and how many were admitted (must stay 0).
    stale_sent: u64,
    stale_admitted: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_and_marks_survive_disk_faults_and_recover_without_restart() {
    let Some(rig) = DiskFaultRig::start(BIN, &["serve", "--listen", "127.0.0.1:0"]) else { return };
    let ledger = Arc::new(Mutex::new(Ledger::default()));

    let mut load = rig.load();
    for client in 0..CLIENTS {
        let ledger = Arc::clone(&ledger);
        load.spawn(|me| async move {
            let mut token = 0u64;
            while me.running() {
                token += 1;
                let name = format!("log-{client}-{}", token % 2);
                let highest = ledger.lock().unwrap().acked.get(&name).and_then(|e| e.last()).map(|e| e.0);
                // Every fourth request presents a token below the last acknowledged one.
                if token.is_multiple_of(4)
                    && let Some(highest) = highest.filter(|h| *h > 1)
                {
                    let answer = append(&me.http, &me.url, &name, highest - 1, "stale").await;
                    let mut ledger = ledger.lock().unwrap();
                    ledger.stale_sent += 1;
                    ledger.stale_admitted += u64::from((200..300).contains(&answer));
                    continue;
                }
                let value = format!("c{client}-t{token}");
                match append(&me.http, &me.url, &name, token, &value).await {
                    201 => ledger.lock().unwrap().acked.entry(name).or_default().push((token, value)),
                    _ => me.refused().await,
                }
            }
        });
    }

    let probe_token = AtomicU64::new(0);
    let (http, url) = (&rig.http, &rig.service.url);
    let faults = rig
        .service
        .switch_disk_faults(http, rounds(2 * DISK_FAULTS.len()), load.refused(), || async {
            let token = probe_token.fetch_add(1, Ordering::Relaxed) + 1;
            let value = format!("probe-{token}");
            let ok = append(http, url, "probe", token, &value).await == 201;
            if ok {
                ledger.lock().unwrap().acked.entry("probe".into()).or_default().push((token, value));
            }
            ok
        })
        .await;
    let refused = load.stop().await;

    let mut ledger = Arc::try_unwrap(ledger).ok().unwrap().into_inner().unwrap();
    ledger.refused = refused;
    let acked: usize = ledger.acked.values().map(Vec::len).sum();
    assert_eq!(ledger.stale_admitted, 0, "stale tokens admitted ({} sent)", ledger.stale_sent);
    assert!(ledger.stale_sent > 0, "no stale token was tried");
    assert!(acked > faults.rounds, "the load made too few appends: {acked}");
    assert!(ledger.refused > 0, "no append was refused: the faults did not reach the stores");
    assert!(faults.not_ready_seen > 0, "/readyz never reported a fault");

    // kill -9, then restart without faults: every acknowledged append and raise is there.
    let rig = rig.restart();
    let (http, url) = (&rig.http, &rig.service.url);
    let mut lost = 0;
    for (name, entries) in &ledger.acked {
        let log: Value = http.get(format!("{url}/logs/{name}")).send().await.unwrap().json().await.unwrap();
        let stored: Vec<(u64, String)> = log["entries"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: no entries after the restart: {log}"))
            .iter()
            .map(|e| (e["token"].as_u64().unwrap(), e["value"].as_str().unwrap().to_owned()))
            .collect();
        lost += entries.iter().filter(|entry| !stored.contains(entry)).count();
        let highest = entries.last().unwrap().0;
        if highest > 1 {
            let answer = append(http, url, name, highest - 1, "stale after restart").await;
            assert_eq!(
                answer,
                409,
                "{name}: token {} admitted after the restart: the raise to {highest} was lost",
                highest - 1
            );
        }
    }
    assert_eq!(lost, 0, "acknowledged appends lost after kill -9");

    faults.print("demo-resource", "appends");
    eprintln!(
        "demo-resource: {} injections, {acked} appends acknowledged, {} refused, 0 lost, stale admitted \
         0 of {}; /readyz 503 in {} of {0}",
        faults.rounds, ledger.refused, ledger.stale_sent, faults.not_ready_seen
    );
}
