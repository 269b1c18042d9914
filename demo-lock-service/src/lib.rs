//! A demo HTTP lease service that issues durable, strictly increasing fencing tokens.
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
//! * Expiry is decided on tokio's monotonic [`Instant`] (so tests can pause time).
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

mod http;
mod metrics;
mod shutdown;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use crate::metrics::install_prometheus;
pub use fencing_layer::verify::ProofSigner;
use metrics_exporter_prometheus::PrometheusHandle;
pub use shutdown::shutdown_signal;
use store::{Store, StoreError};

/// Longest accepted lock name or holder, in bytes (UTF-8).
pub const MAX_NAME_BYTES: usize = 256;
/// Largest accepted request body, in bytes; a larger body gets 413.
pub const MAX_BODY_BYTES: usize = 4096;
/// Default longest TTL a client may ask for: one hour.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(3600);

/// Default bound on leases held at once ([`Config::max_leases`]).
pub const DEFAULT_MAX_LEASES: usize = 100_000;

/// At most this many expired leases are forgotten per grant.
const SWEEP_PER_GRANT: usize = 64;

/// `Retry-After` of a refusal for a full lease table is at most this long: a release
/// can free a slot before the earliest expiry.
const FULL_RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

const CLOSED: &str = "the lock service is shut down";

/// Configuration of a [`LockService`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory holding the durable state (`locks.redb`); created if missing.
    pub data_dir: PathBuf,
    /// Longest TTL a client may ask for; longer requests get 400.
    pub max_ttl: Duration,
    /// Most leases held at once; a grant that needs one more gets 503 (a live lease
    /// is never evicted). Leases restored at start-up count, even past the bound.
    pub max_leases: usize,
    /// Signs every grant's (lock name, token) when set: the grant's `proof`.
    pub signer: Option<ProofSigner>,
    /// Serves `GET /metrics` (Prometheus text) from this handle when set; see [`install_prometheus`].
    pub metrics: Option<PrometheusHandle>,
}

impl Config {
    /// A configuration with the given data directory, the default maximum TTL, the
    /// default bound on leases and no signing key.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Config {
            data_dir: data_dir.into(),
            max_ttl: DEFAULT_MAX_TTL,
            max_leases: DEFAULT_MAX_LEASES,
            signer: None,
            metrics: None,
        }
    }

    /// Serves `GET /metrics` from `handle`: grants, conflicts, expiries,
    /// keepalives and releases, as counted by the recorder it belongs to.
    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        metrics::describe();
        self.metrics = Some(handle);
        self
    }

    /// Sets the most leases held at once.
    pub fn with_max_leases(mut self, max_leases: usize) -> Self {
        self.max_leases = max_leases;
        self
    }

    /// Signs every grant with `signer` (see [`Grant::proof`]).
    pub fn with_signer(mut self, signer: ProofSigner) -> Self {
        self.signer = Some(signer);
        self
    }

    /// Sets the longest TTL a client may ask for.
    pub fn with_max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }
}

/// A successful acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The capability to keep alive or release this lease (32 hex characters, 128 random bits).
    pub lease_id: String,
    /// The lock's name.
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// The fencing token: higher than every token issued before.
    pub token: u64,
    /// The lease's time to live.
    pub ttl: Duration,
    /// With a signing key: [`ProofSigner::sign`] of (`name`, `token`), the value a
    /// client sends as `Fencing-Proof`.
    pub proof: Option<String>,
}

/// A successful keepalive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The lease renewed.
    pub lease_id: String,
    /// Its token (unchanged by renewals).
    pub token: u64,
    /// Its TTL; the lease now expires this long after the renewal was handled.
    pub ttl: Duration,
}

/// The public view of a held lock (no `lease_id`: that is the holder's capability).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    /// The lock's name.
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// The token of the current grant.
    pub token: u64,
    /// Time left until the lease expires unless renewed.
    pub expires_in: Duration,
}

/// The answer of [`LockService::check_token`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenCheck {
    /// The lock is held right now, unexpired, under exactly this token.
    Live {
        /// Time left on the lease unless renewed.
        expires_in: Duration,
    },
    /// The lock is not held: never acquired, released, or its lease expired.
    Free,
    /// The lock is held under another token (higher or lower).
    OtherToken,
}

impl TokenCheck {
    /// Whether the token is the lock's current, live grant.
    pub fn is_valid(&self) -> bool {
        matches!(self, TokenCheck::Live { .. })
    }
}

