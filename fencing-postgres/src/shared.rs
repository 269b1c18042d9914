//! [`PgSharedStore`]: the fencing layer's marks in PostgreSQL, shared by every
//! replica, for effects that are not in the database.
//!
//! It is a [`ClaimStore`] over PostgreSQL: each replica holds a claim on the
//! key's current token, a row with an expiry on the database's clock, renewed
//! in the background; every request with that token is admitted in memory.
//! [`fencing_layer::claims`] states the protocol and why a higher token never
//! runs beside a lower one, whatever happens to database sessions;
//! `claims.rs` in this crate says how PostgreSQL keeps each step.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use fencing_layer::claims::{ClaimStore, ClaimTiming, ClaimTimingError, check_text_key};
use fencing_layer::store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore};

use crate::claims::{HintsHeard, PgClaims};
use crate::connect::PgConnect;
use crate::error::FenceError;
use crate::fence::{MAX_KEY_BYTES, PgFence};

/// The layer's marks in PostgreSQL: give it to
/// [`FencingLayer::shared_store`](fencing_layer::FencingLayer::shared_store)
/// on every replica, with the same database and table.
///
/// A replica uses its `pool` for short transactions only (a grant, a raise, a
/// release: one round trip each, no connection held while a request runs), and
/// two connections of its own, opened from `config`: one renews its claims,
/// the other hears raises and releases (`LISTEN`) on a thread of its own, so
/// that a flood of notifications never holds up a renewal. A key fenced through this store must
/// not also be fenced with [`PgFence::fence`]: each refuses the other's keys.
#[derive(Debug, Clone)]
pub struct PgSharedStore {
    claims: ClaimStore,
    pool: Pool,
    fence: PgFence,
    hints: Arc<HintsHeard>,
}

impl PgSharedStore {
    /// Marks in `fence`'s table (and `<table>_claims`), through `pool`, with
    /// the replica's background session opened from `config` (the database
    /// the pool connects to: a [`PgConnect`], or a `tokio_postgres::Config`), and the
    /// [default claim timing](ClaimTiming::default).
    #[must_use]
    pub fn new(pool: Pool, config: impl Into<PgConnect>, fence: PgFence) -> Self {
        let backend = PgClaims::new(pool.clone(), config.into(), fence.clone());
        let hints = backend.hints();
        Self { claims: ClaimStore::new(backend), pool, fence, hints }
    }

    /// As [`new`](Self::new), with `timing`.
    ///
    /// # Errors
    ///
    /// A timing that cannot keep claims safely ([`ClaimTiming::check`]).
    pub fn with_timing(
        pool: Pool,
        config: impl Into<PgConnect>,
        fence: PgFence,
        timing: ClaimTiming,
    ) -> Result<Self, ClaimTimingError> {
        let backend = PgClaims::new(pool.clone(), config.into(), fence.clone());
        let hints = backend.hints();
        Ok(Self { claims: ClaimStore::with_timing(backend, timing)?, pool, fence, hints })
    }

    /// At most `limit` keys claimed by this replica at once ([`ClaimStore::max_keys`]).
    #[must_use]
    pub fn max_keys(mut self, limit: usize) -> Self {
        self.claims = self.claims.max_keys(limit);
        self
    }

    /// Opens the replica's background session and waits for it (see
    /// [`ClaimStore::ready`]): call it at start-up, so that a session that
    /// cannot open (a wrong `config`, say) is an error then, not 503s later.
    ///
    /// # Errors
    ///
    /// The session did not open within `renew_every + renew_timeout`.
    pub async fn ready(&self) -> Result<(), fencing_layer::store::StoreError> {
        self.claims.ready().await
    }

    /// Creates both tables and the claims table's trigger, or brings them up
    /// to date, without holding up the replicas already running
    /// ([`PgFence::migrate`]: a current schema is only looked at).
    ///
    /// # Errors
    ///
    /// No connection; [`FenceError::MigrationBlocked`] when a change was
    /// needed and another session held a lock on its table (nothing changed,
    /// try again later); or the tables could not be created.
    pub async fn migrate(&self) -> Result<(), FenceError> {
        let client = self.pool.get().await?;
        self.fence.migrate(&client).await
    }

    /// Whether the replica's hint connection hears raises and releases
    /// (`LISTEN`): each session sends itself a test notification when it opens.
    /// `None` until the first session has waited for it (up to 2 s), then
    /// `Some(false)` when it did not come back: a `LISTEN` through a pooler in
    /// transaction mode hears nothing. Raises then wait for renewals and polls
    /// instead (up to one renewal period plus its timeout longer, never past the
    /// term), and the replica logs a warning once; give `config` a direct or
    /// session-pooled connection.
    #[must_use]
    pub fn hints_arrive(&self) -> Option<bool> {
        self.hints.arrive()
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
        match check_text_key(key, MAX_KEY_BYTES) {
            Ok(()) => self.claims.admit(key, token, drain),
            Err(refusal) => Box::pin(std::future::ready(Err(refusal))),
        }
    }
}
