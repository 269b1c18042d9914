//! What the handlers share: the data, the marks (for `GET /readyz`), and the
//! bookkeeping of writes in flight ([`Resource::in_flight`](crate::Resource::in_flight),
//! [`Resource::finish_delays`](crate::Resource::finish_delays)).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fencing_layer::MarkStore;
use tokio::sync::watch;

use crate::backend::Backend;

/// What the handlers share.
#[derive(Debug, Clone)]
pub(crate) struct App {
    pub(crate) data: Backend,
    /// The layer's marks, for `GET /readyz`.
    pub(crate) marks: Option<MarkStore>,
    /// Resource path → how many writes are inside their handler.
    pub(crate) in_flight: Arc<watch::Sender<BTreeMap<String, usize>>>,
    /// Bumped by [`Resource::finish_delays`](crate::Resource::finish_delays): every `delay_ms` wait then ends.
    pub(crate) delays: Arc<watch::Sender<u64>>,
}

impl App {
    /// Counts a write to `resource` as inside its handler until the guard drops.
    pub(crate) fn enter(&self, resource: &str) -> InFlight {
        // Subscribe first: a `finish_delays` seen by anyone counting this write reaches it.
        let delays = self.delays.subscribe();
        self.in_flight.send_modify(|map| *map.entry(resource.to_owned()).or_default() += 1);
        InFlight { resource: resource.to_owned(), in_flight: Arc::clone(&self.in_flight), delays }
    }
}

/// A write inside its handler (admitted, not yet answered).
pub(crate) struct InFlight {
    resource: String,
    in_flight: Arc<watch::Sender<BTreeMap<String, usize>>>,
    delays: watch::Receiver<u64>,
}

impl InFlight {
    /// Waits `delay`, or less if [`Resource::finish_delays`](crate::Resource::finish_delays) is called meanwhile.
    pub(crate) async fn delay(&mut self, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = self.delays.changed() => {}
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.in_flight.send_modify(|map| {
            if let Some(n) = map.get_mut(&self.resource) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&self.resource);
                }
            }
        });
    }
}
