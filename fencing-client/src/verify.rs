//! The resource's side of the online check (Chubby's CheckSequencer):
//! [`TokenVerifier`]s that ask the lock backend whether a token about to raise a
//! mark is the live grant of the lock that guards the key.
//!
//! A raise is genuine iff the lock is held right now, unexpired, under exactly
//! that token. A forged higher token fails; a holder whose lease has lapsed may
//! not raise a mark either; a stale token never gets here (the layer refuses it
//! on its own mark, without asking).
//!
//! Each verifier keeps a small cache of recent *positive* answers (default
//! [`DEFAULT_CACHE_CAPACITY`] entries for [`DEFAULT_CACHE_TTL`], oldest evicted
//! first), so a holder whose one token raises many keys at once asks about once.
//! Negative answers are never cached: a refusal costs a forger a round trip each
//! time, and a holder whose grant is still being written is not refused for long.
//! A cached answer may be up to the cache TTL old: within it a holder whose lease
//! has just lapsed can still raise a key no newer holder has written yet (which
//! plain fencing allows anyway). [`CachedVerifier::cache`] with a zero TTL asks
//! every time.
//!
//! [`CachedVerifier`] holds the mapping and the cache once, over a backend's
//! [`LiveGrantCheck`]; [`DemoLockVerifier`] and `EtcdVerifier` are two of them.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fencing_layer::verify::{Raise, TokenVerifier, Verification, VerifyError};
use reqwest::StatusCode;
use serde::Deserialize;
use tokio::time::Instant;

use crate::LockError;

/// Entries a verifier's cache of positive answers holds unless told otherwise.
pub const DEFAULT_CACHE_CAPACITY: usize = 4096;
/// How long a positive answer is trusted unless told otherwise.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(1);

type LockForKey = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

fn identity() -> LockForKey {
    Arc::new(|key| Some(key.to_owned()))
}

/// Recent positive answers: (lock, token) → when it was answered. Bounded; the
/// oldest answer is evicted first. Only ever locked for short, await-free sections.
struct AnswerCache {
    capacity: usize,
    ttl: Duration,
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    /// (lock, token) → when it was answered, and the insertion's number.
    answered: HashMap<(String, u64), (Instant, u64)>,
    /// Insertion order, for eviction; an entry whose number no longer matches
    /// `answered` was refreshed or dropped and is skipped.
    order: VecDeque<((String, u64), u64)>,
    /// Numbers insertions.
    inserted: u64,
}

impl AnswerCache {
    fn new(capacity: usize, ttl: Duration) -> Self {
        Self { capacity, ttl, inner: Mutex::new(CacheInner::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether (lock, token) was answered valid less than the TTL ago.
    fn is_fresh(&self, lock: &str, token: u64) -> bool {
        if self.capacity == 0 || self.ttl.is_zero() {
            return false;
        }
        let key = (lock.to_owned(), token);
        let mut inner = self.lock();
        match inner.answered.get(&key) {
            Some((at, _)) if at.elapsed() < self.ttl => true,
            Some(_) => {
                inner.answered.remove(&key);
                false
            }
            None => false,
        }
    }

    fn insert(&self, lock: String, token: u64) {
        if self.capacity == 0 || self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let key = (lock, token);
        let mut inner = self.lock();
        inner.inserted += 1;
        let number = inner.inserted;
        inner.answered.insert(key.clone(), (now, number));
        inner.order.push_back((key, number));
        while inner.order.len() > self.capacity {
            let Some((old, number)) = inner.order.pop_front() else { break };
            if inner.answered.get(&old).is_some_and(|&(_, n)| n == number) {
                inner.answered.remove(&old);
            }
        }
    }

    fn len(&self) -> usize {
        self.lock().answered.len()
    }
}

/// Asks a lock backend whether `token` is `lock`'s live grant: what a
/// [`CachedVerifier`] needs from a backend, and all it needs.
pub trait LiveGrantCheck: Clone + Send + Sync + 'static {
    /// `Ok` if `token` is `lock`'s live grant; [`VerifyError::Refused`] if it is
    /// not, [`VerifyError::Unavailable`] if the backend cannot tell.
    fn check(&self, lock: &str, token: u64) -> impl Future<Output = Result<(), VerifyError>> + Send;
}

/// A [`TokenVerifier`] over any [`LiveGrantCheck`]: maps the raised key to its
/// lock, answers from the cache of positive answers when it can, and asks the
/// backend otherwise (caching a yes, never a no).
///
/// [`DemoLockVerifier`] and (feature `etcd`) `EtcdVerifier` are this over their
/// backend's check; another backend needs only its [`LiveGrantCheck`].
#[derive(Clone)]
pub struct CachedVerifier<C> {
    check: C,
    lock_for_key: LockForKey,
    cache: Arc<AnswerCache>,
}

impl<C: fmt::Debug> fmt::Debug for CachedVerifier<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedVerifier").field("check", &self.check).finish_non_exhaustive()
    }
}

