//! The mark store: the highest token seen for every key.
//!
//! [`MarkStore`] is a cheap, cloneable handle. Give the same handle to several
//! layers to share marks between them, and keep one for operators and tests:
//!
//! ```
//! use fencing_layer::{FencingLayer, MarkStore};
//!
//! let store = MarkStore::builder().max_keys(10_000).in_memory();
//! let layer = FencingLayer::new().store(store.clone());
//!
//! store.seed("/logs/billing", 41).unwrap();
//! assert_eq!(store.mark("/logs/billing"), Some(41));
//! assert_eq!(store.len(), 1);
//! # let _ = layer;
//! ```
//!
//! Marks are never evicted: a forgotten mark would readmit its stale holders.
//! When the table holds `max_keys` keys, requests for new keys get 503 while
//! known keys keep working.
//!
//! With a durable [`MarkLog`] (the `redb` feature provides one), a raise is
//! recorded before the raising request is admitted, and the marks are loaded
//! again when the store opens.

pub(crate) mod admission;
mod log;
#[cfg(all(test, loom))]
mod loom_model;
#[cfg(feature = "redb")]
mod redb;
#[cfg(feature = "redb")]
mod reopen;
mod shared;
pub(crate) mod sync;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;

use self::admission::{InsideGuard, KeyState, RecordDuty, ResetRefused};
pub use self::log::MarkLog;
#[cfg(feature = "redb")]
pub use self::redb::RedbMarkLog;
#[cfg(feature = "redb")]
pub use self::reopen::{REOPEN_INTERVAL, ReopeningDatabase, StorageFault};
pub(crate) use self::shared::ClaimedPlace;
pub use self::shared::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore};

/// How many keys a store tracks unless told otherwise.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The longest key a store takes unless told otherwise, in bytes. With
/// [`DEFAULT_MAX_KEYS`] this bounds the table at about 1 GiB in the worst case;
/// typical paths are far shorter (see `BENCHMARKS.md` for bytes per key).
pub const DEFAULT_MAX_KEY_BYTES: usize = 1024;

/// How long a request waits for the durable log to confirm its raise, unless told otherwise.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// A cloneable handle to the table of marks.
#[derive(Clone)]
pub struct MarkStore {
    table: Arc<Table>,
}

struct Table {
    // Randomly keyed per map: clients choose the keys (HashDoS).
    keys: DashMap<Box<str>, Arc<KeyState>, ahash::RandomState>,
    len: AtomicUsize,
    limits: MarkStoreBuilder,
    durable: Option<Durable>,
}

struct Durable {
    log: Arc<dyn MarkLog>,
    writer: log::Writer,
}

impl MarkStore {
    /// An in-memory store with the default key limit.
    #[must_use]
    pub fn in_memory() -> Self {
        Self::builder().in_memory()
    }

