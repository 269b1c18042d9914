//! The data: append-only logs and key-value pairs in one redb database.
//!
//! Every write is one transaction, committed with redb's default
//! `Durability::Immediate` (fsync'd) before it returns, so a write that was
//! answered 2xx survives `kill -9`. All methods block: call them from
//! `spawn_blocking`.
//!
//! A fenced write also checks its token again, in the same transaction, against
//! the highest token the data has seen for the resource (the `fences` table):
//! the layer already refuses stale tokens, and this second check is the
//! `UPDATE … WHERE fence <= $token` a shared database would do. In one process it
//! only matters if a stale write's handler was abandoned mid-commit.
//!
//! After a failed write or fsync the file is closed and reopened from disk
//! ([`ReopeningDatabase`], whose docs say why): meanwhile every operation fails
//! with a [`StorageFault`] that the routes answer with 503.

use std::path::Path;

use crate::data::{DataError, Entry};
use fencing_layer::store::{ReopeningDatabase, StorageFault};
use redb::backends::InMemoryBackend;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

/// `(log name, index)` → `(token, text)`.
const LOGS: TableDefinition<'_, (&str, u64), (Option<u64>, &str)> = TableDefinition::new("logs");
/// key → `(token, text)`.
const KV: TableDefinition<'_, &str, (Option<u64>, &str)> = TableDefinition::new("kv");
/// resource path (`/logs/{name}`, `/kv/{key}`) → highest token written.
const FENCES: TableDefinition<'_, &str, u64> = TableDefinition::new("fences");

/// The database handle.
#[derive(Debug)]
pub(crate) struct Data {
    db: ReopeningDatabase,
}

impl Data {
    /// Opens (or creates) the database file at `path`; after an I/O failure it
    /// is reopened the same way and its tables opened again.
    pub(crate) fn open(path: &Path) -> Result<Self, redb::Error> {
        let db = ReopeningDatabase::open(path, |path: &Path| Database::create(path), create_tables)?;
        Ok(Self { db })
    }

    /// A database that lives in memory only (`--in-memory`).
    pub(crate) fn in_memory() -> Result<Self, redb::Error> {
        let db = Database::builder().create_with_backend(InMemoryBackend::new())?;
        create_tables(&db)?;
        Ok(Self { db: ReopeningDatabase::fixed(db) })
    }

    /// Whether the file is usable now (`GET /readyz`).
    pub(crate) fn ready(&self) -> Result<(), StorageFault> {
        self.db.ready()
    }

    /// Sets the data's own fence of `resource` to `to`, if it has one: the
    /// second half of a mark reset (see `marks::reset`). Returns the old fence.
    pub(crate) fn reset_fence(&self, resource: &str, to: u64) -> Result<Option<u64>, StorageFault> {
        self.db.run(|db| {
            let txn = db.begin_write()?;
            let old = {
                let mut fences = txn.open_table(FENCES)?;
                let old = fences.get(resource)?.map(|fence| fence.value());
                if old.is_some() {
                    fences.insert(resource, to)?;
                }
                old
            };
            txn.commit()?;
            Ok(old)
        })
    }

