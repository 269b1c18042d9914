//! The replica's background session on etcd: a Watch on the store's prefix
//! (raises and releases, as hints), and the renewer.
//!
//! - **Renew**: one keepalive of the replica's lease, sent after the keeper
//!   took its `sent` time, extends every claim on it at once; then one
//!   linearizable read of the claims asked for and their keys' marks says
//!   which are still this grant's on this lease (extended), and which keys'
//!   marks are above the claim (a raise the replica may have missed). A lease
//!   etcd no longer has renews nothing: every claim on it is gone.
//! - **Watch**: from the session's start, with previous values (a deleted
//!   claim's token), on one member. A watch that breaks (its member stalled,
//!   killed, or without a leader: the client asks for `require_leader`) is
//!   opened again on another member from the revision after the last one it
//!   delivered, so the session, and with it the renewals, go on; events are
//!   late by the time it took to notice (HTTP/2 keepalives: about 2 s), never
//!   lost. A watch etcd cancels (its revision compacted) ends the session; the
//!   keeper opens another and every waiter looks again.
//! - **Sweep**: nothing to do: etcd deletes a lease's claims when it ends.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{KeyValue, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchResponse, WatchStream};
use fencing_layer::claims::{BoxFuture, ClaimEvent, ClaimRenewer, ClaimSession, EVENTS, Renewal};
use fencing_layer::store::StoreError;
use tokio::sync::broadcast;

use crate::backend::EtcdClaims;
use crate::error::ToStore;
use crate::layout::{Layout, claim_value, token};
use crate::members::Members;

/// How often a quiet watch checks that its session still listens.
const LISTENED: Duration = Duration::from_secs(1);

/// Reads per Txn: etcd refuses a Txn of more than `--max-txn-ops` (128 by default).
const READS_PER_TXN: usize = 128;

pub(crate) async fn open(claims: EtcdClaims) -> Result<ClaimSession, StoreError> {
    let (stream, next) = watch(&claims.members, claims.layout.prefix(), None).await?;
    let (sender, events) = broadcast::channel(EVENTS);
    let watched = Watched { members: Arc::clone(&claims.members), layout: Arc::clone(&claims.layout), next };
    tokio::spawn(watched.forward(stream, sender));
    Ok(ClaimSession { renewer: Box::new(Renewer { claims }), events })
}

/// A watch of `prefix` from revision `from` (from now if `None`), created on
/// whichever member answers first (safe on several: a watch changes nothing,
/// and the copies not taken are dropped, which cancels them). The stream, and
/// the revision its first event may have.
async fn watch(members: &Members, prefix: &str, from: Option<i64>) -> Result<(WatchStream, i64), StoreError> {
    let prefix = prefix.to_owned();
    let created = members.ask(move |mut client| {
        let mut options = WatchOptions::new().with_prefix().with_prev_key();
        if let Some(from) = from {
            options = options.with_start_revision(from);
        }
        let prefix = prefix.clone();
        async move {
            let mut stream = client.watch(prefix, Some(options)).await?;
            // etcd's first answer says whether the watch was created.
            let created = stream.message().await?;
            Ok((stream, created))
        }
    });
    let (stream, created) = created.await.map_err(ToStore::to_store)?;
    match created {
        Some(created) if created.created() && !created.canceled() => Ok((stream, after(&created, from))),
        _ => Err(StoreError::log(std::io::Error::other("etcd did not create the claims watch"))),
    }
}

/// The revision after the last one `response` accounts for (at least `from`).
fn after(response: &WatchResponse, from: Option<i64>) -> i64 {
    let revision = response.header().map_or(0, |header| header.revision());
    (revision + 1).max(from.unwrap_or(0))
}

/// The session's watch, as its forwarding task keeps it.
struct Watched {
    members: Arc<Members>,
    layout: Arc<Layout>,
    /// The revision after the last one delivered: where a watch opened again starts.
    next: i64,
}

