//! scenarios: the stories told against the fenced storage service (demo-resource), run end to end:
//! the seed's lease scenario, the billing job with its payment stand-in, their timelines, and the simulations.
//! It is not a service to deploy or a library to build on: the service is `demo-resource`, the layer `fencing-layer`.
//!
//! * [`scenario`]: the seed's scenario: client A, paused past its lease, writes after B; without
//!   fencing, with it, and with A's write still inside the handler (`cargo run -p scenarios`). The
//!   tokens come from the demo lock service, or etcd, PostgreSQL, Redis or ZooKeeper (features).
//! * `billing` (feature `billing`): the seed's second failure: a billing job on a Redis lock
//!   charging customers twice through [`payments`], a payment-provider stand-in that deduplicates
//!   by `Idempotency-Key` and cannot check tokens; then the fixes, a per-run record fenced with
//!   the token and idempotency keys (`cargo run -p scenarios --features billing -- billing`,
//!   docs/billing.md).
//! * [`timeline`]: draws a run's history on one time axis, as SVG (`--timeline FILE.svg`).
//! * The simulations are this crate's tests: the seeded fault simulation of the whole system
//!   (tests/it/simulation.rs) and the replica simulation on PostgreSQL
//!   (tests/it/replica_simulation.rs, with `claims-sim-mutants.sh`).

#[cfg(feature = "billing")]
pub mod billing;
mod failure;
pub mod payments;
pub mod scenario;
pub mod timeline;

pub use failure::Failure;

/// docs/*.md, whose Rust code blocks are this crate's doctests (`cargo test -p scenarios
/// --all-features --doc`): each compiles, and those not marked `no_run` run. With feature `full`
/// this crate depends on every crate of the workspace, and its dev-dependencies add what the pages
/// use beyond them. The pages' other blocks say their language (`console`, `text`, `toml`...), so
/// rustdoc leaves them.
#[cfg(all(doctest, feature = "full"))]
mod docs {
    #[doc = include_str!("../../docs/authenticity.md")]
    struct Authenticity;
    #[doc = include_str!("../../docs/billing.md")]
    struct Billing;
    #[doc = include_str!("../../docs/etcd.md")]
    struct Etcd;
    #[doc = include_str!("../../docs/integrating.md")]
    struct Integrating;
    #[doc = include_str!("../../docs/lock-service.md")]
    struct LockService;
    #[doc = include_str!("../../docs/metrics.md")]
    struct Metrics;
    #[doc = include_str!("../../docs/operating-marks.md")]
    struct OperatingMarks;
    #[doc = include_str!("../../docs/replicas.md")]
    struct Replicas;
    #[doc = include_str!("../../docs/token-sources.md")]
    struct TokenSources;
    #[doc = include_str!("../../docs/walkthrough.md")]
    struct Walkthrough;
}