    /// Runs `change` in a write transaction after checking (and raising) the
    /// resource's fence, then commits.
    fn write<T>(
        &self,
        resource: &str,
        token: Option<u64>,
        change: impl FnOnce(&WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, DataError> {
        // Outer: the storage failed; inner: the fence refused (nothing was written).
        let written = self.db.run(|db| {
            let txn = db.begin_write()?;
            if let Some(token) = token {
                let mut fences = txn.open_table(FENCES)?;
                let highest = fences.get(resource)?.map(|fence| fence.value());
                match highest {
                    Some(highest) if token < highest => {
                        return Ok(Err(DataError::Stale { presented: token, highest }));
                    }
                    Some(highest) if token == highest => {}
                    _ => {
                        fences.insert(resource, token)?;
                    }
                }
            }
            let out = change(&txn)?;
            txn.commit()?;
            Ok(Ok(out))
        });
        written.map_err(DataError::Storage)?
    }

    /// Runs a read.
    fn read<T>(&self, read: impl FnOnce(&Database) -> Result<T, redb::Error>) -> Result<T, DataError> {
        self.db.run(read).map_err(DataError::Storage)
    }

    /// Appends `value` to log `name`; returns its index (0 for the first entry).
    pub(crate) fn append(
        &self,
        resource: &str,
        name: &str,
        token: Option<u64>,
        value: &str,
    ) -> Result<u64, DataError> {
        self.write(resource, token, |txn| {
            let mut logs = txn.open_table(LOGS)?;
            let next = match logs.range((name, 0)..=(name, u64::MAX))?.next_back() {
                Some(last) => last?.0.value().1 + 1,
                None => 0,
            };
            logs.insert((name, next), (token, value))?;
            Ok(next)
        })
    }

    /// The entries of log `name` in append order, or `None` if nothing was ever appended.
    pub(crate) fn log(&self, name: &str) -> Result<Option<Vec<Entry>>, DataError> {
        let entries = self.read(|db| {
            let txn = db.begin_read()?;
            let logs = txn.open_table(LOGS)?;
            logs.range((name, 0)..=(name, u64::MAX))?
                .map(|row| {
                    let (_, value) = row?;
                    let (token, value) = value.value();
                    Ok(Entry { token, value: value.to_owned() })
                })
                .collect::<Result<Vec<_>, redb::Error>>()
        })?;
        Ok((!entries.is_empty()).then_some(entries))
    }

    /// Sets `key` to `value`; returns whether the key is new.
    pub(crate) fn put(
        &self,
        resource: &str,
        key: &str,
        token: Option<u64>,
        value: &str,
    ) -> Result<bool, DataError> {
        self.write(resource, token, |txn| Ok(txn.open_table(KV)?.insert(key, (token, value))?.is_none()))
    }

    /// The value of `key`, if set.
    pub(crate) fn get(&self, key: &str) -> Result<Option<Entry>, DataError> {
        self.read(|db| {
            let txn = db.begin_read()?;
            let kv = txn.open_table(KV)?;
            let entry = kv.get(key)?.map(|value| {
                let (token, value) = value.value();
                Entry { token, value: value.to_owned() }
            });
            Ok(entry)
        })
    }

    /// Removes `key`; returns whether it was set.
    pub(crate) fn delete(&self, resource: &str, key: &str, token: Option<u64>) -> Result<bool, DataError> {
        self.write(resource, token, |txn| Ok(txn.open_table(KV)?.remove(key)?.is_some()))
    }
}

/// Creates the tables, so readers never meet a missing one; a reopen runs it
/// too, so a file that does not take a commit stays closed.
fn create_tables(db: &Database) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(LOGS)?;
    txn.open_table(KV)?;
    txn.open_table(FENCES)?;
    Ok(txn.commit()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_keep_order_and_fences_refuse_older_tokens() {
        let data = Data::in_memory().unwrap();
        assert_eq!(data.log("a").unwrap(), None);
        assert_eq!(data.append("/logs/a", "a", Some(3), "x").unwrap(), 0);
        assert_eq!(data.append("/logs/a", "a", Some(3), "y").unwrap(), 1);
        assert_eq!(data.append("/logs/ab", "ab", None, "other").unwrap(), 0);
        assert!(matches!(
            data.append("/logs/a", "a", Some(2), "stale"),
            Err(DataError::Stale { presented: 2, highest: 3 })
        ));
        let values: Vec<_> = data.log("a").unwrap().unwrap().into_iter().map(|e| e.value).collect();
        assert_eq!(values, ["x", "y"]);
        assert_eq!(data.log("ab").unwrap().unwrap(), [Entry { token: None, value: "other".into() }]);
    }

    #[test]
    fn key_values_put_get_delete() {
        let data = Data::in_memory().unwrap();
        assert!(data.put("/kv/k", "k", Some(1), "v1").unwrap());
        assert!(!data.put("/kv/k", "k", Some(2), "v2").unwrap());
        assert_eq!(data.get("k").unwrap(), Some(Entry { token: Some(2), value: "v2".into() }));
        assert!(matches!(data.delete("/kv/k", "k", Some(1)), Err(DataError::Stale { .. })));
        assert!(data.delete("/kv/k", "k", Some(2)).unwrap());
        assert!(!data.delete("/kv/k", "k", Some(2)).unwrap());
        assert_eq!(data.get("k").unwrap(), None);
    }
}
