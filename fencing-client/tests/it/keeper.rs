//! The lease keeper against an in-process fake backend, with paused time.

use std::future::pending;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencing_client::{Grant, Lease, LeaseOptions, LockError, LossReason, Lost, backend::LockProtocol};
use tokio::time::{Instant, sleep};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Failure {
    Hang,
    NotFound,
}

/// Answers `ok_renewals` keepalives, then fails with `failure` (or succeeds forever).
struct Fake {
    ok_renewals: usize,
    failure: Option<Failure>,
    acquire_hangs: bool,
    /// How long each keepalive takes to answer.
    delay: Duration,
    keepalives: Mutex<Vec<Instant>>,
    releases: AtomicUsize,
}

impl Fake {
    fn new(ok_renewals: usize, failure: Option<Failure>) -> Arc<Fake> {
        Arc::new(Fake {
            ok_renewals,
            failure,
            acquire_hangs: false,
            delay: Duration::ZERO,
            keepalives: Mutex::new(Vec::new()),
            releases: AtomicUsize::new(0),
        })
    }

    fn keepalive_times(&self) -> Vec<Instant> {
        self.keepalives.lock().unwrap().clone()
    }
}

/// Only the protocol: the blanket impl makes it a `LockBackend` for `Lease`.
impl LockProtocol for Fake {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
        if self.acquire_hangs {
            pending::<()>().await;
        }
        Ok(Grant {
            lease_id: "fake-lease".into(),
            name: name.into(),
            holder: holder.into(),
            token: 7,
            ttl,
            proof: None,
        })
    }

    async fn keepalive(&self, grant: &Grant) -> Result<(), LockError> {
        assert_eq!(grant.lease_id, "fake-lease");
        let n = {
            let mut k = self.keepalives.lock().unwrap();
            k.push(Instant::now());
            k.len()
        };
        sleep(self.delay).await;
        if n <= self.ok_renewals {
            return Ok(());
        }
        match self.failure {
            None => Ok(()),
            Some(Failure::NotFound) => Err(LockError::LeaseNotFound),
            Some(Failure::Hang) => pending().await,
        }
    }

    async fn release(&self, _grant: &Grant) -> Result<(), LockError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

const TTL: Duration = Duration::from_secs(3);
const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn lease(fake: &Arc<Fake>) -> Lease {
    Lease::acquire(fake.clone(), "job", "me", TTL).await.unwrap()
}

