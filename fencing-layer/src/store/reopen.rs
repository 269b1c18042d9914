//! A redb database that closes itself after an I/O failure and reopens once
//! the disk works again: the one place where a failed write is recovered from.
//!
//! redb latches the first failed write or fsync: every later operation answers
//! `Previous I/O error occurred. Please close and re-open the database`. A
//! process that only logs that error is a zombie: it answers 503 forever while
//! looking alive. [`ReopeningDatabase`] does what the message asks.
//!
//! # Why reopen, and why that is honest
//!
//! After a failed `fsync` nobody knows what the file holds. Linux may have
//! dropped the dirty pages or marked them clean, so a second `fsync` can
//! succeed without the data ever reaching the disk (PostgreSQL's 2018
//! "fsyncgate"). Retrying the failed commit on the same handle would build on
//! that unknown state. PostgreSQL's answer is to stop and recover from what is
//! on disk; this module does the same without stopping the process:
//!
//! 1. **Close** on the first I/O failure ([`redb::Error::Io`],
//!    [`PreviousIo`](redb::Error::PreviousIo) or
//!    [`Corrupted`](redb::Error::Corrupted)). The failing operation's caller
//!    gets the error and acknowledges nothing; later callers get
//!    [`StorageFault::Closed`] at once, until the reopen succeeds.
//! 2. **Reopen** from the file: redb's open sees a file that was not closed
//!    cleanly and repairs it, checking the checksums of the newest commit and
//!    falling back to the one before if they do not match. Every acknowledged
//!    commit had a successful `fsync`, so it is in what redb finds; the commit
//!    whose `fsync` failed was never acknowledged, so finding it or not breaks
//!    no promise.
//! 3. **Re-read**: the caller's `recheck` reads back what it relies on (every
//!    mark, the token counter) before the database is used again. A repair or
//!    a re-read that fails, because the fault is still there, leaves the
//!    database closed.
//!
//! A reopen is tried by the first operation or [`ready`](ReopeningDatabase::ready)
//! call at least [`REOPEN_INTERVAL`] after the previous try, so a cleared fault
//! is recovered from within that interval of the next request or readiness
//! probe, and a lasting one costs one repair attempt per interval, not one per
//! request. [`ready`](ReopeningDatabase::ready) is what a readiness route
//! answers: the process stays alive (liveness) while it is not ready.
//!
//! Exiting instead, for a supervisor to restart the process, would recover the
//! same way (redb's repair at the next open), but would drop every connection
//! and in-memory state such as the lock service's leases' timers, for a fault
//! that often clears in seconds (a full disk, a storage path failover).
//!
//! What neither can see: a reopen reads through the kernel's page cache, which
//! may still hold pages of the failed commit that never reached the disk. They
//! were never acknowledged, so using them breaks no promise now; a power cut
//! before they are written again could still lose them, or tear the file
//! (PostgreSQL replays its WAL for this; redb has none). libfiu, which the
//! tests use, fails the call without losing data, so this case is not tested.
//!
//! ```
//! use std::path::Path;
//!
//! use fencing_layer::store::ReopeningDatabase;
//! use redb::{Database, ReadableDatabase, TableDefinition};
//!
//! const T: TableDefinition<'_, &str, u64> = TableDefinition::new("t");
//! let dir = tempfile::tempdir().unwrap();
//! let open = |path: &Path| Database::create(path);
//! // What a reopen re-reads before the database is used again.
//! let recheck = |db: &Database| db.begin_read().map(drop).map_err(redb::Error::from);
//! let db = ReopeningDatabase::open(dir.path().join("t.redb"), open, recheck).unwrap();
//! db.run(|db| {
//!     let txn = db.begin_write()?;
//!     txn.open_table(T)?.insert("a", 1)?;
//!     Ok(txn.commit()?)
//! })
//! .unwrap();
//! assert!(db.ready().is_ok());
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use redb::Database;

/// The least time between two reopen attempts.
pub const REOPEN_INTERVAL: Duration = Duration::from_millis(250);

type OpenFn = Box<dyn Fn(&Path) -> Result<Database, redb::DatabaseError> + Send + Sync>;
type RecheckFn = Box<dyn Fn(&Database) -> Result<(), redb::Error> + Send + Sync>;

/// A redb [`Database`] that closes after an I/O failure and reopens from the
/// file. Why reopening is the honest recovery: the module docs of
/// `fencing-layer/src/store/reopen.rs`, also in `docs/operating-marks.md`.
pub struct ReopeningDatabase {
    state: RwLock<State>,
    // `None` for a database that cannot be reopened (in memory): never closed.
    reopen: Option<Reopen>,
}

struct Reopen {
    path: PathBuf,
    open: OpenFn,
    recheck: RecheckFn,
}

