//! Replicas: `EtcdSharedStore`s behind `FencingLayer`, each a real axum
//! server on 127.0.0.1, connected to the etcd endpoints a test chooses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fencing_etcd::{ClaimTiming, EtcdSharedStore, connect_options, member_clients};
use fencing_layer::FencingLayer;
use tokio::net::TcpListener;
use tokio::time::{Instant, timeout};

use super::BOUND;
use super::recorder::Recorder;

/// Claims of a 2 s term: valid 1.8 s after a renewal is sent, renewed every 400 ms.
pub(crate) fn timing() -> ClaimTiming {
    ClaimTiming::for_term(Duration::from_secs(2))
}

/// A store on `endpoints` (one client each) with `timing`, marks under `prefix`.
pub(crate) async fn store(endpoints: &[String], prefix: &str, timing: ClaimTiming) -> EtcdSharedStore {
    let clients = member_clients(endpoints, connect_options()).await.unwrap();
    EtcdSharedStore::with_members(clients, prefix, timing).unwrap()
}

/// Every request's `x-request` id, unique in the test binary.
static REQUESTS: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Replica {
    pub(crate) index: usize,
    /// The replica's store (a clone of the one behind its layer).
    pub(crate) store: EtcdSharedStore,
    pub(crate) url: String,
    http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

/// One request's answer, as the client saw it.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) request: u64,
    pub(crate) replica: usize,
    pub(crate) key: u64,
    pub(crate) token: u64,
    pub(crate) status: u16,
    pub(crate) body: String,
    pub(crate) started: Instant,
    pub(crate) took: Duration,
}

impl Replica {
    /// Replica `index` on `endpoints`, marks under `prefix`, raises waiting at most `drain`.
    pub(crate) async fn start(
        recorder: &Recorder,
        index: usize,
        endpoints: &[String],
        prefix: &str,
        drain: Duration,
    ) -> Self {
        Self::serve(recorder, index, store(endpoints, prefix, timing()).await, drain).await
    }

    /// Replica `index` serving `store` behind the layer, raises waiting at most `drain`.
    pub(crate) async fn serve(
        recorder: &Recorder,
        index: usize,
        store: EtcdSharedStore,
        drain: Duration,
    ) -> Self {
        timeout(BOUND, store.ready()).await.expect("ready in time").unwrap();
        let layer = FencingLayer::new().drain_timeout(drain).shared_store(store.clone());
        let router = recorder.router(index, layer);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let http = reqwest::Client::builder().timeout(BOUND).build().unwrap();
        Self { index, store, url, http, server }
    }

    /// `POST /r/{key}` with `token`; a request that gets no answer is status 0.
    pub(crate) async fn post(&self, key: u64, token: u64) -> Answer {
        let request = REQUESTS.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let sent = self
            .http
            .post(format!("{}/r/{key}", self.url))
            .header("fencing-token", token)
            .header("x-request", request)
            .send()
            .await;
        let (status, body) = match sent {
            Ok(response) => (response.status().as_u16(), response.text().await.unwrap_or_default()),
            Err(error) => (0, error.to_string()),
        };
        Answer { request, replica: self.index, key, token, status, body, started, took: started.elapsed() }
    }

    /// Posts until the answer is 200 (every 100 ms, at most `within`); how long that took.
    pub(crate) async fn until_admitted(&self, key: u64, token: u64, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let answer = self.post(key, token).await;
            if answer.status == 200 {
                return started.elapsed();
            }
            assert!(started.elapsed() < within, "replica {} never admitted {token}: {answer:?}", self.index);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.server.abort();
    }
}