    /// Opens (or creates) a durable store in the redb file at `path`.
    ///
    /// # Errors
    ///
    /// The file cannot be opened ([`StoreError::Open`], naming it) or its marks
    /// cannot be read. The file is locked while the store lives, that is while
    /// any clone of the returned handle (or a layer holding one) does: opening
    /// it again meanwhile, here or in another process, is
    /// [`StoreError::AlreadyOpen`]. Drop every clone first to reopen it.
    #[cfg(feature = "redb")]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self, StoreError> {
        Self::builder().open(path)
    }

    /// A builder to set the key limit and the durable log.
    pub fn builder() -> MarkStoreBuilder {
        MarkStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }

    /// How many keys have a mark.
    #[must_use]
    pub fn len(&self) -> usize {
        self.table.len.load(Ordering::Relaxed)
    }

    /// Whether no key has a mark yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys the store takes before refusing new ones.
    #[must_use]
    pub fn max_keys(&self) -> usize {
        self.table.limits.max_keys
    }

    /// The longest key the store takes, in bytes.
    #[must_use]
    pub fn max_key_bytes(&self) -> usize {
        self.table.limits.max_key_bytes
    }

    /// How long a raise may wait for the durable log.
    pub(crate) fn write_timeout(&self) -> Duration {
        self.table.limits.write_timeout
    }

    /// Whether raises are recorded in a durable log.
    #[must_use]
    pub fn is_durable(&self) -> bool {
        self.table.durable.is_some()
    }

    /// Whether raises can be recorded now: always for a store in memory; for a
    /// durable one, whether its log is usable (a redb log closed after an I/O
    /// failure tries to reopen here). Known tokens are admitted either way;
    /// what a readiness route answers.
    ///
    /// # Errors
    ///
    /// Why raises would get 503 now.
    pub fn ready(&self) -> Result<(), StoreError> {
        match &self.table.durable {
            Some(durable) => durable.log.ready(),
            None => Ok(()),
        }
    }

    /// The highest token seen for `key`, if any request for it got this far:
    /// `None` for a key no request reached (its first raise is logged without
    /// an `old` value). A key can be tracked at 0 without a raise (a raise the
    /// verifier refused, or requests with token 0): then `Some(0)`.
    #[must_use]
    pub fn mark(&self, key: &str) -> Option<u64> {
        self.table.keys.get(key).map(|state| state.mark())
    }

    /// Every key and its mark, sorted by key: what an operator lists.
    #[must_use]
    pub fn marks(&self) -> Vec<(String, u64)> {
        let mut marks: Vec<(String, u64)> =
            self.table.keys.iter().map(|entry| (entry.key().to_string(), entry.value().mark())).collect();
        marks.sort_unstable();
        marks
    }

    /// Sets the mark of `key` to `to`, lower or higher, and returns the old
    /// mark (`None` for a key never seen): the deliberate repair of a key that
    /// a forged or foreign token bricked, or of every key after a lock-service
    /// migration whose counter starts over. Logged at `warn` with the key, the
    /// old and the new mark.
    ///
    /// Lowering a mark readmits the tokens between `to` and the old mark:
    /// only reset once their holders are gone. Requests inside stay inside
    /// and no other token joins them; the rules carry on from `to`.
    ///
    /// With a durable log this writes to it on the calling thread (from async
    /// code, call it inside `spawn_blocking`), under the key's lock.
    ///
    /// ```
    /// use fencing_layer::MarkStore;
    ///
    /// let store = MarkStore::in_memory();
    /// store.seed("/logs/billing", u64::MAX).unwrap(); // a forged token got in
    /// assert_eq!(store.reset("/logs/billing", 41).unwrap(), Some(u64::MAX));
    /// assert_eq!(store.mark("/logs/billing"), Some(41));
    /// ```
    ///
    /// # Errors
    ///
    /// A raise of the key is being recorded right now ([`StoreError::Busy`]:
    /// try again), the log could not write the new mark (nothing changed),
    /// or the key is new and the table is full.
    pub fn reset(&self, key: &str, to: u64) -> Result<Option<u64>, StoreError> {
        let known = self.table.keys.contains_key(key);
        let state = self.key_state(key)?;
        let write = || match &self.table.durable {
            Some(durable) => durable.log.reset(key, to),
            None => Ok(()),
        };
        let old = state.reset(to, write).map_err(|refused| match refused {
            ResetRefused::Recording => StoreError::Busy,
            ResetRefused::Log(error) => error,
        })?;
        tracing::warn!(key = ?key, old, new = to, "fencing mark reset");
        Ok(known.then_some(old))
    }

    /// Raises the mark of `key` to at least `token` and returns the mark, as if
    /// a request with `token` had arrived (in-flight requests are not waited for).
    ///
    /// With a durable log this writes to it on the calling thread: from async
    /// code, call it inside `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// The key table is full, or the log could not record the mark.
    pub fn seed(&self, key: &str, token: u64) -> Result<u64, StoreError> {
        let state = self.key_state(key)?;
        if let Some(durable) = &self.table.durable {
            durable.log.record(&[(key, token)])?;
        }
        Ok(state.seed(token))
    }

    /// A place inside for `token` if the fast path admits it, else the key's
    /// state for [`KeyState::admit_raising`]. The hit path takes a shard read lock,
    /// allocates nothing, and drops the guard before returning.
    #[inline(always)]
    pub(crate) fn find(&self, key: &str, token: u64) -> Result<Found, StoreError> {
        if let Some(state) = self.table.keys.get(key) {
            return Ok(match state.try_enter(token) {
                Some(guard) => Found::Entered(guard),
                None => Found::Slow(Arc::clone(&state)),
            });
        }
        self.insert(key).map(Found::Slow)
    }

    /// The state of `key`, created on first sight.
    pub(crate) fn key_state(&self, key: &str) -> Result<Arc<KeyState>, StoreError> {
        if let Some(state) = self.table.keys.get(key) {
            return Ok(Arc::clone(&state));
        }
        self.insert(key)
    }

    /// The miss path: the state of a key not found a moment ago (another
    /// request may have created it since), within the table's limits.
    fn insert(&self, key: &str) -> Result<Arc<KeyState>, StoreError> {
        let max_key_bytes = self.table.limits.max_key_bytes;
        if key.len() > max_key_bytes {
            return Err(StoreError::KeyTooLong { limit: max_key_bytes });
        }
        match self.table.keys.entry(key.into()) {
            Entry::Occupied(entry) => Ok(Arc::clone(entry.get())),
            Entry::Vacant(entry) => {
                let limit = self.table.limits.max_keys;
                self.table
                    .len
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < limit).then_some(n + 1))
                    .map_err(|_| StoreError::KeyTableFull { limit })?;
                Ok(Arc::clone(entry.insert(Arc::new(KeyState::new(0))).value()))
            }
        }
    }

    /// Hands a raise to the log writer.
    pub(crate) fn record(
        &self,
        key: &str,
        mut duty: RecordDuty,
    ) -> oneshot::Receiver<Result<(), StoreError>> {
        if let Some(durable) = &self.table.durable {
            return durable.writer.submit(key, duty);
        }
        // Unreachable in practice: admission asks to record only for durable stores.
        duty.succeeded();
        drop(duty);
        let (reply, answer) = oneshot::channel();
        let _ = reply.send(Ok(()));
        answer
    }
}

