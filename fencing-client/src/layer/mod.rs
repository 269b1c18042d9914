//! A tower layer for the client side: every request carries the lease's token, and
//! none leaves once the lease is lost.
//!
//! [`FencedClientLayer`] (or [`Lease::layer`](crate::Lease::layer)) wraps any tower
//! service over `http::Request<B>`, such as a tonic `Channel` or hyper-util's legacy
//! `Client`, and reqwest's `Client` (a tower service over `reqwest::Request`):
//!
//! * **Fenced.** Each request gets `Fencing-Token` (gRPC metadata `fencing-token`),
//!   replacing any value already there, and `Fencing-Proof` when the lock service
//!   signed the grant (any other `Fencing-Proof` is removed when it did not), as
//!   [`Lease::fence`](crate::Lease::fence) does.
//! * **Refused once lost.** A request made after the lease is lost, released or
//!   dropped, or after its local deadline, fails with [`FencedClientError::NotSent`]
//!   and never reaches the inner client. The check is made in `call`, not in
//!   `poll_ready` (which only forwards): a lease lost between the two still refuses
//!   the request. The inner client's readiness is then left unused; tower's `Buffer`
//!   (inside a tonic `Channel`) keeps that slot for the next call on the same handle.
//! * **Cancelled in flight.** A request whose lease is lost before its response
//!   arrives fails with [`FencedClientError::Cancelled`]: the inner future is dropped,
//!   as [`Lease::run`](crate::Lease::run) does, and hyper (under hyper-util, reqwest
//!   and tonic) abandons the request: it closes an HTTP/1 connection or resets an
//!   HTTP/2 stream, and the server drops the handler. The server may still have received it; its fencing
//!   layer judges it by its token like any other.
//! * **Stopped by proof.** A response that is the fencing layer's stale refusal (a
//!   `409` with `Fencing-Problem: stale-token` or `cancelled`, or the gRPC status
//!   `ABORTED` with that metadata) proves a newer token has reached the resource:
//!   the call fails with [`FencedClientError::Refused`]
//!   ([`LossReason::Superseded`](crate::LossReason::Superseded), with the
//!   `Fencing-Highest-Token` it named), and the layer, with every client it wraps,
//!   sends nothing more ([`FencedClientError::NotSent`]). The application's own 409s
//!   (no `Fencing-Problem` header) pass through as responses. Only the head is read
//!   ([`ResponseHead`]); the [`Lease`](crate::Lease) itself is not cancelled, since
//!   the proof is about one resource: release it if the whole job should stop.
//! * **Inner errors** come back as [`FencedClientError::Inner`].
//!
//! The future ends with the response head: a response body still streaming when the
//! lease is lost is not cut (read it inside `lease.run(..)` if that matters). The
//! layer holds the lease's state, not the lease: it does not keep the lease alive, and
//! requests are refused once the [`Lease`](crate::Lease) handle is dropped or released.
//! Like the lease, the future needs a tokio runtime with timers (it watches the local
//! deadline).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use fencing_client::{DemoLockClient, FencedClientError, LockBackendExt, LossReason};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! // The demo lock service, in process on a loopback port.
//! let dir = tempfile::tempdir()?;
//! let locks = demo_lock_service::LockService::open(demo_lock_service::Config::new(dir.path()))?
//!     .spawn("127.0.0.1:0".parse()?)
//!     .await?;
//! let lease = DemoLockClient::new(locks.base_url())?
//!     .lease("report", "worker-1", Duration::from_secs(10))
//!     .await?;
//!
//! // Any tower HTTP client; this one answers with the token it was sent.
//! let client = service_fn(|request: http::Request<()>| async move {
//!     Ok::<_, Infallible>(http::Response::new(request.headers()["fencing-token"].clone()))
//! });
//! let mut client = ServiceBuilder::new().layer(lease.layer()).service(client);
//!
//! let response = client.ready().await?.call(http::Request::new(())).await?;
//! assert_eq!(response.body(), &lease.token().to_string());
//!
//! lease.release().await?;
//! let refused = client.ready().await?.call(http::Request::new(())).await.unwrap_err();
//! assert!(matches!(refused, FencedClientError::NotSent(_)));
//! assert_eq!(refused.lost().unwrap().0, LossReason::Released);
//! println!("{refused}");
//! # Ok(()) }
//! ```
//!
//! With tonic: `HealthClient::new(ServiceBuilder::new().layer(lease.layer()).service(channel))`;
//! a refused call is a `Status` with code `Unknown` whose source is the
//! [`FencedClientError`]. With reqwest-middleware (feature `reqwest-middleware`), the
//! same rules as a middleware: `FencedMiddleware`. docs/integrating.md shows each
//! client in full.

mod error;
mod future;
#[allow(clippy::module_inception)]
mod layer;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
mod service;
mod stale;

pub use error::FencedClientError;
pub use future::ResponseFuture;
pub use layer::FencedClientLayer;
#[cfg(feature = "reqwest-middleware")]
pub use middleware::FencedMiddleware;
pub use service::FencedClient;
pub use stale::ResponseHead;
