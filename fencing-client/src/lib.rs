//! Client side of fenced leases.
//!
//! * [`LockBackend`]: what a lock service must offer (acquire, keepalive, release,
//!   each returning grant information); a backend writes only its [`LockProtocol`],
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
//! * [`set_fencing_token`] / [`fence_reqwest`]: put the token into the
//!   `Fencing-Token` header (canonical decimal) of an outgoing request, so the
//!   resource can reject a stale holder. `fence_reqwest` takes reqwest **0.13**'s
//!   `RequestBuilder` (a 0.12 one is a type mismatch): use this crate's
//!   re-export, [`fencing_client::reqwest`](reqwest), or depend on
//!   `reqwest = "0.13"` yourself. [`Lease::fence`] and
//!   [`Lease::fence_reqwest`] also send the grant's `Fencing-Proof` when the lock
//!   service signs its grants.
//! * [`FencedClientLayer`] ([`Lease::layer`]): the same as a tower layer around a
//!   client (a tonic `Channel`, hyper-util's `Client`, reqwest's `Client`): every
//!   request fenced, none sent once the lease is lost, those in flight cancelled
//!   ([`layer`] has the details and an example); with the `reqwest-middleware`
//!   feature, `FencedMiddleware` does the same in a reqwest-middleware chain.
//! * [`IdempotencyKey`] and [`FencedOperation`]: for a resource that cannot check
//!   tokens (a payment provider), a key derived from (run, operation), the same in
//!   every holder, sent as `Idempotency-Key` beside the token: fence the run's
//!   record with the token, then make the call with the key ([`FencedOperation`]
//!   has the whole step as a doctest; docs/billing.md the scenario).
//! * [`DemoLockVerifier`] and (feature `etcd`) `EtcdVerifier`: the resource's side,
//!   [`fencing_layer::TokenVerifier`]s that ask the lock backend whether a token
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
//! let http = fencing_client::reqwest::Client::new();
//! let write = lease.fence_reqwest(http.put("http://127.0.0.1:8080/docs/report").body("v2"));
//! // Stops (drops the request) if the lease is lost meanwhile.
//! let response = lease.run(write.send()).await??;
//! println!("{}", response.status());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`CancellationToken`]: tokio_util::sync::CancellationToken

mod backend;
mod demo;
#[cfg(feature = "etcd")]
mod etcd;
mod idempotency;
pub mod layer;
mod lease;
#[cfg(feature = "postgres")]
mod pg_durability;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis_lock;
pub mod verify;
#[cfg(feature = "zookeeper")]
mod zookeeper;

pub use backend::{BoxFuture, Grant, LockBackend, LockBackendExt, LockError, LockProtocol, LockStatus};
/// The pool crate the PostgreSQL backend is built on (for `PgLockClient::from_pool`).
#[cfg(feature = "postgres")]
pub use deadpool_postgres;
pub use demo::DemoLockClient;
#[cfg(feature = "etcd")]
pub use etcd::{DEFAULT_ETCD_PREFIX, EtcdLockClient};
/// The etcd client crate this backend is built on (for `ConnectOptions`, TLS, ...).
#[cfg(feature = "etcd")]
pub use etcd_client;
pub use idempotency::{
    FencedOperation, IDEMPOTENCY_KEY_HEADER, IdempotencyKey, idempotency_key_header, idempotent_reqwest,
    set_idempotency_key,
};
#[cfg(feature = "reqwest-middleware")]
pub use layer::FencedMiddleware;
pub use layer::{FencedClient, FencedClientError, FencedClientLayer};
pub use lease::{Lease, LeaseOptions, LossReason, Lost};
#[cfg(feature = "postgres")]
pub use postgres::{DEFAULT_PG_LOCK_TABLE, PgLockClient};
/// The Redis client crate the Redis backend is built on (for its connection type).
#[cfg(feature = "redis")]
pub use redis;
#[cfg(feature = "redis")]
pub use redis_lock::{DEFAULT_REDIS_PREFIX, RedisLockClient, RedisLockClientBuilder};
/// The reqwest (0.13) whose `RequestBuilder` [`fence_reqwest`] and
/// [`Lease::fence_reqwest`] take: use it (or the same version) for the requests you fence.
pub use reqwest;
#[cfg(feature = "etcd")]
pub use verify::EtcdVerifier;
pub use verify::{DEFAULT_CACHE_CAPACITY, DEFAULT_CACHE_TTL, DemoLockVerifier};
#[cfg(feature = "zookeeper")]
pub use zookeeper::{DEFAULT_ZK_PREFIX, ZkLockClient};
/// The ZooKeeper client crate the ZooKeeper backend is built on.
#[cfg(feature = "zookeeper")]
pub use zookeeper_client;

use http::HeaderValue;
use http::header::HeaderName;

/// The request header carrying the fencing token, as sent on the wire (`Fencing-Token`;
/// HTTP header names are case-insensitive).
pub const FENCING_TOKEN_HEADER: &str = "Fencing-Token";

/// [`FENCING_TOKEN_HEADER`] as a typed header name.
pub fn fencing_token_header() -> HeaderName {
    HeaderName::from_static("fencing-token")
}

