//! demo-lock-service's integration tests, one binary (one link) for all of them:
//! the binary over the wire (restart, `kill -9` loops, keys), disk faults and
//! clock jumps under libfiu and libfaketime, Prometheus, and the docs' flag table.
//!
//! Nothing here sets process-wide state (environment, panic hooks, a global
//! recorder), so the modules share the binary safely. The one test that does,
//! `tests/metrics.rs` (it installs the global `metrics` recorder), is a binary
//! of its own.

// Shared with demo-resource's and fencing-client's fault tests, which include it by path too.
#[path = "../fault_tools/mod.rs"]
mod fault_tools;

mod clock_jumps;
mod disk_faults;
mod docs;
mod http;
mod keys;
mod kill_loop;
mod prometheus;
