//! What the layer was configured with, in the shape its service and futures
//! read it: [`Settings`] (extractor, responder and [`Config`]), shared behind one
//! `Arc` by the layer, every service it makes and their futures. Built by
//! [`FencingLayer`](crate::FencingLayer); this module knows nothing of the
//! layer, the service or the future, which all read it.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Request, Response};

use crate::key::KeyRequest;
use crate::methods::MethodSet;
use crate::metrics::Metrics;
use crate::rejection::Rejection;
use crate::respond::RejectionResponder;
use crate::store::admission::{Rules, WaitFor};
use crate::store::{MarkStore, SharedStore};
use crate::token::FencingToken;
use crate::verify::TokenVerifier;

/// What a higher token does about lower-token requests still inside the inner
/// service (with or without either, no two holders are ever inside at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum InFlightPolicy {
    /// Wait for them to finish, up to the drain timeout (the default).
    #[default]
    Drain,
    /// Drop their inner futures at once, answering them 409, then enter.
    /// Only for handlers whose work is safe to abandon at any `.await`.
    Cancel,
}

/// Everything a [`Fencing`](crate::Fencing) service and its futures read.
#[derive(Clone)]
pub(crate) struct Settings<E, R> {
    pub(crate) extractor: E,
    pub(crate) responder: R,
    pub(crate) config: Config,
}

impl<E, R> Settings<E, R> {
    /// The response for `rejection`: a gRPC status to a gRPC request (unless
    /// turned off), the responder's otherwise. Every refusal passes here, and is counted.
    pub(crate) fn answer<B>(&self, rejection: Rejection, grpc: bool) -> Response<B>
    where
        R: RejectionResponder<B>,
    {
        self.config.metrics.rejected(&rejection);
        if grpc && self.config.grpc_statuses {
            rejection.respond_with(&GrpcFirst(&self.responder))
        } else {
            rejection.respond_with(&self.responder)
        }
    }
}

/// A responder's gRPC answer where it has one, its plain answer otherwise.
struct GrpcFirst<'r, R>(&'r R);

impl<B, R: RejectionResponder<B>> RejectionResponder<B> for GrpcFirst<'_, R> {
    fn respond(&self, rejection: &Rejection) -> Response<B> {
        self.0.respond_grpc(rejection).unwrap_or_else(|| self.0.respond(rejection))
    }
}

/// The settings that do not depend on the extractor or responder types.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) header: HeaderName,
    pub(crate) unfenced_methods: MethodSet,
    pub(crate) allow_unfenced: bool,
    pub(crate) drain_timeout: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) policy: InFlightPolicy,
    pub(crate) store: MarkStore,
    /// When set, every fenced request is decided here instead of in `store`.
    pub(crate) shared_store: Option<SharedStoreHandle>,
    /// When set, asked before any token raises a mark.
    pub(crate) verifier: Option<VerifierHandle>,
    pub(crate) verify_timeout: Duration,
    /// Answer gRPC requests with gRPC statuses.
    pub(crate) grpc_statuses: bool,
    /// When set, requests it holds for pass through unfenced.
    pub(crate) unfenced_if: Option<UnfencedIf>,
    /// Counters and the like (nothing without the `metrics` feature).
    pub(crate) metrics: Metrics,
    /// Put the admitted token into the request extensions.
    pub(crate) token_extension: bool,
    /// `{namespace}:` before every key, when set ([`FencingLayer::key_namespace`](crate::FencingLayer::key_namespace)).
    pub(crate) namespace: Option<Arc<str>>,
    /// Put each admitted request's place into its extensions instead of keeping it
    /// ([`FencingLayer::hand_over_places`](crate::FencingLayer::hand_over_places)).
    pub(crate) hand_over: bool,
    /// The cancel policy or `hand_over`: admission goes through [`Kind::enter`](crate::future),
    /// kept as one flag so that the fast path tests one byte for both.
    pub(crate) slow_entry: bool,
}

/// The [`FencingLayer::unfenced_if`](crate::FencingLayer::unfenced_if) predicate: shared, and debug-printable.
#[derive(Clone)]
pub(crate) struct UnfencedIf(pub(crate) Arc<UnfencedFn>);

/// A predicate over a request's head.
type UnfencedFn = dyn Fn(&dyn KeyRequest) -> bool + Send + Sync;

impl fmt::Debug for UnfencedIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UnfencedIf")
    }
}

/// A [`TokenVerifier`] in the configuration: shared, and debug-printable.
#[derive(Clone)]
pub(crate) struct VerifierHandle(pub(crate) Arc<dyn TokenVerifier>);

impl fmt::Debug for VerifierHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenVerifier")
    }
}

/// A [`SharedStore`] in the configuration: shared, and debug-printable.
#[derive(Clone)]
pub(crate) struct SharedStoreHandle(pub(crate) Arc<dyn SharedStore>);

impl fmt::Debug for SharedStoreHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedStore")
    }
}

impl Config {
    #[inline]
    pub(crate) fn is_fenced<B>(&self, request: &Request<B>) -> bool {
        !self.unfenced_methods.contains(request.method())
            && !self.unfenced_if.as_ref().is_some_and(|unfenced| (unfenced.0)(request))
    }

    /// How long a request may wait for `what`.
    pub(crate) fn bound(&self, what: WaitFor) -> Duration {
        match what {
            WaitFor::Drain => self.drain_timeout,
            WaitFor::Write => self.store.write_timeout(),
            WaitFor::Verify => self.verify_timeout,
        }
    }

    /// What a raise needs here, for a request whose token is `verified` or not yet.
    pub(crate) fn rules(&self, verified: bool) -> Rules {
        Rules { durable: self.store.is_durable(), verify: self.verifier.is_some() && !verified }
    }

    /// How long a shared store may take to decide: its drain, then a write's worth.
    pub(crate) fn shared_store_bound(&self) -> Duration {
        self.drain_timeout.saturating_add(self.store.write_timeout())
    }

    /// Puts an admitted request's token in its extensions, when told to.
    #[inline(always)]
    pub(crate) fn insert_token_extension<B>(&self, request: &mut Request<B>, token: FencingToken) {
        if self.token_extension {
            request.extensions_mut().insert(token);
        }
    }

    /// `key` under the layer's namespace, if it has one.
    #[inline(always)]
    pub(crate) fn namespaced<'r>(&self, key: Cow<'r, str>) -> Cow<'r, str> {
        match &self.namespace {
            None => key,
            Some(prefix) => Cow::Owned([prefix, &*key].concat()),
        }
    }

    /// Whether an admitted request leaves the fast path: to be watched for a
    /// higher token (the cancel policy), or to carry its place in its extensions.
    #[inline(always)]
    pub(crate) fn enters_slowly(&self) -> bool {
        self.slow_entry
    }

    /// Sets [`slow_entry`](Self::slow_entry) from what it stands for; after every change.
    pub(crate) fn settle(&mut self) {
        self.slow_entry = self.hand_over || self.policy == InFlightPolicy::Cancel;
    }
}
