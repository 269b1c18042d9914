//! demo-resource: a small storage service (logs and key-value pairs over HTTP) whose write routes
//! are fenced by [`fencing_layer`], with durable marks, PostgreSQL replicas and admin routes.
//! It is not the stories told against it: the seed's scenario, billing and the simulations live in `scenarios`.
//!
//! Routes (errors are RFC 9457 `application/problem+json`):
//!
//! | route | success | errors |
//! |---|---|---|
//! | `POST /logs/{name}` (fenced), body: UTF-8 text | 201 `{"log","index","token"}` | 400 invalid UTF-8 or bad `delay_ms`; 413 body over [`MAX_BODY_BYTES`]; the layer's 428/400/409/503 |
//! | `GET /logs/{name}` | 200 `{"entries":[{"token","value"}]}` in append order (`token` null when unfenced) | 404 nothing appended yet |
//! | `PUT /kv/{key}` (fenced), body: UTF-8 text | 201 new, 200 replaced: `{"key","token"}` | as `POST /logs` |
//! | `GET /kv/{key}` | 200 `{"key","token","value"}` | 404 unknown key |
//! | `DELETE /kv/{key}` (fenced) | 204 | 404 unknown key; the layer's errors |
//! | `GET /healthz` | 200 `ok`: the process answers (liveness) | |
//! | `GET /readyz` | 200 `ready`: the data and mark stores take writes (readiness) | 503 `not-ready` with `Retry-After` while a store is closed after a disk failure and not yet reopened |
//! | `GET /metrics` | 200: the fencing layer's metrics (`layer="demo-resource"`) in Prometheus text; `serve` always, a library user through [`Resource::with_metrics`] | 404 without a handle |
//!
//! # Token authenticity
//!
//! With [`Config::verify_key`] (`serve --verify-key FILE`) a token may raise a
//! path's mark only with a `Fencing-Proof`: the lock service's Ed25519
//! signature over the lock's name and the token. The lock of `/logs/{name}` and
//! of `/kv/{key}` is `{name}` / `{key}` ([`lock_for_key`]), so a proof for one
//! lock cannot raise another's mark. A raise without a valid proof is a 403
//! problem+json (`unverified-token`) and the mark stays as it was; tokens equal
//! to the mark or below it are never checked. [`Resource::with_verifier`]
//! puts any other [`TokenVerifier`] in its place.
//!
//! # Operating the marks
//!
//! [`Resource::admin_router`] lists, reads and resets marks over HTTP, on a
//! listener of its own (`serve --admin-listen`, off by default, loopback only:
//! the routes have no authentication). `demo-resource marks list|get|reset`
//! does the same on a stopped service's data directory.
//!
//! | admin route | success | errors |
//! |---|---|---|
//! | `GET /marks` | 200 `{"marks":[{"key","mark"}]}`, sorted by key | 400 a query other than `key` |
//! | `GET /marks?key=K` (K URL-encoded) | 200 `{"key","mark"}` | 404 no mark for K |
//! | `POST /marks/reset`, JSON `{"key":K,"to":N}` | 200 `{"key","old","new"}` | 415 not `application/json`; 400 bad JSON; 413 over 16 KiB; 404 no mark for K; 503 + `Retry-After` while a raise of K is being recorded |
//!
//! A reset is durable before the answer and logged at `warn` with the key, the
//! old and new mark, and the peer's address. It sets the data's own fence of
//! the path too (each write checks its token again in its transaction), so
//! the key is really writable from the new mark on ([`StoppedMarks`]).
//!
//! Write routes take `?delay_ms=N` (0 to [`MAX_DELAY_MS`]): the handler waits that
//! long after the layer admitted the request and before applying the write, to
//! reproduce a write still in flight when a newer lease holder arrives.
//!
//! The fencing layer is added with one line, as to any existing router (see
//! [`Resource::router`]); each path (`/logs/billing`, `/kv/k`) has its own mark.
//!
//! # Several replicas: PostgreSQL
//!
//! With [`Storage::Postgres`] (`serve --postgres URL`; feature `postgres`) the data lives in
//! PostgreSQL, and every process given the same URL is a replica of one
//! resource. The layer's marks stay per process, so alone they cannot stop a
//! stale holder whose request lands on a replica that never saw the newer
//! token. So each write is also fenced in its own transaction with
//! `fencing_postgres::PgFence::fence`, keyed by the same path: begin, fence
//! (a lower token than the key's mark in the database: the layer's 409),
//! `delay_ms`, write, commit. A stalled write thus holds the key's mark row,
//! and a newer holder's write on any replica waits for it (at most 5 s, then
//! 503). The layer still answers 428 and 400 for missing and bad tokens, and
//! 409 for what its replica already knows is stale.
//!
//! `fence_in_transaction: false` (`--local-marks`) leaves the layer's
//! per-process marks as the only fence, the data still in PostgreSQL: with
//! several replicas, stale writes get through. That mode exists to show it.
//!
//! Routes, status codes and bodies are the same as with the other storages,
//! except: a database that cannot be reached, or no free connection in time,
//! is a 503 problem+json with `Retry-After`; a name holding NUL (which
//! PostgreSQL text cannot store) is a 400 on writes and a 404 on reads.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use demo_resource::{Config, Resource, Served};
//!
//! let resource = Resource::open(Config::durable("/tmp/resource"))?;
//! let running = resource.spawn("127.0.0.1:0".parse()?).await?;
//! println!("resource at {}", running.base_url());
//! running.shutdown().await?;
//! # Ok(()) }
//! ```

