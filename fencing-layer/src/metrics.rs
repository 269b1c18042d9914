//! What the layer reports through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`):
//! fenced requests by outcome, raises, drain and durable-record waits, requests
//! inside, tracked keys. Without the feature every type here is zero-sized and
//! every method an empty inline function, so the hot path is the same code.
//!
//! The handles are built once per layer, when it first wraps a service (so
//! every series exists at zero before the first request), with the recorder in
//! effect then; a request only increments them: no labels are built or
//! allocated per request. No label names a resource key (an unbounded
//! number of series); the optional `layer` label names the layer.

#[cfg(feature = "metrics")]
pub(crate) use enabled::{InsideCount, Metrics, Stopwatch};

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::{InsideCount, Metrics, Stopwatch};

/// Metric names, for the docs and the recorders that look them up.
#[cfg(feature = "metrics")]
mod names {
    pub(super) const REQUESTS: &str = "fencing_requests_total";
    pub(super) const RAISES: &str = "fencing_raises_total";
    pub(super) const DRAIN_WAIT: &str = "fencing_drain_wait_seconds";
    pub(super) const DURABLE_RECORD: &str = "fencing_durable_record_seconds";
    pub(super) const INSIDE: &str = "fencing_requests_inside";
    pub(super) const TRACKED_KEYS: &str = "fencing_tracked_keys";
}

#[cfg(feature = "metrics")]
mod enabled {
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use metrics::{Counter, Gauge, Histogram, Label, Unit};
    use tokio::time::Instant;

    use super::names::*;
    use crate::rejection::Rejection;
    use crate::store::MarkStore;

    /// The refusals' outcome labels come from [`Rejection::KINDS`], one counter
    /// handle per variant (variants sharing a label share its series).
    const REJECTIONS: usize = Rejection::KINDS.len();