/// What [`MarkStore::find`] found for a request.
pub(crate) enum Found {
    /// Admitted on the fast path.
    Entered(InsideGuard),
    /// Ask [`KeyState::admit_raising`].
    Slow(Arc<KeyState>),
}

impl Default for MarkStore {
    fn default() -> Self {
        Self::in_memory()
    }
}

impl fmt::Debug for MarkStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MarkStore")
            .field("len", &self.len())
            .field("max_keys", &self.max_keys())
            .field("durable", &self.is_durable())
            .finish_non_exhaustive()
    }
}

/// Configures a [`MarkStore`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MarkStoreBuilder {
    max_keys: usize,
    max_key_bytes: usize,
    write_timeout: Duration,
}

impl MarkStoreBuilder {
    /// The most keys to track; new keys past it get 503 (default [`DEFAULT_MAX_KEYS`]).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The longest key to track, in bytes; a request with a longer new key gets
    /// 400 (default [`DEFAULT_MAX_KEY_BYTES`]). Together with `max_keys` this
    /// bounds the table's memory.
    pub fn max_key_bytes(mut self, max_key_bytes: usize) -> Self {
        self.max_key_bytes = max_key_bytes;
        self
    }

    /// How long a raise waits for the durable log before it gets 503 (default
    /// [`DEFAULT_WRITE_TIMEOUT`]): the request writing it, and every request with
    /// the same token waiting for that write. The drain bound starts after the
    /// write. Any duration up to `Duration::MAX` is valid.
    pub fn write_timeout(mut self, write_timeout: Duration) -> Self {
        self.write_timeout = write_timeout;
        self
    }

    /// A store that keeps marks in memory only.
    pub fn in_memory(self) -> MarkStore {
        self.build(None)
    }

