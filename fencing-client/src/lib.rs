//! fencing-client: the client side of fenced leases: lock backends (the demo service, etcd, PostgreSQL,
//! Redis, ZooKeeper), a lease keeper that renews and cancels on loss, and the token on every request.
//! It is not the check: the resource (fencing-layer, fencing-postgres) is what refuses a stale token.
//!
//! * [`LockBackend`]: what a lock service must offer (acquire, keepalive, release,
//!   each returning grant information); a backend writes only its [`LockProtocol`](backend::LockProtocol),
//!   and [`LockBackendExt`] gives each one `lease`/`lease_with`. [`DemoLockClient`] implements it for the
//!   workspace's `demo-lock-service` over HTTP; with the `etcd` feature,
//!   `EtcdLockClient` implements it on etcd v3 (the lock key's create revision is the token);
//!   with `postgres`, `PgLockClient` on PostgreSQL (a lease table, a durable counter row,
//!   expiry on the database's clock); with `redis`, `RedisLockClient` on Redis (`INCR` of a
//!   per-lock counter, refusing a server that would lose it in a crash); with `zookeeper`,
//!   `ZkLockClient` on ZooKeeper (an ephemeral znode per lock, its creation zxid the token).
//! * [`Lease`]: a backend-agnostic handle that renews every TTL/3, keeps a local
//!   deadline on the monotonic clock (send time of the last successful renewal +
//!   TTL − safety margin), and on any renewal error, timeout, 404 or a passed
//!   deadline cancels a [`CancellationToken`] so in-flight work stops.
//! * [`header::set_fencing_token`] / [`header::fence_reqwest`]: put the token into the
//!   `Fencing-Token` header (canonical decimal) of an outgoing request, so the
//!   resource can reject a stale holder. `fence_reqwest` takes reqwest **0.13**'s
//!   `RequestBuilder` (a 0.12 one is a type mismatch): use this crate's
//!   re-export, [`fencing_client::drivers::reqwest`](drivers::reqwest), or depend on
//!   `reqwest = "0.13"` yourself. [`Lease::fence`] and
//!   [`Lease::fence_reqwest`] also send the grant's `Fencing-Proof` when the lock
//!   service signs its grants.
//! * [`FencedClientLayer`] ([`Lease::layer`]): the same as a tower layer around a
//!   client (a tonic `Channel`, hyper-util's `Client`, reqwest's `Client`): every
//!   request fenced, none sent once the lease is lost, those in flight cancelled
//!   ([`layer`] has the details and an example); with the `reqwest-middleware`
//!   feature, `layer::FencedMiddleware` does the same in a reqwest-middleware chain.
//! * [`IdempotencyKey`](idempotency::IdempotencyKey) and [`FencedOperation`]: for a resource that cannot check
//!   tokens (a payment provider), a key derived from (run, operation), the same in
//!   every holder, sent as `Idempotency-Key` beside the token: fence the run's
//!   record with the token, then make the call with the key ([`FencedOperation`]
//!   has the whole step as a doctest; docs/billing.md the scenario).
//! * [`DemoLockVerifier`](verify::DemoLockVerifier) and (feature `etcd`) `verify::EtcdVerifier`: the resource's side,
//!   [`fencing_layer::verify::TokenVerifier`]s that ask the lock backend whether a token
//!   about to raise a mark is the lock's live grant (Chubby's CheckSequencer).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use fencing_client::{DemoLockClient, LockBackendExt};
//!
//! let locks = DemoLockClient::new("http://127.0.0.1:7000")?;
//! let lease = locks.lease("report", "worker-1", Duration::from_secs(10)).await?;
//! // reqwest 0.13, the version `fence_reqwest` takes: this crate's re-export.
//! let http = fencing_client::drivers::reqwest::Client::new();
//! let write = lease.fence_reqwest(http.put("http://127.0.0.1:8080/docs/report").body("v2"));
//! // Stops (drops the request) if the lease is lost meanwhile.
//! let response = lease.run(write.send()).await??;
//! println!("{}", response.status());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`CancellationToken`]: tokio_util::sync::CancellationToken
//! [`FencedOperation`]: idempotency::FencedOperation

pub mod backend;
mod demo;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod header;
pub mod idempotency;
pub mod layer;
mod lease;
#[cfg(feature = "postgres")]
mod pg_durability;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
#[path = "redis_lock.rs"]
pub mod redis;
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper-tls"))]
pub mod tls;
pub mod verify;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

// The root holds the lease API every user names; the rest is in the modules
// above: `backend` (writing a backend), `header` (fencing requests by hand),
// `idempotency`, `layer`, `verify` (the resource's side), one module per
// optional backend for its settings, and `drivers` for the crates they use.
pub use backend::{Grant, LockBackend, LockBackendExt, LockError};
pub use demo::DemoLockClient;
#[cfg(feature = "etcd")]
pub use etcd::EtcdLockClient;
pub use layer::{FencedClient, FencedClientError, FencedClientLayer};
pub use lease::{Lease, LeaseOptions, LossReason, Lost};
#[cfg(feature = "postgres")]
pub use postgres::PgLockClient;
#[cfg(feature = "redis")]
pub use redis::RedisLockClient;
#[cfg(feature = "zookeeper")]
pub use zookeeper::ZkLockClient;

/// The crates this one is built on, re-exported at the versions its types
/// take: a value from another version of one of them is a different type.
pub mod drivers {
    /// The pool crate the PostgreSQL backend is built on (for `PgLockClient::from_pool`).
    #[cfg(feature = "postgres")]
    pub use deadpool_postgres;
    /// The etcd client crate the etcd backend is built on (for `ConnectOptions`, TLS, ...).
    #[cfg(feature = "etcd")]
    pub use etcd_client;
    /// The Redis client crate the Redis backend is built on (for its connection type).
    #[cfg(feature = "redis")]
    pub use redis;
    /// The reqwest (0.13) of the demo backend, and whose `RequestBuilder`
    /// [`header::fence_reqwest`](crate::header::fence_reqwest) and
    /// [`Lease::fence_reqwest`](crate::Lease::fence_reqwest) take: use it (or the
    /// same version) for the requests you fence.
    pub use reqwest;
    /// The ZooKeeper client crate the ZooKeeper backend is built on.
    #[cfg(feature = "zookeeper")]
    pub use zookeeper_client;
}
