//! A bounded soak over loopback: a fenced axum app with a small key limit, and
//! many concurrent keep-alive connections sending a mix of valid, stale,
//! malformed, repeated-header, token-less, oversized and garbage requests over
//! many distinct keys, up to and past the key limit. It reports every status
//! seen, fails on a crash, on any 5xx other than the designed 503, on any
//! status outside the contract, and on RSS growth once the key table is full.
//!
//! The app is this file's own, shaped like demo-resource's log route (which does not expose the key limit):
//! `POST /logs/{name}` fenced by `FencingLayer` over
//! `MarkStore::builder().max_keys(SOAK_MAX_KEYS)`, the handler reading at most
//! 64 KiB of body (413 past it) and remembering the last token per key.
//!
//! ```text
//! ulimit -n 65536   # two descriptors per connection (client and server side)
//! cargo run --release -p fencing-benches --example soak
//! SOAK_CONNECTIONS=1000 SOAK_SECS=60 SOAK_MAX_KEYS=2000 SOAK_KEYS=5000 cargo run --release -p fencing-benches --example soak
//! ```
//!
//! RSS is this process's (server and clients together), from `/proc/self/status`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use fencing_layer::{FencingLayer, FencingToken, MarkStore};
use http_body_util::{BodyExt, Limited};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

// Measured as the lock service's soak measures it (packaged with that crate).
#[path = "../../demo-lock-service/examples/rss/mod.rs"]
mod rss;
use rss::rss_kib;

type Data = Arc<Mutex<HashMap<String, u64>>>;

