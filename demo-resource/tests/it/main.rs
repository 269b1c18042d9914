//! demo-resource's integration tests, one binary (one link) for all of them:
//! the routes, token authenticity, the admin routes and `marks`, hostile input,
//! replicas on PostgreSQL (per-process, in-transaction and shared marks, and
//! over TLS), `kill -9`, disk faults and clock jumps on the real binary, and Prometheus.
//! The stories told against the service, and their simulations, are the
//! `scenarios` crate's tests.
//!
//! Nothing here sets process-wide state (environment, panic hooks, a global
//! recorder), so the modules share the binary safely. The one test that does,
//! `tests/metrics.rs` (it installs the global `metrics` recorder, which every
//! in-process `Resource` here would then report to), is a binary of its own.

mod common;
#[path = "../../../demo-lock-service/tests/fault_tools/mod.rs"]
mod fault_tools;

mod authenticity;
mod clock_jumps;
mod disk_faults;
mod hostile;
mod kill;
mod kill_under_writes;
mod log_pipe;
mod operating_marks;
mod pgbouncer;
mod prometheus;
mod replicas;
mod routes;
mod shared_marks;
mod tls;