impl Watched {
    /// Turns watched changes into hints until nobody listens (looked at every
    /// [`LISTENED`], so a quiet watch of an ended session does not stay open)
    /// or the watch cannot go on (etcd cancelled it, or no member would open
    /// it again); then `sender` drops, which ends the session.
    async fn forward(mut self, mut stream: WatchStream, sender: broadcast::Sender<ClaimEvent>) {
        loop {
            let message = match tokio::time::timeout(LISTENED, stream.message()).await {
                Ok(message) => message,
                Err(_) if sender.receiver_count() == 0 => return,
                Err(_) => continue,
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => {
                    tracing::debug!("claims: etcd ended the watch; opening it again");
                    let Some(again) = self.again().await else { return };
                    stream = again;
                    continue;
                }
                Err(error) => {
                    tracing::debug!(%error, "claims: the etcd watch broke; opening it again");
                    let Some(again) = self.again().await else { return };
                    stream = again;
                    continue;
                }
            };
            if response.canceled() {
                let (reason, compacted) = (response.cancel_reason(), response.compact_revision());
                return tracing::warn!(reason, compacted, "claims: etcd cancelled the watch");
            }
            self.next = after(&response, Some(self.next));
            for event in response.events() {
                let put = event.event_type() == etcd_client::EventType::Put;
                let (now, before) = (event.kv(), event.prev_kv());
                let Some(key) = now.or(before).map(KeyValue::key) else { continue };
                let value = if put { now } else { before }.map(KeyValue::value);
                // A full channel drops the oldest: the keeper then reads every mark.
                if let Some(event) = self.layout.event(put, key, value)
                    && sender.send(event).is_err()
                {
                    return;
                }
            }
        }
    }

    /// The watch opened again from where it broke, on the member that answers first.
    async fn again(&self) -> Option<WatchStream> {
        match watch(&self.members, self.layout.prefix(), Some(self.next)).await {
            Ok((stream, _)) => Some(stream),
            Err(error) => {
                tracing::warn!(%error, "claims: the etcd watch broke and could not be opened again");
                None
            }
        }
    }
}

struct Renewer {
    claims: EtcdClaims,
}

impl ClaimRenewer for Renewer {
    fn renew(
        &self,
        replica: &str,
        held: Vec<(String, u64)>,
        term: Duration,
    ) -> BoxFuture<'static, Result<Renewal, StoreError>> {
        let (claims, replica) = (self.claims.clone(), replica.to_owned());
        Box::pin(async move {
            let Some(lease) = claims.lease.current() else { return Ok(Renewal::default()) };
            if !claims.lease.covers(term) || !claims.lease.keep_alive(lease).await? {
                return Ok(Renewal::default());
            }
            let keys = held
                .iter()
                .flat_map(|(key, _)| [claims.layout.claim(key, &replica), claims.layout.mark(key)]);
            let found = gets(&claims.members, keys.collect()).await?;
            let mut renewal = Renewal::default();
            for ((_, grant), pair) in held.iter().zip(found.chunks(2)) {
                let [Some(claim), mark] = pair else { continue };
                let Some(value) = claim_value(claim.value()).filter(|value| value.grant == *grant) else {
                    continue;
                };
                if claim.lease() != lease {
                    continue;
                }
                renewal.extended.push(*grant);
                if let Some(mark) = mark.as_ref().and_then(|mark| token(mark.value()))
                    && mark > value.token
                {
                    renewal.raised.push((*grant, mark));
                }
            }
            Ok(renewal)
        })
    }

    fn read_marks(&self, keys: Vec<String>) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        let claims = self.claims.clone();
        Box::pin(async move {
            let found =
                gets(&claims.members, keys.iter().map(|key| claims.layout.mark(key)).collect()).await?;
            let marks = keys.into_iter().zip(found).filter_map(|(key, kv)| Some((key, token(kv?.value())?)));
            Ok(marks.collect())
        })
    }

    fn sweep(&self) -> BoxFuture<'static, Result<u64, StoreError>> {
        Box::pin(std::future::ready(Ok(0)))
    }
}

/// Reads `keys` (linearizable), in Txns of at most [`READS_PER_TXN`] sent at
/// once; the key-values in the order asked, `None` where a key is missing.
async fn gets(members: &Arc<Members>, keys: Vec<String>) -> Result<Vec<Option<KeyValue>>, StoreError> {
    let mut reads = tokio::task::JoinSet::new();
    for (batch, keys) in keys.chunks(READS_PER_TXN).enumerate() {
        let txn =
            Txn::new().and_then(keys.iter().map(|key| TxnOp::get(key.as_str(), None)).collect::<Vec<_>>());
        let members = Arc::clone(members);
        // Safe on several members: reads only, each linearizable where it is answered.
        reads.spawn(async move {
            let reply = members.ask(move |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            });
            (batch, reply.await)
        });
    }
    let mut batches = Vec::with_capacity(reads.len());
    while let Some(done) = reads.join_next().await {
        let (batch, reply) = done.map_err(StoreError::log)?;
        batches.push((batch, reply.map_err(ToStore::to_store)?));
    }
    batches.sort_unstable_by_key(|(batch, _)| *batch);
    let found =
        batches.into_iter().flat_map(|(_, reply)| reply.op_responses()).map(|response| match response {
            TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
    Ok(found.collect())
}
