//! Where the logs and key-value pairs live: one redb file (or memory) for one
//! process ([`store`](crate::store)), or PostgreSQL shared by every replica
//! (the `postgres` module, feature `postgres`). The handlers see only [`Backend`].
//!
//! Every write takes `wait`, the request's `?delay_ms`, and awaits it where a
//! stalled write would be stalled: for redb before the write transaction (redb
//! has one writer per database, so a held transaction would stall every key);
//! for PostgreSQL inside the transaction, after the fence, so a stalled stale
//! write holds the key's mark row as a real one would.

use std::future::Future;
use std::sync::Arc;

use crate::data::{DataError, Entry};
#[cfg(feature = "postgres")]
use crate::postgres::PgData;
use crate::store::Data;

/// The data of a resource.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// One process's data (`--data-dir`, `--in-memory`).
    Redb(Arc<Data>),
    /// Data shared by every replica (`--postgres`).
    #[cfg(feature = "postgres")]
    Postgres(PgData),
}

impl Backend {
    /// Appends `value` to log `name` (resource key `resource`); returns its index.
    pub(crate) async fn append(
        &self,
        resource: &str,
        name: &str,
        token: Option<u64>,
        value: String,
        wait: impl Future<Output = ()>,
    ) -> Result<u64, DataError> {
        match self {
            Self::Redb(data) => {
                redb_write(data, resource, name, wait, move |data, r, n| data.append(r, n, token, &value))
                    .await
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pg) => Ok(pg.append(resource, name, token, &value, wait).await?),
        }
    }

    /// The entries of log `name` in append order, or `None` if nothing was ever appended.
    pub(crate) async fn log(&self, name: &str) -> Result<Option<Vec<Entry>>, DataError> {
        match self {
            Self::Redb(data) => {
                let name = name.to_owned();
                blocking(data, move |data| data.log(&name)).await
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pg) => Ok(pg.log(name).await?),
        }
    }

    /// Sets `key` to `value`; returns whether the key is new.
    pub(crate) async fn put(
        &self,
        resource: &str,
        key: &str,
        token: Option<u64>,
        value: String,
        wait: impl Future<Output = ()>,
    ) -> Result<bool, DataError> {
        match self {
            Self::Redb(data) => {
                redb_write(data, resource, key, wait, move |data, r, k| data.put(r, k, token, &value)).await
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pg) => Ok(pg.put(resource, key, token, &value, wait).await?),
        }
    }

    /// The value of `key`, if set.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<Entry>, DataError> {
        match self {
            Self::Redb(data) => {
                let key = key.to_owned();
                blocking(data, move |data| data.get(&key)).await
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pg) => Ok(pg.get(key).await?),
        }
    }

    /// Removes `key`; returns whether it was set.
    pub(crate) async fn delete(
        &self,
        resource: &str,
        key: &str,
        token: Option<u64>,
        wait: impl Future<Output = ()>,
    ) -> Result<bool, DataError> {
        match self {
            Self::Redb(data) => {
                redb_write(data, resource, key, wait, move |data, r, k| data.delete(r, k, token)).await
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pg) => Ok(pg.delete(resource, key, token, wait).await?),
        }
    }
}

/// A write to redb: waits out `wait` first (redb has one writer per database,
/// so a write held inside its transaction would stall every key), then runs
/// `write` on a blocking thread with the resource and the log's or key's name.
async fn redb_write<T: Send + 'static>(
    data: &Arc<Data>,
    resource: &str,
    name: &str,
    wait: impl Future<Output = ()>,
    write: impl FnOnce(&Data, &str, &str) -> Result<T, DataError> + Send + 'static,
) -> Result<T, DataError> {
    wait.await;
    let (resource, name) = (resource.to_owned(), name.to_owned());
    blocking(data, move |data| write(data, &resource, &name)).await
}

/// Runs a blocking redb operation off the async threads.
async fn blocking<T: Send + 'static>(
    data: &Arc<Data>,
    op: impl FnOnce(&Data) -> Result<T, DataError> + Send + 'static,
) -> Result<T, DataError> {
    let data = Arc::clone(data);
    tokio::task::spawn_blocking(move || op(&data)).await.map_err(DataError::Task)?
}
