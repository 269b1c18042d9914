//! The slow path: a request whose token this replica holds no valid claim on.
//! Look at what this replica knows; else claim through the backend (raising the
//! mark if it is lower); while a lower claim is live, wait for its release or
//! expiry, up to the drain bound.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::claim::State;
use super::room::Room;
use super::{ClaimReply, ClaimRequest, Entered, Inner, KeyTableFull, POLL};
use crate::store::{SharedPermit, SharedRefusal, StoreError};

/// What this replica can tell about a token without the backend.
enum Look {
    Entered(Entered),
    Stale(u64),
    Ask,
}

pub(super) async fn admit(
    inner: Arc<Inner>,
    key: String,
    token: u64,
    drain: Duration,
) -> Result<SharedPermit, SharedRefusal> {
    inner.start();
    let started = Instant::now();
    let deadline = started.checked_add(drain).unwrap_or(started + Duration::from_secs(86_400 * 365));
    let mut raised = false;
    let mut waited = false;
    let admitted = |entered: Entered, raised: bool, waited: bool| {
        let drained = waited.then(|| started.elapsed());
        Ok(SharedPermit::claim(entered).with_raise(raised, drained))
    };
    loop {
        // Registered before looking, so a release or raise heard after the look wakes it.
        let mut woken = Arc::clone(inner.stripe(&key)).notified_owned();
        match look(&inner, &key, token) {
            Look::Entered(entered) => return admitted(entered, raised, waited),
            Look::Stale(highest) => return Err(SharedRefusal::Stale { highest }),
            Look::Ask => {}
        }
        // One claim in flight per key and token on this replica: the others wait for its outcome.
        let Some(_claiming) = Claiming::start(&inner, &key, token) else {
            if Instant::now() >= deadline {
                return Err(SharedRefusal::DrainTimeout);
            }
            pause(woken, deadline.min(Instant::now() + POLL)).await;
            continue;
        };
        let (reply, grant, sent, mut room) = claim(&inner, &key, token, deadline).await?;
        match reply {
            ClaimReply::Stale { mark } => {
                inner.raised(&key, mark);
                return Err(SharedRefusal::Stale { highest: mark });
            }
            ClaimReply::Refused(why) => return Err(SharedRefusal::InvalidKey(why)),
            ClaimReply::Granted { raised: now_raised } => {
                raised |= now_raised;
                inner.note_mark(&key, token);
                match inner.install(&key, token, grant, sent, &mut room) {
                    Ok(Some(entered)) => return admitted(entered, raised, waited),
                    // Revoked the instant it was installed (a deadline already past): claim again.
                    Ok(None) => {}
                    Err(KeyTableFull) => {
                        inner.release(&key, token, grant);
                        return Err(key_table_full(&inner));
                    }
                }
            }
            ClaimReply::Wait { raised: now_raised, soonest } => {
                raised |= now_raised;
                waited = true;
                // News woke this key's waiters, this request among them: watch afresh,
                // or it would claim again at once, in a loop of round trips. Else the
                // wake-up registered before this claim was sent still stands, and a
                // release heard since its answer left the backend is not missed.
                if inner.raised(&key, token) {
                    woken = Arc::clone(inner.stripe(&key)).notified_owned();
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(SharedRefusal::DrainTimeout);
                }
                // Just after the soonest expiry, or at the next poll, or at the bound.
                let wait = soonest.map_or(POLL, |soonest| (soonest + Duration::from_millis(1)).min(POLL));
                pause(woken, deadline.min(now + wait)).await;
            }
        }
    }
}

/// Asks the database for `key`'s claim at `token`, as this replica's one claimer of
/// them: if the key has room (taken now, before the round trip), once a session
/// can renew the claim (a claim nobody can renew would only lapse). The reply,
/// with the grant asked for, when, and the room it holds.
async fn claim(
    inner: &Arc<Inner>,
    key: &str,
    token: u64,
    deadline: Instant,
) -> Result<(ClaimReply, u64, u64, Room), SharedRefusal> {
    let Some(room) = inner.reserve(key) else { return Err(key_table_full(inner)) };
    let left = deadline.saturating_duration_since(Instant::now());
    let timing = inner.timing;
    inner
        .session(left.min(timing.renew_every + timing.renew_timeout))
        .await
        .map_err(SharedRefusal::Unavailable)?;
    let grant = inner.next_grant();
    let sent = inner.now();
    let (reply, room) = ask(inner, key, token, grant, room).await;
    Ok((reply.map_err(SharedRefusal::Unavailable)?, grant, sent, room))
}