mod admin;
mod app;
mod backend;
mod data;
mod http;
mod limits;
mod marks;
mod metrics;
#[cfg(feature = "postgres")]
mod postgres;
pub mod problem;
mod ready;
mod shared;
mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use fencing_layer::claims::ClaimTiming;
use fencing_layer::{
    FencingLayer, MarkStore,
    verify::{Ed25519Verifier, ProofPublicKey, TokenVerifier},
};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::backend::Backend;
pub use crate::data::Entry;
pub use crate::limits::{MAX_BODY_BYTES, MAX_DELAY_MS, MAX_NAME_BYTES};
pub use crate::marks::{OpenMarksError, ResetError, StoppedMarks};
#[cfg(feature = "postgres")]
use crate::postgres::PgData;
use crate::shared::SharedMarks;
use crate::store::Data;
/// Installs the process's Prometheus recorder (the same as the lock service's); pass its handle to
/// [`Resource::with_metrics`].
pub use demo_lock_service::install_prometheus;
pub use demo_lock_service::{Running, Served};

/// What [`Resource::connect`] answers for [`Storage::Postgres`] in a build
/// without feature `postgres`.
#[cfg(not(feature = "postgres"))]
const POSTGRES_NOT_BUILT: &str = "PostgreSQL storage needs demo-resource built with feature `postgres` \
     (cargo build -p demo-resource --features postgres)";

/// What [`Resource::connect`] answers for [`Config::etcd_marks`] in a build
/// without feature `etcd`.
#[cfg(not(feature = "etcd"))]
const ETCD_NOT_BUILT: &str = "marks in etcd need demo-resource built with feature `etcd` \
     (cargo build -p demo-resource --features etcd)";

/// Where a [`Resource`] keeps its data and marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// `data.redb` and `marks.redb` in this directory (created if missing):
    /// both survive `kill -9` and restarts.
    Dir(PathBuf),
    /// Memory only: a restart forgets data and marks.
    InMemory,
    /// The data in the PostgreSQL database at `url` (`postgres://user@host:port/db`
    /// or `host=… user=… dbname=…`), shared by every replica given the same URL;
    /// the layer's marks in memory. Opened with [`Resource::connect`], which
    /// creates the tables if missing; without feature `postgres` it answers
    /// that the crate was built without it.
    Postgres {
        /// The database, as tokio-postgres parses it.
        url: String,
        /// Whether each fenced write is also fenced in its own transaction
        /// (marks in the database, shared by every replica). `false` is
        /// `--local-marks`: the layer's per-process marks only, not enough
        /// with several replicas.
        fence_in_transaction: bool,
        /// The layer decides through the marks every replica shares
        /// (`fencing_postgres::PgSharedStore`: replica claims, admitted in
        /// memory) instead of its own (`--shared-marks`); the writes are then
        /// not fenced in their transactions (a key is fenced one way).
        shared_marks: bool,
    },
}

