//! demo-lock-service: a demo HTTP lease service issuing durable, strictly increasing fencing tokens
//! (library: [`LockService`]; binary: `demo-lock-service`), the token source of the workspace's demos.
//! It is not a production lock service (one process, no replication), and it never checks a token: resources do.
//!
//! Routes (JSON; durations in milliseconds, never wall-clock timestamps):
//!
//! | route | success | errors |
//! |---|---|---|
//! | `POST /v1/leases` `{"name","holder","ttl_ms"}` | 201 `{"lease_id","name","holder","token","ttl_ms"}` | 409 held by another (`holder`, `expires_in_ms`, `Retry-After`); 400 bad input; 413 body too large; 415 not JSON |
//! | `POST /v1/leases/{lease_id}/keepalive` | 200 `{"lease_id","token","ttl_ms"}` (token unchanged) | 404 expired, released or unknown |
//! | `DELETE /v1/leases/{lease_id}` | 204 | 404 |
//! | `POST /v1/leases` when [`Config::max_leases`] leases are held | | 503 `lease-table-full` with `Retry-After` |
//! | `GET /v1/locks/{name}` | 200 `{"name","holder","token","expires_in_ms"}` | 404 free |
//! | `GET /v1/locks/{name}/tokens/{token}` | 200 `{"lock","token","valid":true,"expires_in_ms"}` or `{"lock","token","valid":false,"reason"}` | 400 bad name or token |
//! | `GET /healthz` | 200: the process answers (liveness) | |
//! | `GET /readyz` | 200 `ready`: the store takes grants (readiness) | 503 `not-ready` with `Retry-After` while the store is closed after a disk failure (it reopens by itself: [`fencing_layer::store::ReopeningDatabase`]) or shut down |
//! | `GET /metrics` | 200: grants, conflicts, expiries, keepalives and releases in Prometheus text (the binary; a library user sets [`Config::with_metrics`]) | 404 without it |
//!
//! Every error body is an RFC 9457 `application/problem+json` object.
//!
//! * With a signing key ([`Config::with_signer`], `--signing-key FILE`), every grant
//!   also carries `"proof"`: the lock service's Ed25519 signature over (lock name,
//!   token) in the format of [`fencing_layer::verify::ProofSigner::sign`], which a resource
//!   checks with [`fencing_layer::verify::Ed25519Verifier`] before a token raises its mark.
//! * The token check (Chubby's CheckSequencer) answers `valid: true` exactly when the
//!   lock is held right now, unexpired, under that token ([`LockService::check_token`]).
//!   A forged higher token fails; a stale holder never needs it (a resource asks only
//!   before a raise).
//! * At most [`Config::max_leases`] leases are held at once (default
//!   [`DEFAULT_MAX_LEASES`]). A grant that would need one more is refused with 503 and
//!   `Retry-After`; a live lease is never evicted. Expired leases are forgotten (in
//!   memory and on disk) by later grants, oldest expiry first, so their slots are
//!   reused; released leases are forgotten at once.
//!
//! * Expiry is decided on tokio's monotonic [`Instant`](tokio::time::Instant) (so tests can pause time).
//! * Tokens come from one counter in a redb file; a grant (new counter value and the
//!   lease record) is fsync'd before the grant is answered, so tokens never repeat or
//!   go down, across restarts and `kill -9`.
//! * Grants and releases are persisted; keepalives are not. On start-up every lease
//!   found on disk is re-created with the same `lease_id`, token and holder, expiring
//!   its full TTL after start-up, so a restart never hands a held lock to someone else
//!   early. Each grant also forgets (in the same transaction) up to 64 expired leases
//!   of other locks; an expired lease not yet forgotten when the service stops blocks
//!   its lock for one more TTL after the restart (conservative by design).
//! * A holder that acquires a lock it already holds gets a new lease and a higher
//!   token; its previous `lease_id` stops working.
//!
//! Start it in-process:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use demo_lock_service::{Config, LockService};
//! let service = LockService::open(Config::new("/tmp/locks"))?;
//! let running = service.spawn("127.0.0.1:0".parse()?).await?;
//! println!("lock service at {}", running.base_url());
//! running.shutdown().await?;
//! # Ok(()) }
//! ```

mod answers;
mod clock;
mod config;
mod error;
mod http;
mod metrics;
mod running;
mod server;
mod service;
mod shutdown;
mod store;
mod table;

pub use crate::metrics::install_prometheus;
pub use answers::{Grant, LockStatus, Renewal, TokenCheck};
pub use config::{Config, DEFAULT_MAX_LEASES, DEFAULT_MAX_TTL};
pub use error::{AcquireError, OpenError, StorageError};
pub use fencing_layer::verify::ProofSigner;
pub use http::MAX_BODY_BYTES;
pub use running::{Running, Served};
pub use server::RunningService;
pub use service::{LockService, MAX_NAME_BYTES};
pub use shutdown::{Signal, shutdown_signal};

#[cfg(test)]
mod tests;
