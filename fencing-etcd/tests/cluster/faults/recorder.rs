//! One recorder for every replica's handler: each entry and exit appended
//! under one mutex, so all of them are in one order (one clock), and the
//! fencing invariants can be checked on that order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::routing::post;
use fencing_layer::{FencingLayer, FencingToken};
use tokio::sync::Semaphore;

use super::BOUND;

/// One handler's entry or exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) replica: usize,
    pub(crate) key: u64,
    pub(crate) token: u64,
    pub(crate) entered: bool,
    /// The request's `x-request` header: which client request it was.
    pub(crate) request: u64,
}

/// Every handler's entries and exits in one order; requests with a held
/// token stay inside until released, the others 0–4 ms.
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
    gates: Arc<Mutex<HashMap<u64, Arc<Semaphore>>>>,
}

impl Recorder {
    /// Requests with `token` stay inside until stopped (their claim lost, their client gone).
    pub(crate) fn hold(&self, token: u64) {
        self.gates.lock().unwrap().entry(token).or_insert_with(|| Arc::new(Semaphore::new(0)));
    }

    /// Lets every request held with `token` leave, now and from now on.
    pub(crate) fn let_go(&self, token: u64) {
        if let Some(gate) = self.gates.lock().unwrap().remove(&token) {
            gate.add_permits(Semaphore::MAX_PERMITS / 2);
        }
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.events.lock().unwrap()
    }

    /// Per key, in the recorder's one order: no token enters while another
    /// is inside, and admitted tokens never decrease (no stale token after a
    /// higher one). The number of admissions checked.
    pub(crate) fn assert_invariants(&self) -> usize {
        let mut keys: HashMap<u64, (u64, usize, u64)> = HashMap::new(); // key → (inside, count, last admitted)
        let events = self.events();
        for event in &events {
            let (inside, count, last) = keys.entry(event.key).or_default();
            if event.entered {
                assert!(*count == 0 || *inside == event.token, "{event:?} entered while {inside} was inside");
                assert!(event.token >= *last, "{event:?} admitted after token {last}");
                (*inside, *count, *last) = (event.token, *count + 1, event.token);
            } else {
                *count -= 1;
            }
        }
        events.iter().filter(|event| event.entered).count()
    }

    /// The position of the first event matching `what`.
    pub(crate) fn position(&self, what: impl Fn(&Event) -> bool) -> Option<usize> {
        self.lock().iter().position(what)
    }

    /// Waits until a request with `token` on `key` is inside.
    pub(crate) async fn wait_inside(&self, key: u64, token: u64) {
        let inside = || {
            let events = self.lock();
            let count = |entered| {
                events.iter().filter(|e| (e.key, e.token, e.entered) == (key, token, entered)).count()
            };
            count(true) > count(false)
        };
        let waited = tokio::time::timeout(BOUND, async {
            while !inside() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        waited.await.unwrap_or_else(|_| panic!("no request with {token} got inside"));
    }

    /// `POST /r/{key}` behind `layer`, recorded as replica `replica`.
    pub(crate) fn router(&self, replica: usize, layer: FencingLayer) -> Router {
        let recorder = self.clone();
        let handler = move |Path(key): Path<u64>, token: FencingToken, headers: HeaderMap| {
            let recorder = recorder.clone();
            let request = headers.get("x-request").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
            async move {
                let event = Event { replica, key, token: token.get(), entered: true, request };
                let n = {
                    let mut events = recorder.lock();
                    events.push(event);
                    events.len() as u64
                };
                // Recorded on drop too, so that a request stopped inside still leaves.
                let _exit = Exit(recorder.clone(), event);
                let gate = recorder.gates.lock().unwrap().get(&token.get()).cloned();
                match gate {
                    Some(gate) => drop(gate.acquire().await),
                    None => tokio::time::sleep(Duration::from_millis(n * 7 % 5)).await,
                }
                "ok"
            }
        };
        Router::new().route("/r/{key}", post(handler)).route_layer(layer)
    }
}

struct Exit(Recorder, Event);

impl Drop for Exit {
    fn drop(&mut self) {
        self.0.lock().push(Event { entered: false, ..self.1 });
    }
}
