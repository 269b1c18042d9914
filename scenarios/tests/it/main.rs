//! The scenarios crate's integration tests, one binary (one link) for all of them:
//! the seed's scenario (demo lock service, etcd, PostgreSQL, Redis, ZooKeeper),
//! billing and payments, the timelines they draw, and the simulations (the whole
//! system on tokio's paused clock; three replicas on PostgreSQL in real time).
//!
//! Nothing here sets process-wide state (environment, panic hooks, a global
//! recorder), so the modules share the binary safely.

mod common;
mod svg_check;

mod backend_scenarios;
mod billing;
mod etcd_scenario;
mod payments;
mod replica_simulation;
mod scenario;
mod simulation;