impl<C> CachedVerifier<C> {
    /// A verifier asking `check`, for locks named as the keys they guard, with
    /// the default cache.
    pub fn over(check: C) -> Self {
        Self {
            check,
            lock_for_key: identity(),
            cache: Arc::new(AnswerCache::new(DEFAULT_CACHE_CAPACITY, DEFAULT_CACHE_TTL)),
        }
    }

    /// Maps a resource key to the lock whose holder may write it (by default the
    /// key itself); `None` (no lock guards this key) refuses every raise of it.
    #[must_use]
    pub fn lock_for_key(mut self, f: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        self.lock_for_key = Arc::new(f);
        self
    }

    /// Keeps at most `capacity` positive answers, each for `ttl` (zero for either:
    /// no cache). The default is [`DEFAULT_CACHE_CAPACITY`] for [`DEFAULT_CACHE_TTL`].
    #[must_use]
    pub fn cache(mut self, capacity: usize, ttl: Duration) -> Self {
        self.cache = Arc::new(AnswerCache::new(capacity, ttl));
        self
    }

    /// Positive answers in the cache (expired ones not yet dropped included).
    pub fn cached_answers(&self) -> usize {
        self.cache.len()
    }
}

impl<C: LiveGrantCheck> CachedVerifier<C> {
    /// Asks the backend whether `token` is `lock`'s live grant (no cache).
    ///
    /// # Errors
    ///
    /// [`VerifyError::Refused`] if it is not, [`VerifyError::Unavailable`] if the
    /// backend cannot tell.
    pub async fn check(&self, lock: &str, token: u64) -> Result<(), VerifyError> {
        self.check.check(lock, token).await
    }
}

impl<C: LiveGrantCheck> TokenVerifier for CachedVerifier<C> {
    fn verify(&self, raise: &Raise<'_>) -> Verification {
        let Some(lock) = (self.lock_for_key)(raise.key()) else {
            return Verification::refused(format!("no lock guards {}", raise.key()));
        };
        let token = raise.token();
        if self.cache.is_fresh(&lock, token) {
            return Verification::valid();
        }
        let (check, cache) = (self.check.clone(), Arc::clone(&self.cache));
        Verification::later(async move {
            check.check(&lock, token).await?;
            cache.insert(lock, token);
            Ok(())
        })
    }
}

fn refused_not_live(lock: &str, token: u64, why: &str) -> VerifyError {
    VerifyError::Refused(format!("token {token} is not the live grant of lock {lock:?}: {why}").into())
}

fn unavailable(what: &str, e: impl fmt::Display) -> VerifyError {
    VerifyError::Unavailable(format!("{what}: {e}").into())
}

