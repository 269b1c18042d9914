//! fencing-layer's integration tests, one binary (one link) for all of them:
//! the HTTP contract, invariants 1–3 and 6 under real tasks, the durable and
//! shared stores' side of the layer, authenticity, keys, placement in axum, any
//! body, gRPC, the docs' integration examples, and the metrics.
//!
//! Sharing the binary is safe: nothing here sets the environment or installs a
//! global recorder (the metrics tests record per thread, `with_local_recorder`).
//! The one process-wide setting, `durable_liveness`'s panic hook, only hides
//! that file's deliberate panics (messages with "(on purpose)") and passes every
//! other panic to the default hook. `tests/gate_stress.rs` stays a binary of its
//! own: its timing-sensitive runs must not share the 2 cores with other tests.

mod common;

mod any_body;
mod authenticity;
mod axum_extract;
mod claim_stops;

mod contract;
mod durable;
mod durable_liveness;
mod grpc;
mod hand_over;
mod integrating;
mod keys;
#[cfg(feature = "metrics")]
mod metrics;
mod namespace;
mod overlap;
mod placement;
mod randomized;
mod shared_store;
