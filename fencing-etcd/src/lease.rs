//! The replica's one etcd lease: every claim of the replica is attached to it,
//! so one keepalive extends them all, and its expiry is every claim's expiry.
//!
//! The proof in `fencing_layer::claims` needs each claim to expire no sooner
//! than `term` after the replica *sent* the grant or renewal that its local
//! deadline counts from. A lease's expiry is `TTL` after the leader last
//! processed a grant or keepalive of it, so both the grant path
//! ([`ReplicaLease::fresh`]) and the renewal ([`ReplicaLease::keep_alive`])
//! send a keepalive (or grant a lease) of their own after the caller took its
//! `sent` time, and trust no keepalive sent before it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencing_layer::store::StoreError;

use crate::error::{ToStore, is_lease_gone};
use crate::members::Members;

/// The replica's lease: granted on the first claim, kept alive by every grant
/// and renewal, granted again once etcd says it is gone.
pub(crate) struct ReplicaLease {
    members: Arc<Members>,
    /// Whole seconds, at least the claims' term.
    ttl: i64,
    current: Mutex<Option<i64>>,
    /// One grant at a time, so that concurrent claims share one lease.
    granting: tokio::sync::Mutex<()>,
}

impl ReplicaLease {
    pub(crate) fn new(members: Arc<Members>, term: Duration) -> Self {
        // Rounded up: a longer lease only makes raises wait longer for a dead replica.
        let ttl = term.as_secs().saturating_add(u64::from(term.subsec_nanos() > 0)).max(1);
        let ttl = i64::try_from(ttl).unwrap_or(i64::MAX);
        Self { members, ttl, current: Mutex::new(None), granting: tokio::sync::Mutex::new(()) }
    }

    /// The lease as a grant or keepalive sent by this call left it: it lasts
    /// at least the term from when this call began.
    pub(crate) async fn fresh(&self) -> Result<i64, StoreError> {
        for _ in 0..3 {
            if let Some(id) = self.current() {
                if self.keep_alive(id).await? {
                    return Ok(id);
                }
                continue;
            }
            let _one = self.granting.lock().await;
            // Another claim granted one meanwhile, maybe before this call began:
            // keep it alive ourselves rather than trust its grant.
            if self.current().is_some() {
                continue;
            }
            let id = self.grant().await?;
            *self.lock() = Some(id);
            return Ok(id);
        }
        Err(StoreError::log(std::io::Error::other("etcd kept dropping the replica's lease")))
    }

    /// One keepalive of `id`, sent now: `false` (and the lease forgotten) if
    /// etcd says it is gone, with every claim on it.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<bool, StoreError> {
        // Safe on several members: a keepalive only extends the lease, from when
        // a leader processes it, which is after the caller's `sent` whichever member forwards it.
        match self
            .members
            .ask(move |mut client| async move { client.lease_keep_alive(id).await.map(drop) })
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if is_lease_gone(&error) => {
                let mut current = self.lock();
                if *current == Some(id) {
                    *current = None;
                }
                Ok(false)
            }
            Err(error) => Err(error.to_store()),
        }
    }

    /// Whether the lease outlasts a claim of `term` (it is granted for the store's term, rounded up).
    pub(crate) fn covers(&self, term: Duration) -> bool {
        u64::try_from(self.ttl).is_ok_and(|ttl| Duration::from_secs(ttl) >= term)
    }

    /// The lease claims go on now, if there is one.
    pub(crate) fn current(&self) -> Option<i64> {
        *self.lock()
    }

    async fn grant(&self) -> Result<i64, StoreError> {
        let ttl = self.ttl;
        // Safe on several members: a lease granted twice leaves one unused, which
        // holds no key and ends after its TTL.
        let granted = self
            .members
            .ask(move |mut client| async move { client.lease_grant(ttl, None).await })
            .await
            .map_err(ToStore::to_store)?;
        // etcd may raise a TTL to its minimum, never lower it; a shorter one would break the proof.
        if !granted.error().is_empty() || granted.ttl() < self.ttl {
            let why = format!(
                "etcd granted a lease of {} s for {} s: {}",
                granted.ttl(),
                self.ttl,
                granted.error()
            );
            return Err(StoreError::log(std::io::Error::other(why)));
        }
        tracing::debug!(
            lease = format_args!("{:x}", granted.id()),
            ttl = granted.ttl(),
            "claims: etcd lease granted"
        );
        Ok(granted.id())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<i64>> {
        self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
