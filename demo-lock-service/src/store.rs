//! Durable state in one redb file: the token counter and the current grant of each lock.
//!
//! Every write transaction is committed with [`Durability::Immediate`], so when
//! [`Store::grant`] returns, the new counter value and the grant are on disk (fsync'd).
//! A grant takes its token from the counter and records the lease in the same
//! transaction, so one fsync per grant covers both; there is no batching to get wrong.

use std::fs::File;
use std::path::{Path, PathBuf};

use fencing_layer::store::{ReopeningDatabase, StorageFault};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

/// `"next_token"` → the next token to hand out (starts at 1).
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// lock name → JSON [`StoredLease`] of the grant that currently owns it.
const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
const NEXT_TOKEN: &str = "next_token";

/// redb's page cache. The store is write-mostly (it is read once, at start-up), and
/// redb's default cache (1 GiB) keeps the pages it writes, so the service's memory
/// grew with the file: about 1 KiB per lease. 4 MiB keeps the B-tree's upper
/// levels; the operating system's page cache serves the rest (BENCHMARKS.md §9).
const CACHE_BYTES: usize = 4 << 20;

/// The file name inside the data directory.
pub(crate) const DB_FILE: &str = "locks.redb";

/// A grant as recorded on disk. Expiry is not stored: it is a monotonic-clock
/// instant, meaningless after a restart, where it becomes start-up + `ttl_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StoredLease {
    pub(crate) lease_id: String,
    pub(crate) holder: String,
    pub(crate) token: u64,
    pub(crate) ttl_ms: u64,
}

/// An error from the durable store.
#[derive(Debug)]
pub(crate) enum StoreError {
    /// Disk or database failure.
    Db(String),
    /// The counter reached `u64::MAX`; no token can be issued any more.
    Exhausted,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Db(e) => write!(f, "storage error: {e}"),
            StoreError::Exhausted => f.write_str("the token counter is exhausted"),
        }
    }
}

fn db_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Db(e.to_string())
}

/// The open database. After a failed write or fsync it is closed and reopened
/// from disk ([`ReopeningDatabase`], whose docs say why), the tables and every
/// lease re-read; meanwhile grants and releases fail (503) and [`Store::ready`]
/// says why. The counter is read from the file in every grant's transaction, so
/// after a reopen it continues from the last durable grant.
#[derive(Debug)]
pub(crate) struct Store {
    db: ReopeningDatabase,
}

/// What [`Store::open`] found on disk.
pub(crate) struct Loaded {
    pub(crate) store: Store,
    /// Grants that were live (not released, not replaced) when the store was last written.
    pub(crate) leases: Vec<(String, StoredLease)>,
}

