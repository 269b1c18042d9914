//! [`FencingLayer`]: the configuration, built once and shared by every route.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use tower_layer::Layer;

use crate::config::InFlightPolicy;
use crate::config::{Config, Settings, SharedStoreHandle, UnfencedIf, VerifierHandle};
use crate::headers::FENCING_TOKEN;
use crate::key::{KeyFn, KeyRequest, NAMESPACE_SEPARATOR, OwnedKeyFn, PathKey};
use crate::metrics::Metrics;
use crate::respond::ProblemJson;
use crate::service::Fencing;
use crate::store::{MarkStore, SharedStore};
use crate::verify::{DEFAULT_VERIFY_TIMEOUT, TokenVerifier};

/// A [`Layer`] that fences the services it wraps: requests with a stale
/// fencing token are refused before they reach them.
///
/// Cloning is cheap: the configuration sits behind an `Arc`, and clones share
/// one [`MarkStore`]. See the [crate docs](crate) for the HTTP contract.
#[must_use]
pub struct FencingLayer<E = PathKey, R = ProblemJson> {
    settings: Arc<Settings<E, R>>,
}

impl FencingLayer {
    /// How long a higher token waits, by default, for lower-token requests still
    /// inside the inner service: long enough for an ordinary write to finish, short
    /// enough that a new holder is not stalled behind a hung one.
    pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

    /// The default fencing: `Fencing-Token` header, every method but GET, HEAD,
    /// OPTIONS and TRACE fenced, keyed by path, problem+json rejections, a fresh
    /// in-memory store, drain policy with a [`DEFAULT_DRAIN_TIMEOUT`](Self::DEFAULT_DRAIN_TIMEOUT) bound.
    pub fn new() -> Self {
        let config = Config {
            header: FENCING_TOKEN,
            unfenced_methods: [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE]
                .into_iter()
                .collect(),
            allow_unfenced: false,
            token_extension: false,
            drain_timeout: Self::DEFAULT_DRAIN_TIMEOUT,
            retry_after: Duration::from_secs(1),
            policy: InFlightPolicy::Drain,
            store: MarkStore::in_memory(),
            shared_store: None,
            verifier: None,
            verify_timeout: DEFAULT_VERIFY_TIMEOUT,
            grpc_statuses: true,
            unfenced_if: None,
            metrics: Metrics::new(),
            namespace: None,
            hand_over: false,
            slow_entry: false,
        };
        Self::from_parts(PathKey, ProblemJson, config)
    }
}

impl Default for FencingLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<E, R> FencingLayer<E, R> {
    fn from_parts(extractor: E, responder: R, config: Config) -> Self {
        Self { settings: Arc::new(Settings { extractor, responder, config }) }
    }

    /// The store holding this layer's marks.
    #[must_use]
    pub fn mark_store(&self) -> &MarkStore {
        &self.settings.config.store
    }
}

// Builders run before the layer is shared, so `unwrap_or_clone` does not clone;
// the `Clone` bounds only cover a builder called on a clone.
impl<E: Clone, R: Clone> FencingLayer<E, R> {
    fn with(self, change: impl FnOnce(&mut Config)) -> Self {
        let mut settings = Arc::unwrap_or_clone(self.settings);
        change(&mut settings.config);
        settings.config.settle();
        Self { settings: Arc::new(settings) }
    }

    /// Reads the token from `header` instead of `Fencing-Token`.
    pub fn header(self, header: HeaderName) -> Self {
        self.with(|s| s.header = header)
    }