/// A [`TokenVerifier`] that asks the demo lock service
/// (`GET /v1/locks/{lock}/tokens/{token}`) whether a raising token is the lock's
/// live grant: a [`CachedVerifier`] over [`DemoLockCheck`].
///
/// Valid: the raise goes ahead. Not the live grant (a forged token, a lapsed or
/// released lease, a lock never held) or a lock name the service rejects:
/// refused, 403. The service unreachable, failing (5xx) or slow past the
/// client's timeout (2 s; the layer's own verify timeout also applies): 503,
/// the mark unchanged.
///
/// ```no_run
/// # fn demo() -> Result<(), fencing_client::LockError> {
/// use fencing_client::verify::DemoLockVerifier;
/// use fencing_layer::FencingLayer;
///
/// // Keys are paths, `/logs/{lock}`; other paths are guarded by no lock.
/// let verifier = DemoLockVerifier::new("http://127.0.0.1:7000")?
///     .lock_for_key(|key| key.strip_prefix("/logs/").map(str::to_owned));
/// let layer = FencingLayer::new().verifier(verifier);
/// # let _ = layer;
/// # Ok(()) }
/// ```
pub type DemoLockVerifier = CachedVerifier<DemoLockCheck>;

/// The demo lock service's answer to "is this the live grant?".
#[derive(Clone)]
pub struct DemoLockCheck {
    http: reqwest::Client,
    base: Arc<str>,
}

impl fmt::Debug for DemoLockCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DemoLockCheck").field("base", &self.base).finish_non_exhaustive()
    }
}

impl DemoLockVerifier {
    /// Asks the service at `base_url` (e.g. `http://127.0.0.1:7000`). Proxies are
    /// never used; connecting is bounded to 1 s and each check to 2 s.
    pub fn new(base_url: impl Into<String>) -> Result<Self, LockError> {
        Ok(Self::with_client(
            crate::demo::http_client(Duration::from_secs(1), Duration::from_secs(2))?,
            base_url,
        ))
    }

    /// Asks through a configured `reqwest::Client` (set its timeout).
    pub fn with_client(http: reqwest::Client, base_url: impl Into<String>) -> Self {
        let base = crate::demo::without_trailing_slashes(base_url.into());
        Self::over(DemoLockCheck { http, base: base.into() })
    }
}

impl LiveGrantCheck for DemoLockCheck {
    async fn check(&self, lock: &str, token: u64) -> Result<(), VerifyError> {
        let url = format!("{}/v1/locks/{}/tokens/{token}", self.base, crate::demo::segment(lock));
        let what = "the lock service cannot check the token";
        let response = self.http.get(url).send().await.map_err(|e| unavailable(what, e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| unavailable(what, e))?;
        match status {
            StatusCode::OK => {
                let body: CheckBody = serde_json::from_slice(&bytes)
                    .map_err(|e| unavailable(what, format!("bad answer: {e}")))?;
                if body.lock != lock || body.token != token {
                    return Err(unavailable(
                        what,
                        format!("answered for lock {:?} token {}", body.lock, body.token),
                    ));
                }
                if body.valid {
                    Ok(())
                } else {
                    let why = match body.reason.as_deref() {
                        Some("free") => "the lock is not held",
                        Some("other-token") => "the lock is held under another token",
                        _ => "the lock service says so",
                    };
                    Err(refused_not_live(lock, token, why))
                }
            }
            // Only a lock name no lock can have (too long, control characters).
            StatusCode::BAD_REQUEST => Err(refused_not_live(lock, token, &problem_detail(&bytes))),
            _ => Err(unavailable(what, format!("status {}: {}", status.as_u16(), problem_detail(&bytes)))),
        }
    }
}

#[derive(Deserialize)]
struct CheckBody {
    lock: String,
    token: u64,
    valid: bool,
    #[serde(default)]
    reason: Option<String>,
}

fn problem_detail(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v["detail"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).chars().take(200).collect())
}

