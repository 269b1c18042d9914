//! [`Pending`]: a request that is not inside yet, and the answers it can get.

use std::sync::Arc;

use http::{Request, Response};
use tokio::sync::oneshot;

use crate::config::Settings;
use crate::grpc::is_grpc;
use crate::rejection::Rejection;
use crate::respond::RejectionResponder;
use crate::store::admission::RecordDuty;
use crate::store::{SharedAdmission, StoreError};
use crate::token::FencingToken;
use crate::verify::{Raise, Verification, VerifyError};

/// A request that is not inside yet, with the readied service that will take it.
pub(super) struct Pending<S, B, E, R> {
    pub(super) inner: S,
    pub(super) request: Request<B>,
    pub(super) token: FencingToken,
    pub(super) key: String,
    pub(super) settings: Arc<Settings<E, R>>,
    /// The verifier has accepted this request's raise.
    pub(super) verified: bool,
}

impl<S, B, E, R> Pending<S, B, E, R> {
    pub(super) fn new(
        inner: S,
        request: Request<B>,
        token: FencingToken,
        key: String,
        settings: &Arc<Settings<E, R>>,
    ) -> Self {
        Self { inner, request, token, key, settings: Arc::clone(settings), verified: false }
    }

    /// The response to this request for `rejection`.
    pub(super) fn answer<ResBody>(&self, rejection: Rejection) -> Response<ResBody>
    where
        R: RejectionResponder<ResBody>,
    {
        self.settings.answer(rejection, is_grpc(self.request.headers()))
    }

    /// Has the store record the raise this request carries the duty for.
    pub(super) fn record(&self, duty: RecordDuty) -> oneshot::Receiver<Result<(), StoreError>> {
        self.settings.config.store.record(&self.key, duty)
    }

    /// Asks the verifier about raising the mark from `mark` to this request's token.
    pub(super) fn verify(&self, mark: u64) -> Verification {
        let raise = Raise::new(&self.key, self.token.get(), mark, self.request.headers());
        match &self.settings.config.verifier {
            Some(verifier) => verifier.0.verify(&raise),
            None => Verification::unavailable("no verifier is configured"),
        }
    }

    /// With a shared store and a verifier: the highest token verified for the
    /// key by this process, which the local mark store keeps. A token at or
    /// below it goes to the shared store unverified; that is safe because the
    /// verified token's lock holder, and every later one, holds a token at
    /// least as high, so such a raise can lock no honest holder out.
    pub(super) fn shared_floor(&self) -> Option<u64> {
        let config = &self.settings.config;
        config.verifier.as_ref().map(|_| config.store.mark(&self.key).unwrap_or(0))
    }

    /// Asks the shared store to admit this request.
    pub(super) fn admit_shared(&self) -> SharedAdmission {
        let config = &self.settings.config;
        let Some(store) = &config.shared_store else { unreachable!("only called with a shared store") };
        store.0.admit(&self.key, self.token.get(), config.drain_timeout)
    }

    pub(super) fn unverified(&self, error: VerifyError) -> Rejection {
        let (key, presented) = (self.key.clone(), self.token.get());
        match error {
            VerifyError::Refused(reason) => {
                Rejection::Unverified { key, presented, reason: reason.into_owned() }
            }
            VerifyError::Unavailable(reason) => Rejection::VerifierUnavailable {
                key,
                presented,
                reason: reason.into_owned(),
                retry_after: self.settings.config.retry_after,
            },
        }
    }

    /// The verifier gave no answer within its bound.
    pub(super) fn verifier_silent(&self) -> Rejection {
        let reason = format!("no answer within {:?}", self.settings.config.verify_timeout);
        self.unverified(VerifyError::Unavailable(reason.into()))
    }

    pub(super) fn stale(&self, highest: u64) -> Rejection {
        Rejection::Stale { key: self.key.clone(), presented: self.token.get(), highest }
    }

    pub(super) fn drain_timeout(&self) -> Rejection {
        Rejection::DrainTimeout {
            key: self.key.clone(),
            presented: self.token.get(),
            retry_after: self.settings.config.retry_after,
        }
    }

    /// The store's error, as the rejection it is.
    pub(super) fn store_error(&self, error: StoreError) -> Rejection {
        Rejection::from_store_error(
            error,
            self.key.clone(),
            self.token.get(),
            self.settings.config.retry_after,
        )
    }
}