    /// The methods that pass through unfenced (default GET, HEAD, OPTIONS,
    /// TRACE). Pass an empty list to fence every method.
    pub fn unfenced_methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.with(|s| s.unfenced_methods = methods.into_iter().collect())
    }

    /// Lets fenced requests without a token through unchecked (default: 428).
    /// Requests that do carry a token are still checked.
    pub fn allow_unfenced(self, allow: bool) -> Self {
        self.with(|s| s.allow_unfenced = allow)
    }

    /// Whether an admitted request also carries its token into the inner
    /// service in the request extensions (default `false`), for
    /// `Extension<FencingToken>` or code that reads `extensions().get()`.
    ///
    /// Without it the handler still has the token: [`FencingToken::current`]
    /// (and the axum extractor, which reads it) is the token the layer admitted,
    /// while the inner future runs. The insert costs about as much as the rest
    /// of the layer (in an axum router the token is a fourth extension, so the
    /// map moves to a bigger table, and the value is boxed: two allocations;
    /// `BENCHMARKS.md`, section 19), so it is off unless asked for.
    ///
    /// ```
    /// use axum::{Extension, Router, routing::put};
    /// use fencing_layer::{FencingLayer, FencingToken};
    ///
    /// // A handler written against the extensions.
    /// async fn store(Extension(token): Extension<FencingToken>) -> String {
    ///     format!("stored under token {token}")
    /// }
    ///
    /// let app: Router = Router::new()
    ///     .route("/docs/{name}", put(store))
    ///     .route_layer(FencingLayer::new().token_extension(true));
    /// # let _ = app;
    /// ```
    ///
    /// [`FencingToken::current`]: crate::FencingToken::current
    pub fn token_extension(self, insert: bool) -> Self {
        self.with(|s| s.token_extension = insert)
    }

    /// How long a higher token waits for lower-token requests to leave the
    /// inner service before it gets 503 (default [`FencingLayer::DEFAULT_DRAIN_TIMEOUT`]).
    /// With a durable store it starts once the raise is recorded. Any duration
    /// up to `Duration::MAX` is valid.
    pub fn drain_timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.drain_timeout = timeout)
    }

    /// The `Retry-After` sent with a drain timeout's 503, rounded up to whole
    /// seconds (default 1 s).
    pub fn retry_after(self, retry_after: Duration) -> Self {
        self.with(|s| s.retry_after = retry_after)
    }

    /// What to do about lower-token requests in flight when a higher token arrives.
    pub fn in_flight_policy(self, policy: InFlightPolicy) -> Self {
        self.with(|s| s.policy = policy)
    }

    /// Whether the layer hands each admitted request's place inside to the
    /// inner service, in the request's extensions as a
    /// [`HeldPlace`](crate::future::HeldPlace), instead of keeping it until the
    /// response future is done (default `false`). The request then counts as
    /// inside until every clone of that place is dropped: for work that
    /// outlives the response future, such as a proxy's upstream exchange that
    /// must run to its end after the client has gone (`fencing-gate` does
    /// this). The inner service answers for the place: dropping it early lets
    /// a higher token in while the work goes on. The cancel policy does not
    /// apply to handed-over places, and a shared store's revocation is the
    /// holder's to act on ([`HeldPlace::revoked`](crate::future::HeldPlace::revoked)).
    pub fn hand_over_places(self, hand_over: bool) -> Self {
        self.with(|s| s.hand_over = hand_over)
    }

    /// Keeps marks in `store` (default: a fresh in-memory store per layer).
    pub fn store(self, store: MarkStore) -> Self {
        self.with(|s| s.store = store)
    }

    /// Decides every fenced request in `store`, shared by every replica of the
    /// resource, instead of in this process's [`MarkStore`]: see [`SharedStore`].
    /// The drain bound is passed to the store; the whole decision is also
    /// bounded by the drain bound plus [`MarkStoreBuilder::write_timeout`]
    /// (then 503). A store may decide in memory first
    /// ([`SharedStore::try_admit`]: [`ClaimStore`](crate::claims::ClaimStore)
    /// admits its replica's current token there), and may revoke a request it
    /// admitted: its inner future is dropped and it gets 503 `claim-lost`.
    /// With a shared store a raise always drains: the cancel policy needs to
    /// see every raise at once, which only local marks give.
    ///
    /// [`MarkStoreBuilder::write_timeout`]: crate::store::MarkStoreBuilder::write_timeout
    pub fn shared_store(self, store: impl SharedStore) -> Self {
        let store = SharedStoreHandle(Arc::new(store));
        self.with(|s| s.shared_store = Some(store))
    }

    /// Asks `verifier` before any token raises a mark, and only then: a
    /// refused raise gets 403, a verifier that cannot answer 503, and the mark
    /// stays as it was. Equal and lower tokens never reach it, so the common
    /// request costs nothing more. See [`TokenVerifier`].
    pub fn verifier(self, verifier: impl TokenVerifier) -> Self {
        let verifier = VerifierHandle(Arc::new(verifier));
        self.with(|s| s.verifier = Some(verifier))
    }

    /// How long a raise waits for the verifier's answer before it gets 503
    /// (default [`DEFAULT_VERIFY_TIMEOUT`]). The drain bound starts after it.
    pub fn verify_timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.verify_timeout = timeout)
    }

    /// Adds the label `layer="{name}"` to every metric this layer reports, so
    /// that several fenced routers in one process can be told apart (feature
    /// `metrics`; see the crate docs for the metrics). The name should be one
    /// of a few fixed strings, never a resource key: each name is a series.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(self, name: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        self.with(|s| s.metrics.set_label(name))
    }

    /// Puts every key of this layer under `namespace`: `{namespace}:{key}`
    /// (`orders:/docs/1`, `tenants:acme`), in the store, in 409 bodies, in the
    /// logs and in `MarkStore::marks`. For several fenced routers sharing one
    /// store (a durable store locks its file, so one process opens it once):
    /// give each layer a namespace of its own, and a header key on one router
    /// and a path parameter on another can no longer meet on the same mark.
    /// Without it (the default) keys are stored as they are. `max_key_bytes`
    /// counts the prefix.
    ///
    /// The order of the builder calls does not matter: the namespace applies
    /// to whatever extractor the layer ends up with
    /// ([`key_extractor`](Self::key_extractor), [`key_fn`](Self::key_fn), the
    /// path), before or after it is set. A second call replaces the first.
    ///
    /// ```
    /// use fencing_layer::{FencingLayer, MarkStore, key::HeaderKey};
    ///
    /// let store = MarkStore::in_memory(); // or MarkStore::open(path), once per process
    /// let tenants = FencingLayer::new()
    ///     .store(store.clone())
    ///     .key_namespace("tenants")
    ///     .key_extractor(HeaderKey::new("x-tenant"));
    /// let documents = FencingLayer::new().store(store).key_namespace("documents");
    /// # let _ = (tenants, documents);
    /// ```
    ///
    /// # Panics
    ///
    /// When `namespace` is empty or contains `:` ([`NAMESPACE_SEPARATOR`]).
    #[track_caller]
    pub fn key_namespace(self, namespace: &str) -> Self {
        assert!(
            !namespace.is_empty() && !namespace.contains(NAMESPACE_SEPARATOR),
            "a key namespace is non-empty and has no {NAMESPACE_SEPARATOR:?}: {namespace:?}"
        );
        let prefix: Arc<str> = format!("{namespace}{NAMESPACE_SEPARATOR}").into();
        self.with(|s| s.namespace = Some(prefix))
    }

    /// Keys requests with `extractor` instead of by path.
    pub fn key_extractor<E2>(self, extractor: E2) -> FencingLayer<E2, R> {
        let Settings { responder, config, .. } = Arc::unwrap_or_clone(self.settings);
        FencingLayer::from_parts(extractor, responder, config)
    }

    /// Lets requests for which `unfenced` holds pass through, as unfenced
    /// methods do: the read-only methods of a gRPC service (every gRPC call is
    /// a POST), a health check, a path prefix. It sees the request as a
    /// [`KeyRequest`], so it needs no annotations.
    ///
    /// ```
    /// let layer = fencing_layer::FencingLayer::new()
    ///     .unfenced_if(|request| request.path().starts_with("/ledger.Ledger/Get"));
    /// # let _ = layer;
    /// ```
    pub fn unfenced_if(self, unfenced: impl Fn(&dyn KeyRequest) -> bool + Send + Sync + 'static) -> Self {
        let unfenced = UnfencedIf(Arc::new(unfenced));
        self.with(|s| s.unfenced_if = Some(unfenced))
    }

    /// Whether a gRPC request (`content-type: application/grpc…`) is refused
    /// with a gRPC status (the default, where the responder makes one:
    /// [`ProblemJson`] does) or like any other request. See
    /// [`GrpcStatus`](crate::grpc::GrpcStatus) for the mapping.
    pub fn grpc_statuses(self, grpc: bool) -> Self {
        self.with(|s| s.grpc_statuses = grpc)
    }

    /// Keys requests with a closure that may borrow its key from the request;
    /// it sees the request as a [`KeyRequest`], so it needs no annotations.
    /// `None` is answered 400. See the [`key`](crate::key::KeyExtractor) docs.
    ///
    /// ```
    /// let layer = fencing_layer::FencingLayer::new().key_fn(|request| request.header("x-tenant"));
    /// # let _ = layer;
    /// ```
    pub fn key_fn<F>(self, key: F) -> FencingLayer<KeyFn<F>, R>
    where
        F: Fn(&dyn KeyRequest) -> Option<&str>,
    {
        self.key_extractor(KeyFn(key))
    }

    /// Keys requests with a closure that builds its key (a `String`, say);
    /// like [`key_fn`](Self::key_fn) otherwise.
    pub fn key_fn_owned<F, K>(self, key: F) -> FencingLayer<OwnedKeyFn<F>, R>
    where
        F: Fn(&dyn KeyRequest) -> Option<K>,
        K: Into<Cow<'static, str>>,
    {
        self.key_extractor(OwnedKeyFn(key))
    }

    /// Answers rejections with `responder` instead of problem+json.
    pub fn on_rejection<R2>(self, responder: R2) -> FencingLayer<E, R2> {
        let Settings { extractor, config, .. } = Arc::unwrap_or_clone(self.settings);
        FencingLayer::from_parts(extractor, responder, config)
    }
}