/// Configuration of a [`Resource`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where data and marks live.
    pub storage: Storage,
    /// Whether the write routes are fenced (`--no-fencing` turns it off).
    pub fencing: bool,
    /// Raises need the lock service's proof, signed by this key's secret half
    /// (`--verify-key`); see [`proof_verifier`]. Needs `fencing`.
    pub verify_key: Option<ProofPublicKey>,
    /// The claims' timing with [`Storage::Postgres`] `{ shared_marks: true }` or [`Config::etcd_marks`]
    /// (term, renewal period, margin); `None` is fencing-layer's default (a
    /// 5 s term). Ignored by the other storages. Shorter terms make a dead or
    /// cut-off replica hold up raises for less time, at the cost of more
    /// renewals; see [`fencing_layer::claims::ClaimTiming`].
    pub claim_timing: Option<ClaimTiming>,
    /// With shared marks: where the replica's background session (renewals,
    /// `LISTEN` for raises and releases) connects, if not to the storage's
    /// `url`: the same database by another route, e.g. straight to PostgreSQL
    /// when `url` goes through a transaction-pooling PgBouncer, which cannot
    /// carry `LISTEN`. The tests give it a route of its own to cut.
    pub claims_session_url: Option<String>,
    /// With PostgreSQL: `url` goes through a pooler in transaction mode
    /// (PgBouncer `pool_mode = transaction`): the bounds are set in each
    /// transaction and nothing is prepared across transactions
    /// (`fencing_postgres::Pooling::Transaction`, `--pg-pooling transaction`).
    /// Left `false` through such a pooler, the replica refuses to start.
    pub transaction_pooling: bool,
    /// With PostgreSQL: serve from a server that could lose an acknowledged
    /// commit in a crash or failover (`synchronous_commit = off`, an
    /// asynchronous standby), which is refused otherwise: a mark raised there
    /// can come back lower (`fencing_postgres::durability`,
    /// `--accept-volatile-commits`).
    pub accept_volatile_commits: bool,
    /// The layer decides through marks every replica shares in etcd
    /// (`fencing_etcd::EtcdSharedStore`, `--etcd`), whatever holds the data;
    /// with [`Storage::Postgres`], its writes are then not fenced in their
    /// transactions (a key is fenced one way). Needs feature `etcd`.
    pub etcd_marks: Option<EtcdMarks>,
}

/// Where the replicas' shared marks live in etcd ([`Config::etcd_marks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMarks {
    /// The cluster's client URLs (`http://127.0.0.1:2379`, …; `https://` over TLS).
    pub endpoints: Vec<String>,
    /// The key prefix marks and claims live under: the same on every replica.
    pub prefix: String,
    /// With `https://` endpoints: the PEM file of the CA that signed the members'
    /// certificates (`--etcd-ca`); `None` trusts the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl Config {
    /// Fenced, durable in `dir`.
    pub fn durable(dir: impl Into<PathBuf>) -> Self {
        Self {
            storage: Storage::Dir(dir.into()),
            fencing: true,
            verify_key: None,
            claim_timing: None,
            claims_session_url: None,
            transaction_pooling: false,
            etcd_marks: None,
            accept_volatile_commits: false,
        }
    }

    /// Fenced, in memory.
    pub fn in_memory() -> Self {
        Self {
            storage: Storage::InMemory,
            fencing: true,
            verify_key: None,
            claim_timing: None,
            claims_session_url: None,
            transaction_pooling: false,
            etcd_marks: None,
            accept_volatile_commits: false,
        }
    }

    /// Fenced by the layer and in each write's transaction, data in PostgreSQL at `url`.
    pub fn postgres(url: impl Into<String>) -> Self {
        Self {
            storage: Storage::Postgres { url: url.into(), fence_in_transaction: true, shared_marks: false },
            fencing: true,
            verify_key: None,
            claim_timing: None,
            claims_session_url: None,
            transaction_pooling: false,
            etcd_marks: None,
            accept_volatile_commits: false,
        }
    }

    /// The same routes without the fencing layer: stale writes get through.
    pub fn without_fencing(mut self) -> Self {
        self.fencing = false;
        self
    }

    /// Lets a token raise a mark only with a valid `Fencing-Proof` signed by
    /// `key`'s secret half, for the path's lock ([`proof_verifier`]).
    pub fn verify_key(mut self, key: ProofPublicKey) -> Self {
        self.verify_key = Some(key);
        self
    }

    /// Claims with `timing` instead of the default, with shared marks
    /// ([`Config::claim_timing`]).
    pub fn claim_timing(mut self, timing: ClaimTiming) -> Self {
        self.claim_timing = Some(timing);
        self
    }

    /// The verifier `verify_key` asks for; an error when it cannot apply.
    fn verifier(&self) -> Result<Option<Verifier>, OpenError> {
        match (self.verify_key, self.fencing) {
            (None, _) => Ok(None),
            (Some(_), false) => {
                Err(OpenError("a verify key needs fencing: without the layer no token is checked".into()))
            }
            (Some(key), true) => Ok(Some(Verifier(Arc::new(proof_verifier(key))))),
        }
    }
}

