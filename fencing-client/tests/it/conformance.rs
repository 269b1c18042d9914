//! One suite of lock scenarios, run against every backend (as tower-sessions runs
//! one suite against every store): a backend's module implements [`Backend`] (and
//! [`Restartable`] where the suite can kill -9 its server) and invokes
//! [`conformance!`] / [`restart_conformance!`]. Each scenario is a test of that
//! module, under the scenario's name.
//!
//! Where backends differ in what they can promise (ZooKeeper cannot tell the time
//! left on another session; counters that move only for grants make tokens
//! consecutive), a constant of the trait says so, and the scenario checks the
//! promise the backend makes.

#![allow(async_fn_in_trait)]

use std::time::Duration;

use fencing_client::{Grant, LockBackend, LockBackendExt, LockError, backend::LockStatus};
use tokio::time::{Instant, sleep, timeout};

use crate::common::{fenced_resource, write_doc};

/// A running backend for the lock scenarios.
pub(crate) trait Backend: Sized + 'static {
    /// The backend's client.
    type Locks: LockBackend + Clone;
    /// Starts the server (or a database of the test's own): `None` after SKIPPED.
    async fn start() -> Option<Self>;
    /// A new client of it, ready to lock (connected, migrated).
    async fn locks(&self) -> Self::Locks;
    /// The client's `lock_status`.
    async fn status(locks: &Self::Locks, name: &str) -> Option<LockStatus>;
    /// Clients the racers are spread over (each its own connections).
    const CLIENTS: usize = 1;
    /// Racers per round.
    const RACERS: usize = 16;
    /// The racers' TTL, granted as asked.
    const RACE_TTL: Duration = Duration::from_secs(30);
    /// Whether `lock_status` and `Held` tell the time left on another holder's lease.
    const TELLS_TIME_LEFT: bool = true;
    /// Whether a counter moves only for grants, so one lock's grants are consecutive.
    const CONSECUTIVE_TOKENS: bool = false;
    /// A holder paused past this TTL loses the lock; not before the second duration.
    const PAUSED: (Duration, Duration);
    /// A TTL its keepalives hold past (renewed every third of it).
    const KEEPALIVE_TTL: Duration = Duration::from_millis(900);
    /// The backend's own checks after the race (its key layout, its counter).
    async fn after_race(&self, _locks: &Self::Locks, _last: &Grant) {}
}

/// A backend whose server the suite can kill -9 and start again on the same data.
pub(crate) trait Restartable: Sized + 'static {
    /// The backend's client.
    type Locks: LockBackend + Clone;
    /// Starts a server of the test's own: `None` after SKIPPED.
    async fn start() -> Option<Self>;
    /// A new client, ready to lock.
    async fn locks(&self) -> Self::Locks;
    /// SIGKILL, then start again on the same data and port.
    async fn kill_9_and_restart(&mut self);
    /// Lives of the server (each ends in a kill -9).
    const RESTARTS: usize = 2;
    /// Grants (each released) per life before the kill.
    const GRANTS_PER_LIFE: usize = 3;
    /// Whether a lease held at the crash is still held after the restart.
    const HELD_SURVIVES: bool = true;
    /// Whether each life gets a new client (else the one client reconnects).
    const NEW_CLIENT_PER_LIFE: bool = true;
    /// The server's name, for the log line.
    const NAME: &'static str;
}

/// The lock scenarios as tests of the calling module.
macro_rules! conformance {
    ($backend:ty) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn racing_clients_one_holder_each_later_holder_higher_and_stale_write_fenced() {
            crate::conformance::racing_clients_one_holder_each_later_holder_higher_and_stale_write_fenced::<
                $backend,
            >()
            .await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn expired_holder_is_replaced_with_a_higher_token_and_fenced() {
            crate::conformance::expired_holder_is_replaced_with_a_higher_token_and_fenced::<$backend>().await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn keepalives_hold_the_lock_past_its_ttl() {
            crate::conformance::keepalives_hold_the_lock_past_its_ttl::<$backend>().await
        }
    };
}

/// The kill -9 scenario as a test of the calling module.
macro_rules! restart_conformance {
    ($server:ty) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tokens_keep_increasing_across_kill_9_restarts() {
            crate::conformance::tokens_keep_increasing_across_kill_9_restarts::<$server>().await
        }
    };
}

