//! Replicas for the tests: real axum servers on 127.0.0.1, each with its own
//! layer, pool and `PgSharedStore`, and one `Probe` recording what every
//! handler saw, in one order (one mutex: one clock for all of them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use fencing_layer::claims::ClaimTiming;
use fencing_layer::{FencingLayer, FencingToken};
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_postgres::Config;

use super::BOUND;

/// What every replica's handler saw, in one order: `(key, token, entered)`.
#[derive(Clone, Default)]
pub struct Probe {
    events: Arc<Mutex<Vec<(u64, u64, bool)>>>,
    gates: Arc<Mutex<HashMap<u64, Arc<Semaphore>>>>,
    /// Requests with these tokens block their worker thread this long once inside.
    blocks: Arc<Mutex<HashMap<u64, Duration>>>,
    /// Each request stays inside 0–4 ms, so that requests overlap.
    pub jitter: bool,
}

impl Probe {
    /// A probe whose handlers stay inside 0–9 ms each, so that requests overlap.
    pub fn jittery() -> Self {
        Self { jitter: true, ..Self::default() }
    }

    /// Requests with `token` stay inside until released.
    pub fn hold(&self, token: u64) -> Arc<Semaphore> {
        Arc::clone(self.gates.lock().unwrap().entry(token).or_insert_with(|| Arc::new(Semaphore::new(0))))
    }

    /// Requests with `token` block their worker thread for `how_long` once
    /// inside: a handler that never yields.
    pub fn block(&self, token: u64, how_long: Duration) {
        self.blocks.lock().unwrap().insert(token, how_long);
    }

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

    /// The position of `event` in the probe's order.
    pub fn at(&self, event: (u64, u64, bool)) -> usize {
        let events = self.events();
        events
            .iter()
            .position(|e| *e == event)
            .unwrap_or_else(|| panic!("{event:?} never happened: {events:?}"))
    }

    pub fn events(&self) -> Vec<(u64, u64, bool)> {
        self.events.lock().unwrap().clone()
    }

    pub fn inside(&self, key: u64, token: u64) -> usize {
        let events = self.events();
        let entered = events.iter().filter(|e| **e == (key, token, true)).count();
        entered - events.iter().filter(|e| **e == (key, token, false)).count()
    }

    pub async fn wait_inside(&self, key: u64, token: u64, n: usize) {
        let waited = tokio::time::timeout(BOUND, async {
            while self.inside(key, token) < n {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        waited.await.unwrap_or_else(|_| panic!("{n} requests with {token} never got inside"));
    }

    pub fn router(&self, layer: FencingLayer) -> Router {
        let probe = self.clone();
        let handler = move |Path(key): Path<u64>, token: FencingToken| {
            let probe = probe.clone();
            async move {
                probe.events.lock().unwrap().push((key, token.get(), true));
                // Recorded on drop too, so a request cut off inside still leaves.
                let _exit = Exit(probe.clone(), key, token.get());
                let block = probe.blocks.lock().unwrap().get(&token.get()).copied();
                if let Some(block) = block {
                    std::thread::sleep(block);
                }
                let gate = probe.gates.lock().unwrap().get(&token.get()).cloned();
                if let Some(gate) = gate {
                    let _ = gate.acquire().await;
                }
                if probe.jitter {
                    let n = probe.events.lock().unwrap().len() as u64;
                    tokio::time::sleep(Duration::from_millis(n * 7 % 10)).await;
                }
                "ok"
            }
        };
        Router::new().route("/r/{key}", post(handler)).route_layer(layer)
    }
}

pub struct Exit(Probe, u64, u64);

impl Drop for Exit {
    fn drop(&mut self) {
        self.0.events.lock().unwrap().push((self.1, self.2, false));
    }
}

/// One replica: a real server on 127.0.0.1 with its own layer and pool.
pub struct Replica {
    pub url: String,
    pub server: tokio::task::JoinHandle<()>,
    pub store: Option<PgSharedStore>,
    /// A replica on a runtime of its own: that runtime stops when this drops.
    pub stop: Option<std::sync::mpsc::Sender<()>>,
}

/// How a replica is built beyond its probe and layer.
pub struct Setup {
    /// The pool's database.
    pub pool: Config,
    /// The background session's database (the pool's, unless a test routes it elsewhere).
    pub session: Config,
    pub limits: PoolLimits,
    pub timing: ClaimTiming,
    /// Serve on a runtime of its own with one worker thread (which a handler can block).
    pub one_worker: bool,
}

impl Setup {
    pub fn new(config: Config, timing: ClaimTiming) -> Self {
        Self {
            pool: config.clone(),
            session: config,
            limits: PoolLimits::default(),
            timing,
            one_worker: false,
        }
    }
}

impl Replica {
    /// A replica on the database `config` names, with the default claim timing.
    pub async fn start(probe: &Probe, config: Config, layer: FencingLayer, limits: PoolLimits) -> Self {
        Self::with_timing(probe, config, layer, limits, ClaimTiming::default()).await
    }

    /// A replica on the database `config` names.
    pub async fn with_timing(
        probe: &Probe,
        config: Config,
        layer: FencingLayer,
        limits: PoolLimits,
        timing: ClaimTiming,
    ) -> Self {
        Self::build(probe, layer, Setup { limits, ..Setup::new(config, timing) }).await
    }

    /// A replica as `setup` says, its session open before it serves.
    pub async fn build(probe: &Probe, layer: FencingLayer, setup: Setup) -> Self {
        let pool = fencing_postgres::pool(setup.pool, setup.limits).unwrap();
        let store = PgSharedStore::with_timing(pool, setup.session, PgFence::new(), setup.timing).unwrap();
        store.migrate().await.unwrap();
        store.ready().await.unwrap();
        let router = probe.router(layer.shared_store(store.clone()));
        if !setup.one_worker {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
            return Self { url, server, store: Some(store), stop: None };
        }
        let (started, ready) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let server = runtime.block_on(async {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let url = format!("http://{}", listener.local_addr().unwrap());
                (url, tokio::spawn(async move { axum::serve(listener, router).await.unwrap() }))
            });
            started.send(server).unwrap();
            // The runtime serves while this thread drives it, until the replica is dropped.
            runtime.block_on(async {
                while stopped.try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        });
        let (url, server) = ready.recv().unwrap();
        Self { url, server, store: Some(store), stop: Some(stop) }
    }

    /// Waits until this replica has heard that `key`'s mark is at least `mark`.
    pub async fn hears(&self, key: u64, mark: u64) {
        let store = self.store.as_ref().expect("a replica with a store");
        let heard = async {
            while store.claims().known_mark(&format!("/r/{key}")) < Some(mark) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(BOUND, heard).await.unwrap_or_else(|_| panic!("never heard of mark {mark}"));
    }

    pub async fn post(&self, key: u64, token: u64) -> (u16, serde_json::Value) {
        let client = reqwest::Client::new();
        let request = client.post(format!("{}/r/{key}", self.url)).header("fencing-token", token).send();
        let response = tokio::time::timeout(BOUND, request).await.expect("the request hung").unwrap();
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap();
        (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
    }

    pub fn spawn_post(
        self: &Arc<Self>,
        key: u64,
        token: u64,
    ) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
        let replica = Arc::clone(self);
        tokio::spawn(async move { replica.post(key, token).await })
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.server.abort();
    }
}
