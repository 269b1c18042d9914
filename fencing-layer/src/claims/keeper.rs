//! The background task: keeps a session open, renews this replica's claims,
//! hears raises and releases, and revokes every claim whose deadline passes.
//! It holds the store weakly and ends when the store is dropped.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};

use super::claim::{Claim, State};
use super::{BoxFuture, ClaimEvent, ClaimRenewer, ClaimSession, Inner, Renewed};
use crate::store::StoreError;

/// The first pause before reopening a session that failed; it doubles up to a second.
const REOPEN_PAUSE: Duration = Duration::from_millis(50);
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A renewal in flight: what it asked for and when it was sent.
struct Renewal {
    sent: u64,
    /// Each claim asked for, with the grant asked for.
    held: Vec<(Arc<Claim>, u64)>,
    reply: BoxFuture<'static, Result<Result<Vec<Renewed>, StoreError>, tokio::time::error::Elapsed>>,
}

pub(super) async fn run(store: Weak<Inner>) {
    let mut pause = REOPEN_PAUSE;
    loop {
        let Some(inner) = store.upgrade() else { return };
        let bound = inner.timing.renew_every.max(Duration::from_millis(100));
        let opening = tokio::time::timeout(bound, inner.backend.open_session());
        let deadline = inner.next_deadline();
        drop(inner);
        // Deadlines keep running while no session is open.
        let opened = tokio::select! {
            opened = opening => opened,
            () = sleep_until(deadline) => {
                revoke_expired(&store);
                continue;
            }
        };
        match opened {
            Ok(Ok(session)) => {
                pause = REOPEN_PAUSE;
                if let Some(inner) = store.upgrade() {
                    // Whatever was announced while no session listened: everyone looks again.
                    inner.wake_all();
                }
                serve(&store, session).await;
            }
            Ok(Err(error)) => tracing::warn!(%error, "claims: cannot open the background session"),
            Err(_) => tracing::warn!("claims: opening the background session timed out"),
        }
        let until = Instant::now() + pause;
        pause = (pause * 2).min(REOPEN_PAUSE_MAX);
        while Instant::now() < until {
            let deadline = match store.upgrade() {
                Some(inner) => inner.next_deadline(),
                None => return,
            };
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = sleep_until(deadline) => revoke_expired(&store),
            }
        }
    }
}

/// Runs one session until it breaks (or the store is dropped).
async fn serve(store: &Weak<Inner>, session: ClaimSession) {
    let ClaimSession { renewer, mut events } = session;
    let renewer: Arc<dyn ClaimRenewer> = Arc::from(renewer);
    let Some(every) = store.upgrade().map(|inner| inner.timing.renew_every) else { return };
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut renewal: Option<Renewal> = None;
    loop {
        let Some(deadline) = store.upgrade().map(|inner| inner.next_deadline()) else { return };
        tokio::select! {
            _ = tick.tick() => {
                let Some(inner) = store.upgrade() else { return };
                inner.release_idle();
                if renewal.is_none() {
                    renewal = Some(renew(&inner, &renewer));
                }
            }
            replied = async { renewal.as_mut().expect("guarded").reply.as_mut().await }, if renewal.is_some() => {
                let Renewal { sent, held, .. } = renewal.take().expect("guarded");
                let Some(inner) = store.upgrade() else { return };
                match replied {
                    Ok(Ok(renewed)) => inner.renewed(sent, &held, renewed),
                    Ok(Err(error)) => {
                        tracing::warn!(%error, "claims: renewal failed; reopening the session");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!("claims: renewal timed out; reopening the session");
                        return;
                    }
                }
            }
            event = events.recv() => {
                let Some(inner) = store.upgrade() else { return };
                match event {
                    Some(ClaimEvent::Raised { key, token }) => inner.raised(&key, token),
                    Some(ClaimEvent::Released { key, .. }) => inner.wake(&key),
                    None => {
                        tracing::warn!("claims: the background session ended; reopening it");
                        return;
                    }
                }
            }
            () = sleep_until(deadline) => revoke_expired(store),
        }
    }
}