/// Rounds of racers for one free lock: exactly one wins each round, the others
/// hear who holds it; each winner's token is higher than the last, the previous
/// holder's write is refused by the resource, and it can neither renew nor
/// release the new holder's lease.
pub(crate) async fn racing_clients_one_holder_each_later_holder_higher_and_stale_write_fenced<B: Backend>() {
    let Some(server) = B::start().await else { return };
    let (resource, docs) = fenced_resource().await;
    let mut clients = Vec::new();
    for _ in 0..B::CLIENTS {
        clients.push(server.locks().await);
    }
    let locks = clients[0].clone();

    let mut previous: Option<Grant> = None;
    for round in 0..3 {
        let racers: Vec<_> = (0..B::RACERS)
            .map(|i| {
                let locks = clients[i % clients.len()].clone();
                tokio::spawn(async move {
                    let holder = format!("client-{round}-{i}");
                    let result = locks.acquire("report", &holder, B::RACE_TTL).await;
                    (holder, result)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut held = 0;
        for racer in racers {
            let (holder, result) = timeout(Duration::from_secs(30), racer).await.unwrap().unwrap();
            match result {
                Ok(grant) => winners.push((grant, holder)),
                Err(LockError::Held { .. }) => held += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one holder");
        assert_eq!(held, B::RACERS - 1);
        let (grant, holder) = winners.pop().unwrap();
        assert_eq!(grant.holder, holder);
        assert_eq!(grant.ttl, B::RACE_TTL);
        let status = B::status(&locks, "report").await.expect("held");
        assert_eq!((status.holder.as_str(), status.token), (holder.as_str(), grant.token));
        let most_left = B::RACE_TTL - B::RACE_TTL / 6;
        if B::TELLS_TIME_LEFT {
            assert!(status.expires_in > most_left && status.expires_in <= B::RACE_TTL, "{status:?}");
        }
        // A loser hears who holds it.
        match locks.acquire("report", "late", B::RACE_TTL).await {
            Err(LockError::Held { holder: h, expires_in, .. }) => {
                assert_eq!(h, holder);
                assert!(!B::TELLS_TIME_LEFT || expires_in > most_left, "{expires_in:?}");
            }
            other => panic!("expected Held, got {other:?}"),
        }
        assert_eq!(write_doc(&resource, "report", grant.token, &holder).await, 200);
        if let Some(old) = &previous {
            assert!(grant.token > old.token, "{:#x} > {:#x}", grant.token, old.token);
            if B::CONSECUTIVE_TOKENS {
                // The counter moved only for grants: one per round.
                assert_eq!(grant.token, old.token + 1);
            }
            // The previous holder's late write is refused by the resource.
            assert_eq!(write_doc(&resource, "report", old.token, &old.holder).await, 409);
            // And it cannot renew or release the new holder's lease.
            assert_eq!(locks.keepalive(old).await, Err(LockError::LeaseNotFound));
            assert_eq!(locks.release(old).await, Err(LockError::LeaseNotFound));
        }
        assert_eq!(docs.lock().unwrap()["report"], (holder.clone(), grant.token));
        locks.release(&grant).await.unwrap();
        assert_eq!(B::status(&locks, "report").await, None);
        previous = Some(grant);
    }
    server.after_race(&locks, &previous.unwrap()).await;
}

/// A holder paused past its TTL (a raw grant, never renewed) is replaced after
/// the TTL, by the server's clock: the new holder's token is higher, the paused
/// holder can neither renew nor release, and its late write is refused.
pub(crate) async fn expired_holder_is_replaced_with_a_higher_token_and_fenced<B: Backend>() {
    let Some(server) = B::start().await else { return };
    let (resource, docs) = fenced_resource().await;
    let a = server.locks().await;
    let b = server.locks().await;
    let (ttl, not_before) = B::PAUSED;

    let grant_a = a.acquire("ledger", "client-a", ttl).await.unwrap();
    let taken = Instant::now();
    assert!(grant_a.ttl >= ttl, "{:?}", grant_a.ttl);
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A before the pause").await, 200);
    let lease_b = loop {
        match b.lease("ledger", "client-b", Duration::from_secs(5)).await {
            Ok(lease) => break lease,
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, "client-a"),
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(taken.elapsed() < ttl + Duration::from_secs(10), "A's lease never expired");
        sleep(Duration::from_millis(50)).await;
    };
    // The server's clock decided; ours only bounds it from below (minus scheduling).
    assert!(taken.elapsed() >= not_before, "acquired after {:?}", taken.elapsed());
    assert!(lease_b.token() > grant_a.token);
    assert_eq!(write_doc(&resource, "ledger", lease_b.token(), "B").await, 200);

    // A wakes up: its lease is gone, it cannot renew or release B's, its write is refused.
    assert_eq!(a.keepalive(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(a.release(&grant_a).await, Err(LockError::LeaseNotFound));
    assert_eq!(write_doc(&resource, "ledger", grant_a.token, "A after the pause").await, 409);
    assert_eq!(docs.lock().unwrap()["ledger"].0, "B");
    assert_eq!(B::status(&b, "ledger").await.unwrap().token, lease_b.token());
    lease_b.release().await.unwrap();
    assert_eq!(B::status(&b, "ledger").await, None);
}

/// A lease kept alive outlives its TTL several times over: still valid, still
/// the holder's (same token), refused to another; released, the lock is free.
pub(crate) async fn keepalives_hold_the_lock_past_its_ttl<B: Backend>() {
    let Some(server) = B::start().await else { return };
    let a = server.locks().await;
    let b = server.locks().await;
    let lease = a.lease("held", "client-a", B::KEEPALIVE_TTL).await.unwrap();
    sleep(B::KEEPALIVE_TTL * 10 / 3).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.loss_reason());
    assert!(matches!(b.acquire("held", "client-b", B::KEEPALIVE_TTL).await, Err(LockError::Held { .. })));
    assert_eq!(B::status(&b, "held").await.unwrap().token, lease.token());
    lease.release().await.unwrap();
    assert_eq!(B::status(&b, "held").await, None);
}

/// Tokens keep increasing across kill -9 restarts of the server: the counter
/// (and, where promised, a lease held at the crash) is durable before a grant
/// is answered.
pub(crate) async fn tokens_keep_increasing_across_kill_9_restarts<S: Restartable>() {
    let Some(mut server) = S::start().await else { return };
    let mut locks = server.locks().await;
    let mut last = 0;
    for restart in 0..S::RESTARTS {
        if S::NEW_CLIENT_PER_LIFE {
            locks = server.locks().await;
        }
        for _ in 0..S::GRANTS_PER_LIFE {
            let grant = locks.acquire("job", "a", Duration::from_secs(30)).await.unwrap();
            assert!(grant.token > last, "life {restart}: {:#x} after {last:#x}", grant.token);
            last = grant.token;
            locks.release(&grant).await.unwrap();
        }
        // (Another lock: its token may come from a counter of its own.)
        let held = if S::HELD_SURVIVES {
            Some(locks.acquire("held", "holder", Duration::from_secs(30)).await.unwrap())
        } else {
            None
        };
        server.kill_9_and_restart().await;
        if S::NEW_CLIENT_PER_LIFE {
            locks = server.locks().await;
        }
        // Connections died with the server: the first uses may fail.
        let after = timeout(Duration::from_secs(20), async {
            loop {
                match locks.acquire("job", "a", Duration::from_secs(30)).await {
                    Ok(grant) => break grant,
                    Err(LockError::Transport(_)) => sleep(Duration::from_millis(100)).await,
                    Err(e) => panic!("unexpected error after restart: {e}"),
                }
            }
        })
        .await
        .expect("no grant within 20 s of the restart");
        assert!(after.token > last, "after kill -9 #{restart}: {:#x} after {last:#x}", after.token);
        eprintln!("{} kill -9 #{restart}: last token before {last}, first after {}", S::NAME, after.token);
        last = after.token;
        locks.release(&after).await.unwrap();
        if let Some(held) = held {
            // A lease held at the crash is still held after it.
            match locks.acquire("held", "other", Duration::from_secs(30)).await {
                Err(LockError::Held { holder, .. }) => assert_eq!(holder, "holder"),
                other => panic!("the lease held at the crash was lost: {other:?}"),
            }
            locks.release(&held).await.unwrap();
        }
    }
}