impl<E, R> Clone for FencingLayer<E, R> {
    fn clone(&self) -> Self {
        Self { settings: Arc::clone(&self.settings) }
    }
}

impl<E, R> fmt::Debug for FencingLayer<E, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings.config;
        f.debug_struct("FencingLayer")
            .field("header", &s.header)
            .field("unfenced_methods", &s.unfenced_methods)
            .field("allow_unfenced", &s.allow_unfenced)
            .field("token_extension", &s.token_extension)
            .field("hand_over", &s.hand_over)
            .field("drain_timeout", &s.drain_timeout)
            .field("policy", &s.policy)
            .field("store", &s.store)
            .field("shared_store", &s.shared_store)
            .field("verifier", &s.verifier)
            .field("verify_timeout", &s.verify_timeout)
            .field("metrics", &s.metrics)
            .finish_non_exhaustive()
    }
}

// Here rather than beside the service, which knows nothing of the layer that makes it.
impl<S> Fencing<S> {
    /// Wraps `inner` with the default configuration.
    pub fn new(inner: S) -> Self {
        FencingLayer::new().layer(inner)
    }

    /// The default [`FencingLayer`], to configure and apply.
    pub fn layer() -> FencingLayer {
        FencingLayer::new()
    }
}

impl<S, E, R> Layer<S> for FencingLayer<E, R> {
    type Service = Fencing<S, E, R>;

    fn layer(&self, inner: S) -> Self::Service {
        // Every series at zero from now on, not from the first request.
        self.settings.config.metrics.register(&self.settings.config.store);
        Fencing::from_settings(inner, Arc::clone(&self.settings))
    }
}