impl Store {
    /// Opens (or creates) `dir/locks.redb`, creating `dir` if needed.
    pub(crate) fn open(dir: &Path) -> Result<Loaded, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let path: PathBuf = dir.join(DB_FILE);
        let open = |path: &Path| Database::builder().set_cache_size(CACHE_BYTES).create(path);
        let recheck = |db: &Database| {
            create_tables(db)?;
            read_counter(db)?;
            read_leases(db).map(drop)
        };
        let db = ReopeningDatabase::open(path, open, recheck).map_err(db_err)?;
        // Make the new file's directory entry durable too (cheap; matters on first start).
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err(dir, e))?;
        let leases = db.run(read_leases).map_err(db_err)?;
        Ok(Loaded { store: Store { db }, leases })
    }

    /// Whether the file takes grants now (`GET /readyz`); tries a due reopen.
    pub(crate) fn ready(&self) -> Result<(), StorageFault> {
        self.db.ready()
    }

    /// Takes the next token from the counter and records the lease (with that token)
    /// as the grant of lock `name`, replacing any previous grant of `name`; in the
    /// same transaction (and before that record), forgets the expired grants of the
    /// locks in `expired` (which may include `name`). The counter is a row of its
    /// own: forgetting grants never lowers it.
    /// Returns the token once the transaction is durably committed.
    pub(crate) fn grant(
        &self,
        name: &str,
        lease_id: &str,
        holder: &str,
        ttl_ms: u64,
        expired: &[&str],
    ) -> Result<u64, StoreError> {
        let record = |token| {
            serde_json::to_vec(&StoredLease {
                lease_id: lease_id.to_owned(),
                holder: holder.to_owned(),
                token,
                ttl_ms,
            })
        };
        // Outer: the storage failed; inner: the counter is exhausted (nothing written).
        let granted = self.db.run(|db| {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            let token;
            {
                let mut meta = txn.open_table(META)?;
                token = meta.get(NEXT_TOKEN)?.map(|v| v.value()).unwrap_or(1);
                let Some(next) = token.checked_add(1) else {
                    return Ok(Err(StoreError::Exhausted));
                };
                meta.insert(NEXT_TOKEN, next)?;
                let record = match record(token) {
                    Ok(record) => record,
                    Err(e) => return Ok(Err(StoreError::Db(e.to_string()))),
                };
                let mut leases = txn.open_table(LEASES)?;
                for old in expired {
                    leases.remove(*old)?;
                }
                leases.insert(name, record.as_slice())?;
            }
            txn.commit()?;
            Ok(Ok(token))
        });
        granted.map_err(db_err)?
    }

    /// Removes the grant of lock `name` (durably).
    pub(crate) fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.db
            .run(|db| {
                let mut txn = db.begin_write()?;
                txn.set_durability(Durability::Immediate)?;
                txn.open_table(LEASES)?.remove(name)?;
                Ok(txn.commit()?)
            })
            .map_err(db_err)
    }
}

/// Creates the tables, so that read transactions find them (a durable commit:
/// a reopen whose disk still fails stops here).
fn create_tables(db: &Database) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.open_table(META)?;
    txn.open_table(LEASES)?;
    Ok(txn.commit()?)
}

/// The next token to hand out.
fn read_counter(db: &Database) -> Result<u64, redb::Error> {
    let read = db.begin_read()?;
    let next = read.open_table(META)?.get(NEXT_TOKEN)?.map(|v| v.value());
    Ok(next.unwrap_or(1))
}

/// Every recorded grant; a record that does not parse is corruption.
fn read_leases(db: &Database) -> Result<Vec<(String, StoredLease)>, redb::Error> {
    let read = db.begin_read()?;
    let table = read.open_table(LEASES)?;
    let mut leases = Vec::new();
    for row in table.iter()? {
        let (name, value) = row?;
        let lease: StoredLease = serde_json::from_slice(value.value()).map_err(|e| {
            redb::Error::Corrupted(format!("corrupt lease record for {:?}: {e}", name.value()))
        })?;
        leases.push((name.value().to_owned(), lease));
    }
    Ok(leases)
}

fn io_err(dir: &Path, e: std::io::Error) -> StoreError {
    StoreError::Db(format!("{}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_and_grants_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = Store::open(dir.path()).unwrap();
        assert!(loaded.leases.is_empty());
        let s = loaded.store;
        assert_eq!(s.grant("a", "id1", "h1", 1000, &[]).unwrap(), 1);
        assert_eq!(s.grant("b", "id2", "h2", 2000, &[]).unwrap(), 2);
        assert_eq!(s.grant("a", "id3", "h3", 3000, &[]).unwrap(), 3);
        s.remove("b").unwrap();
        drop(s);

        let loaded = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.leases.len(), 1);
        let (name, lease) = &loaded.leases[0];
        assert_eq!(name, "a");
        assert_eq!(lease.lease_id, "id3");
        assert_eq!(lease.holder, "h3");
        assert_eq!(lease.token, 3);
        assert_eq!(lease.ttl_ms, 3000);
        assert_eq!(loaded.store.grant("c", "id4", "h4", 1, &[]).unwrap(), 4);
    }
}
