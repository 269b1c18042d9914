//! The lock service's operations: grant, renew, release, read, check a token, close.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Clock;
use crate::store::{Store, StoreError};
use crate::table::{CENTURY, LeaseId, Live, Table, expiry, format_lease_id, new_lease_id, parse_lease_id};
use crate::{AcquireError, Config, Grant, LockStatus, OpenError, Renewal, StorageError, TokenCheck, metrics};

/// Longest accepted lock name or holder, in bytes (UTF-8).
pub const MAX_NAME_BYTES: usize = 256;

/// At most this many expired leases are forgotten per grant.
const SWEEP_PER_GRANT: usize = 64;

/// `Retry-After` of a refusal for a full lease table is at most this long: a release
/// can free a slot before the earliest expiry.
const FULL_RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

const CLOSED: &str = "the lock service is shut down";

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: Config,
    /// Serialises every change of ownership (grant, release): holding it, the
    /// "is the lock free?" decision stays true until the grant is recorded.
    /// Only ever locked on a blocking thread, never across an `.await`.
    /// `None` once [`LockService::close`] ran.
    pub(crate) writer: Mutex<Option<Store>>,
    pub(crate) table: Mutex<Table>,
    /// Expiry is decided on this clock: monotonic, and never back (see [`Clock`]).
    pub(crate) clock: Clock,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The protected sections leave the data consistent at every step, so a
    // panic elsewhere does not make the state unusable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock service: a cheap, cloneable handle to shared state.
#[derive(Debug, Clone)]
pub struct LockService {
    pub(crate) inner: Arc<Inner>,
}

impl LockService {
    /// Opens the store in `config.data_dir` and restores the leases recorded there,
    /// each expiring its full TTL after now. Fails if another `LockService` (in this
    /// or another process) has the same data directory open.
    pub fn open(config: Config) -> Result<Self, OpenError> {
        let loaded = Store::open(&config.data_dir).map_err(|e| OpenError(e.to_string()))?;
        let clock = Clock::default();
        let now = clock.now();
        let mut table = Table::default();
        for (name, lease) in loaded.leases {
            let Some(lease_id) = parse_lease_id(&lease.lease_id) else {
                return Err(OpenError(format!("corrupt lease id {:?} for lock {name:?}", lease.lease_id)));
            };
            let ttl = Duration::from_millis(lease.ttl_ms);
            tracing::info!(
                name,
                holder = lease.holder,
                token = lease.token,
                ttl_ms = lease.ttl_ms,
                "restored lease"
            );
            table.insert(
                name.into(),
                Live {
                    lease_id,
                    holder: lease.holder.into(),
                    token: lease.token,
                    ttl,
                    expires: expiry(now, ttl),
                },
            );
        }
        Ok(LockService {
            inner: Arc::new(Inner {
                config,
                writer: Mutex::new(Some(loaded.store)),
                table: Mutex::new(table),
                clock,
            }),
        })
    }

    /// The configuration the service was opened with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Acquires lock `name` for `holder` for `ttl`.
    ///
    /// Succeeds if the lock is free, its lease has expired, or `holder` already holds
    /// it (then the old lease is replaced). The token is durably recorded before this
    /// returns. Concurrent calls for the same free lock: exactly one succeeds.
    pub async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, AcquireError> {
        self.validate(name, holder, ttl)?;
        let now = self.inner.clock.now();
        let inner = Arc::clone(&self.inner);
        let (name, holder) = (name.to_owned(), holder.to_owned());
        // A blocking task runs to completion even if the caller goes away, so memory
        // and disk never disagree about a grant that was committed.
        tokio::task::spawn_blocking(move || inner.acquire_blocking(now, name, holder, ttl))
            .await
            .map_err(|e| AcquireError::Unavailable(e.to_string()))?
    }

    fn validate(&self, name: &str, holder: &str, ttl: Duration) -> Result<(), AcquireError> {
        check_text("name", name)?;
        check_text("holder", holder)?;
        let max = self.inner.config.max_ttl.min(CENTURY);
        if ttl.is_zero() || ttl > max {
            return Err(AcquireError::Invalid(format!("ttl_ms must be between 1 and {}", max.as_millis())));
        }
        Ok(())
    }