struct State {
    db: Option<Database>,
    // Bumped at every reopen, so a failure on an old handle never closes a new one.
    generation: u64,
    // Why the database is closed (the failure, then the last reopen's error).
    cause: String,
    next_try: Instant,
}

/// Why an operation on a [`ReopeningDatabase`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum StorageFault {
    /// The operation failed. An I/O failure also closed the database.
    Failed(redb::Error),
    /// The database is closed after an I/O failure and not reopened yet.
    Closed {
        /// The failure, or why the last reopen failed.
        cause: String,
    },
}

impl fmt::Display for StorageFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(error) => error.fmt(f),
            Self::Closed { cause } => {
                write!(f, "the database is closed after an I/O failure and is being reopened: {cause}")
            }
        }
    }
}

impl StorageFault {
    /// Whether the database is closed because of this failure or an earlier
    /// one: the disk, not the request, is at fault (answer 503, retry later).
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Failed(error) => is_io_fault(error),
            Self::Closed { .. } => true,
        }
    }
}

impl std::error::Error for StorageFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Failed(error) => Some(error),
            Self::Closed { .. } => None,
        }
    }
}

/// Whether `error` leaves the file in an unknown state (close and reopen).
fn is_io_fault(error: &redb::Error) -> bool {
    matches!(error, redb::Error::Io(_) | redb::Error::PreviousIo | redb::Error::Corrupted(_))
}

impl ReopeningDatabase {
    /// Opens the database at `path` with `open` (for example
    /// [`Database::create`]) and runs `recheck` on it; after an I/O failure
    /// both run again to reopen it.
    ///
    /// # Errors
    ///
    /// `open` failed, or `recheck` did.
    pub fn open(
        path: impl Into<PathBuf>,
        open: impl Fn(&Path) -> Result<Database, redb::DatabaseError> + Send + Sync + 'static,
        recheck: impl Fn(&Database) -> Result<(), redb::Error> + Send + Sync + 'static,
    ) -> Result<Self, redb::Error> {
        let reopen = Reopen { path: path.into(), open: Box::new(open), recheck: Box::new(recheck) };
        let db = reopen.attempt()?;
        Ok(Self { state: RwLock::new(State::open(db)), reopen: Some(reopen) })
    }

    /// Wraps a database that cannot be reopened (one in memory): it is never closed.
    #[must_use]
    pub fn fixed(db: Database) -> Self {
        Self { state: RwLock::new(State::open(db)), reopen: None }
    }

    /// Runs `op` on the database, reopening it first if it is closed and a try is due.
    /// Blocks: call it from a blocking thread.
    ///
    /// # Errors
    ///
    /// `op` failed ([`StorageFault::Failed`]; an I/O failure closes the
    /// database), or the database is closed ([`StorageFault::Closed`]).
    pub fn run<T>(&self, op: impl FnOnce(&Database) -> Result<T, redb::Error>) -> Result<T, StorageFault> {
        self.reopen_if_due();
        let state = self.read();
        let Some(db) = &state.db else {
            return Err(StorageFault::Closed { cause: state.cause.clone() });
        };
        let generation = state.generation;
        op(db).map_err(|error| {
            drop(state);
            if is_io_fault(&error) {
                self.close(generation, &error);
            }
            StorageFault::Failed(error)
        })
    }

    /// Whether the database is open, after trying to reopen it if it is closed
    /// and a try is due: what a readiness route answers.
    ///
    /// # Errors
    ///
    /// [`StorageFault::Closed`], with why.
    pub fn ready(&self) -> Result<(), StorageFault> {
        self.reopen_if_due();
        let state = self.read();
        match state.db {
            Some(_) => Ok(()),
            None => Err(StorageFault::Closed { cause: state.cause.clone() }),
        }
    }

    fn close(&self, generation: u64, error: &redb::Error) {
        let Some(reopen) = &self.reopen else { return };
        let mut state = self.write();
        if state.generation != generation || state.db.is_none() {
            return; // Already closed, or reopened since this handle failed.
        }
        // Dropping the handle releases the file's lock; redb writes nothing after a latched failure.
        state.db = None;
        state.cause = error.to_string();
        state.next_try = Instant::now() + REOPEN_INTERVAL;
        tracing::error!(path = %reopen.path.display(), %error, "storage failed: database closed, reopening");
    }

    fn reopen_if_due(&self) {
        let Some(reopen) = &self.reopen else { return };
        if self.read().db.is_some() {
            return;
        }
        let mut state = self.write();
        let now = Instant::now();
        if state.db.is_some() || now < state.next_try {
            return;
        }
        state.next_try = now + REOPEN_INTERVAL;
        match reopen.attempt() {
            Ok(db) => {
                state.db = Some(db);
                state.generation += 1;
                tracing::warn!(path = %reopen.path.display(), after = %state.cause, "database reopened and re-read");
            }
            Err(error) => {
                state.cause = format!("reopening failed: {error}");
                tracing::warn!(path = %reopen.path.display(), %error, "database still failing; reopen later");
            }
        }
    }