/// The lock whose holder may write the resource `key` (the fencing layer's key,
/// the percent-decoded path): `{name}` for `/logs/{name}`, `{key}` for
/// `/kv/{key}`, and none for anything else (no raise of it is verified).
///
/// ```
/// assert_eq!(demo_resource::lock_for_key("/logs/billing").as_deref(), Some("billing"));
/// assert_eq!(demo_resource::lock_for_key("/kv/a b").as_deref(), Some("a b"));
/// assert_eq!(demo_resource::lock_for_key("/healthz"), None);
/// ```
#[must_use]
pub fn lock_for_key(key: &str) -> Option<String> {
    let name = key.strip_prefix("/logs/").or_else(|| key.strip_prefix("/kv/"))?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// The verifier of `serve --verify-key`: a raise of a path's mark needs a
/// `Fencing-Proof` signed by `key` for that path's lock ([`lock_for_key`]).
#[must_use]
pub fn proof_verifier(key: ProofPublicKey) -> Ed25519Verifier {
    Ed25519Verifier::new(key).lock_for_key(lock_for_key)
}

/// The layer's verifier, shared by every router the resource builds.
#[derive(Clone)]
struct Verifier(Arc<dyn TokenVerifier>);

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Verifier")
    }
}

/// Why [`Resource::open`] failed.
#[derive(Debug)]
pub struct OpenError(String);

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot open the resource: {}", self.0)
    }
}

impl std::error::Error for OpenError {}

/// The storage service: data, marks, and the bookkeeping of writes in flight.
#[derive(Debug, Clone)]
pub struct Resource {
    app: App,
    marks: Option<MarkStore>,
    /// With `--shared-marks` or `--etcd`: the layer decides through the replicas' shared marks.
    shared: Option<SharedMarks>,
    verifier: Option<Verifier>,
    metrics: Option<PrometheusHandle>,
}