/// Why an acquisition failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The request is invalid (empty or too long name/holder, bad TTL, ...).
    Invalid(String),
    /// Another holder has a live lease on the lock.
    Held {
        /// The current holder.
        holder: String,
        /// Time left on its lease.
        expires_in: Duration,
    },
    /// [`Config::max_leases`] leases are held and none has expired; nothing was granted.
    Full {
        /// The bound.
        max_leases: usize,
        /// When to try again: until the earliest live lease expires, at most a minute.
        retry_after: Duration,
    },
    /// The durable store failed or the token counter is exhausted; nothing was granted.
    Unavailable(String),
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Invalid(d) => write!(f, "invalid request: {d}"),
            AcquireError::Held { holder, expires_in } => {
                write!(f, "held by {holder:?} for another {expires_in:?}")
            }
            AcquireError::Full { max_leases, .. } => {
                write!(f, "{max_leases} leases are held, the most this service keeps")
            }
            AcquireError::Unavailable(d) => write!(f, "unavailable: {d}"),
        }
    }
}

impl std::error::Error for AcquireError {}

/// Why [`LockService::open`] failed.
#[derive(Debug)]
pub struct OpenError(String);

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot open the lock service store: {}", self.0)
    }
}

impl std::error::Error for OpenError {}

/// A storage failure while releasing; the lease may or may not still be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageError(String);

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "storage error: {}", self.0)
    }
}

impl std::error::Error for StorageError {}

/// A lease id: 128 random bits, shown as 32 lowercase hex characters.
type LeaseId = u128;

/// A lease in memory (live, or expired and not yet forgotten).
#[derive(Debug)]
struct Live {
    lease_id: LeaseId,
    holder: Box<str>,
    token: u64,
    ttl: Duration,
    expires: Instant,
}

/// The in-memory lock table. Only ever locked for short, await-free sections.
///
/// One entry per lease in each map; the name is shared (`Arc<str>`), so a lease
/// costs its name and holder once plus a fixed overhead (BENCHMARKS.md §9).
#[derive(Debug, Default)]
struct Table {
    /// lock name → its current (possibly expired) lease.
    by_name: HashMap<Arc<str>, Live>,
    /// lease id → lock name.
    by_id: HashMap<LeaseId, Arc<str>>,
    /// (expiry, token) → lock name, earliest expiry first: expired leases are found
    /// without a scan. Tokens are unique, so keys are too.
    by_expiry: BTreeMap<(Instant, u64), Arc<str>>,
}

impl Table {
    fn insert(&mut self, name: Arc<str>, live: Live) {
        self.by_id.insert(live.lease_id, Arc::clone(&name));
        self.by_expiry.insert((live.expires, live.token), Arc::clone(&name));
        if let Some(old) = self.by_name.insert(name, live) {
            self.by_id.remove(&old.lease_id);
            self.by_expiry.remove(&(old.expires, old.token));
        }
    }

    fn remove_by_id(&mut self, lease_id: LeaseId) -> Option<(Arc<str>, Live)> {
        let name = self.by_id.remove(&lease_id)?;
        let live = self.by_name.remove(&name)?;
        self.by_expiry.remove(&(live.expires, live.token));
        Some((name, live))
    }

    /// Moves the expiry of `name`'s lease to `expires`.
    fn renew(&mut self, name: &Arc<str>, expires: Instant) {
        if let Some(live) = self.by_name.get_mut(name) {
            if let Some(n) = self.by_expiry.remove(&(live.expires, live.token)) {
                self.by_expiry.insert((expires, live.token), n);
            }
            live.expires = expires;
        }
    }

    /// Up to `limit` leases expired at `now`, earliest first: (name, lease id).
    fn expired(&self, now: Instant, limit: usize) -> Vec<(Arc<str>, LeaseId)> {
        self.by_expiry
            .iter()
            .take_while(|((expires, _), _)| *expires <= now)
            .take(limit)
            .filter_map(|(_, name)| self.by_name.get(name).map(|l| (Arc::clone(name), l.lease_id)))
            .collect()
    }

    /// The earliest expiry after `now`, if any lease is live.
    fn next_expiry(&self, now: Instant) -> Option<Instant> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.by_expiry.range((Excluded((now, u64::MAX)), Unbounded)).next().map(|((e, _), _)| *e)
    }
}