async fn append(
    State(data): State<Data>,
    Path(name): Path<String>,
    token: FencingToken,
    body: Body,
) -> (StatusCode, String) {
    match Limited::new(body, 64 * 1024).collect().await {
        Ok(_) => {
            data.lock().unwrap().insert(name, token.get());
            (StatusCode::CREATED, format!("{{\"token\":{token}}}"))
        }
        Err(_) => (StatusCode::PAYLOAD_TOO_LARGE, "{}".into()),
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Reads one response; `None` when the connection closed or broke.
async fn read_response(reader: &mut BufReader<TcpStream>) -> Option<u16> {
    let mut line = String::new();
    if reader.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
    let (mut length, mut chunked) = (0usize, false);
    loop {
        line.clear();
        reader.read_line(&mut line).await.ok()?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let lower = header.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line).await.ok()?;
            let size = usize::from_str_radix(line.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await.ok()?;
            if size == 0 {
                break;
            }
        }
    } else {
        let mut body = vec![0; length];
        reader.read_exact(&mut body).await.ok()?;
    }
    Some(status)
}

#[derive(Default)]
struct Counts {
    by_kind_status: BTreeMap<(&'static str, u16), u64>,
    reconnects: u64,
}

#[tokio::main]
async fn main() {
    let connections = env("SOAK_CONNECTIONS", 1000) as usize;
    let secs = env("SOAK_SECS", 60);
    let max_keys = env("SOAK_MAX_KEYS", 2000) as usize;
    let keys = env("SOAK_KEYS", 5000);
    let seed = env("SOAK_SEED", 1);

    let store = MarkStore::builder().max_keys(max_keys).in_memory();
    let data: Data = Arc::default();
    let app = Router::new()
        .route("/logs/{name}", post(append).get(|| async { "ok" }))
        .route_layer(FencingLayer::new().store(store.clone()))
        .with_state(Arc::clone(&data));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    println!(
        "soak: {connections} connections for {secs} s against {addr}, max_keys {max_keys}, {keys} distinct keys, RSS at start {} KiB",
        rss_kib()
    );

    let current: Arc<Vec<AtomicU64>> = Arc::new((0..keys).map(|_| AtomicU64::new(1)).collect());
    let counts = Arc::new(Mutex::new(Counts::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut master = StdRng::seed_from_u64(seed);
    let mut clients = Vec::new();
    for _ in 0..connections {
        let (current, counts, stop) = (Arc::clone(&current), Arc::clone(&counts), Arc::clone(&stop));
        let mut rng = StdRng::seed_from_u64(master.random());
        clients.push(tokio::spawn(async move {
            let mut local: BTreeMap<(&'static str, u16), u64> = BTreeMap::new();
            let mut reconnects = 0;
            let big = vec![b'x'; 70 * 1024];
            'connect: while !stop.load(Ordering::Relaxed) {
                let Ok(stream) = TcpStream::connect(addr).await else {
                    reconnects += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let mut reader = BufReader::new(stream);
                while !stop.load(Ordering::Relaxed) {
                    let key = rng.random_range(0..keys);
                    let cur = &current[key as usize];
                    let roll = rng.random_range(0..100);
                    let (kind, request): (&'static str, Vec<u8>) = {
                        let path = format!("/logs/k{key}");
                        let post = |headers: &str, body: &[u8]| {
                            let mut r = format!(
                                "POST {path} HTTP/1.1\r\nHost: soak\r\n{headers}Content-Length: {}\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(body);
                            r
                        };
                        match roll {
                            0..45 => {
                                if rng.random_bool(0.05) {
                                    cur.fetch_add(1, Ordering::Relaxed);
                                }
                                let t = cur.load(Ordering::Relaxed);
                                ("valid", post(&format!("Fencing-Token: {t}\r\n"), b"value"))
                            }
                            45..60 => {
                                let t = cur.load(Ordering::Relaxed).saturating_sub(rng.random_range(1..3));
                                ("stale", post(&format!("Fencing-Token: {t}\r\n"), b"stale"))
                            }
                            60..70 => {
                                // (Not " 7 ": HTTP/1.1 strips whitespace around a field value, so that is 7.)
                                let bad =
                                    ["abc", "-1", "01", "+5", "7 8", "18446744073709551616", "0x10", "1e3"]
                                        [rng.random_range(0..8)];
                                ("malformed", post(&format!("Fencing-Token: {bad}\r\n"), b"m"))
                            }
                            70..78 => {
                                let t = cur.load(Ordering::Relaxed);
                                (
                                    "repeated",
                                    post(&format!("Fencing-Token: {t}\r\nFencing-Token: {t}\r\n"), b"r"),
                                )
                            }
                            78..84 => ("no-token", post("", b"n")),
                            84..88 => {
                                let t = cur.load(Ordering::Relaxed);
                                ("oversized", post(&format!("Fencing-Token: {t}\r\n"), &big))
                            }
                            88..96 => {
                                ("read", format!("GET {path} HTTP/1.1\r\nHost: soak\r\n\r\n").into_bytes())
                            }
                            _ => ("garbage", b"PO\x01ST /\xff HTTP/9.9\r\n\r\n".to_vec()),
                        }
                    };
                    if reader.get_mut().write_all(&request).await.is_err() {
                        *local.entry((kind, 0)).or_default() += 1;
                        reconnects += 1;
                        continue 'connect;
                    }
                    match read_response(&mut reader).await {
                        Some(status) => *local.entry((kind, status)).or_default() += 1,
                        None => {
                            *local.entry((kind, 0)).or_default() += 1;
                            reconnects += 1;
                            continue 'connect;
                        }
                    }
                    if kind == "garbage" || kind == "oversized" {
                        // The server may close such a connection; start afresh.
                        reconnects += 1;
                        continue 'connect;
                    }
                }
            }
            let mut counts = counts.lock().unwrap();
            for (k, n) in local {
                *counts.by_kind_status.entry(k).or_default() += n;
            }
            counts.reconnects += reconnects;
        }));
    }

    let mut full_at: Option<(Duration, u64)> = None;
    let mut peak_after_full = 0u64;
    while started.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let rss = rss_kib();
        if full_at.is_none() && store.len() >= max_keys {
            full_at = Some((started.elapsed(), rss));
        }
        if full_at.is_some() {
            peak_after_full = peak_after_full.max(rss);
        }
        println!(
            "t={:>3} s  keys {:>6}/{max_keys}  RSS {rss} KiB  server alive {}",
            started.elapsed().as_secs(),
            store.len(),
            !server.is_finished()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = tokio::time::timeout(Duration::from_secs(10), c).await;
    }
    let rss_end = rss_kib();
    let counts = counts.lock().unwrap();
    let total: u64 = counts.by_kind_status.values().sum();
    println!(
        "soak: {total} requests in {:.1?} ({:.0}/s), {} reconnects",
        started.elapsed(),
        total as f64 / started.elapsed().as_secs_f64(),
        counts.reconnects
    );
    let allowed: &[(&str, &[u16])] = &[
        ("valid", &[201, 409, 503]),
        ("stale", &[201, 409, 503]),
        ("malformed", &[400]),
        ("repeated", &[400]),
        ("no-token", &[428]),
        ("oversized", &[413, 409, 503, 0]),
        ("read", &[200]),
        ("garbage", &[400, 0]),
    ];
    let mut failures = Vec::new();
    for ((kind, status), n) in &counts.by_kind_status {
        println!("  {kind:<10} {status:>3}  {n}");
        let ok = allowed.iter().any(|(k, s)| k == kind && s.contains(status))
            // A write cut by a closed connection shows as 0; only counted, not a failure.
            || *status == 0;
        if !ok || (*status >= 500 && *status != 503) {
            failures.push(format!("{kind} got {status} ({n} times)"));
        }
    }
    if server.is_finished() {
        failures.push("the server stopped".into());
    }
    match full_at {
        Some((at, rss_full)) => {
            let growth = peak_after_full.max(rss_end) as f64 / rss_full as f64;
            println!(
                "key table full ({} keys) at {:.0?} with RSS {rss_full} KiB; peak after {peak_after_full} KiB; end {rss_end} KiB; growth x{growth:.2}",
                store.len(),
                at
            );
            if growth > 1.25 {
                failures.push(format!("RSS grew x{growth:.2} after the key table was full"));
            }
        }
        None => failures.push(format!("the key table never filled ({} of {max_keys})", store.len())),
    }
    if failures.is_empty() {
        println!("soak: OK");
    } else {
        println!("soak: FAILED: {failures:?}");
        std::process::exit(1);
    }
}