    /// The layer's metrics: its optional label and, from the first service it
    /// wraps on (or its first request, whichever comes first), its handles.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Metrics {
        label: Option<Arc<str>>,
        handles: OnceLock<Handles>,
    }

    #[derive(Debug, Clone)]
    struct Handles {
        admitted: Counter,
        unfenced: Counter,
        /// By [`Rejection::index`].
        rejected: [Counter; REJECTIONS],
        raises: Counter,
        drain_wait: Histogram,
        durable_record: Histogram,
        inside: Gauge,
        tracked_keys: Gauge,
    }

    impl Handles {
        fn new(label: Option<&str>) -> Self {
            describe();
            let layer: Vec<Label> = label.map(|l| Label::new("layer", l.to_owned())).into_iter().collect();
            let requests = |outcome: &'static str| {
                let mut labels = vec![Label::new("outcome", outcome)];
                labels.extend(layer.iter().cloned());
                metrics::counter!(REQUESTS, labels)
            };
            Self {
                admitted: requests("admitted"),
                unfenced: requests("unfenced"),
                rejected: std::array::from_fn(|index| requests(Rejection::KINDS[index].outcome)),
                raises: metrics::counter!(RAISES, layer.clone()),
                drain_wait: metrics::histogram!(DRAIN_WAIT, layer.clone()),
                durable_record: metrics::histogram!(DURABLE_RECORD, layer.clone()),
                inside: metrics::gauge!(INSIDE, layer.clone()),
                tracked_keys: metrics::gauge!(TRACKED_KEYS, layer),
            }
        }
    }

    /// Descriptions and units, for exporters that show them (`# HELP` in Prometheus).
    fn describe() {
        metrics::describe_counter!(
            REQUESTS,
            Unit::Count,
            "Fenced requests by outcome: admitted, or why the fencing layer refused them"
        );
        metrics::describe_counter!(RAISES, Unit::Count, "Times a higher fencing token raised a key's mark");
        metrics::describe_histogram!(
            DRAIN_WAIT,
            Unit::Seconds,
            "How long higher-token requests waited for lower-token ones to leave the service"
        );
        metrics::describe_histogram!(
            DURABLE_RECORD,
            Unit::Seconds,
            "How long the durable store took to record a raise"
        );
        metrics::describe_gauge!(INSIDE, Unit::Count, "Fenced requests inside the inner service now");
        metrics::describe_gauge!(TRACKED_KEYS, Unit::Count, "Resource keys in the layer's mark store");
    }

    impl Metrics {
        pub(crate) fn new() -> Self {
            Self::default()
        }

        pub(crate) fn set_label(&mut self, label: Arc<str>) {
            self.label = Some(label);
            self.handles = OnceLock::new();
        }

        fn handles(&self) -> &Handles {
            self.handles.get_or_init(|| Handles::new(self.label.as_deref()))
        }

        /// Makes every series exist, at zero, with the recorder in effect now
        /// (once per layer; later calls do nothing but refresh the key count):
        /// so that a rate or an increase sees the first event after a start.
        /// Called when the layer wraps a service, never per request.
        pub(crate) fn register(&self, store: &MarkStore) {
            let handles = self.handles();
            // Keys a durable store loaded are tracked before any raise.
            handles.tracked_keys.set(store.len() as f64);
        }

        /// A fenced request is let into the inner service; it counts as inside until `InsideCount` drops.
        #[inline]
        pub(crate) fn admitted(&self) -> InsideCount {
            let handles = self.handles();
            handles.admitted.increment(1);
            handles.inside.increment(1.0);
            InsideCount(handles.inside.clone())
        }

        /// A fenced request without a token passes through (`allow_unfenced`).
        #[inline]
        pub(crate) fn unfenced(&self) {
            self.handles().unfenced.increment(1);
        }

        /// The layer refused a request.
        pub(crate) fn rejected(&self, rejection: &Rejection) {
            self.handles().rejected[rejection.index()].increment(1);
        }

        /// A token raised a key's mark in `store`.
        pub(crate) fn raised(&self, store: &MarkStore) {
            let handles = self.handles();
            handles.raises.increment(1);
            // A raise is the only way a key enters the table (keys enter at mark 0).
            handles.tracked_keys.set(store.len() as f64);
        }

        /// A drain wait that `stopwatch` timed ended (admitted, overtaken or timed out).
        pub(crate) fn drain_waited(&self, stopwatch: &mut Stopwatch) {
            if let Some(elapsed) = stopwatch.stop() {
                self.handles().drain_wait.record(elapsed);
            }
        }

        /// A shared store admitted a request after a raise, or after waiting for lower tokens.
        pub(crate) fn shared_admission(&self, raised: bool, drained: Option<Duration>) {
            let handles = self.handles();
            if raised {
                handles.raises.increment(1);
            }
            if let Some(drained) = drained {
                handles.drain_wait.record(drained);
            }
        }

        /// A shared store's raise waited the whole drain bound for lower tokens, in vain.
        pub(crate) fn shared_drain_timed_out(&self, waited: Duration) {
            self.handles().drain_wait.record(waited);
        }

        /// A durable write that `stopwatch` timed ended.
        pub(crate) fn recorded(&self, stopwatch: &mut Stopwatch) {
            if let Some(elapsed) = stopwatch.stop() {
                self.handles().durable_record.record(elapsed);
            }
        }
    }

    /// Counts a request as inside the inner service until dropped.
    #[derive(Debug)]
    pub(crate) struct InsideCount(Gauge);

    impl Drop for InsideCount {
        fn drop(&mut self) {
            self.0.decrement(1.0);
        }
    }

    /// Times one wait, from `start` to `stop`.
    #[derive(Debug)]
    pub(crate) struct Stopwatch(Option<Instant>);

    impl Stopwatch {
        pub(crate) fn new() -> Self {
            Self(None)
        }

        /// Starts timing, unless it already is.
        pub(crate) fn start(&mut self) {
            self.0.get_or_insert_with(Instant::now);
        }

        fn stop(&mut self) -> Option<Duration> {
            self.0.take().map(|since| since.elapsed())
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod disabled {
    use crate::rejection::Rejection;
    use crate::store::MarkStore;

    /// Nothing: the `metrics` feature is off.
    #[derive(Debug, Clone)]
    pub(crate) struct Metrics;

    impl Metrics {
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn admitted(&self) -> InsideCount {
            InsideCount
        }
        #[inline(always)]
        pub(crate) fn register(&self, _: &MarkStore) {}
        #[inline(always)]
        pub(crate) fn unfenced(&self) {}
        #[inline(always)]
        pub(crate) fn rejected(&self, _: &Rejection) {}
        #[inline(always)]
        pub(crate) fn raised(&self, _: &MarkStore) {}
        #[inline(always)]
        pub(crate) fn drain_waited(&self, _: &mut Stopwatch) {}
        #[inline(always)]
        pub(crate) fn recorded(&self, _: &mut Stopwatch) {}
        #[inline(always)]
        pub(crate) fn shared_admission(&self, _: bool, _: Option<std::time::Duration>) {}
        #[inline(always)]
        pub(crate) fn shared_drain_timed_out(&self, _: std::time::Duration) {}
    }

    /// Nothing: the `metrics` feature is off.
    #[derive(Debug)]
    pub(crate) struct InsideCount;

    /// Nothing: the `metrics` feature is off.
    #[derive(Debug)]
    pub(crate) struct Stopwatch;

    impl Stopwatch {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn start(&mut self) {}
    }
}