    // A panicking operation poisons nothing that matters: the state is valid between statements.
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Reopen {
    fn attempt(&self) -> Result<Database, redb::Error> {
        let db = (self.open)(&self.path)?;
        (self.recheck)(&db)?;
        Ok(db)
    }
}

impl State {
    fn open(db: Database) -> Self {
        Self { db: Some(db), generation: 0, cause: String::new(), next_try: Instant::now() }
    }
}

impl fmt::Debug for ReopeningDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.read();
        f.debug_struct("ReopeningDatabase")
            .field("path", &self.reopen.as_ref().map(|r| &r.path))
            .field("open", &state.db.is_some())
            .field("generation", &state.generation)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::fs::OpenOptions;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use redb::backends::FileBackend;
    use redb::{ReadableDatabase, StorageBackend, TableDefinition};

    use super::*;

    const T: TableDefinition<'_, &str, u64> = TableDefinition::new("t");

    /// A file whose fsync fails while `failing` is set (the libfiu tests do this
    /// to real processes; this one runs everywhere, in a unit test).
    #[derive(Debug)]
    struct FlakySync {
        file: FileBackend,
        failing: Arc<AtomicBool>,
    }

    impl StorageBackend for FlakySync {
        fn len(&self) -> std::io::Result<u64> {
            self.file.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.file.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.file.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            if self.failing.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(5));
            }
            self.file.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.file.write(offset, data)
        }
    }

    fn put(db: &ReopeningDatabase, key: &str, value: u64) -> Result<(), StorageFault> {
        db.run(|db| {
            let txn = db.begin_write()?;
            txn.open_table(T)?.insert(key, value)?;
            Ok(txn.commit()?)
        })
    }

    fn get(db: &ReopeningDatabase, key: &str) -> Option<u64> {
        db.run(|db| Ok(db.begin_read()?.open_table(T)?.get(key)?.map(|v| v.value()))).unwrap()
    }

    #[test]
    fn a_failed_fsync_closes_the_file_and_it_reopens_with_what_was_acknowledged_once_the_disk_works() {
        let dir = tempfile::tempdir().unwrap();
        let failing = Arc::new(AtomicBool::new(false));
        let flaky = Arc::clone(&failing);
        let open = move |path: &Path| {
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
            let file = FlakySync { file: FileBackend::new(file)?, failing: Arc::clone(&flaky) };
            Database::builder().create_with_backend(file)
        };
        // The recheck commits, so a reopen on a disk that still fails stays closed.
        let recheck = |db: &Database| {
            let txn = db.begin_write()?;
            txn.open_table(T)?;
            Ok(txn.commit()?)
        };
        let db = ReopeningDatabase::open(dir.path().join("t.redb"), open, recheck).unwrap();
        put(&db, "acknowledged", 1).unwrap();

        failing.store(true, Ordering::SeqCst);
        let failed = put(&db, "failed", 2).unwrap_err();
        assert!(matches!(failed, StorageFault::Failed(redb::Error::Io(_))), "{failed:?}");
        assert!(failed.is_unavailable());
        // Closed at once, not a zombie: no operation reaches the failed handle again.
        assert!(matches!(put(&db, "later", 3), Err(StorageFault::Closed { .. })));
        std::thread::sleep(REOPEN_INTERVAL);
        let still = db.ready().unwrap_err();
        assert!(still.to_string().contains("reopening failed"), "{still}");

        failing.store(false, Ordering::SeqCst);
        let start = Instant::now();
        while db.ready().is_err() {
            assert!(start.elapsed() < 4 * REOPEN_INTERVAL, "not reopened in {:?}", start.elapsed());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(get(&db, "acknowledged"), Some(1), "an acknowledged write survives the reopen");
        put(&db, "after", 4).unwrap();
        assert_eq!(get(&db, "after"), Some(4));
    }

    #[test]
    fn a_database_in_memory_is_never_closed() {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).unwrap();
        let db = ReopeningDatabase::fixed(db);
        put(&db, "k", 1).unwrap();
        // A failing operation of another kind leaves it open.
        let missing = db.run(|db| {
            let none = TableDefinition::<&str, u64>::new("none");
            Ok(db.begin_read()?.open_table(none)?.get("k")?.map(|v| v.value()))
        });
        assert!(matches!(missing, Err(StorageFault::Failed(redb::Error::TableDoesNotExist(_)))));
        assert!(db.ready().is_ok());
        assert_eq!(get(&db, "k"), Some(1));
    }
}
