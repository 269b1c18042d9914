//! Token authenticity: a [`TokenVerifier`] the layer consults before a token
//! raises a mark.
//!
//! Fencing assumes honest clients. Any client that reaches the resource can
//! send `Fencing-Token: 18446744073709551615`, and every honest holder of that
//! key is refused from then on. Only a *raise* does lasting harm, so that is
//! the one moment the layer asks the verifier: never for a token equal to the
//! mark (the holder's every request) or below it (refused anyway), so the hot
//! path does not change.
//!
//! ```
//! use fencing_layer::FencingLayer;
//! use fencing_layer::verify::{Verification, verify_fn};
//!
//! // Accept raises only from tokens this deployment's lock service could have
//! // issued by now; a real verifier checks a signature or asks the lock service.
//! let layer = FencingLayer::new().verifier(verify_fn(|raise| {
//!     if raise.token() < 1_000_000 {
//!         Verification::valid()
//!     } else {
//!         Verification::refused("no lock service issues tokens that high")
//!     }
//! }));
//! # let _ = layer;
//! ```
//!
//! A refused raise is answered 403 (`unverified-token`) and a verifier that
//! cannot answer — the lock service is down, or the answer takes longer than
//! [`FencingLayer::verify_timeout`] — 503 with `Retry-After`
//! (`verifier-unavailable`). Either way the mark is unchanged and nothing is
//! admitted.
//!
//! The verifier runs before the raise, outside the key's lock, so other
//! requests for the key carry on meanwhile. A token is raised only if it is
//! still above the mark once verified; if another request raised the mark to
//! the same token first, the verified request joins it, and if higher, it is
//! stale.
//!
//! With the `ed25519` feature, [`Ed25519Verifier`]
//! checks a lock service's signature sent in `Fencing-Proof`, and
//! [`ProofSigner`] makes those signatures.
//!
//! [`FencingLayer::verify_timeout`]: crate::FencingLayer::verify_timeout
#![cfg_attr(feature = "ed25519", doc = "[`Ed25519Verifier`]: Ed25519Verifier")]
#![cfg_attr(not(feature = "ed25519"), doc = "[`Ed25519Verifier`]: TokenVerifier")]
#![cfg_attr(feature = "ed25519", doc = "[`ProofSigner`]: ProofSigner")]
#![cfg_attr(not(feature = "ed25519"), doc = "[`ProofSigner`]: TokenVerifier")]

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;

#[cfg(feature = "ed25519")]
mod proof;

#[cfg(feature = "ed25519")]
pub use self::proof::{Ed25519Verifier, KeyError, ProofPublicKey, ProofSigner};

/// How long the layer waits for a verifier's answer unless told otherwise.
pub const DEFAULT_VERIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Decides whether a token may raise a key's mark.
///
/// Called only for a token above the key's mark, once per raising request.
/// Anything the verifier needs from the request (a proof header, a client
/// certificate's identity put in the headers by a proxy) it reads from
/// [`Raise::headers`] before returning; a [`Verification::later`] future must
/// own what it uses.
pub trait TokenVerifier: Send + Sync + 'static {
    /// Whether `raise` is genuine.
    fn verify(&self, raise: &Raise<'_>) -> Verification;
}

/// A token about to raise a key's mark, as shown to a [`TokenVerifier`].
#[derive(Debug, Clone, Copy)]
pub struct Raise<'a> {
    key: &'a str,
    token: u64,
    mark: u64,
    headers: &'a HeaderMap,
}

impl<'a> Raise<'a> {
    /// A raise of `key`'s mark from `mark` to `token`, by a request with `headers`.
    /// For testing verifiers; the layer builds these itself.
    #[must_use]
    pub fn new(key: &'a str, token: u64, mark: u64, headers: &'a HeaderMap) -> Self {
        Self { key, token, mark, headers }
    }

    /// The resource key, as the layer's key extractor gave it.
    #[must_use]
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The token the request carries.
    #[must_use]
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The key's mark when the request arrived (0 for a key never seen).
    #[must_use]
    pub fn mark(&self) -> u64 {
        self.mark
    }

    /// The request's headers.
    #[must_use]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }
}

/// Why a raise was not verified.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyError {
    /// The token is not a genuine grant for this key (403).
    Refused(Cow<'static, str>),
    /// The verifier could not tell (503): its lock service is down, say.
    Unavailable(Cow<'static, str>),
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(why) | Self::Unavailable(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for VerifyError {}

type Later = Pin<Box<dyn Future<Output = Result<(), VerifyError>> + Send>>;

/// A verifier's answer: ready now (a signature check), or later (a question
/// to the lock service).
#[must_use]
pub struct Verification(Answer);

enum Answer {
    Ready(Option<Result<(), VerifyError>>),
    Later(Later),
}

impl Verification {
    /// The raise is genuine.
    pub fn valid() -> Self {
        Self(Answer::Ready(Some(Ok(()))))
    }

    /// The raise is not genuine: 403, with `why` in the problem's detail.
    pub fn refused(why: impl Into<Cow<'static, str>>) -> Self {
        Self(Answer::Ready(Some(Err(VerifyError::Refused(why.into())))))
    }

    /// The verifier cannot tell now: 503 with `Retry-After`.
    pub fn unavailable(why: impl Into<Cow<'static, str>>) -> Self {
        Self(Answer::Ready(Some(Err(VerifyError::Unavailable(why.into())))))
    }

    /// The answer of `future`, which the layer awaits up to its verify timeout.
    pub fn later(future: impl Future<Output = Result<(), VerifyError>> + Send + 'static) -> Self {
        Self(Answer::Later(Box::pin(future)))
    }
}

impl From<Result<(), VerifyError>> for Verification {
    fn from(result: Result<(), VerifyError>) -> Self {
        Self(Answer::Ready(Some(result)))
    }
}

impl Future for Verification {
    type Output = Result<(), VerifyError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Answer::Ready(answer) => {
                Poll::Ready(answer.take().expect("Verification polled after completion"))
            }
            Answer::Later(future) => future.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Answer::Ready(answer) => f.debug_tuple("Verification").field(answer).finish(),
            Answer::Later(_) => f.write_str("Verification(later)"),
        }
    }
}

/// A verifier from a closure; [`verify_fn`] makes one.
#[derive(Clone, Copy)]
pub struct VerifyFn<F>(F);

/// Makes a [`TokenVerifier`] of `f`. Going through this function lets the
/// closure's argument type be inferred: `verify_fn(|raise| …)`.
pub fn verify_fn<F>(f: F) -> VerifyFn<F>
where
    F: Fn(&Raise<'_>) -> Verification + Send + Sync + 'static,
{
    VerifyFn(f)
}

impl<F> TokenVerifier for VerifyFn<F>
where
    F: Fn(&Raise<'_>) -> Verification + Send + Sync + 'static,
{
    fn verify(&self, raise: &Raise<'_>) -> Verification {
        (self.0)(raise)
    }
}

impl<F> fmt::Debug for VerifyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("VerifyFn")
    }
}

impl<V: TokenVerifier + ?Sized> TokenVerifier for std::sync::Arc<V> {
    fn verify(&self, raise: &Raise<'_>) -> Verification {
        (**self).verify(raise)
    }
}
