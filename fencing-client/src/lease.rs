//! The lease keeper: renews in the background, watches the local deadline, and
//! cancels in-flight work the moment the lease may be lost.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::backend::{Grant, LockBackend, LockError};

/// How a [`Lease`] is kept. Unset fields take defaults derived from the TTL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Time between renewals (counted from when the previous one was sent). Default TTL/3.
    pub renew_every: Option<Duration>,
    /// How long before the server-side expiry the holder stops trusting the lease.
    /// Default TTL/10. Must be below the TTL.
    pub safety_margin: Option<Duration>,
    /// Bound on each acquire and keepalive request. Default TTL/3.
    pub request_timeout: Option<Duration>,
}

impl LeaseOptions {
    /// Sets [`LeaseOptions::renew_every`].
    pub fn renew_every(mut self, d: Duration) -> Self {
        self.renew_every = Some(d);
        self
    }

    /// Sets [`LeaseOptions::safety_margin`].
    pub fn safety_margin(mut self, d: Duration) -> Self {
        self.safety_margin = Some(d);
        self
    }

    /// Sets [`LeaseOptions::request_timeout`].
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = Some(d);
        self
    }

    fn resolve(self, ttl: Duration) -> Result<Resolved, LockError> {
        if ttl.is_zero() {
            return Err(LockError::InvalidArgument("ttl must be positive".into()));
        }
        let third = (ttl / 3).max(Duration::from_millis(1));
        let resolved = Resolved {
            renew_every: self.renew_every.unwrap_or(third),
            safety_margin: self.safety_margin.unwrap_or(ttl / 10),
            request_timeout: self.request_timeout.unwrap_or(third),
        };
        if resolved.safety_margin >= ttl {
            return Err(LockError::InvalidArgument(format!(
                "safety margin {:?} must be below the ttl {ttl:?}",
                resolved.safety_margin
            )));
        }
        // Instants must not overflow: cap everything at a century.
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        if ttl > CENTURY || resolved.renew_every > CENTURY || resolved.request_timeout > CENTURY {
            return Err(LockError::InvalidArgument("durations above a century are not supported".into()));
        }
        if resolved.renew_every.is_zero() || resolved.request_timeout.is_zero() {
            return Err(LockError::InvalidArgument(
                "renewal interval and request timeout must be positive".into(),
            ));
        }
        Ok(resolved)
    }
}

#[derive(Debug, Clone, Copy)]
struct Resolved {
    renew_every: Duration,
    safety_margin: Duration,
    request_timeout: Duration,
}

/// Why a [`Lease`] stopped being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renewal failed: error, timeout ([`LockError::Timeout`]) or the service no
    /// longer knows the lease ([`LockError::LeaseNotFound`]).
    RenewalFailed(LockError),
    /// The local deadline (last successful renewal's send time + TTL − margin) passed.
    DeadlinePassed,
    /// [`Lease::release`] was called.
    Released,
    /// The [`Lease`] handle was dropped.
    Dropped,
    /// The resource refused a request of the client layer as stale (the fencing layer's
    /// `409` with `Fencing-Problem: stale-token` or `cancelled`, or the gRPC status
    /// `ABORTED` with the same metadata): a newer token, `highest` where the answer
    /// gave it, has reached that resource. Only the [client layer](crate::layer) that
    /// received the answer stops; the [`Lease`] itself is not cancelled.
    Superseded {
        /// The highest token the resource had seen for the key, from `Fencing-Highest-Token`.
        highest: Option<u64>,
    },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::RenewalFailed(e) => write!(f, "renewal failed: {e}"),
            LossReason::DeadlinePassed => f.write_str("the lease's local deadline passed"),
            LossReason::Released => f.write_str("released"),
            LossReason::Dropped => f.write_str("lease handle dropped"),
            LossReason::Superseded { highest: Some(highest) } => {
                write!(f, "the resource has seen a newer token ({highest})")
            }
            LossReason::Superseded { highest: None } => f.write_str("the resource has seen a newer token"),
        }
    }
}

/// The error of [`Lease::run`]: the lease was lost before the work finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost(pub LossReason);

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease lost: {}", self.0)
    }
}

impl std::error::Error for Lost {}

/// The state a [`Lease`] shares with its keeper and with the client layer.
#[derive(Debug)]
pub(crate) struct Shared {
    cancel: CancellationToken,
    deadline: Mutex<Instant>,
    loss: Mutex<Option<LossReason>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Records the first loss reason and cancels.
    pub(crate) fn lose(&self, reason: LossReason) {
        {
            let mut loss = lock(&self.loss);
            if loss.is_none() {
                match &reason {
                    LossReason::Released | LossReason::Dropped => {
                        tracing::debug!(%reason, "lease ended")
                    }
                    _ => tracing::warn!(%reason, "lease lost"),
                }
                *loss = Some(reason);
            }
        }
        self.cancel.cancel();
    }

