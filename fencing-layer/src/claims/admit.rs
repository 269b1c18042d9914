//! The slow path: a request whose token this replica holds no valid claim on.
//! Look at what this replica knows; else claim through the backend (raising the
//! mark if it is lower); while a lower claim is live, wait for its release or
//! expiry, up to the drain bound.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::claim::State;
use super::{ClaimReply, ClaimRequest, Entered, Inner, POLL};
use crate::store::{SharedPermit, SharedRefusal};

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
        let woken = Arc::clone(inner.stripe(&key)).notified_owned();
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
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep_until(deadline.min(Instant::now() + POLL)) => {}
            }
            continue;
        };
        let grant = inner.next_grant();
        let request =
            ClaimRequest { replica: &inner.replica, key: &key, token, term: inner.timing.term, grant };
        let sent = inner.now();
        let reply = inner.backend.claim(request).await.map_err(SharedRefusal::Unavailable)?;
        match reply {
            ClaimReply::Stale { mark } => {
                inner.raised(&key, mark);
                return Err(SharedRefusal::Stale { highest: mark });
            }
            ClaimReply::Refused(why) => return Err(SharedRefusal::InvalidKey(why)),
            ClaimReply::Granted { raised: now_raised } => {
                raised |= now_raised;
                inner.note_mark(&key, token);
                if let Some(entered) = inner.install(&key, token, grant, sent) {
                    return admitted(entered, raised, waited);
                }
                // Revoked the instant it was installed (a deadline already past): claim again.
            }
            ClaimReply::Wait { raised: now_raised, soonest } => {
                raised |= now_raised;
                waited = true;
                inner.raised(&key, token);
                let now = Instant::now();
                if now >= deadline {
                    return Err(SharedRefusal::DrainTimeout);
                }
                // Just after the soonest expiry, or at the next poll, or at the bound.
                let pause = soonest.map_or(POLL, |soonest| (soonest + Duration::from_millis(1)).min(POLL));
                let until = deadline.min(now + pause);
                tokio::select! {
                    () = woken => {}
                    () = tokio::time::sleep_until(until) => {}
                }
            }
        }
    }
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