/// 503: `max_keys` keys are held or on their way.
fn key_table_full(inner: &Inner) -> SharedRefusal {
    let limit = inner.max_claims.load(std::sync::atomic::Ordering::Relaxed);
    SharedRefusal::Unavailable(StoreError::KeyTableFull { limit })
}

/// Until `woken` (a release or a raise of the key was heard) or `until`.
async fn pause(woken: OwnedNotified, until: Instant) {
    tokio::select! {
        () = woken => {}
        () = tokio::time::sleep_until(until) => {}
    }
}

/// Sends the claim on a task of its own, so that a grant whose request went
/// away meanwhile (its client left, its future was dropped) is released at
/// once rather than blocking raises until it expires. The task holds the
/// key's room until then: an abandoned grant still counts against `max_keys`.
async fn ask(
    inner: &Arc<Inner>,
    key: &str,
    token: u64,
    grant: u64,
    room: Room,
) -> (Result<ClaimReply, StoreError>, Room) {
    let request = ClaimRequest { replica: &inner.replica, key, token, term: inner.timing.term, grant };
    let reply = inner.backend.claim(request);
    let (sender, receiver) = oneshot::channel();
    let (backend, replica, key) = (Arc::clone(&inner.backend), inner.replica.clone(), key.to_owned());
    tokio::spawn(async move {
        if let Err((Ok(ClaimReply::Granted { .. }), _room)) = sender.send((reply.await, room))
            && let Err(error) = backend.release(&replica, &key, grant).await
        {
            tracing::debug!(key, token, %error, "an abandoned grant's release failed; it will expire");
        }
    });
    // The task ends only by sending, or by its runtime shutting down (then nothing was granted here).
    receiver.await.unwrap_or_else(|_| (Err(StoreError::Closed), Room::within_key()))
}

/// This replica's claim of `(key, token)` in flight; when it ends, however it
/// ends (the request dropped included), the others waiting on it look again.
struct Claiming<'a> {
    inner: &'a Inner,
    key: &'a str,
    token: u64,
}

impl<'a> Claiming<'a> {
    fn start(inner: &'a Inner, key: &'a str, token: u64) -> Option<Self> {
        let mut claiming = inner.claiming.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let first = claiming.insert((key.to_owned(), token));
        drop(claiming);
        // Built only when this request is the one claiming: dropping it unregisters.
        first.then(|| Self { inner, key, token })
    }
}

impl Drop for Claiming<'_> {
    fn drop(&mut self) {
        let mut claiming = self.inner.claiming.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        claiming.remove(&(self.key.to_owned(), self.token));
        drop(claiming);
        self.inner.wake(self.key);
    }
}

fn look(inner: &Arc<Inner>, key: &str, token: u64) -> Look {
    let known = inner.marks.get(key).map_or(0, |mark| *mark);
    if known > token {
        return Look::Stale(known);
    }
    let Some(claim) = inner.claims.get(key).map(|claim| Arc::clone(&claim)) else { return Look::Ask };
    match claim.token.cmp(&token) {
        Ordering::Greater => Look::Stale(inner.highest(key, claim.token)),
        // This request raises: the lower claim takes nobody more, and is released once empty.
        Ordering::Less => {
            claim.overtake(token);
            Look::Ask
        }
        Ordering::Equal => match claim.try_enter(inner.now()) {
            Some(entered) => Look::Entered(entered),
            None => match claim.overtaken_by() {
                Some(by) if claim.state() == State::Overtaken => Look::Stale(inner.highest(key, by)),
                // Expired here, lost or being released: a new grant replaces it.
                _ => Look::Ask,
            },
        },
    }
}