    pub(crate) fn deadline(&self) -> Instant {
        *lock(&self.deadline)
    }

    pub(crate) fn is_valid(&self) -> bool {
        !self.cancel.is_cancelled() && Instant::now() < self.deadline()
    }

    /// Why the lease was lost (a passed deadline if the keeper has not said yet).
    pub(crate) fn lost(&self) -> Lost {
        Lost(lock(&self.loss).clone().unwrap_or(LossReason::DeadlinePassed))
    }

    pub(crate) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }
}

/// A held lease, kept alive in the background until released, dropped or lost.
///
/// * Renews every `renew_every` (default TTL/3), each request bounded by
///   `request_timeout` (default TTL/3).
/// * Local deadline: send time of the last successful renewal (or of the acquire)
///   + TTL − `safety_margin` (default TTL/10), on tokio's monotonic clock.
/// * Any renewal error, timeout or 404, or the deadline passing, is loss: the
///   [`CancellationToken`] is cancelled and [`Lease::is_valid`] turns false for good.
/// * Dropping the handle stops the keepalive task and cancels the token.
///
/// Validity is advisory: a paused process can still act on a lost lease, which is
/// why every write must carry [`Lease::token`] (see [`Lease::fence`]).
pub struct Lease {
    grant: Grant,
    backend: Arc<dyn LockBackend>,
    shared: Arc<Shared>,
    keeper: JoinHandle<()>,
    request_timeout: Duration,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.grant.name)
            .field("holder", &self.grant.holder)
            .field("token", &self.grant.token)
            .field("valid", &self.is_valid())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// Acquires `name` for `holder` from `backend` with default [`LeaseOptions`].
    /// Must be called within a tokio runtime (the keepalive task is spawned on it).
    pub async fn acquire(
        backend: Arc<dyn LockBackend>,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Lease, LockError> {
        Self::acquire_with(backend, name, holder, ttl, LeaseOptions::default()).await
    }

    /// Acquires `name` for `holder` from `backend` and starts keeping the lease alive.
    pub async fn acquire_with(
        backend: Arc<dyn LockBackend>,
        name: &str,
        holder: &str,
        ttl: Duration,
        options: LeaseOptions,
    ) -> Result<Lease, LockError> {
        let opts = options.resolve(ttl)?;
        let sent = Instant::now();
        let grant = timeout(opts.request_timeout, backend.acquire(name, holder, ttl))
            .await
            .map_err(|_| LockError::Timeout)??;
        // Never trust the lease for longer than either side thinks it lasts.
        let ttl = grant.ttl.min(ttl);
        if opts.safety_margin >= ttl {
            return Err(LockError::InvalidArgument(format!(
                "granted ttl {ttl:?} is not above the safety margin {:?}",
                opts.safety_margin
            )));
        }
        let deadline = sent + (ttl - opts.safety_margin);
        let shared = Arc::new(Shared {
            cancel: CancellationToken::new(),
            deadline: Mutex::new(deadline),
            loss: Mutex::new(None),
        });
        let keeper = tokio::spawn(keep_alive(
            Arc::clone(&backend),
            grant.clone(),
            Arc::clone(&shared),
            opts,
            ttl,
            sent,
        ));
        Ok(Lease { grant, backend, shared, keeper, request_timeout: opts.request_timeout })
    }

    /// The fencing token: send it with every write to the protected resource.
    pub fn token(&self) -> u64 {
        self.grant.token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.grant.name
    }

    /// The holder this lease was granted to.
    pub fn holder(&self) -> &str {
        &self.grant.holder
    }

    /// The backend's lease id.
    pub fn lease_id(&self) -> &str {
        &self.grant.lease_id
    }

    /// The grant as the backend reported it.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The current local deadline (moves forward with each successful renewal).
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// True while the lease has not been lost and its local deadline is ahead.
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// Why the lease stopped being valid, once it has.
    pub fn loss_reason(&self) -> Option<LossReason> {
        lock(&self.shared.loss).clone()
    }

    /// A token cancelled when the lease is lost, released or dropped: hand it (or
    /// child tokens) to in-flight work.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// Completes when the lease is lost, released or dropped.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.shared.cancel.cancelled()
    }

    /// Runs `work` while the lease is held: if the lease is lost first, `work` is
    /// dropped (stopped at its current `.await`) and `Err(Lost)` is returned.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Lost> {
        if !self.is_valid() {
            return Err(self.lost());
        }
        let deadline = async {
            // The keeper cancels at the deadline too; this also covers a keeper that
            // has not been scheduled yet.
            loop {
                let d = self.shared.deadline();
                sleep_until(d).await;
                if Instant::now() >= self.shared.deadline() {
                    break;
                }
            }
        };
        tokio::select! {
            biased;
            () = self.shared.cancel.cancelled() => Err(self.lost()),
            () = deadline => {
                self.shared.lose(LossReason::DeadlinePassed);
                Err(self.lost())
            }
            out = work => Ok(out),
        }
    }

    fn lost(&self) -> Lost {
        self.shared.lost()
    }

    /// A tower layer that fences every request of a client with this lease, and
    /// refuses or cancels them once it is lost: [`FencedClientLayer::new`](crate::FencedClientLayer::new).
    pub fn layer(&self) -> crate::FencedClientLayer {
        crate::FencedClientLayer::new(self)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Sets the `Fencing-Token` header of `request` to this lease's token, and
    /// `Fencing-Proof` to the grant's proof when the lock service signed it (any
    /// `Fencing-Proof` already there is removed when it did not).
    pub fn fence<B>(&self, request: &mut http::Request<B>) {
        crate::header::set_fencing_token(request, self.grant.token);
        match &self.grant.proof {
            Some(proof) => crate::header::set_fencing_proof(request, proof),
            None => {
                request.headers_mut().remove(crate::header::FENCING_PROOF);
            }
        }
    }

    /// Adds the `Fencing-Token` header with this lease's token to a reqwest request,
    /// and `Fencing-Proof` with the grant's proof when the lock service signed it.
    pub fn fence_reqwest(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = crate::header::fence_reqwest(request, self.grant.token);
        match &self.grant.proof {
            Some(proof) => crate::header::fence_reqwest_proof(request, proof),
            None => request,
        }
    }

    /// Operation `op` of run `run` under this lease: its token, and the
    /// operation's idempotency key (the same for every holder), to fence a
    /// record and then call a resource that cannot check tokens.
    pub fn operation(&self, run: &str, op: &str) -> crate::idempotency::FencedOperation {
        crate::idempotency::FencedOperation::new(self.grant.token, run, op)
    }

    /// Sets the `fencing-token` metadata of a tonic request to this lease's
    /// token, and `fencing-proof` to the grant's proof when the lock service
    /// signed it (removing any other proof when it did not).
    #[cfg(feature = "tonic")]
    pub fn fence_tonic<T>(&self, request: &mut tonic::Request<T>) {
        crate::header::fence_tonic(request, self.grant.token);
        match &self.grant.proof {
            Some(proof) => crate::header::fence_tonic_proof(request, proof),
            None => {
                request.metadata_mut().remove(crate::header::FENCING_PROOF.as_str());
            }
        }
    }

    /// Stops renewing, cancels in-flight work, then deletes the lease so the lock is
    /// free at once. The request is bounded by the request timeout.
    pub async fn release(self) -> Result<(), LockError> {
        self.keeper.abort();
        self.shared.lose(LossReason::Released);
        timeout(self.request_timeout, self.backend.release(&self.grant))
            .await
            .map_err(|_| LockError::Timeout)?
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
        self.shared.lose(LossReason::Dropped);
    }
}

async fn keep_alive(
    backend: Arc<dyn LockBackend>,
    grant: Grant,
    shared: Arc<Shared>,
    opts: Resolved,
    ttl: Duration,
    acquired_sent: Instant,
) {
    let mut deadline = shared.deadline();
    let mut next = acquired_sent + opts.renew_every;
    loop {
        tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return,
            () = sleep_until(deadline) => {
                shared.lose(LossReason::DeadlinePassed);
                return;
            }
            () = sleep_until(next) => {}
        }
        let sent = Instant::now();
        let result = tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return,
            () = sleep_until(deadline) => {
                shared.lose(LossReason::DeadlinePassed);
                return;
            }
            r = timeout(opts.request_timeout, backend.keepalive(&grant)) => r,
        };
        match result {
            Ok(Ok(())) => {
                deadline = sent + (ttl - opts.safety_margin);
                *lock(&shared.deadline) = deadline;
                next = sent + opts.renew_every;
                tracing::trace!(name = grant.name, token = grant.token, "renewed");
            }
            Ok(Err(e)) => {
                shared.lose(LossReason::RenewalFailed(e));
                return;
            }
            Err(_) => {
                shared.lose(LossReason::RenewalFailed(LockError::Timeout));
                return;
            }
        }
    }
}
