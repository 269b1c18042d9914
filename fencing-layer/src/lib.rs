//! fencing-layer: the resource's side of fencing tokens, a tower `Layer` that refuses any request
//! whose token is lower than the highest seen for its resource, for any tower or axum service.
//! It is not a lock and grants no tokens (a lock service does; fencing-client holds leases).
//!
//! A distributed lock is a lease, and a lease can run out while its holder is
//! paused (a GC pause, SIGSTOP, a VM migration, a slow network write). The
//! holder wakes, still believes it holds the lock, and writes after the new
//! holder. Only the resource can refuse that write: every grant carries a
//! strictly increasing *fencing token*, and the resource rejects requests whose
//! token is lower than the highest it has seen for that resource.
//!
//! [`FencingLayer`] makes any service such a resource.
//!
//! # Wrapping an existing axum router
//!
//! ```
//! use axum::{Router, routing::post};
//! use fencing_layer::FencingLayer;
//!
//! async fn append(body: String) -> String {
//!     body
//! }
//!
//! let fencing = FencingLayer::new(); // clones share one store: one per route
//! let app: Router = Router::new()
//!     // On each route's method router: unknown paths get the router's 404 and
//!     // methods the route does not serve its 405, without reaching the layer.
//!     .route("/logs/{name}", post(append).route_layer(fencing.clone()))
//!     .route("/notes/{name}", post(append).route_layer(fencing));
//! # let _ = app;
//! ```
//!
//! Not `Router::route_layer`: axum wraps each route's 405 fallback with it too,
//! so a wrong method with a high token would raise the mark before axum refused
//! it. The layer decides before the handler runs: a request refused later (an
//! extractor's 400, a handler's 422) has still raised its key's mark, since a
//! higher token proves the older leases are over, and the mark must rise
//! before the handler runs for a lower token never to be inside it alongside.
//!
//! `POST /logs/billing` with `Fencing-Token: 7` is admitted and raises the mark
//! of `/logs/billing` to 7; a later request with token 6 gets 409, with token 7
//! or more it is admitted. `GET` passes through.
//!
//! # The contract
//!
//! | request | response |
//! |---|---|
//! | method not fenced (GET, HEAD, OPTIONS, TRACE) | passes through |
//! | no `Fencing-Token` header | 428 (or passes through with [`FencingLayer::allow_unfenced`]) |
//! | header repeated, empty, or not a canonical decimal `u64` | 400 |
//! | no resource key | 400 |
//! | a new key longer than [`MarkStoreBuilder::max_key_bytes`](store::MarkStoreBuilder::max_key_bytes) | 400 |
//! | token < highest seen for the key | 409; the body names both tokens |
//! | token == highest seen | admitted |
//! | token > highest seen | the mark rises at once; admitted once no lower-token request for the key is inside the inner service |
//! | that drain outlasts [`FencingLayer::drain_timeout`] | 503 with `Retry-After`; the mark stays raised |
//! | a raise the [`FencingLayer::verifier`] refuses | 403; the mark is unchanged |
//! | a raise the verifier cannot answer within [`FencingLayer::verify_timeout`] | 503 with `Retry-After`; the mark is unchanged |
//! | a new key while the key table is full | 503; marks are never evicted |
//! | the durable log cannot record a raise within [`MarkStoreBuilder::write_timeout`](store::MarkStoreBuilder::write_timeout) (the drain bound starts after it) | 503; nothing admitted |
//!
//! Rejections are [RFC 9457] `application/problem+json` responses
//! ([`ProblemJson`](respond::ProblemJson)), replaceable through [`FencingLayer::on_rejection`]; the
//! typed [`Rejection`] is also in the response's extensions. A gRPC request is
//! answered with a gRPC status instead ([`GrpcStatus`](grpc::GrpcStatus)). The layer keeps the
//! inner service's response type; the default responder writes into any
//! [`RejectionBody`](respond::RejectionBody) (axum's, `String`, `Full`, boxed bodies, tonic's).
//!
//! Two guarantees hold per key. **Monotonic admission**: the tokens of admitted
//! requests, in order of admission, never decrease. **No overlap across
//! holders**: while a request with token *t* is inside the inner service (until
//! its response future completes or is dropped), no request with a higher token
//! is. A check before the handler alone would not give this: a stale request
//! could pass the check, stall inside the handler and write after the newer
//! holder. With [`InFlightPolicy::Cancel`] the newer holder does not wait: the
//! older requests' futures are dropped and answered 409.
//!
//! "Inside" means until the inner service's response future completes or is
//! dropped. Work that outlives it is invisible to the layer: a task the handler
//! spawned, a `spawn_blocking` still running after the client went away, a
//! streamed response body. Pass the token on with such work and have the store
//! check it again (see below); the layer then gives early rejection, the store
//! the last word.
//!
//! [RFC 9457]: https://www.rfc-editor.org/rfc/rfc9457
//!
//! # Choosing the key
//!
//! The default key is the percent-decoded request path. [`HeaderKey`](key::HeaderKey),
//! [`GlobalKey`](key::GlobalKey) and any closure are the alternatives ([`key`] has them all):
//!
//! ```
//! use axum::{Router, body::Body, routing::put};
//! use fencing_layer::FencingLayer;
//! use fencing_layer::key::GlobalKey;
//! use axum::http::Request;
//!
//! // Every account's ledger is one resource, whatever the path below it.
//! let per_account = FencingLayer::new().key_extractor(|request: &Request<Body>| {
//!     let account = request.uri().path().strip_prefix("/accounts/")?.split('/').next()?;
//!     Some(format!("account:{account}"))
//! });
//! // The whole service is one resource, as with a single leader lease.
//! let whole_service = FencingLayer::new().key_extractor(GlobalKey);
//!
//! let app: Router = Router::new().route("/accounts/{id}/ledger", put(|| async {}).route_layer(per_account));
//! # let _ = (app, whole_service);
//! ```
//!
//! # Reading the token in a handler
//!
//! While the inner service works on an admitted request, the token it was
//! admitted with is [`FencingToken::current`], so the handler can pass it on
//! to a store that checks it again (`UPDATE … WHERE fence <= $token`). With the
//! `axum` feature `FencingToken` is an extractor that reads it (and
//! `Option<FencingToken>` one for routes that also serve unfenced requests):
//!
//! ```
//! use axum::{Router, routing::post};
//! use fencing_layer::{FencingLayer, FencingToken};
//!
//! async fn write(token: FencingToken, body: String) -> String {
//!     format!("wrote {} bytes under token {token}", body.len())
//! }
//!
//! let app: Router = Router::new().route("/kv/{key}", post(write).route_layer(FencingLayer::new()));
//! # let _ = app;
//! ```
//!
//! The layer sets it around each poll of the inner future, on that thread, so
//! it is the token the layer checked, whatever the layers between do to the
//! request. Read it in the handler's future (an `async` body, an extractor):
//! a `Service::call` that reads it before returning its future finds `None`,
//! and work the handler spawns onto other tasks takes it along as a value.
//! [`FencingLayer::token_extension`]`(true)` also puts the token in the
//! request extensions (for `Extension<FencingToken>` or code that reads
//! extensions); it is off by default because that insert was about half of
//! what the layer cost per request (an axum request already holds three
//! extensions, so a fourth moves the map to a bigger table; `BENCHMARKS.md`,
//! section 19).
//!
//! # Durable marks
//!
//! By default marks live in memory and a restart forgets them. With the `redb`
//! feature, [`MarkStore::open`] keeps them in a file: a raise is fsync'd before
//! the raising request is admitted, requests with an already-recorded token do
//! no disk I/O, and a restart never lowers a mark.
//!
//! ```
//! # #[cfg(feature = "redb")] {
//! use fencing_layer::{FencingLayer, MarkStore};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = MarkStore::open(dir.path().join("marks.redb")).unwrap();
//! let layer = FencingLayer::new().store(store.clone());
//! # let _ = layer;
//! # }
//! ```
//!
//! Any storage can hold marks by implementing [`MarkLog`](store::MarkLog).
//!
//! # Several replicas
//!
//! Marks in a [`MarkStore`] belong to one process. When several replicas serve
//! one resource, a stale holder's request can reach a replica that never saw
//! the newer token. [`FencingLayer::shared_store`] takes a [`SharedStore`](store::SharedStore)
//! that every replica checks instead. [`claims::ClaimStore`] is one, over any
//! backend with expiring records and notifications: each replica holds a
//! *claim* on a key's current token, renewed in the background, admits that
//! token's requests in memory, and stops them itself before the claim can
//! lapse (`fencing-postgres`'s `PgSharedStore` is a claim store on
//! PostgreSQL). For effects inside a database, check the token in the write's
//! own transaction instead (`fencing_postgres::PgFence::fence`).
//!
//! # Metrics
//!
//! With the `metrics` feature the layer reports through the [`metrics`](https://docs.rs/metrics)
//! facade, to whatever exporter the application installed (none in this crate):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fencing_requests_total` | counter | `outcome` | fenced requests: `admitted`, `stale` (409, cancelled ones included), `missing` (428), `invalid` (400), `unverified` (403), `verifier-unavailable`, `key-table-full`, `drain-timeout`, `store-unavailable`, `claim-lost` (503), `unfenced` (let through without a token) |
//! | `fencing_raises_total` | counter | | times a token raised a key's mark |
//! | `fencing_drain_wait_seconds` | histogram | | how long a request waited for lower tokens to leave (requests that waited) |
//! | `fencing_durable_record_seconds` | histogram | | how long the durable store took to record a raise |
//! | `fencing_requests_inside` | gauge | | fenced requests inside the inner service |
//! | `fencing_tracked_keys` | gauge | | keys in the mark store, as of the last raise (or the layer's start) |
//!
//! No label names a resource key. `FencingLayer::metrics_label("orders")` adds
//! `layer="orders"` to every series of that layer. The handles are made when
//! the layer first wraps a service, with the recorder installed then (install
//! it before building the router): every series exists at zero before the
//! first request, so an `increase` sees the first event. Requests do not build
//! labels. With a shared store, the raises and drain waits that the store
//! reports with its admission are counted too, and a request stopped because
//! its replica lost its claim counts as `claim-lost`. A `stale` refusal means a lock was violated somewhere:
//! alert on it (`docs/metrics.md` in the repository has the rule).
//!
//! # Cargo features
//!
//! - `axum`: [`FencingToken`] as an extractor; `key::PathParamKey`, keying by one path parameter.
//! - `redb`: [`RedbMarkLog`] and [`MarkStore::open`].
//! - `ed25519`: tokens signed by the lock service: `verify::Ed25519Verifier` and `verify::ProofSigner`.
//! - `metrics`: counters, histograms and gauges through the `metrics` facade (above).
//!
//! The crate needs a tokio runtime with the time driver (as `#[tokio::main]`
//! gives) for the drain timeout.
//!
// Items behind a feature: linked where it is on, to the nearest item that is
// always there where it is off, so the docs build with any set of features.
#![cfg_attr(feature = "redb", doc = "[`MarkStore::open`]: crate::MarkStore::open")]
#![cfg_attr(not(feature = "redb"), doc = "[`MarkStore::open`]: crate::MarkStore")]
#![cfg_attr(feature = "redb", doc = "[`RedbMarkLog`]: crate::store::RedbMarkLog")]
#![cfg_attr(not(feature = "redb"), doc = "[`RedbMarkLog`]: crate::store::MarkLog")]
#![deny(missing_docs, unsafe_code, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
pub mod axum;
mod body;
pub mod claims;
mod config;
pub mod future;
pub mod grpc;
mod headers;
pub mod key;
mod layer;
mod methods;
mod metrics;
mod rejection;
pub mod respond;
mod scope;
mod service;
pub mod store;
mod token;
pub mod verify;

// The root holds what every user of the layer names; the rest is in the
// modules above, by what it is for: `key`, `store`, `verify`, `respond`,
// `grpc`, `claims`, `future`, `axum`.
pub use crate::config::InFlightPolicy;
pub use crate::headers::{FENCING_HIGHEST_TOKEN, FENCING_PROBLEM, FENCING_PROOF, FENCING_TOKEN};
pub use crate::layer::FencingLayer;
pub use crate::rejection::Rejection;
pub use crate::service::Fencing;
pub use crate::store::MarkStore;
pub use crate::token::{FencingToken, TokenError};