/// Waits (in paused time) for the lease's cancellation; returns when it fired, relative to `start`.
async fn cancelled_at(lease: &Lease, start: Instant) -> Duration {
    tokio::time::timeout(Duration::from_secs(600), lease.cancelled()).await.expect("never cancelled");
    Instant::now() - start
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl_and_moves_the_deadline() {
    let fake = Fake::new(usize::MAX, None);
    let start = Instant::now();
    let lease = lease(&fake).await;
    assert_eq!(lease.token(), 7);
    assert_eq!(lease.name(), "job");
    assert_eq!(lease.holder(), "me");
    assert_eq!(lease.lease_id(), "fake-lease");
    assert_eq!(lease.deadline(), start + ms(2700), "acquire send time + ttl - ttl/10");

    sleep(ms(10_500)).await;
    let offsets: Vec<Duration> = fake.keepalive_times().iter().map(|t| *t - start).collect();
    let expected: Vec<Duration> = (1..=10).map(|k| ms(1000 * k)).collect();
    assert_eq!(offsets, expected);
    assert!(lease.is_valid());
    assert_eq!(lease.loss_reason(), None);
    // Deadline counts from the send time of the last successful renewal (at 10 s).
    assert_eq!(lease.deadline(), start + ms(10_000) + ms(2700));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_is_loss_before_the_deadline() {
    let fake = Fake::new(0, Some(Failure::Hang));
    let start = Instant::now();
    let lease = lease(&fake).await;
    let token = lease.cancellation_token();
    let deadline = lease.deadline();
    // Renewal sent at 1 s, times out at 1 s + ttl/3 = 2 s; the deadline is 2.7 s.
    let fired = cancelled_at(&lease, start).await;
    assert_eq!(fired, ms(2000));
    assert!(start + fired < deadline);
    assert!(token.is_cancelled());
    assert!(!lease.is_valid());
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::Timeout)));
    assert_eq!(fake.keepalive_times().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_404_renewal_is_loss_at_once() {
    let fake = Fake::new(2, Some(Failure::NotFound));
    let start = Instant::now();
    let lease = lease(&fake).await;
    assert_eq!(cancelled_at(&lease, start).await, ms(3000));
    assert!(!lease.is_valid());
    assert_eq!(lease.loss_reason(), Some(LossReason::RenewalFailed(LockError::LeaseNotFound)));
    // Nothing more is sent after loss.
    sleep(ms(10_000)).await;
    assert_eq!(fake.keepalive_times().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cancels_even_while_a_renewal_is_pending() {
    let fake = Fake::new(1, Some(Failure::Hang));
    let start = Instant::now();
    let options = LeaseOptions::default().request_timeout(Duration::from_secs(60));
    let lease = Lease::acquire_with(fake.clone(), "job", "me", TTL, options).await.unwrap();
    // Renewed (sent) at 1 s → deadline 3.7 s; the renewal sent at 2 s never answers.
    let fired = cancelled_at(&lease, start).await;
    assert_eq!(fired, ms(3700));
    assert_eq!(lease.loss_reason(), Some(LossReason::DeadlinePassed));
    assert!(!lease.is_valid());
}

#[tokio::test(start_paused = true)]
async fn is_valid_turns_false_at_the_deadline_itself() {
    // A keeper that never renews before the deadline (interval longer than the TTL).
    let fake = Fake::new(usize::MAX, None);
    let start = Instant::now();
    let options = LeaseOptions::default().renew_every(Duration::from_secs(100));
    let lease = Lease::acquire_with(fake.clone(), "job", "me", TTL, options).await.unwrap();
    tokio::time::advance(ms(2699)).await;
    assert!(lease.is_valid());
    tokio::time::advance(ms(1)).await;
    assert!(!lease.is_valid(), "valid at {:?}", Instant::now() - start);
    assert_eq!(cancelled_at(&lease, start).await, ms(2700));
    assert!(fake.keepalive_times().is_empty());
}

#[tokio::test(start_paused = true)]
async fn run_stops_in_flight_work_on_loss() {
    let fake = Fake::new(0, Some(Failure::Hang));
    let start = Instant::now();
    let lease = lease(&fake).await;
    assert_eq!(lease.run(async { 5 }).await, Ok(5));
    let finished = Arc::new(AtomicUsize::new(0));
    let f = finished.clone();
    let r = lease
        .run(async move {
            sleep(Duration::from_secs(100)).await;
            f.fetch_add(1, Ordering::SeqCst);
        })
        .await;
    assert_eq!(r, Err(Lost(LossReason::RenewalFailed(LockError::Timeout))));
    assert_eq!(Instant::now() - start, ms(2000));
    assert_eq!(finished.load(Ordering::SeqCst), 0);
    // Once lost, no new work starts.
    assert!(lease.run(async { 1 }).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_stops_keepalives_and_cancels() {
    let (fake, lease) = renewed_once().await;
    let token = lease.cancellation_token();
    drop(lease);
    assert!(token.is_cancelled());
    assert_no_more_keepalives(&fake).await;
}

#[tokio::test(start_paused = true)]
async fn release_cancels_then_releases_and_stops_keepalives() {
    let (fake, lease) = renewed_once().await;
    let token = lease.cancellation_token();
    lease.release().await.unwrap();
    assert!(token.is_cancelled());
    assert_eq!(fake.releases.load(Ordering::SeqCst), 1);
    assert_no_more_keepalives(&fake).await;
}

/// A lease on a backend that always renews, 1.5 s in: renewed once.
async fn renewed_once() -> (Arc<Fake>, Lease) {
    let fake = Fake::new(usize::MAX, None);
    let lease = lease(&fake).await;
    sleep(ms(1500)).await;
    assert_eq!(fake.keepalive_times().len(), 1);
    (fake, lease)
}

/// Ten more seconds bring no renewal after the first.
async fn assert_no_more_keepalives(fake: &Fake) {
    sleep(ms(10_000)).await;
    assert_eq!(fake.keepalive_times().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn bad_options_and_hanging_acquire_are_errors() {
    let fake = Fake::new(usize::MAX, None);
    let err = Lease::acquire_with(fake.clone(), "job", "me", TTL, LeaseOptions::default().safety_margin(TTL))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidArgument(_)), "{err:?}");
    let err = Lease::acquire(fake.clone(), "job", "me", Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidArgument(_)), "{err:?}");

    let hanging = Arc::new(Fake {
        ok_renewals: 0,
        failure: None,
        acquire_hangs: true,
        delay: Duration::ZERO,
        keepalives: Mutex::new(Vec::new()),
        releases: AtomicUsize::new(0),
    });
    let start = Instant::now();
    let err = Lease::acquire(hanging, "job", "me", TTL).await.unwrap_err();
    assert_eq!(err, LockError::Timeout);
    assert_eq!(Instant::now() - start, ms(1000));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_when_the_renewal_was_sent() {
    let fake = Arc::new(Fake {
        ok_renewals: usize::MAX,
        failure: None,
        acquire_hangs: false,
        delay: ms(400),
        keepalives: Mutex::new(Vec::new()),
        releases: AtomicUsize::new(0),
    });
    let start = Instant::now();
    let lease = lease(&fake).await;
    // First renewal sent at 1 s, answered at 1.4 s: deadline 1 s + 2.7 s, not 1.4 s + 2.7 s.
    sleep(ms(1500)).await;
    assert_eq!(fake.keepalive_times().len(), 1);
    assert_eq!(lease.deadline(), start + ms(3700));
    // The next one is sent a third of the TTL after the previous send.
    sleep(ms(1000)).await;
    let offsets: Vec<Duration> = fake.keepalive_times().iter().map(|t| *t - start).collect();
    assert_eq!(offsets, vec![ms(1000), ms(2000)]);
    assert_eq!(lease.deadline(), start + ms(4700));
    assert!(lease.is_valid());
}

#[tokio::test]
async fn absurd_durations_are_refused_not_panics() {
    let fake = Fake::new(usize::MAX, None);
    let err = Lease::acquire(fake.clone(), "job", "me", Duration::MAX).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidArgument(_)), "{err:?}");
    let options = LeaseOptions::default().renew_every(Duration::MAX);
    let err = Lease::acquire_with(fake.clone(), "job", "me", TTL, options).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidArgument(_)), "{err:?}");
}
