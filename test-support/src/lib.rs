//! test-support: what the workspace's tests share, written once: skips, ports, throwaway servers
//! and databases, failing proxies, child servers, Prometheus's tools, the token parser's oracle.
//! It is not for production code: only tests and the fuzz target depend on it.
//!
//! In detail: the loud skip, free ports,
//! throwaway servers (Redis, etcd, ZooKeeper) on ephemeral loopback ports, an
//! etcd cluster whose members can be killed, frozen and partitioned ([`EtcdCluster`]), a
//! throwaway database on the shared PostgreSQL and a PostgreSQL server of the
//! test's own (`TestDb`, `OwnPg`: feature `postgres`), TCP proxies that can stop
//! answering ([`Proxy`]) or stall and sever ([`StallProxy`]), the workspace's
//! own server binaries as child processes ([`ChildServer`]), Prometheus's
//! tools ([`prometheus_tool`], [`promtool`]), and the token parser's oracle
//! ([`canonical_token`]). With feature `replicas`: replicas of a fenced
//! resource (module `replicas`) and the conformance suite every shared store
//! runs (module `shared_store_suite`). With feature `tls`: certificates made at
//! run time (`TestCerts`) and the servers that serve TLS with them
//! (`Etcd::start_tls`, `Redis::start_tls`, `ZooKeeper::start_tls`; with
//! `postgres` too, `OwnPg::start_tls`: a PostgreSQL that accepts only TLS).
//!
//! A dev-dependency only (`publish = false`). Every server lives in a temporary
//! directory, listens on 127.0.0.1 only, and is killed (SIGKILL) when its handle
//! drops, panics included.
//!
//! ```
//! // A port that was free a moment ago: what the launchers bind their servers to.
//! let port = test_support::free_port();
//! assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
//! ```

#![deny(missing_docs, unsafe_code, unreachable_pub)]

mod child_server;
mod etcd;
mod etcd_cluster;
#[cfg(feature = "postgres")]
mod own_pg;
mod peer_gate;
mod pgbouncer;
mod process;
mod prometheus;
mod proxy;
mod redis;
#[cfg(feature = "replicas")]
pub mod replicas;
#[cfg(feature = "replicas")]
pub mod shared_store_suite;
mod stall;
#[cfg(feature = "postgres")]
mod testdb;
#[cfg(feature = "tls")]
mod tls;
mod token;
mod zookeeper;

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

pub use child_server::{ChildServer, Starting};
pub use etcd::Etcd;
pub use etcd_cluster::EtcdCluster;
#[cfg(feature = "postgres")]
pub use own_pg::OwnPg;
pub use pgbouncer::{PgBouncer, PoolMode};
pub use prometheus::{prometheus_tool, promtool};
pub use proxy::Proxy;
pub use redis::Redis;
pub use stall::StallProxy;
#[cfg(feature = "postgres")]
pub use testdb::TestDb;
#[cfg(feature = "tls")]
pub use tls::TestCerts;
pub use token::canonical_token;
pub use zookeeper::ZooKeeper;

/// Every await on a server in a test is bounded by this, so a hang fails the test.
pub const BOUND: Duration = Duration::from_secs(20);

/// `None` after a loud SKIPPED line, unless `CI=true`: then the test fails, since
/// CI installs every server and a skip there would hide a missing test.
pub fn skip<T>(what: &str) -> Option<T> {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true and {what}: these tests must run in CI");
    // Straight to stderr: the harness captures `eprintln!` of passing tests.
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {what} ***\n");
    None
}

/// A port that was free a moment ago on 127.0.0.1 (another process may take it
/// before the caller binds it: the launchers retry with a new one).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether the tests run as root (uid 0): servers that refuse root then run as `postgres`.
pub(crate) fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}
