//! `EtcdClaims`: the claim backend on etcd (the protocol and its proof are in
//! [`fencing_layer::claims`]; this file is only how etcd keeps each step).
//!
//! - **Claim**, in two round trips. First, at once: a keepalive of the
//!   replica's lease ([`ReplicaLease::fresh`]), and one Txn that raises the
//!   mark if it is lower (creating it if there is none) and reads the mark and
//!   every claim on the key. A mark above the token is a 409; a claim below it
//!   is a wait. Else a second Txn puts the claim on the lease **if the mark's
//!   mod revision is still the one read**.
//! - **Why no lower claim can slip in** between the read and the put: a claim
//!   on token `s` is only ever put by a Txn comparing the mark's mod revision
//!   with a read that found the mark at `s`. The mark only rises, so once it
//!   was written at `t > s` (at revision `R`), no such Txn succeeds; every
//!   claim below `t` was put before `R`, and the read (at or after `R`, since
//!   it saw `t`) saw each one still there. A claim deleted after the read only
//!   makes the wait longer.
//! - **Renewal against grant**: a grant judges a lower claim expired only when
//!   its key is gone, and etcd deletes a lease's keys in the same step that
//!   ends the lease, which no keepalive then brings back.
//! - **Release**: read the claim, then delete it if its mod revision is
//!   unchanged and it is still this grant's (a late release never deletes a
//!   newer grant's claim); tried again until done, since the replica's lease
//!   would keep a forgotten claim alive (see `EtcdClaims::release`).
//! - **Announcements**: none are sent; the session's Watch sees every mark
//!   written (a raise) and every claim deleted, by a release or by its lease
//!   ending (a release).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use fencing_layer::claims::{BoxFuture, ClaimBackend, ClaimReply, ClaimRequest, ClaimSession};
use fencing_layer::store::StoreError;
use tokio::sync::oneshot;

use crate::error::{ToStore, is_lease_gone};
use crate::layout::{Layout, claim_value, encode_claim, padded, token};
use crate::lease::ReplicaLease;
use crate::members::Members;
use crate::session;

/// How many times a claim starts over when the mark moved between its read
/// and its put, or its lease ended, before it says "wait".
const ATTEMPTS: usize = 3;

/// How often a claim's release that failed is tried again.
const RELEASE_RETRY: Duration = Duration::from_millis(250);

/// The claim backend: marks and claims under `layout`'s prefix, claims on `lease`.
#[derive(Clone)]
pub(crate) struct EtcdClaims {
    pub(crate) members: Arc<Members>,
    pub(crate) layout: Arc<Layout>,
    pub(crate) lease: Arc<ReplicaLease>,
}

/// What the first round trip found.
struct Read {
    raised: bool,
    mark: u64,
    mark_revision: i64,
    /// Tokens of the claims below the mark, any replica's.
    lower: usize,
}