    /// Renews lease `lease_id`: it now expires its TTL from now. `None` if the lease
    /// is expired, released, replaced or unknown. No disk I/O.
    pub fn keepalive(&self, lease_id: &str) -> Option<Renewal> {
        let id = parse_lease_id(lease_id)?;
        let now = self.inner.clock.now();
        let mut table = lock(&self.inner.table);
        let name = Arc::clone(table.by_id.get(&id)?);
        let live = table.by_name.get(&name)?;
        if live.lease_id != id || live.expires <= now {
            return None;
        }
        let (token, ttl) = (live.token, live.ttl);
        table.renew(&name, expiry(now, ttl));
        metrics::kept_alive();
        Some(Renewal { lease_id: lease_id.to_owned(), token, ttl })
    }

    /// Releases lease `lease_id` (durably). `Ok(true)` if it was live and is now
    /// released; `Ok(false)` if it was expired, released, replaced or unknown (an
    /// expired lease's record is cleaned up all the same).
    pub async fn release(&self, lease_id: &str) -> Result<bool, StorageError> {
        let Some(lease_id) = parse_lease_id(lease_id) else {
            return Ok(false);
        };
        let now = self.inner.clock.now();
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.release_blocking(now, lease_id))
            .await
            .map_err(|e| StorageError(e.to_string()))?
    }

    /// Whether the store takes grants now: what `GET /readyz` answers. After a
    /// disk failure the store is closed and reopened from the file by itself;
    /// this call tries a reopen that is due. Blocks behind a grant being written.
    ///
    /// # Errors
    ///
    /// Why grants would fail now (503).
    pub async fn ready(&self) -> Result<(), StorageError> {
        let inner = Arc::clone(&self.inner);
        let ready = tokio::task::spawn_blocking(move || match lock(&inner.writer).as_ref() {
            Some(store) => store.ready().map_err(|e| StorageError(e.to_string())),
            None => Err(StorageError(CLOSED.into())),
        });
        ready.await.map_err(|e| StorageError(e.to_string()))?
    }

    /// The current holder of lock `name`, or `None` if it is free.
    pub fn lock_status(&self, name: &str) -> Option<LockStatus> {
        let now = self.inner.clock.now();
        let table = lock(&self.inner.table);
        let live = table.by_name.get(name)?;
        if live.expires <= now {
            return None;
        }
        Some(LockStatus {
            name: name.to_owned(),
            holder: live.holder.to_string(),
            token: live.token,
            expires_in: live.expires - now,
        })
    }

    /// Whether `token` is the current, live grant of lock `name` (Chubby's
    /// CheckSequencer). A resource asks this before letting `token` raise its mark:
    /// a forged higher token is never a live grant, and a holder whose lease has
    /// lapsed may not raise a mark either. (A stale token is refused by the
    /// resource's own mark; it never needs asking.) No disk I/O.
    pub fn check_token(&self, name: &str, token: u64) -> TokenCheck {
        let now = self.inner.clock.now();
        let table = lock(&self.inner.table);
        match table.by_name.get(name) {
            Some(live) if live.expires > now && live.token == token => {
                TokenCheck::Live { expires_in: live.expires - now }
            }
            Some(live) if live.expires > now => TokenCheck::OtherToken,
            _ => TokenCheck::Free,
        }
    }

    /// Leases in memory: the held ones, and expired ones not yet forgotten (at most
    /// [`Config::max_leases`] in all, unless more were restored at start-up).
    pub fn leases_in_memory(&self) -> usize {
        lock(&self.inner.table).by_name.len()
    }

    /// Closes the durable store, so the data directory can be opened again (by a
    /// restart in this process, say) even while clones of this handle are still
    /// around. Afterwards acquisitions and releases fail as unavailable (503);
    /// keepalives and reads still answer from memory. Blocks while a grant or
    /// release is being written.
    pub fn close(&self) {
        let store = lock(&self.inner.writer).take();
        if store.is_some() {
            tracing::info!(data_dir = %self.inner.config.data_dir.display(), "store closed");
        }
    }
}

