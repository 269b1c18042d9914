//! Memory per tracked key: a counting global allocator measures the bytes a
//! store holds after tracking N keys, divided by N, minus the key's own length.
//!
//! Rows: the fencing layer's `MarkStore` (filled with `seed`, and filled by
//! requests through the fenced router, which take the same insertion path), the
//! hand-written `HashMap<String, u64>`, and tower_governor's keyed limiter. Each
//! row also shows the resident-set growth per key (`/proc/self/statm`), which
//! adds the allocator's own overhead (glibc rounds every block up to 16 bytes
//! and adds 8).
//!
//! Not a criterion bench: it prints a table (and `--json PATH` writes one). Each
//! row is measured in a fresh child process (this binary with `--child`).

// The counting allocator wraps the system allocator: `GlobalAlloc` is an unsafe
// trait. Nothing else in this file is unsafe.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use fencing_benches::{KEY_LEN, fenced, governor, key, request};
use fencing_layer::MarkStore;
use http::{Method, Request};
use tower::{Service, ServiceExt};

/// Counts live heap bytes (requested sizes) and live blocks.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged;
// the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        counted(unsafe { System.alloc(layout) }, layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        counted(unsafe { System.alloc_zeroed(layout) }, layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

/// Counts a new block of `layout` (unless the allocation failed); returns it.
fn counted(ptr: *mut u8, layout: Layout) -> *mut u8 {
    if !ptr.is_null() {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
    }
    ptr
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Resident set size in bytes, from `/proc/self/statm` (0 where it is missing).
fn rss() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[derive(Debug, serde::Serialize)]
struct Row {
    structure: &'static str,
    keys: usize,
    key_len: usize,
    heap_bytes_per_key: f64,
    heap_bytes_per_key_beyond_key: f64,
    blocks_per_key: f64,
    rss_bytes_per_key: f64,
}

/// Runs `fill(n)` (which builds and returns the structure), measures what it
/// holds, then drops it.
fn measure<T>(structure: &'static str, keys: usize, fill: impl FnOnce(usize) -> T) -> Row {
    let (bytes, blocks, resident) =
        (LIVE_BYTES.load(Ordering::Relaxed), LIVE_BLOCKS.load(Ordering::Relaxed), rss());
    let held = black_box(fill(keys));
    let bytes = LIVE_BYTES.load(Ordering::Relaxed) - bytes;
    let blocks = LIVE_BLOCKS.load(Ordering::Relaxed) - blocks;
    let resident = rss().saturating_sub(resident);
    drop(held);
    let per = |x: usize| x as f64 / keys as f64;
    Row {
        structure,
        keys,
        key_len: KEY_LEN,
        heap_bytes_per_key: per(bytes),
        heap_bytes_per_key_beyond_key: per(bytes) - KEY_LEN as f64,
        blocks_per_key: per(blocks),
        rss_bytes_per_key: per(resident),
    }
}

/// A reused buffer holding [`key`]`(i)`, so building keys leaves nothing behind.
fn with_key(buf: &mut String, i: usize) -> &str {
    use std::fmt::Write;
    buf.clear();
    write!(buf, "/logs/k{i:07}").expect("writing to a String");
    debug_assert_eq!(buf.as_str(), key(i));
    buf
}

fn fencing_seed(n: usize) -> MarkStore {
    let store = MarkStore::builder().max_keys(n).in_memory();
    let mut buf = String::with_capacity(32);
    for i in 0..n {
        store.seed(with_key(&mut buf, i), 1).expect("room for every key");
    }
    store
}

fn fencing_requests(runtime: &tokio::runtime::Runtime, n: usize) -> MarkStore {
    let store = MarkStore::builder().max_keys(n).in_memory();
    let mut router = fenced(store.clone());
    runtime.block_on(async {
        let mut buf = String::with_capacity(32);
        for i in 0..n {
            let req = request(Method::POST, with_key(&mut buf, i), Some("1"));
            let ready = ServiceExt::<Request<Body>>::ready(&mut router).await.expect("infallible");
            let response = ready.call(req).await.expect("infallible");
            assert!(response.status().is_success());
        }
    });
    drop(router);
    assert_eq!(store.len(), n);
    store
}

fn handwritten(n: usize) -> HashMap<String, u64> {
    let mut map = HashMap::new();
    for i in 0..n {
        map.insert(key(i), 1);
    }
    map
}

/// The rows: a structure's name and how to fill it with `n` keys.
const STRUCTURES: [&str; 4] = [
    "fencing MarkStore (seed)",
    "fencing MarkStore (requests)",
    "hand-written HashMap<String, u64>",
    "tower_governor keyed limiter",
];

/// Measures one row in this process and prints it as one JSON line.
fn child(structure: usize, keys: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // Warm the runtime and the router types once, so their one-time allocations
    // are not counted against the row.
    drop(fencing_requests(&runtime, 1));
    let name = STRUCTURES[structure];
    let row = match structure {
        0 => measure(name, keys, fencing_seed),
        1 => measure(name, keys, |n| fencing_requests(&runtime, n)),
        2 => measure(name, keys, handwritten),
        _ => measure(name, keys, governor::seeded),
    };
    println!("{}", serde_json::to_string(&row).expect("a row serializes"));
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut json = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = args.next(),
            // Each row runs in a fresh process, so the resident-set growth is its own.
            "--child" => {
                let structure = args.next().and_then(|a| a.parse().ok()).expect("--child STRUCTURE KEYS");
                let keys = args.next().and_then(|a| a.parse().ok()).expect("--child STRUCTURE KEYS");
                return child(structure, keys);
            }
            _ => {}
        }
    }
    let exe = std::env::current_exe().expect("the bench's own path");
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for keys in [1_000, 1_000_000] {
        for structure in 0..STRUCTURES.len() {
            let output = std::process::Command::new(&exe)
                .args(["--child", &structure.to_string(), &keys.to_string()])
                .output()
                .expect("running a measurement");
            assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            let line = String::from_utf8_lossy(&output.stdout);
            rows.push(serde_json::from_str(line.trim()).expect("a row from the child"));
        }
    }

    println!(
        "{:<36} {:>9} {:>8} {:>12} {:>14} {:>11} {:>10}",
        "structure", "keys", "key_len", "heap B/key", "beyond key B", "blocks/key", "RSS B/key"
    );
    for r in &rows {
        println!(
            "{:<36} {:>9} {:>8} {:>12.1} {:>14.1} {:>11.2} {:>10.1}",
            r["structure"].as_str().unwrap_or("?"),
            r["keys"].as_u64().unwrap_or(0),
            r["key_len"].as_u64().unwrap_or(0),
            r["heap_bytes_per_key"].as_f64().unwrap_or(f64::NAN),
            r["heap_bytes_per_key_beyond_key"].as_f64().unwrap_or(f64::NAN),
            r["blocks_per_key"].as_f64().unwrap_or(f64::NAN),
            r["rss_bytes_per_key"].as_f64().unwrap_or(f64::NAN),
        );
    }
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&rows).expect("rows serialize");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
}