fn renew(inner: &Arc<Inner>, renewer: &Arc<dyn ClaimRenewer>) -> Renewal {
    let held: Vec<(Arc<Claim>, u64)> = inner
        .claims
        .iter()
        .filter(|claim| matches!(claim.state(), State::Valid | State::Overtaken))
        .map(|claim| (Arc::clone(&claim), claim.grant()))
        .collect();
    let asked = held.iter().map(|(claim, grant)| (claim.key.clone(), *grant)).collect();
    let sent = inner.now();
    // A renewal that takes longer than the period is as good as failed.
    let bound = inner.timing.renew_every.max(Duration::from_millis(100));
    let reply =
        Box::pin(tokio::time::timeout(bound, renewer.renew(&inner.replica, asked, inner.timing.term)));
    Renewal { sent, held, reply }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn revoke_expired(store: &Weak<Inner>) {
    if let Some(inner) = store.upgrade() {
        inner.revoke_expired();
    }
}

impl Inner {
    /// The earliest deadline of a claim that still admits or has requests inside.
    fn next_deadline(&self) -> Option<Instant> {
        let now = self.now();
        let soonest = self
            .claims
            .iter()
            .filter(|claim| matches!(claim.state(), State::Valid | State::Overtaken))
            // The mutant never revokes: a past deadline would wake the keeper in a loop.
            .filter(|claim| !mutant::no_deadline_revoke() || claim.deadline() > now)
            .map(|claim| claim.deadline())
            .min()?;
        Some(self.epoch + Duration::from_nanos(soonest))
    }

    /// Revokes every claim whose deadline has passed: its requests are stopped.
    fn revoke_expired(&self) {
        if mutant::no_deadline_revoke() {
            return;
        }
        let now = self.now();
        for claim in self.claims.iter() {
            if matches!(claim.state(), State::Valid | State::Overtaken) && claim.deadline() <= now {
                tracing::warn!(
                    key = claim.key,
                    token = claim.token,
                    inside = claim.inside(),
                    "claims: a claim was not renewed in time; stopping its requests"
                );
                claim.revoke();
            }
        }
    }

    /// Releases claims nobody used since the last tick, so raises elsewhere need not wait for them.
    fn release_idle(&self) {
        for claim in self.claims.iter() {
            if claim.state() == State::Valid {
                claim.release_if_idle();
            }
        }
    }

    /// A renewal sent at `sent` for `held` came back with `renewed`.
    fn renewed(&self, sent: u64, held: &[(Arc<Claim>, u64)], renewed: Vec<Renewed>) {
        let deadline = self.deadline_from(sent);
        let mut kept = HashSet::with_capacity(renewed.len());
        for Renewed { key, grant, token, mark } in renewed {
            if mark > token {
                self.raised(&key, mark);
            }
            kept.insert((key, grant));
        }
        for (claim, grant) in held {
            if kept.contains(&(claim.key.clone(), *grant)) {
                claim.renewed(*grant, deadline);
            } else if claim.grant() == *grant && matches!(claim.state(), State::Valid | State::Overtaken) {
                // Gone from the backend (expired, then deleted by a raise) and
                // not replaced by a newer grant meanwhile: stop it.
                tracing::warn!(
                    key = claim.key,
                    token = claim.token,
                    "claims: a renewal found the claim gone"
                );
                claim.revoke();
            }
        }
    }
}

/// The mutant switch of the `mutants` feature (tests only): without the
/// feature, every switch is a constant `false`.
mod mutant {
    /// `FENCING_MUTANT=no-deadline-revoke`: the keeper stops no request when a
    /// claim's local deadline passes (a lost renewal cancels nothing).
    #[cfg(feature = "mutants")]
    pub(super) fn no_deadline_revoke() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            let on = std::env::var("FENCING_MUTANT").is_ok_and(|mutant| mutant == "no-deadline-revoke");
            if on {
                tracing::error!("MUTANT no-deadline-revoke: claims are not revoked at their local deadline");
            }
            on
        })
    }

    #[cfg(not(feature = "mutants"))]
    #[inline(always)]
    pub(super) const fn no_deadline_revoke() -> bool {
        false
    }
}