/// `token` as a header value: canonical decimal (no sign, no padding, no leading zeros).
pub fn fencing_token_value(token: u64) -> HeaderValue {
    HeaderValue::from(token)
}

/// Sets the `Fencing-Token` header of `request` to `token`, replacing any value
/// already there (a repeated header would be rejected by the fencing layer).
pub fn set_fencing_token<B>(request: &mut http::Request<B>, token: u64) {
    request.headers_mut().insert(fencing_token_header(), fencing_token_value(token));
}

/// Adds the `Fencing-Token` header with `token` to a reqwest request.
///
/// reqwest 0.13's `RequestBuilder`, re-exported as [`fencing_client::reqwest`](reqwest):
/// a builder from another reqwest version is a different type.
pub fn fence_reqwest(request: reqwest::RequestBuilder, token: u64) -> reqwest::RequestBuilder {
    request.header(fencing_token_header(), fencing_token_value(token))
}

/// The request header carrying the lock service's signature over (lock name, token):
/// `Fencing-Proof`. A resource with a proof verifier lets a token raise its mark only
/// with a valid proof.
pub const FENCING_PROOF_HEADER: &str = "Fencing-Proof";

/// [`FENCING_PROOF_HEADER`] as a typed header name.
pub fn fencing_proof_header() -> HeaderName {
    HeaderName::from_static("fencing-proof")
}

/// Sets the `Fencing-Proof` header of `request` to `proof` (a grant's
/// [`Grant::proof`]), replacing any value already there. A proof that is not a
/// valid header value (it never is one, from the lock service: URL-safe base64)
/// is left out, and the resource refuses the raise.
pub fn set_fencing_proof<B>(request: &mut http::Request<B>, proof: &str) {
    match HeaderValue::from_str(proof) {
        Ok(value) => {
            request.headers_mut().insert(fencing_proof_header(), value);
        }
        Err(_) => {
            request.headers_mut().remove(fencing_proof_header());
        }
    }
}

/// Adds the `Fencing-Proof` header with `proof` to a reqwest request.
pub fn fence_reqwest_proof(request: reqwest::RequestBuilder, proof: &str) -> reqwest::RequestBuilder {
    request.header(fencing_proof_header(), proof)
}

/// Sets the `fencing-token` metadata of a tonic request to `token` (gRPC
/// metadata travels as HTTP/2 headers, so the fencing layer reads it as it reads
/// the header), replacing any value already there.
#[cfg(feature = "tonic")]
pub fn fence_tonic<T>(request: &mut tonic::Request<T>, token: u64) {
    request.metadata_mut().insert("fencing-token", tonic::metadata::MetadataValue::from(token));
}

/// Sets the `fencing-proof` metadata of a tonic request to `proof`, or removes
/// it when `proof` is not a valid metadata value (the resource then refuses a raise).
#[cfg(feature = "tonic")]
pub fn fence_tonic_proof<T>(request: &mut tonic::Request<T>, proof: &str) {
    match proof.parse() {
        Ok(value) => {
            request.metadata_mut().insert("fencing-proof", value);
        }
        Err(_) => {
            request.metadata_mut().remove("fencing-proof");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tonic")]
    #[test]
    fn sets_token_and_proof_metadata_on_a_tonic_request() {
        let mut request = tonic::Request::new(());
        request.metadata_mut().append("fencing-token", "7".parse().unwrap());
        fence_tonic(&mut request, 42);
        let values: Vec<_> = request.metadata().get_all("fencing-token").iter().collect();
        assert_eq!(values, ["42"]);
        fence_tonic_proof(&mut request, "abc_-");
        assert_eq!(request.metadata().get("fencing-proof").unwrap(), "abc_-");
        fence_tonic_proof(&mut request, "not\nvalid");
        assert!(request.metadata().get("fencing-proof").is_none());
        // As the layer reads it: the request's headers.
        let http = request.into_parts().0.into_headers();
        assert_eq!(http["fencing-token"], "42");
    }

    #[test]
    fn sets_canonical_header_on_http_request() {
        let mut req = http::Request::builder()
            .method("PUT")
            .uri("/docs/a")
            .header("fencing-token", "0007")
            .header("Fencing-Token", "1")
            .body(())
            .unwrap();
        set_fencing_token(&mut req, 42);
        let values: Vec<_> = req.headers().get_all(FENCING_TOKEN_HEADER).iter().collect();
        assert_eq!(values, vec!["42"]);
        set_fencing_token(&mut req, u64::MAX);
        assert_eq!(req.headers()["fencing-token"], "18446744073709551615");
        set_fencing_token(&mut req, 0);
        assert_eq!(req.headers()["fencing-token"], "0");
    }

    #[test]
    fn sets_header_on_reqwest_builder() {
        let client = reqwest::Client::new();
        let req = fence_reqwest(client.put("http://127.0.0.1:9/x"), 1234).build().unwrap();
        let values: Vec<_> = req.headers().get_all("Fencing-Token").iter().collect();
        assert_eq!(values, vec!["1234"]);
    }
}