#[derive(Debug)]
struct Inner {
    config: Config,
    /// Serialises every change of ownership (grant, release): holding it, the
    /// "is the lock free?" decision stays true until the grant is recorded.
    /// Only ever locked on a blocking thread, never across an `.await`.
    /// `None` once [`LockService::close`] ran.
    writer: Mutex<Option<Store>>,
    table: Mutex<Table>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The protected sections leave the data consistent at every step, so a
    // panic elsewhere does not make the state unusable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock service: a cheap, cloneable handle to shared state.
#[derive(Debug, Clone)]
pub struct LockService {
    inner: Arc<Inner>,
}

impl LockService {
    /// Opens the store in `config.data_dir` and restores the leases recorded there,
    /// each expiring its full TTL after now. Fails if another `LockService` (in this
    /// or another process) has the same data directory open.
    pub fn open(config: Config) -> Result<Self, OpenError> {
        let loaded = Store::open(&config.data_dir).map_err(|e| OpenError(e.to_string()))?;
        let now = Instant::now();
        let mut table = Table::default();
        for (name, lease) in loaded.leases {
            let Some(lease_id) = parse_lease_id(&lease.lease_id) else {
                return Err(OpenError(format!("corrupt lease id {:?} for lock {name:?}", lease.lease_id)));
            };
            let ttl = Duration::from_millis(lease.ttl_ms);
            tracing::info!(
                name,
                holder = lease.holder,
                token = lease.token,
                ttl_ms = lease.ttl_ms,
                "restored lease"
            );
            table.insert(
                name.into(),
                Live {
                    lease_id,
                    holder: lease.holder.into(),
                    token: lease.token,
                    ttl,
                    expires: expiry(now, ttl),
                },
            );
        }
        Ok(LockService {
            inner: Arc::new(Inner {
                config,
                writer: Mutex::new(Some(loaded.store)),
                table: Mutex::new(table),
            }),
        })
    }

    /// The configuration the service was opened with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Acquires lock `name` for `holder` for `ttl`.
    ///
    /// Succeeds if the lock is free, its lease has expired, or `holder` already holds
    /// it (then the old lease is replaced). The token is durably recorded before this
    /// returns. Concurrent calls for the same free lock: exactly one succeeds.
    pub async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, AcquireError> {
        self.validate(name, holder, ttl)?;
        let now = Instant::now();
        let inner = Arc::clone(&self.inner);
        let (name, holder) = (name.to_owned(), holder.to_owned());
        // A blocking task runs to completion even if the caller goes away, so memory
        // and disk never disagree about a grant that was committed.
        tokio::task::spawn_blocking(move || inner.acquire_blocking(now, name, holder, ttl))
            .await
            .map_err(|e| AcquireError::Unavailable(e.to_string()))?
    }

    fn validate(&self, name: &str, holder: &str, ttl: Duration) -> Result<(), AcquireError> {
        check_text("name", name)?;
        check_text("holder", holder)?;
        let max = self.inner.config.max_ttl.min(CENTURY);
        if ttl.is_zero() || ttl > max {
            return Err(AcquireError::Invalid(format!("ttl_ms must be between 1 and {}", max.as_millis())));
        }
        Ok(())
    }

    /// Renews lease `lease_id`: it now expires its TTL from now. `None` if the lease
    /// is expired, released, replaced or unknown. No disk I/O.
    pub fn keepalive(&self, lease_id: &str) -> Option<Renewal> {
        let id = parse_lease_id(lease_id)?;
        let now = Instant::now();
        let mut table = lock(&self.inner.table);
        let name = Arc::clone(table.by_id.get(&id)?);
        let live = table.by_name.get(&name)?;
        if live.lease_id != id || live.expires <= now {
            return None;
        }
        let (token, ttl) = (live.token, live.ttl);
        table.renew(&name, expiry(now, ttl));
        metrics::kept_alive();
        Some(Renewal { lease_id: lease_id.to_owned(), token, ttl })
    }

    /// Releases lease `lease_id` (durably). `Ok(true)` if it was live and is now
    /// released; `Ok(false)` if it was expired, released, replaced or unknown (an
    /// expired lease's record is cleaned up all the same).
    pub async fn release(&self, lease_id: &str) -> Result<bool, StorageError> {
        let Some(lease_id) = parse_lease_id(lease_id) else {
            return Ok(false);
        };
        let now = Instant::now();
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.release_blocking(now, lease_id))
            .await
            .map_err(|e| StorageError(e.to_string()))?
    }

    /// Whether the store takes grants now: what `GET /readyz` answers. After a
    /// disk failure the store is closed and reopened from the file by itself;
    /// this call tries a reopen that is due. Blocks behind a grant being written.
    ///
    /// # Errors
    ///
    /// Why grants would fail now (503).
    pub async fn ready(&self) -> Result<(), StorageError> {
        let inner = Arc::clone(&self.inner);
        let ready = tokio::task::spawn_blocking(move || match lock(&inner.writer).as_ref() {
            Some(store) => store.ready().map_err(|e| StorageError(e.to_string())),
            None => Err(StorageError(CLOSED.into())),
        });
        ready.await.map_err(|e| StorageError(e.to_string()))?
    }

