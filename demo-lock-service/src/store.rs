//! Durable state in one redb file: the token counter and the current grant of each lock.
//!
//! Every write transaction is committed with [`Durability::Immediate`], so when
//! [`Store::grant`] returns, the new counter value and the grant are on disk (fsync'd).
//! A grant takes its token from the counter and records the lease in the same
//! transaction, so one fsync per grant covers both; there is no batching to get wrong.

use std::fs::File;
use std::path::{Path, PathBuf};

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

fn db_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db(e.into().to_string())
}

/// The open database.
#[derive(Debug)]
pub(crate) struct Store {
    db: Database,
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
        let db = Database::builder().set_cache_size(CACHE_BYTES).create(&path).map_err(db_err)?;
        // Make the new file's directory entry durable too (cheap; matters on first start).
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err(dir, e))?;

        // Create the tables so that read transactions find them.
        let mut txn = db.begin_write().map_err(db_err)?;
        txn.set_durability(Durability::Immediate).map_err(db_err)?;
        {
            txn.open_table(META).map_err(db_err)?;
            txn.open_table(LEASES).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;

        let read = db.begin_read().map_err(db_err)?;
        let table = read.open_table(LEASES).map_err(db_err)?;
        let mut leases = Vec::new();
        for row in table.iter().map_err(db_err)? {
            let (name, value) = row.map_err(db_err)?;
            let lease: StoredLease = serde_json::from_slice(value.value())
                .map_err(|e| StoreError::Db(format!("corrupt lease record for {:?}: {e}", name.value())))?;
            leases.push((name.value().to_owned(), lease));
        }
        drop(table);
        drop(read);
        Ok(Loaded { store: Store { db }, leases })
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
        let mut txn = self.db.begin_write().map_err(db_err)?;
        txn.set_durability(Durability::Immediate).map_err(db_err)?;
        let token;
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            token = meta.get(NEXT_TOKEN).map_err(db_err)?.map(|v| v.value()).unwrap_or(1);
            let next = token.checked_add(1).ok_or(StoreError::Exhausted)?;
            meta.insert(NEXT_TOKEN, next).map_err(db_err)?;

            let record = serde_json::to_vec(&StoredLease {
                lease_id: lease_id.to_owned(),
                holder: holder.to_owned(),
                token,
                ttl_ms,
            })
            .map_err(|e| StoreError::Db(e.to_string()))?;
            let mut leases = txn.open_table(LEASES).map_err(db_err)?;
            for old in expired {
                leases.remove(*old).map_err(db_err)?;
            }
            leases.insert(name, record.as_slice()).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok(token)
    }

    /// Removes the grant of lock `name` (durably).
    pub(crate) fn remove(&self, name: &str) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(db_err)?;
        txn.set_durability(Durability::Immediate).map_err(db_err)?;
        {
            let mut leases = txn.open_table(LEASES).map_err(db_err)?;
            leases.remove(name).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok(())
    }
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
