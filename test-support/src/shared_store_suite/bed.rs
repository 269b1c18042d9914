//! What every scenario starts from: the engine, one probe, and replicas built
//! on them, straight to the engine or through a proxy of their own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencing_layer::FencingLayer;
use fencing_layer::claims::ClaimTiming;
use tokio::task::JoinHandle;

use super::Engine;
use crate::StallProxy;
use crate::replicas::{Probe, Replica, Workers};

/// A replica of the engine's store.
pub(super) type Of<E> = Arc<Replica<<E as Engine>::Store>>;

/// A request's outcome: status and problem+json body.
pub(super) type Answer = JoinHandle<(u16, serde_json::Value)>;

/// The engine and one probe shared by the scenario's replicas.
pub(super) struct Bed<E> {
    pub(super) engine: E,
    pub(super) probe: Probe,
    built: AtomicUsize,
}

/// How one replica is built beyond its engine.
pub(super) struct Spec {
    /// Where its store reaches the engine (the engine itself unless a proxy's).
    pub(super) via: Option<SocketAddr>,
    pub(super) drain: Duration,
    pub(super) timing: ClaimTiming,
    pub(super) workers: Workers,
}

impl<E: Engine> Bed<E> {
    /// The engine started (`None` after SKIPPED), with `probe`.
    pub(super) async fn start(probe: Probe) -> Option<Self> {
        Some(Self { engine: E::start().await?, probe, built: AtomicUsize::new(0) })
    }

    /// The suite's usual replica: straight to the engine, the engine's timing, the test's runtime.
    pub(super) fn spec(&self, drain: Duration) -> Spec {
        Spec { via: None, drain, timing: E::timing(), workers: Workers::Shared }
    }

    /// `n` usual replicas draining for at most `drain`.
    pub(super) async fn replicas(&self, n: usize, drain: Duration) -> Vec<Of<E>> {
        let mut all = Vec::new();
        for _ in 0..n {
            all.push(self.replica(self.spec(drain)).await);
        }
        all
    }

    /// A replica as `spec` says.
    pub(super) async fn replica(&self, spec: Spec) -> Of<E> {
        Arc::new(self.replica_named(spec).await.1)
    }

    /// A replica as `spec` says, and its name in the engine.
    pub(super) async fn replica_named(&self, spec: Spec) -> (String, Replica<E::Store>) {
        let name = format!("replica-{}", self.built.fetch_add(1, Ordering::Relaxed));
        let store =
            self.engine.store(spec.via.unwrap_or_else(|| self.engine.addr()), &name, spec.timing).await;
        let layer = FencingLayer::new().drain_timeout(spec.drain);
        (name.clone(), Replica::serve(&self.probe, layer, store, E::claims, spec.workers).await)
    }

    /// A proxy in front of the engine, for one replica's route.
    pub(super) async fn proxy(&self) -> StallProxy {
        StallProxy::start(self.engine.addr()).await
    }

    /// A request with `token` on `key`, sent to `replica` and held inside its handler.
    pub(super) async fn held_inside(&self, replica: &Of<E>, key: u64, token: u64) -> Answer {
        self.probe.hold(token);
        let request = replica.spawn_post(key, token);
        self.probe.wait_inside(key, token, 1).await;
        request
    }

    /// Asserts that the last exit of `low` on `key` came before the first entry of `high`.
    pub(super) fn assert_left_before(&self, key: u64, low: u64, high: u64) {
        let events = self.probe.events();
        let entered = self.probe.at((key, high, true));
        let left = events.iter().rposition(|e| *e == (key, low, false));
        assert!(left.is_some_and(|left| left < entered), "{high} entered while {low} was inside: {events:?}");
    }
}