impl Inner {
    fn acquire_blocking(
        &self,
        now: Instant,
        name: String,
        holder: String,
        ttl: Duration,
    ) -> Result<Grant, AcquireError> {
        let guard = lock(&self.writer);
        let Some(store) = guard.as_ref() else {
            return Err(AcquireError::Unavailable(CLOSED.into()));
        };
        let (name, expired): (Arc<str>, Vec<(Arc<str>, LeaseId)>) = {
            let table = lock(&self.table);
            let current = table.by_name.get_key_value(name.as_str());
            if let Some((_, cur)) = current
                && cur.expires > now
                && *cur.holder != *holder
            {
                metrics::conflicted();
                return Err(AcquireError::Held {
                    holder: cur.holder.to_string(),
                    expires_in: cur.expires - now,
                });
            }
            // Expired leases, earliest first, forgotten in the same transaction, so
            // abandoned locks neither pile up nor block again after a restart.
            // (Nothing can revive them: a keepalive at or after `now` finds them expired.)
            let expired = table.expired(now, SWEEP_PER_GRANT);
            // Fail closed: a grant that needs a new slot when every slot holds a live
            // lease is refused; no live lease is ever evicted.
            let replaces = current.is_some();
            if !replaces && table.by_name.len() - expired.len() >= self.config.max_leases {
                let retry_after = table
                    .next_expiry(now)
                    .map_or(FULL_RETRY_AFTER_MAX, |e| (e - now).min(FULL_RETRY_AFTER_MAX));
                tracing::warn!(name, max_leases = self.config.max_leases, "lease table full");
                return Err(AcquireError::Full { max_leases: self.config.max_leases, retry_after });
            }
            let name = current.map_or_else(|| Arc::from(name), |(n, _)| Arc::clone(n));
            (name, expired)
        };
        // Nothing else can grant or release while `store` is locked, so the lock is
        // still ours to grant.
        let lease_id = new_lease_id().map_err(AcquireError::Unavailable)?;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let expired_names: Vec<&str> = expired.iter().map(|(n, _)| &**n).collect();
        let token =
            store.grant(&name, &format_lease_id(lease_id), &holder, ttl_ms, &expired_names).map_err(|e| {
                tracing::error!(error = %e, %name, "grant not recorded");
                match e {
                    StoreError::Exhausted => AcquireError::Unavailable(e.to_string()),
                    StoreError::Db(d) => AcquireError::Unavailable(d),
                }
            })?;
        {
            let mut table = lock(&self.table);
            for (_, old_id) in &expired {
                table.remove_by_id(*old_id);
            }
            table.insert(
                Arc::clone(&name),
                Live { lease_id, holder: holder.as_str().into(), token, ttl, expires: expiry(now, ttl) },
            );
        }
        drop(guard);
        if !expired.is_empty() {
            tracing::debug!(forgotten = expired.len(), "expired leases forgotten");
            metrics::expired(expired.len());
        }
        metrics::granted();
        tracing::info!(%name, holder, token, ttl_ms, "granted");
        let proof = self.config.signer.as_ref().map(|s| s.sign(&name, token));
        Ok(Grant { lease_id: format_lease_id(lease_id), name: name.to_string(), holder, token, ttl, proof })
    }

    fn release_blocking(&self, now: Instant, lease_id: LeaseId) -> Result<bool, StorageError> {
        let guard = lock(&self.writer);
        let Some(store) = guard.as_ref() else {
            return Err(StorageError(CLOSED.into()));
        };
        let (name, live) = {
            let table = lock(&self.table);
            let Some(name) = table.by_id.get(&lease_id) else {
                return Ok(false);
            };
            let Some(live) = table.by_name.get(name) else {
                return Ok(false);
            };
            (Arc::clone(name), live.expires > now)
        };
        store.remove(&name).map_err(|e| StorageError(e.to_string()))?;
        lock(&self.table).remove_by_id(lease_id);
        drop(guard);
        tracing::info!(%name, live, "released");
        if live {
            metrics::released();
        } else {
            metrics::expired(1);
        }
        Ok(live)
    }
}

pub(crate) fn check_text(field: &str, value: &str) -> Result<(), AcquireError> {
    if value.is_empty() {
        return Err(AcquireError::Invalid(format!("{field} must not be empty")));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(AcquireError::Invalid(format!("{field} must be at most {MAX_NAME_BYTES} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(AcquireError::Invalid(format!("{field} must not contain control characters")));
    }
    Ok(())
}