    /// The current holder of lock `name`, or `None` if it is free.
    pub fn lock_status(&self, name: &str) -> Option<LockStatus> {
        let now = Instant::now();
        let table = lock(&self.inner.table);
        let live = table.by_name.get(name)?;
        if live.expires <= now {
            return None;
        }
        Some(LockStatus {
            name: name.to_owned(),
            holder: live.holder.to_string(),
            token: live.token,
            expires_in: live.expires - now,
        })
    }

    /// Whether `token` is the current, live grant of lock `name` (Chubby's
    /// CheckSequencer). A resource asks this before letting `token` raise its mark:
    /// a forged higher token is never a live grant, and a holder whose lease has
    /// lapsed may not raise a mark either. (A stale token is refused by the
    /// resource's own mark; it never needs asking.) No disk I/O.
    pub fn check_token(&self, name: &str, token: u64) -> TokenCheck {
        let now = Instant::now();
        let table = lock(&self.inner.table);
        match table.by_name.get(name) {
            Some(live) if live.expires > now && live.token == token => {
                TokenCheck::Live { expires_in: live.expires - now }
            }
            Some(live) if live.expires > now => TokenCheck::OtherToken,
            _ => TokenCheck::Free,
        }
    }

    /// Leases in memory: the held ones, and expired ones not yet forgotten (at most
    /// [`Config::max_leases`] in all, unless more were restored at start-up).
    pub fn leases_in_memory(&self) -> usize {
        lock(&self.inner.table).by_name.len()
    }

    /// Closes the durable store, so the data directory can be opened again (by a
    /// restart in this process, say) even while clones of this handle are still
    /// around. Afterwards acquisitions and releases fail as unavailable (503);
    /// keepalives and reads still answer from memory. Blocks while a grant or
    /// release is being written.
    pub fn close(&self) {
        let store = lock(&self.inner.writer).take();
        if store.is_some() {
            tracing::info!(data_dir = %self.inner.config.data_dir.display(), "store closed");
        }
    }

    /// The HTTP routes of the service (see the crate docs).
    pub fn router(&self) -> axum::Router {
        http::router(self.clone())
    }

    /// Serves the routes on `listener` until `shutdown` completes, then waits for
    /// open connections to finish.
    pub async fn serve<F>(&self, listener: TcpListener, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).await
    }

    /// Binds `addr` (use `127.0.0.1:0` for a free port) and serves in a background
    /// task. Once the returned [`RunningService`] is shut down (or dropped), the
    /// store is closed and the data directory can be opened again.
    pub async fn spawn(self, addr: SocketAddr) -> std::io::Result<RunningService> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let service = self.clone();
        let task = tokio::spawn(async move {
            self.serve(listener, async {
                let _ = rx.await;
            })
            .await
        });
        tracing::info!(%addr, "lock service listening");
        Ok(RunningService { addr, service, shutdown: Some(tx), task })
    }
}