impl EtcdClaims {
    async fn claim(
        self,
        replica: String,
        key: String,
        token: u64,
        grant: u64,
    ) -> Result<ClaimReply, StoreError> {
        let mut raised = false;
        for _ in 0..ATTEMPTS {
            // The keepalive goes out beside the read, but a 409 or a wait does not
            // wait for it: a raise that must wait starts listening for releases
            // the moment it knows, not a keepalive's round trip later.
            let fresh = self.lease.fresh();
            tokio::pin!(fresh);
            let mut lease = None;
            let read = self.raise_and_read(&key, token);
            tokio::pin!(read);
            let read = loop {
                tokio::select! {
                    read = &mut read => break read?,
                    kept = &mut fresh, if lease.is_none() => lease = Some(kept),
                }
            };
            raised |= read.raised;
            if read.mark > token {
                return Ok(ClaimReply::Stale { mark: read.mark });
            }
            if read.lower > 0 {
                return Ok(ClaimReply::Wait { raised, soonest: None });
            }
            let lease = match lease {
                Some(kept) => kept?,
                None => fresh.await?,
            };
            let claim = self.layout.claim(&key, &replica);
            let put = Txn::new()
                .when([Compare::mod_revision(self.layout.mark(&key), CompareOp::Equal, read.mark_revision)])
                .and_then([TxnOp::put(
                    claim.as_str(),
                    encode_claim(token, grant),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(claim.as_str(), None)]);
            // Safe on several members: every copy puts the same claim (this
            // grant, this lease) under the same compare, so a second copy
            // applied changes nothing. A copy that finds the mark moved may
            // follow one that put the claim: its read of the claim says so.
            let put = self.members.ask(move |mut client| {
                let put = put.clone();
                async move { client.txn(put).await }
            });
            match put.await {
                Ok(put) if put.succeeded() || holds(&put, grant, lease) => {
                    return Ok(ClaimReply::Granted { raised });
                }
                // The mark moved: read again (a higher mark makes it a 409).
                Ok(_) => {}
                // The lease ended between its keepalive and the put: a new one next time.
                Err(error) if is_lease_gone(&error) => {}
                Err(error) => return Err(error.to_store()),
            }
        }
        Ok(ClaimReply::Wait { raised, soonest: None })
    }

    /// One Txn: create the mark at `token` if there is none, else raise it if
    /// lower; then read it and every claim on the key.
    async fn raise_and_read(&self, key: &str, token: u64) -> Result<Read, StoreError> {
        let mark = self.layout.mark(key);
        let reads = || {
            [
                TxnOp::get(mark.as_str(), None),
                TxnOp::get(self.layout.claims_of(key), Some(GetOptions::new().with_prefix())),
            ]
        };
        let raise = Txn::new()
            .when([Compare::value(mark.as_str(), CompareOp::Less, padded(token))])
            .and_then([TxnOp::put(mark.as_str(), padded(token), None)]);
        let create = TxnOp::put(mark.as_str(), padded(token), None);
        let txn = Txn::new()
            .when([Compare::create_revision(mark.as_str(), CompareOp::Equal, 0)])
            .and_then([vec![create], reads().to_vec()].concat())
            .or_else([vec![TxnOp::txn(raise)], reads().to_vec()].concat());
        // Safe on several members: a raise writes the mark only if it is lower,
        // so copies leave it at the token whatever their number (a copy after
        // the first says "not raised": only the layer's count of raises misses
        // it), and the reads used are the answering copy's own.
        let reply = self.members.ask(move |mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        });
        let reply = reply.await.map_err(ToStore::to_store)?;
        read(&reply, token)
    }

    /// Deletes `grant`'s claim on `key` if it is still there; sends the first
    /// attempt's outcome to `first`, and tries again every [`RELEASE_RETRY`]
    /// until the claim is gone, no longer this grant's, or the store dropped.
    ///
    /// Why it never gives up while the store lives: a claim's key is on the
    /// replica's one lease, which every renewal keeps alive whatever claims the
    /// replica still holds. A row whose release failed (etcd without a leader
    /// for a moment) would not expire, unlike a PostgreSQL row with its own
    /// expiry: the replica forgets the claim, nobody renews or deletes the row,
    /// and every raise of its key waits for it until the drain bound, for as
    /// long as the replica lives (found by `tests/cluster/cluster_faults.rs`: a leader
    /// killed under load left such rows, and raises of their keys got 503 for
    /// good). The store stops waiting for a release after a term, so the
    /// retries run in a task of their own.
    async fn release(
        self,
        replica: String,
        key: String,
        grant: u64,
        first: oneshot::Sender<Result<(), StoreError>>,
    ) {
        let (claim, members, lease) =
            (self.layout.claim(&key, &replica), self.members, Arc::downgrade(&self.lease));
        drop(self.lease);
        let mut first = Some(first);
        loop {
            let outcome = release_once(&members, &claim, grant).await;
            let done = outcome.is_ok();
            if let Some(first) = first.take() {
                let _ = first.send(outcome);
            }
            if done || lease.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(RELEASE_RETRY).await;
        }
    }
}