#[cfg(feature = "etcd")]
pub use etcd::{EtcdCheck, EtcdVerifier};

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;

    /// A [`TokenVerifier`] that asks etcd whether a raising token is the lock's
    /// live grant: the lock key (`{prefix}{lock}`, as [`crate::EtcdLockClient`]
    /// writes it) exists and its create revision is the token. The key lives
    /// exactly as long as the holder's etcd lease, so it exists only while the
    /// lock is held; a key deleted and created again has a new create revision.
    ///
    /// Missing key or another revision: refused (403). etcd unreachable or failing:
    /// 503. A [`CachedVerifier`] over [`EtcdCheck`], so the same cache of positive
    /// answers as [`DemoLockVerifier`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fencing_client::LockError> {
    /// use fencing_client::{EtcdLockClient, verify::EtcdVerifier};
    ///
    /// let locks = EtcdLockClient::connect(["http://127.0.0.1:2379"]).await?;
    /// let verifier = EtcdVerifier::from_lock_client(&locks)
    ///     .lock_for_key(|key| key.strip_prefix("/logs/").map(str::to_owned));
    /// # let _ = verifier;
    /// # Ok(()) }
    /// ```
    pub type EtcdVerifier = CachedVerifier<EtcdCheck>;

    /// etcd's answer to "is this the live grant?": the lock key's create revision.
    #[derive(Clone)]
    pub struct EtcdCheck {
        client: etcd_client::Client,
        prefix: Arc<str>,
    }

    impl fmt::Debug for EtcdCheck {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("EtcdCheck").field("prefix", &self.prefix).finish_non_exhaustive()
        }
    }

    impl EtcdVerifier {
        /// Asks etcd through `client`, for lock keys under [`crate::etcd::DEFAULT_ETCD_PREFIX`].
        pub fn new(client: etcd_client::Client) -> Self {
            Self::over(EtcdCheck { client, prefix: crate::etcd::DEFAULT_ETCD_PREFIX.into() })
        }

        /// Asks the etcd that `locks` uses, for its lock keys (same connection and prefix).
        pub fn from_lock_client(locks: &crate::EtcdLockClient) -> Self {
            let prefix = locks.lock_key("");
            Self::new(locks.client().clone()).with_prefix(prefix)
        }

        /// Lock keys are under `prefix` (as [`crate::EtcdLockClient::with_prefix`]).
        #[must_use]
        pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
            self.check.prefix = prefix.into().into();
            self
        }
    }

    impl LiveGrantCheck for EtcdCheck {
        async fn check(&self, lock: &str, token: u64) -> Result<(), VerifyError> {
            let key = format!("{}{lock}", self.prefix);
            let mut client = self.client.clone();
            let response =
                client.get(key, None).await.map_err(|e| unavailable("etcd cannot check the token", e))?;
            match response.kvs().first() {
                None => Err(refused_not_live(lock, token, "the lock is not held")),
                Some(kv) if u64::try_from(kv.create_revision()).ok() == Some(token) => Ok(()),
                Some(_) => Err(refused_not_live(lock, token, "the lock is held under another token")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn cache_answers_within_its_ttl_and_evicts_the_oldest() {
        let cache = AnswerCache::new(3, Duration::from_secs(1));
        cache.insert("a".into(), 1);
        assert!(cache.is_fresh("a", 1));
        assert!(!cache.is_fresh("a", 2), "another token");
        assert!(!cache.is_fresh("b", 1), "another lock");
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(cache.is_fresh("a", 1));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!cache.is_fresh("a", 1), "expired");
        assert_eq!(cache.len(), 0, "an expired answer is dropped when looked up");

        for t in 1..=3 {
            cache.insert("l".into(), t);
        }
        cache.insert("l".into(), 4);
        assert!(!cache.is_fresh("l", 1), "the oldest is evicted");
        assert!((2..=4).all(|t| cache.is_fresh("l", t)));
        assert!(cache.len() <= 3);
        // Refreshing an entry and evicting its older copy keeps the fresh one.
        cache.insert("l".into(), 2);
        cache.insert("l".into(), 5);
        assert!(cache.is_fresh("l", 2));
        for t in 6..1000 {
            cache.insert("x".into(), t);
            assert!(cache.len() <= 3 && cache.lock().order.len() <= 3);
        }

        let off = AnswerCache::new(0, Duration::from_secs(1));
        off.insert("a".into(), 1);
        assert!(!off.is_fresh("a", 1));
        let off = AnswerCache::new(10, Duration::ZERO);
        off.insert("a".into(), 1);
        assert!(!off.is_fresh("a", 1));
    }
}
