//! fencing-postgres's integration tests, one binary (one link) for all of them:
//! the in-transaction fence (`fence`, `concurrency`, `atomicity`, `responses`),
//! the shared store (`shared_store`, `conformance`: the suite every claims
//! engine runs), what only PostgreSQL's sessions do to claims (`claims`,
//! `claims_under_attack`, `claims_interference`), restarts and failover
//! (`failover`), all of it through PgBouncer (`pgbouncer`), and TLS (`tls`: a
//! server of the test's own that accepts only TLS). Run one part
//! with `cargo test --workspace --all-features --test it -- claims::`.
//!
//! They need PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth); each
//! test creates its own database, or its own server, and drops it. Nothing
//! here sets process-wide state; `slow_log.rs`, which installs the global
//! tracing subscriber, is a binary of its own.

#[path = "../common/mod.rs"]
mod common;

mod atomicity;
mod claims;
mod claims_interference;
mod claims_under_attack;
mod concurrency;
mod conformance;
mod failover;
mod fence;
mod pgbouncer;
mod responses;
mod shared_store;
mod tls;
