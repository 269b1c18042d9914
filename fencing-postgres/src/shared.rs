//! [`PgSharedStore`]: the fencing layer's marks in PostgreSQL, shared by every
//! replica, for effects that are not in the database.
//!
//! It is a [`ClaimStore`] over PostgreSQL: each replica holds a claim on the
//! key's current token, a row with an expiry on the database's clock, renewed
//! in the background; every request with that token is admitted in memory.
//! [`fencing_layer::claims`] states the protocol and why a higher token never
//! runs beside a lower one, whatever happens to database sessions;
//! `claims.rs` in this crate says how PostgreSQL keeps each step.

use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_layer::claims::{ClaimStore, ClaimTiming};
use fencing_layer::store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore};

use crate::claims::PgClaims;
use crate::error::FenceError;
use crate::fence::{MAX_KEY_BYTES, PgFence};

/// The layer's marks in PostgreSQL: give it to
/// [`FencingLayer::shared_store`](fencing_layer::FencingLayer::shared_store)
/// on every replica, with the same database and table.
///
/// A replica uses its `pool` for short transactions only (a grant, a raise, a
/// release: one round trip each, no connection held while a request runs), and
/// one connection of its own, opened from `config`, to renew its claims and
/// hear raises and releases (`LISTEN`). A key fenced through this store must
/// not also be fenced with [`PgFence::fence`]: each refuses the other's keys.
#[derive(Debug, Clone)]
pub struct PgSharedStore {
    claims: ClaimStore,
    pool: Pool,
    fence: PgFence,
}

impl PgSharedStore {
    /// Marks in `fence`'s table (and `<table>_claims`), through `pool`, with
    /// the replica's background session opened from `config` (the database
    /// the pool connects to), and the [default claim timing](ClaimTiming::default).
    #[must_use]
    pub fn new(pool: Pool, config: tokio_postgres::Config, fence: PgFence) -> Self {
        Self::with_timing(pool, config, fence, ClaimTiming::default())
    }

    /// As [`new`](Self::new), with `timing`.
    #[must_use]
    pub fn with_timing(
        pool: Pool,
        config: tokio_postgres::Config,
        fence: PgFence,
        timing: ClaimTiming,
    ) -> Self {
        let backend = PgClaims::new(pool.clone(), config, fence.clone());
        Self { claims: ClaimStore::with_timing(backend, timing), pool, fence }
    }

    /// Creates both tables if they do not exist ([`PgFence::migrate`]).
    ///
    /// # Errors
    ///
    /// No connection, or the tables could not be created.
    pub async fn migrate(&self) -> Result<(), FenceError> {
        let client = self.pool.get().await?;
        self.fence.migrate(&client).await
    }

    /// The claims this replica holds.
    #[must_use]
    pub fn claims(&self) -> &ClaimStore {
        &self.claims
    }
}

impl SharedStore for PgSharedStore {
    #[inline]
    fn try_admit(&self, key: &str, token: u64) -> Option<Result<SharedPermit, SharedRefusal>> {
        self.claims.try_admit(key, token)
    }

    fn admit(&self, key: &str, token: u64, drain: Duration) -> SharedAdmission {
        if key.len() > MAX_KEY_BYTES {
            return Box::pin(std::future::ready(Err(SharedRefusal::KeyTooLong { limit: MAX_KEY_BYTES })));
        }
        if key.contains('\0') {
            return Box::pin(std::future::ready(Err(SharedRefusal::InvalidKey(
                "the key contains a NUL character",
            ))));
        }
        self.claims.admit(key, token, drain)
    }
}