/// Reads `claim`, then deletes it if its mod revision is unchanged and it is
/// still `grant`'s (a late release never deletes a newer grant's claim; a
/// changed revision is that newer grant, since only this replica writes it).
async fn release_once(members: &Members, claim: &str, grant: u64) -> Result<(), StoreError> {
    // Safe on several members: a read; and a delete that compares the
    // revision read, so a second copy finds the claim gone and deletes nothing.
    let key = claim.to_owned();
    let found = members.ask(move |mut client| {
        let key = key.clone();
        async move { client.get(key, None).await }
    });
    let found = found.await.map_err(ToStore::to_store)?;
    let Some(kv) = found.kvs().first() else { return Ok(()) };
    if claim_value(kv.value()).is_none_or(|value| value.grant != grant) {
        return Ok(());
    }
    let delete = Txn::new()
        .when([Compare::mod_revision(claim, CompareOp::Equal, kv.mod_revision())])
        .and_then([TxnOp::delete(claim, None)]);
    let deleted = members.ask(move |mut client| {
        let delete = delete.clone();
        async move { client.txn(delete).await }
    });
    deleted.await.map(drop).map_err(ToStore::to_store)
}

/// Whether a claim's put that found the mark moved read the claim as this
/// grant's on this lease: an earlier copy of the same put was applied, and
/// that claim stands (its put compared the mark's revision like any other).
fn holds(put: &TxnResponse, grant: u64, lease: i64) -> bool {
    put.op_responses().into_iter().any(|response| match response {
        TxnOpResponse::Get(get) => get.kvs().first().is_some_and(|kv| {
            kv.lease() == lease && claim_value(kv.value()).is_some_and(|value| value.grant == grant)
        }),
        _ => false,
    })
}

/// The mark and the claims below it, from the first Txn's answer.
fn read(reply: &TxnResponse, token: u64) -> Result<Read, StoreError> {
    let responses = reply.op_responses();
    let raised = reply.succeeded()
        || responses
            .iter()
            .any(|response| matches!(response, TxnOpResponse::Txn(raise) if raise.succeeded()));
    let mut gets = responses.into_iter().filter_map(|response| match response {
        TxnOpResponse::Get(get) => Some(get),
        _ => None,
    });
    let (Some(mark), Some(claims)) = (gets.next(), gets.next()) else {
        return Err(malformed("a claim's Txn answered without its reads"));
    };
    let Some(mark) = mark.kvs().first() else { return Err(malformed("the mark vanished during a claim")) };
    let (mark, mark_revision) = (mark_of(mark)?, mark.mod_revision());
    let lower =
        claims.kvs().iter().filter(|kv| claim_value(kv.value()).is_none_or(|claim| claim.token < token));
    Ok(Read { raised, mark, mark_revision, lower: lower.count() })
}

fn mark_of(kv: &KeyValue) -> Result<u64, StoreError> {
    token(kv.value()).ok_or_else(|| malformed("a mark that is not a token"))
}

fn malformed(what: &str) -> StoreError {
    StoreError::log(std::io::Error::other(what.to_owned()))
}

impl ClaimBackend for EtcdClaims {
    fn claim(&self, request: ClaimRequest<'_>) -> BoxFuture<'static, Result<ClaimReply, StoreError>> {
        let ClaimRequest { replica, key, token, grant, term } = request;
        if !self.lease.covers(term) {
            let why = format!("a claim's term of {term:?} is longer than the replica's etcd lease");
            return Box::pin(std::future::ready(Err(malformed(&why))));
        }
        Box::pin(self.clone().claim(replica.to_owned(), key.to_owned(), token, grant))
    }

    fn release(&self, replica: &str, key: &str, grant: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        let (claims, replica, key) = (self.clone(), replica.to_owned(), key.to_owned());
        Box::pin(async move {
            let (first, outcome) = oneshot::channel();
            // Spawned here, on the runtime that runs the release: retries outlive this future.
            tokio::spawn(claims.release(replica, key, grant, first));
            outcome.await.unwrap_or_else(|_| Err(malformed("a claim's release ended without an answer")))
        })
    }

    fn open_session(&self) -> BoxFuture<'static, Result<ClaimSession, StoreError>> {
        Box::pin(session::open(self.clone()))
    }
}