impl Resource {
    /// Opens the data (and, when fenced, the marks) as `config` says. This blocks
    /// (it creates the files and commits): from async code, call it in
    /// `spawn_blocking`, or call [`connect`](Self::connect).
    ///
    /// # Errors
    ///
    /// The directory or a database file cannot be created or opened (another
    /// process may have it); [`Storage::Postgres`], which only `connect` opens.
    pub fn open(config: Config) -> Result<Self, OpenError> {
        let verifier = config.verifier()?;
        let (data, marks) = match &config.storage {
            Storage::Postgres { .. } => {
                return Err(OpenError("PostgreSQL storage is opened with `Resource::connect`".into()));
            }
            Storage::Dir(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| OpenError(format!("{}: {e}", dir.display())))?;
                let data = Data::open(&dir.join("data.redb")).map_err(|e| OpenError(format!("data: {e}")))?;
                let marks = if config.fencing {
                    let marks = MarkStore::open(dir.join("marks.redb"));
                    Some(marks.map_err(|e| OpenError(format!("marks: {e}")))?)
                } else {
                    None
                };
                (data, marks)
            }
            Storage::InMemory => {
                let data = Data::in_memory().map_err(|e| OpenError(format!("data: {e}")))?;
                (data, config.fencing.then(MarkStore::in_memory))
            }
        };
        Ok(Self::new(Backend::Redb(Arc::new(data)), marks, verifier))
    }

    /// Opens the resource as `config` says, from async code. [`Storage::Postgres`]
    /// opens only here: it connects, and creates the mark table and the data
    /// tables if missing (replicas may start at once). The other storages are
    /// opened by [`open`](Self::open) on the blocking pool.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open); for PostgreSQL, a bad URL, a database that
    /// cannot be reached within 5 s, or a failed migration; or this crate
    /// built without feature `postgres`.
    pub async fn connect(config: Config) -> Result<Self, OpenError> {
        let etcd_marks = config.etcd_marks.clone().filter(|_| config.fencing);
        let timing = config.claim_timing;
        let resource = Self::connect_storage(config).await?;
        let Some(marks) = etcd_marks else { return Ok(resource) };
        #[cfg(not(feature = "etcd"))]
        {
            let _ = (marks, timing);
            Err(OpenError(ETCD_NOT_BUILT.into()))
        }
        #[cfg(feature = "etcd")]
        {
            let shared = SharedMarks::etcd(&marks, timing).await.map_err(OpenError)?;
            Ok(Self { shared: Some(shared), ..resource })
        }
    }

    async fn connect_storage(config: Config) -> Result<Self, OpenError> {
        let Storage::Postgres { url, fence_in_transaction, shared_marks } = &config.storage else {
            let opened = tokio::task::spawn_blocking(move || Self::open(config)).await;
            return opened.map_err(|e| OpenError(e.to_string()))?;
        };
        #[cfg(not(feature = "postgres"))]
        {
            let _ = (url, fence_in_transaction, shared_marks);
            Err(OpenError(POSTGRES_NOT_BUILT.into()))
        }
        #[cfg(feature = "postgres")]
        Self::connect_postgres(&config, url, *fence_in_transaction, *shared_marks).await
    }

    #[cfg(feature = "postgres")]
    async fn connect_postgres(
        config: &Config,
        url: &str,
        fence_in_transaction: bool,
        shared_marks: bool,
    ) -> Result<Self, OpenError> {
        let verifier = config.verifier()?;
        let shared_marks = config.fencing && shared_marks;
        // A key is fenced one way: by the shared marks (PostgreSQL's or etcd's), or in the transaction.
        let fence_in_transaction =
            config.fencing && fence_in_transaction && !shared_marks && config.etcd_marks.is_none();
        let pooled = config.transaction_pooling;
        let data = PgData::connect(url, fence_in_transaction, config.accept_volatile_commits, pooled)
            .await
            .map_err(|e| OpenError(format!("postgres: {e}")))?;
        let shared = match shared_marks {
            true => {
                let session = config.claims_session_url.as_deref().unwrap_or(url);
                let timing = config.claim_timing.unwrap_or_default();
                let store =
                    data.shared_store(session, timing).map_err(|e| OpenError(format!("postgres: {e}")))?;
                // A replica whose claims could never be renewed refuses to start.
                store.ready().await.map_err(|e| OpenError(format!("postgres: {e}")))?;
                Some(SharedMarks::Postgres(store))
            }
            false => None,
        };
        let mut resource =
            Self::new(Backend::Postgres(data), config.fencing.then(MarkStore::in_memory), verifier);
        resource.shared = shared;
        Ok(resource)
    }

    fn new(data: Backend, marks: Option<MarkStore>, verifier: Option<Verifier>) -> Self {
        let app = App {
            data,
            marks: marks.clone(),
            in_flight: Arc::new(watch::Sender::new(BTreeMap::new())),
            delays: Arc::new(watch::Sender::new(0)),
        };
        Self { app, marks, shared: None, verifier, metrics: None }
    }

    /// Asks `verifier` before any token raises a mark (403 when it refuses,
    /// 503 when it cannot answer), instead of the one [`Config::verify_key`]
    /// made. Routers built afterwards use it; without fencing it has no effect.
    ///
    /// With PostgreSQL storage it applies too: a token reaches the database's
    /// fence only once this process's layer admitted it, and a token above the
    /// layer's mark is admitted only when verified. Every replica needs it.
    #[must_use]
    pub fn with_verifier(mut self, verifier: impl TokenVerifier) -> Self {
        self.verifier = Some(Verifier(Arc::new(verifier)));
        self
    }

    /// Serves `GET /metrics` from `handle` (see [`install_prometheus`]); routers
    /// built afterwards have the route.
    #[must_use]
    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// The service's routes, fenced unless the config said otherwise.
    pub fn router(&self) -> axum::Router {
        let routes = http::routes();
        let routes = match &self.marks {
            // The one line that fences an existing router's write routes. `route_layer`,
            // so unknown routes are 404 without touching the key table. On the `Router` it
            // would also fence each route's 405 fallback, but `http::finish` replaces those
            // fallbacks afterwards (`method_not_allowed_fallback`), so a wrong method moves
            // no mark (tests/it/routes.rs: `unknown_routes_and_methods_never_touch_the_marks`).
            Some(marks) => {
                let layer = FencingLayer::new().store(marks.clone()).metrics_label("demo-resource");
                let layer = match &self.shared {
                    Some(shared) => shared.on(layer),
                    None => layer,
                };
                let layer = match &self.verifier {
                    Some(verifier) => layer.verifier(Arc::clone(&verifier.0)),
                    None => layer,
                };
                routes.route_layer(layer)
            }
            None => routes,
        };
        let routes = match self.metrics.clone() {
            Some(handle) => {
                routes.route("/metrics", axum::routing::get(move || async move { metrics::render(&handle) }))
            }
            None => routes,
        };
        http::finish(routes, self.app.clone())
    }

    /// The fencing marks, or `None` without fencing.
    pub fn mark_store(&self) -> Option<&MarkStore> {
        self.marks.as_ref()
    }

    /// The admin routes (list, read and reset marks; see the `admin` module's
    /// table in the crate docs), for a listener of their own: they have no
    /// authentication, so never merge them into [`router`](Self::router).
    /// `None` without fencing, and with PostgreSQL storage, whose marks live in
    /// the database (the layer's marks there are a per-process cache).
    pub fn admin_router(&self) -> Option<axum::Router> {
        match (&self.marks, &self.app.data) {
            (Some(marks), Backend::Redb(data)) => Some(admin::router(marks.clone(), Arc::clone(data))),
            _ => None,
        }
    }

    /// Serves [`admin_router`](Self::admin_router) on `listener` until
    /// `shutdown` completes (each request knows its peer, for the reset log).
    ///
    /// # Errors
    ///
    /// This resource has no admin routes (`InvalidInput`), or accepting
    /// connections failed.
    pub async fn serve_admin<F>(&self, listener: TcpListener, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(router) = self.admin_router() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no admin routes: they need fencing, and marks in this process (not --postgres)",
            ));
        };
        let service = router.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, service).with_graceful_shutdown(shutdown).await
    }

    /// How many writes to `resource` (a path such as `/logs/billing`) are inside
    /// their handler now: admitted by the layer and not yet answered.
    pub fn in_flight(&self, resource: &str) -> usize {
        self.app.in_flight.borrow().get(resource).copied().unwrap_or(0)
    }

    /// Waits until [`in_flight`](Self::in_flight) for `resource` is `count`.
    pub async fn wait_in_flight(&self, resource: &str, count: usize) {
        let mut watch = self.app.in_flight.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = watch.wait_for(|map| map.get(resource).copied().unwrap_or(0) == count).await;
    }

    /// Ends every `delay_ms` wait now in progress, as if the slow writes had
    /// reached the end of their delay: lets the scenario finish quickly without
    /// guessing how long its steps take.
    pub fn finish_delays(&self) {
        self.app.delays.send_modify(|epoch| *epoch += 1);
    }
}

/// A resource started by [`Served::spawn`]. Dropping it stops the server
/// without waiting; [`shutdown`](Running::shutdown) waits.
pub type RunningResource = Running<Resource>;

/// Its [`router`](Resource::router), in the foreground ([`Served::serve`]) or in
/// a background task ([`Served::spawn`]); nothing more to do once its server
/// has stopped.
impl Served for Resource {
    fn router(&self) -> axum::Router {
        Resource::router(self)
    }
}
