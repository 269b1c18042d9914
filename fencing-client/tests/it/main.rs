//! fencing-client's integration tests, one binary (one link) for all of them:
//! the keeper against a fake, the demo service in-process, and each optional
//! backend (its feature on) against a real server the test starts. The lock
//! scenarios every backend must pass are written once, in [`conformance`].
//!
//! Nothing here sets process-wide state (environment, global recorders), so the
//! modules share the binary safely.

#[cfg(any(feature = "etcd", feature = "postgres", feature = "redis", feature = "zookeeper"))]
#[macro_use]
mod conformance;
#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "postgres")]
#[path = "../../../demo-lock-service/tests/fault_tools/mod.rs"]
mod fault_tools;

mod authenticity;
mod client_layer;
mod demo_service;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod etcd_leader;
mod keeper;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper-tls"))]
mod tls;
#[cfg(feature = "zookeeper")]
mod zookeeper;