impl Inner {
    fn acquire_blocking(
        &self,
        now: Instant,
        name: String,
        holder: String,
        ttl: Duration,
    ) -> Result<Grant, AcquireError> {
        let guard = lock(&self.writer);
        let Some(store) = guard.as_ref() else {
            return Err(AcquireError::Unavailable(CLOSED.into()));
        };
        let (name, expired): (Arc<str>, Vec<(Arc<str>, LeaseId)>) = {
            let table = lock(&self.table);
            let current = table.by_name.get_key_value(name.as_str());
            if let Some((_, cur)) = current
                && cur.expires > now
                && *cur.holder != *holder
            {
                metrics::conflicted();
                return Err(AcquireError::Held {
                    holder: cur.holder.to_string(),
                    expires_in: cur.expires - now,
                });
            }
            // Expired leases, earliest first, forgotten in the same transaction, so
            // abandoned locks neither pile up nor block again after a restart.
            // (Nothing can revive them: a keepalive at or after `now` finds them expired.)
            let expired = table.expired(now, SWEEP_PER_GRANT);
            // Fail closed: a grant that needs a new slot when every slot holds a live
            // lease is refused; no live lease is ever evicted.
            let replaces = current.is_some();
            if !replaces && table.by_name.len() - expired.len() >= self.config.max_leases {
                let retry_after = table
                    .next_expiry(now)
                    .map_or(FULL_RETRY_AFTER_MAX, |e| (e - now).min(FULL_RETRY_AFTER_MAX));
                tracing::warn!(name, max_leases = self.config.max_leases, "lease table full");
                return Err(AcquireError::Full { max_leases: self.config.max_leases, retry_after });
            }
            let name = current.map_or_else(|| Arc::from(name), |(n, _)| Arc::clone(n));
            (name, expired)
        };
        // Nothing else can grant or release while `store` is locked, so the lock is
        // still ours to grant.
        let lease_id = new_lease_id().map_err(AcquireError::Unavailable)?;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let expired_names: Vec<&str> = expired.iter().map(|(n, _)| &**n).collect();
        let token =
            store.grant(&name, &format_lease_id(lease_id), &holder, ttl_ms, &expired_names).map_err(|e| {
                tracing::error!(error = %e, %name, "grant not recorded");
                match e {
                    StoreError::Exhausted => AcquireError::Unavailable(e.to_string()),
                    StoreError::Db(d) => AcquireError::Unavailable(d),
                }
            })?;
        {
            let mut table = lock(&self.table);
            for (_, old_id) in &expired {
                table.remove_by_id(*old_id);
            }
            table.insert(
                Arc::clone(&name),
                Live { lease_id, holder: holder.as_str().into(), token, ttl, expires: expiry(now, ttl) },
            );
        }
        drop(guard);
        if !expired.is_empty() {
            tracing::debug!(forgotten = expired.len(), "expired leases forgotten");
            metrics::expired(expired.len());
        }
        metrics::granted();
        tracing::info!(%name, holder, token, ttl_ms, "granted");
        let proof = self.config.signer.as_ref().map(|s| s.sign(&name, token));
        Ok(Grant { lease_id: format_lease_id(lease_id), name: name.to_string(), holder, token, ttl, proof })
    }

    fn release_blocking(&self, now: Instant, lease_id: LeaseId) -> Result<bool, StorageError> {
        let guard = lock(&self.writer);
        let Some(store) = guard.as_ref() else {
            return Err(StorageError(CLOSED.into()));
        };
        let (name, live) = {
            let table = lock(&self.table);
            let Some(name) = table.by_id.get(&lease_id) else {
                return Ok(false);
            };
            let Some(live) = table.by_name.get(name) else {
                return Ok(false);
            };
            (Arc::clone(name), live.expires > now)
        };
        store.remove(&name).map_err(|e| StorageError(e.to_string()))?;
        lock(&self.table).remove_by_id(lease_id);
        drop(guard);
        tracing::info!(%name, live, "released");
        if live {
            metrics::released();
        } else {
            metrics::expired(1);
        }
        Ok(live)
    }
}

/// A service started by [`LockService::spawn`].
#[derive(Debug)]
pub struct RunningService {
    addr: SocketAddr,
    service: LockService,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningService {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The service being served.
    pub fn service(&self) -> &LockService {
        &self.service
    }

    /// Stops accepting connections, waits for open ones to finish, then closes the
    /// store ([`LockService::close`]): the data directory can be opened again at once.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let served = match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        };
        self.service.close();
        served
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        // Dropped without `shutdown`: stop accepting at once and close the store
        // (requests still in flight on open connections then fail with 503).
        self.task.abort();
        self.service.close();
    }
}

pub(crate) fn check_text(field: &str, value: &str) -> Result<(), AcquireError> {
    if value.is_empty() {
        return Err(AcquireError::Invalid(format!("{field} must not be empty")));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(AcquireError::Invalid(format!("{field} must be at most {MAX_NAME_BYTES} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(AcquireError::Invalid(format!("{field} must not contain control characters")));
    }
    Ok(())
}

/// 128 random bits from the OS.
fn new_lease_id() -> Result<LeaseId, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a lease id: {e}"))?;
    Ok(u128::from_be_bytes(bytes))
}

/// A lease id as clients see it: 32 lowercase hex characters.
fn format_lease_id(id: LeaseId) -> String {
    format!("{id:032x}")
}

/// The lease id written as 32 lowercase hex characters; `None` for anything else
/// (no lease has such an id).
fn parse_lease_id(s: &str) -> Option<LeaseId> {
    if s.len() != 32 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// No TTL is accepted above this, whatever `max_ttl` says, so instants never overflow.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + ttl`; `ttl` is at most a [`CENTURY`] (validated), which cannot overflow a
/// monotonic clock counted from boot.
fn expiry(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl.min(CENTURY)).unwrap_or(now)
}

/// Milliseconds in `d`, rounded up (so a live lease never shows 0).
pub(crate) fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
