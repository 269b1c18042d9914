//! A [`MarkLog`] in one redb file.
//!
//! redb commits with `Durability::Immediate` by default: `commit` returns once
//! the data is fsync'd, which is exactly the promise `record` has to keep.
//! After a failed write or fsync the file is closed and reopened from disk,
//! every mark re-read, before it records again ([`ReopeningDatabase`]); until
//! then raises get 503 and [`MarkStore::ready`](super::MarkStore::ready) says why.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::reopen::{ReopeningDatabase, StorageFault};
use super::{MarkLog, StoreError};

const MARKS: TableDefinition<'_, &str, u64> = TableDefinition::new("fencing_marks");

/// Durable marks in a redb database file.
///
/// ```
/// use fencing_layer::{FencingLayer, MarkStore};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = MarkStore::open(dir.path().join("marks.redb")).unwrap();
/// store.seed("/logs/billing", 7).unwrap();
/// drop(store);
///
/// // A restart never lowers a mark.
/// let store = MarkStore::open(dir.path().join("marks.redb")).unwrap();
/// assert_eq!(store.mark("/logs/billing"), Some(7));
/// assert!(store.ready().is_ok());
/// let layer = FencingLayer::new().store(store);
/// # let _ = layer;
/// ```
#[derive(Debug)]
pub struct RedbMarkLog {
    db: ReopeningDatabase,
}

impl RedbMarkLog {
    /// Opens the database at `path`, creating it if missing.
    ///
    /// # Errors
    ///
    /// The file cannot be created or opened ([`StoreError::Open`]), or another
    /// handle holds its lock ([`StoreError::AlreadyOpen`]): a `RedbMarkLog` or
    /// [`MarkStore`](super::MarkStore) on it still alive in this process (any
    /// clone keeps it), or another process. Both name the path.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        ReopeningDatabase::open(path, |path: &Path| Database::create(path), |db| read_marks(db).map(drop))
            .map(|db| Self { db })
            .map_err(|error| match error {
                redb::Error::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path: path.to_owned() },
                error => StoreError::Open { path: path.to_owned(), error: Arc::new(error) },
            })
    }
}

/// Every mark in the file: what `load` returns and what a reopen re-reads.
fn read_marks(db: &Database) -> Result<Vec<(String, u64)>, redb::Error> {
    let txn = db.begin_read()?;
    let table = match txn.open_table(MARKS) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    table
        .iter()?
        .map(|entry| {
            let (key, mark) = entry?;
            Ok((key.value().to_owned(), mark.value()))
        })
        .collect()
}

fn fault(error: StorageFault) -> StoreError {
    StoreError::log(error)
}

impl MarkLog for RedbMarkLog {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.db.run(read_marks).map_err(fault)
    }

    fn record(&self, raises: &[(&str, u64)]) -> Result<(), StoreError> {
        self.db
            .run(|db| {
                let txn = db.begin_write()?;
                {
                    let mut table = txn.open_table(MARKS)?;
                    for &(key, token) in raises {
                        let current = table.get(key)?.map(|mark| mark.value());
                        if current.is_none_or(|mark| mark < token) {
                            table.insert(key, token)?;
                        }
                    }
                }
                Ok(txn.commit()?)
            })
            .map_err(fault)
    }

    fn reset(&self, key: &str, to: u64) -> Result<(), StoreError> {
        self.db
            .run(|db| {
                let txn = db.begin_write()?;
                txn.open_table(MARKS)?.insert(key, to)?;
                Ok(txn.commit()?)
            })
            .map_err(fault)
    }

    fn ready(&self) -> Result<(), StoreError> {
        self.db.ready().map_err(fault)
    }
}
