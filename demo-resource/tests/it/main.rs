//! demo-resource's integration tests, one binary (one link) for all of them:
//! the routes, the scenarios (demo lock service, etcd, PostgreSQL, Redis,
//! ZooKeeper), billing and payments, hostile input, the simulations, replicas,
//! `kill -9`, disk faults and clock jumps on the real binary, and Prometheus.
//!
//! Nothing here sets process-wide state (environment, panic hooks, a global
//! recorder), so the modules share the binary safely. The one test that does,
//! `tests/metrics.rs` (it installs the global `metrics` recorder, which every
//! in-process `Resource` here would then report to), is a binary of its own.

mod common;
#[path = "../../../demo-lock-service/tests/fault_tools/mod.rs"]
mod fault_tools;
mod svg_check;

mod authenticity;
mod backend_scenarios;
mod billing;
mod clock_jumps;
mod disk_faults;
mod etcd_scenario;
mod hostile;
mod kill;
mod kill_under_writes;
mod operating_marks;
mod payments;
mod prometheus;
mod replica_simulation;
mod replicas;
mod routes;
mod scenario;
mod shared_marks;
mod simulation;
