//! What every replica's handler saw, in one order (one mutex: one clock for
//! all of them), and the handler itself: it can be held inside, made to block
//! its worker thread, or made to stay a few milliseconds so that requests overlap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use fencing_layer::{FencingLayer, FencingToken};
use tokio::sync::Semaphore;

use crate::BOUND;

/// One handler event: `(key, token, entered)`; `entered == false` is its exit.
pub type Event = (u64, u64, bool);

/// Every replica's handler events, in one order; see the module docs.
#[derive(Clone, Default)]
pub struct Probe {
    events: Arc<Mutex<Vec<Event>>>,
    gates: Arc<Mutex<HashMap<u64, Arc<Semaphore>>>>,
    /// Requests with these tokens block their worker thread this long once inside.
    blocks: Arc<Mutex<HashMap<u64, Duration>>>,
    /// Each request stays inside 0–9 ms, so that requests overlap.
    pub jitter: bool,
}

impl Probe {
    /// A probe whose handlers stay inside 0–9 ms each, so that requests overlap.
    pub fn jittery() -> Self {
        Self { jitter: true, ..Self::default() }
    }

    /// Requests with `token` stay inside until [`release`](Self::release)d.
    pub fn hold(&self, token: u64) -> Arc<Semaphore> {
        Arc::clone(self.gates.lock().unwrap().entry(token).or_insert_with(|| Arc::new(Semaphore::new(0))))
    }

    /// Requests with `token` block their worker thread for `how_long` once
    /// inside: a handler that never yields.
    pub fn block(&self, token: u64, how_long: Duration) {
        self.blocks.lock().unwrap().insert(token, how_long);
    }

    /// Requests with `token` held inside leave, and later ones no longer stay.
    pub fn release(&self, token: u64) {
        self.hold(token).close();
    }

    /// Per key, in the probe's one order: no token enters while another is
    /// inside, and admitted tokens never decrease.
    pub fn assert_invariants(&self) {
        let mut state: HashMap<u64, (u64, usize, u64)> = HashMap::new(); // key → (inside token, count, last admitted)
        for (key, token, entered) in self.events() {
            let (inside, count, last) = state.entry(key).or_default();
            if entered {
                assert!(
                    *count == 0 || *inside == token,
                    "key {key}: {token} entered while {inside} was inside"
                );
                assert!(token >= *last, "key {key}: {token} admitted after {last}");
                (*inside, *count, *last) = (token, *count + 1, token);
            } else {
                *count -= 1;
            }
        }
    }

    /// The position of the first `event` in the probe's order (a panic if it never happened).
    pub fn at(&self, event: Event) -> usize {
        let events = self.events();
        events
            .iter()
            .position(|e| *e == event)
            .unwrap_or_else(|| panic!("{event:?} never happened: {events:?}"))
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// How many requests with `token` are inside for `key` now.
    pub fn inside(&self, key: u64, token: u64) -> usize {
        let events = self.events();
        let entered = events.iter().filter(|e| **e == (key, token, true)).count();
        entered - events.iter().filter(|e| **e == (key, token, false)).count()
    }

    /// Waits until `n` requests with `token` are inside for `key` (at most [`BOUND`]).
    pub async fn wait_inside(&self, key: u64, token: u64, n: usize) {
        let waited = tokio::time::timeout(BOUND, async {
            while self.inside(key, token) < n {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        waited.await.unwrap_or_else(|_| panic!("{n} requests with {token} never got inside"));
    }

    /// `POST /r/{key}` behind `layer`, answering "ok" with what this probe says.
    pub fn router(&self, layer: FencingLayer) -> Router {
        let probe = self.clone();
        let handler = move |Path(key): Path<u64>, token: FencingToken| {
            let probe = probe.clone();
            async move { probe.handle(key, token.get()).await }
        };
        Router::new().route("/r/{key}", post(handler)).route_layer(layer)
    }

    async fn handle(self, key: u64, token: u64) -> &'static str {
        self.events.lock().unwrap().push((key, token, true));
        // Recorded on drop too, so a request cut off inside still leaves.
        let _exit = Exit(self.clone(), key, token);
        let block = self.blocks.lock().unwrap().get(&token).copied();
        if let Some(block) = block {
            std::thread::sleep(block);
        }
        let gate = self.gates.lock().unwrap().get(&token).cloned();
        if let Some(gate) = gate {
            let _ = gate.acquire().await;
        }
        if self.jitter {
            let n = self.events.lock().unwrap().len() as u64;
            tokio::time::sleep(Duration::from_millis(n * 7 % 10)).await;
        }
        "ok"
    }
}

/// A handler's exit, recorded when it finishes or is dropped.
struct Exit(Probe, u64, u64);

impl Drop for Exit {
    fn drop(&mut self) {
        self.0.events.lock().unwrap().push((self.1, self.2, false));
    }
}
