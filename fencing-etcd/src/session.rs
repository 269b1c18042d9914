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
//!   claim's token). A watch etcd cancels (its revision compacted, its member
//!   without a leader: the client asks for `require_leader`) or that breaks
//!   ends the session; the keeper opens another and every waiter looks again.
//! - **Sweep**: nothing to do: etcd deletes a lease's claims when it ends.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, KeyValue, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream};
use fencing_layer::claims::{BoxFuture, ClaimEvent, ClaimRenewer, ClaimSession, EVENTS, Renewal};
use fencing_layer::store::StoreError;
use tokio::sync::broadcast;

use crate::backend::EtcdClaims;
use crate::error::{ToStore, sent};
use crate::layout::{Layout, claim_value, token};

/// How often a quiet watch checks that its session still listens.
const LISTENED: Duration = Duration::from_secs(1);

/// Reads per Txn: etcd refuses a Txn of more than `--max-txn-ops` (128 by default).
const READS_PER_TXN: usize = 128;

pub(crate) async fn open(claims: EtcdClaims) -> Result<ClaimSession, StoreError> {
    let options = WatchOptions::new().with_prefix().with_prev_key();
    let mut stream = claims
        .client
        .clone()
        .watch(claims.layout.prefix(), Some(options))
        .await
        .map_err(ToStore::to_store)?;
    // etcd's first answer says whether the watch was created.
    match stream.message().await.map_err(ToStore::to_store)? {
        Some(created) if created.created() && !created.canceled() => {}
        _ => return Err(StoreError::log(std::io::Error::other("etcd did not create the claims watch"))),
    }
    let (sender, events) = broadcast::channel(EVENTS);
    tokio::spawn(forward(stream, Arc::clone(&claims.layout), sender));
    Ok(ClaimSession { renewer: Box::new(Renewer { claims }), events })
}

/// Turns watched changes into hints until the watch ends or nobody listens
/// (looked at every [`LISTENED`], so a quiet watch of an ended session does not
/// stay open); then `sender` drops, which ends the session.
async fn forward(mut stream: WatchStream, layout: Arc<Layout>, sender: broadcast::Sender<ClaimEvent>) {
    loop {
        let message = match tokio::time::timeout(LISTENED, stream.message()).await {
            Ok(message) => message,
            Err(_) if sender.receiver_count() == 0 => return,
            Err(_) => continue,
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => return tracing::warn!("claims: etcd ended the watch"),
            Err(error) => return tracing::warn!(%error, "claims: the etcd watch broke"),
        };
        if response.canceled() {
            let (reason, compacted) = (response.cancel_reason(), response.compact_revision());
            return tracing::warn!(reason, compacted, "claims: etcd cancelled the watch");
        }
        for event in response.events() {
            let put = event.event_type() == etcd_client::EventType::Put;
            let (now, before) = (event.kv(), event.prev_kv());
            let Some(key) = now.or(before).map(KeyValue::key) else { continue };
            let value = if put { now } else { before }.map(KeyValue::value);
            // A full channel drops the oldest: the keeper then reads every mark.
            if let Some(event) = layout.event(put, key, value)
                && sender.send(event).is_err()
            {
                return;
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
            let found = gets(&claims.client, keys.collect()).await?;
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
                gets(&claims.client, keys.iter().map(|key| claims.layout.mark(key)).collect()).await?;
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
async fn gets(client: &Client, keys: Vec<String>) -> Result<Vec<Option<KeyValue>>, StoreError> {
    let mut reads = tokio::task::JoinSet::new();
    for (batch, keys) in keys.chunks(READS_PER_TXN).enumerate() {
        let txn =
            Txn::new().and_then(keys.iter().map(|key| TxnOp::get(key.as_str(), None)).collect::<Vec<_>>());
        let client = client.clone();
        reads.spawn(async move {
            let reply = sent(&client, |mut client| {
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