    /// A store that records every raise in `log` before admitting it, starting
    /// from the marks `log` holds. Loaded keys count toward the limit but are
    /// all kept, even past it.
    ///
    /// # Errors
    ///
    /// The log's marks cannot be loaded, or the writer thread cannot start.
    pub fn durable(self, log: impl MarkLog) -> Result<MarkStore, StoreError> {
        let log: Arc<dyn MarkLog> = Arc::new(log);
        let marks = log.load()?;
        let writer = log::Writer::spawn(Arc::clone(&log))?;
        let store = self.build(Some(Durable { log, writer }));
        for (key, mark) in marks {
            store.table.keys.insert(key.into_boxed_str(), Arc::new(KeyState::new(mark)));
        }
        store.table.len.store(store.table.keys.len(), Ordering::Relaxed);
        Ok(store)
    }

    /// A durable store in the redb file at `path`, created if missing.
    ///
    /// # Errors
    ///
    /// The file cannot be opened ([`StoreError::Open`], naming it) or its marks
    /// cannot be read. The file is locked while the store lives, that is while
    /// any clone of the returned handle (or a layer holding one) does: opening
    /// it again meanwhile, here or in another process, is
    /// [`StoreError::AlreadyOpen`]. Drop every clone first to reopen it.
    #[cfg(feature = "redb")]
    pub fn open(self, path: impl AsRef<std::path::Path>) -> Result<MarkStore, StoreError> {
        self.durable(RedbMarkLog::open(path)?)
    }

    fn build(self, durable: Option<Durable>) -> MarkStore {
        MarkStore {
            table: Arc::new(Table {
                keys: DashMap::default(),
                len: AtomicUsize::new(0),
                limits: self,
                durable,
            }),
        }
    }
}

/// What went wrong in the mark store.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreError {
    /// The key table is full and the key is new.
    KeyTableFull {
        /// The table's capacity.
        limit: usize,
    },
    /// The key is longer than the store takes.
    KeyTooLong {
        /// The longest key the store takes, in bytes.
        limit: usize,
    },
    /// The durable log did not confirm the write in time.
    Timeout(Duration),
    /// The durable log failed.
    Log(Arc<dyn std::error::Error + Send + Sync>),
    /// The log writer has stopped.
    Closed,
    /// A raise of the key is being recorded; a reset has to wait for it.
    Busy,
    /// The durable log's file is locked by another handle: a [`MarkStore`]
    /// (any clone of it, or a layer holding one) still alive in this process,
    /// or another process.
    AlreadyOpen {
        /// The file.
        path: PathBuf,
    },
    /// The durable log's file could not be opened or created.
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        error: Arc<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// Wraps a durable log's error.
    pub fn log(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Log(Arc::new(error))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KeyTableFull { limit } => write!(f, "the key table is full ({limit} keys)"),
            Self::KeyTooLong { limit } => write!(f, "the key is longer than {limit} bytes"),
            Self::Timeout(after) => write!(f, "the mark log did not confirm the write within {after:?}"),
            Self::Log(error) => write!(f, "the mark log failed: {error}"),
            Self::Closed => f.write_str("the mark log writer has stopped"),
            Self::Busy => f.write_str("a raise of this key is being recorded; try again"),
            Self::AlreadyOpen { path } => write!(
                f,
                "cannot open the mark store {}: it is already open, by a MarkStore in this process \
                 (the file stays locked while any clone of it lives) or by another process",
                path.display()
            ),
            Self::Open { path, error } => write!(f, "cannot open the mark store {}: {error}", path.display()),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Log(error) | Self::Open { error, .. } => Some(&**error),
            _ => None,
        }
    }
}

impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::KeyTableFull { limit: a }, Self::KeyTableFull { limit: b }) => a == b,
            (Self::KeyTooLong { limit: a }, Self::KeyTooLong { limit: b }) => a == b,
            (Self::Timeout(a), Self::Timeout(b)) => a == b,
            (Self::Log(a), Self::Log(b)) => Arc::ptr_eq(a, b) || a.to_string() == b.to_string(),
            (Self::Closed, Self::Closed) | (Self::Busy, Self::Busy) => true,
            (Self::AlreadyOpen { path: a }, Self::AlreadyOpen { path: b }) => a == b,
            (Self::Open { path: a, error: x }, Self::Open { path: b, error: y }) => {
                a == b && (Arc::ptr_eq(x, y) || x.to_string() == y.to_string())
            }
            _ => false,
        }
    }
}

impl Eq for StoreError {}
