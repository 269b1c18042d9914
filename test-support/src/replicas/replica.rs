//! One replica: a real axum server on 127.0.0.1 serving a [`Probe`]'s handler
//! behind its own layer and store, and the client calls the tests make to it.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use axum::Router;
use fencing_layer::FencingLayer;
use fencing_layer::claims::ClaimStore;
use fencing_layer::store::SharedStore;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::{Probe, key};
use crate::BOUND;

/// Where a replica's application runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// On the test's runtime.
    Shared,
    /// On a runtime of its own with one worker thread: a handler can block it,
    /// and [`Replica::kill`] stops it with every task on it.
    OwnThread,
}

/// A replica of the fenced resource; see the module docs. Dropping it stops
/// its server (and its runtime, for [`Workers::OwnThread`]).
pub struct Replica<S> {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The replica's store (`None`: killed, or a replica whose layer came with its store).
    pub store: Option<S>,
    claims: Option<ClaimStore>,
    serving: Serving,
}

enum Serving {
    Shared(JoinHandle<()>),
    /// Told to stop, the thread drops the runtime: every task on it, requests inside included.
    OwnThread {
        stop: mpsc::Sender<()>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
}

impl<S: SharedStore + Clone> Replica<S> {
    /// Serves `probe`'s handler behind `layer` with `store`; `claims` reaches
    /// the store's [`ClaimStore`] (for [`hears`](Self::hears)).
    pub async fn serve(
        probe: &Probe,
        layer: FencingLayer,
        store: S,
        claims: fn(&S) -> &ClaimStore,
        workers: Workers,
    ) -> Self {
        let claimed = claims(&store).clone();
        let mut replica = Self::with_layer(probe, layer.shared_store(store.clone()), workers).await;
        (replica.store, replica.claims) = (Some(store), Some(claimed));
        replica
    }
}

impl<S> Replica<S> {
    /// Serves `probe`'s handler behind `layer`, which carries its store already.
    pub async fn with_layer(probe: &Probe, layer: FencingLayer, workers: Workers) -> Self {
        let router = probe.router(layer);
        let (url, serving) = match workers {
            Workers::Shared => {
                let (url, server) = listen(router).await;
                (url, Serving::Shared(server))
            }
            Workers::OwnThread => on_own_thread(router),
        };
        Self { url, store: None, claims: None, serving }
    }

    /// The replica's claims (a panic for a replica built [`with_layer`](Self::with_layer)).
    pub fn claims(&self) -> &ClaimStore {
        self.claims.as_ref().expect("a replica with a store")
    }

    /// Waits until this replica has heard that `key`'s mark is at least `mark`.
    pub async fn hears(&self, key_n: u64, mark: u64) {
        let claims = self.claims();
        let heard = async {
            while claims.known_mark(&key(key_n)) < Some(mark) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(BOUND, heard).await.unwrap_or_else(|_| panic!("never heard of mark {mark}"));
    }

    /// `POST /r/{key}` with `token`: the status and the body as JSON (`Null` if it is not).
    pub async fn post(&self, key: u64, token: u64) -> (u16, serde_json::Value) {
        let answered = self.post_within(key, token, BOUND).await;
        answered.unwrap_or_else(|| panic!("the request with {token} hung"))
    }

    /// As [`post`](Self::post), from a client that gives up after `patience`:
    /// `None` if it did (the server sees its client leave).
    pub async fn post_within(
        &self,
        key: u64,
        token: u64,
        patience: Duration,
    ) -> Option<(u16, serde_json::Value)> {
        let client = reqwest::Client::builder().timeout(patience).build().unwrap();
        let request = client.post(format!("{}/r/{key}", self.url)).header("fencing-token", token);
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_timeout() => return None,
            Err(e) => panic!("the request with {token} failed: {e}"),
        };
        let status = response.status().as_u16();
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(e) if e.is_timeout() => return None,
            Err(e) => panic!("the answer to {token} failed: {e}"),
        };
        Some((status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)))
    }

    /// Stops the replica as a crash would: its runtime and every task on it
    /// (requests inside, releases on their way) end, and its store is dropped,
    /// releasing nothing more. Only for [`Workers::OwnThread`]: on the shared
    /// runtime a server's connections outlive it.
    pub fn kill(&mut self) {
        let Serving::OwnThread { stop, thread } = &mut self.serving else {
            panic!("only a replica on a runtime of its own can be killed");
        };
        let _ = stop.send(());
        thread.take().expect("killed once").join().expect("the replica's thread panicked");
        (self.store, self.claims) = (None, None);
    }
}

impl<S: Send + Sync + 'static> Replica<S> {
    /// [`post`](Self::post) on a task of its own.
    pub fn spawn_post(self: &Arc<Self>, key: u64, token: u64) -> JoinHandle<(u16, serde_json::Value)> {
        let replica = Arc::clone(self);
        tokio::spawn(async move { replica.post(key, token).await })
    }
}

impl<S> Drop for Replica<S> {
    fn drop(&mut self) {
        match &self.serving {
            Serving::Shared(server) => server.abort(),
            Serving::OwnThread { stop, .. } => {
                let _ = stop.send(());
            }
        }
    }
}

async fn listen(router: Router) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (url, tokio::spawn(async move { axum::serve(listener, router).await.unwrap() }))
}

/// Serves `router` on a current-thread runtime driven by a thread of its own,
/// until told to stop.
fn on_own_thread(router: Router) -> (String, Serving) {
    let (started, ready) = mpsc::channel();
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (url, _server) = runtime.block_on(listen(router));
        started.send(url).unwrap();
        // The runtime serves while this thread drives it; dropping it ends every task.
        runtime.block_on(async {
            while stopped.try_recv() == Err(mpsc::TryRecvError::Empty) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    });
    let url = ready.recv().unwrap();
    (url, Serving::OwnThread { stop, thread: Some(thread) })
}
