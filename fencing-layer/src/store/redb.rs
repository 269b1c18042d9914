//! A [`MarkLog`] in one redb file.
//!
//! redb commits with `Durability::Immediate` by default: `commit` returns once
//! the data is fsync'd, which is exactly the promise `record` has to keep.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition, TableError};

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
/// let layer = FencingLayer::new().store(store);
/// # let _ = layer;
/// ```
#[derive(Debug)]
pub struct RedbMarkLog {
    db: Database,
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
        Database::create(path).map(|db| Self { db }).map_err(|error| match error {
            DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path: path.to_owned() },
            error => StoreError::Open { path: path.to_owned(), error: Arc::new(error) },
        })
    }
}

impl MarkLog for RedbMarkLog {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let txn = self.db.begin_read().map_err(StoreError::log)?;
        let table = match txn.open_table(MARKS) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(StoreError::log(error)),
        };
        table
            .iter()
            .map_err(StoreError::log)?
            .map(|entry| {
                let (key, mark) = entry.map_err(StoreError::log)?;
                Ok((key.value().to_owned(), mark.value()))
            })
            .collect()
    }

    fn record(&self, raises: &[(&str, u64)]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(StoreError::log)?;
        {
            let mut table = txn.open_table(MARKS).map_err(StoreError::log)?;
            for &(key, token) in raises {
                let current = table.get(key).map_err(StoreError::log)?.map(|mark| mark.value());
                if current.is_none_or(|mark| mark < token) {
                    table.insert(key, token).map_err(StoreError::log)?;
                }
            }
        }
        txn.commit().map_err(StoreError::log)
    }

    fn reset(&self, key: &str, to: u64) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(StoreError::log)?;
        {
            let mut table = txn.open_table(MARKS).map_err(StoreError::log)?;
            table.insert(key, to).map_err(StoreError::log)?;
        }
        txn.commit().map_err(StoreError::log)
    }
}
