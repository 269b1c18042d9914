//! fencing-benches: what fencing costs, side by side with the bare service and the alternatives:
//! criterion benches, a loopback load generator (`fencing-load`), and the layer's soak (examples/soak.rs).
//! It is not a test suite or a library to build on: it measures, and nothing depends on it.
//!
//! The criterion benches (`cargo bench -p fencing-benches`) and the loopback load
//! generator (`cargo run --release -p fencing-benches --bin fencing-load`) share the
//! services built here, so every row of a comparison wraps the same router:
//!
//! - [`routes`]: an axum router with a trivial handler on `POST`/`GET /logs/{name}`;
//! - [`fenced`]: the same behind [`FencingLayer`] (`route_layer`, as the crate docs say);
//! - [`noop`]: the same behind tower's `Identity` layer, the floor any middleware pays;
//! - [`handwritten`]: what a user would write without the crate, an
//!   `axum::middleware::from_fn` over a `Mutex<HashMap<String, u64>>`;
//! - [`governor`]: tower_governor's keyed rate limiter, a peer with the same shape of
//!   per-key state, with a quota that never triggers;
//! - [`standin`]: the load generator's in-process target, a small append-only log
//!   service shaped like `demo-resource` (`POST /logs/{name}`), fenced or not.
//! - [`load`]: the load generator's parts (targets and path templates, token
//!   schedules, closed and open loop, report, thresholds, plot).
//!
//! See `BENCHMARKS.md` at the workspace root for the results and how to reproduce them.

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use fencing_layer::{FencingLayer, MarkStore};
use http::{Method, Request};

/// The header the benches send, the layer's default.
pub const TOKEN_HEADER: &str = "fencing-token";

/// A request `method path` with the token header set to `token` when given.
///
/// # Panics
///
/// `path` is not a valid URI path.
#[must_use]
pub fn request(method: Method, path: &str, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        builder = builder.header(TOKEN_HEADER, token);
    }
    builder.body(Body::empty()).expect("a valid bench request")
}

/// The path of the `i`-th pre-seeded key: `/logs/k0000042`. All seeded keys have
/// the same length, [`KEY_LEN`].
#[must_use]
pub fn key(i: usize) -> String {
    format!("/logs/k{i:07}")
}

/// The length in bytes of every [`key`] below ten million.
pub const KEY_LEN: usize = "/logs/k0000000".len();

/// The trivial handler every bench route uses.
pub async fn trivial() -> &'static str {
    "ok"
}

/// The bare router: `POST` and `GET /logs/{name}` answered by [`trivial`].
///
/// It is already `with_state(())`, as `axum::serve` makes every router it serves:
/// handlers are turned into services once, and a layer added later with
/// `route_layer` is applied once, not per request. (Calling a `Router<()>` that
/// never went through `with_state` re-applies its route layers on every request,
/// which would charge every layered row for building its layer each time.)
pub fn routes() -> Router {
    Router::new().route("/logs/{name}", post(trivial).get(trivial)).with_state(())
}

/// [`routes`] behind `tower::layer::util::Identity`: what any layer costs at least.
pub fn noop() -> Router {
    routes().route_layer(tower::layer::util::Identity::new())
}

/// [`routes`] fenced by a [`FencingLayer`] keeping its marks in `store`.
pub fn fenced(store: MarkStore) -> Router {
    routes().route_layer(FencingLayer::new().store(store))
}

/// [`fenced`], with the layer also putting the token in the request extensions
/// ([`FencingLayer::token_extension`]`(true)`; the default before 0.13).
pub fn fenced_extension(store: MarkStore) -> Router {
    routes().route_layer(FencingLayer::new().store(store).token_extension(true))
}

/// [`routes`] fenced with `store` and an [`Ed25519Verifier`](fencing_layer::verify::Ed25519Verifier)
/// trusting `signer`'s key, each path its own lock.
pub fn fenced_verified(store: MarkStore, signer: &fencing_layer::verify::ProofSigner) -> Router {
    let verifier = fencing_layer::verify::Ed25519Verifier::new(signer.public_key());
    routes().route_layer(FencingLayer::new().store(store).verifier(verifier))
}

/// An in-memory store holding `keys` keys ([`key`]`(0..keys)`, each with mark 1),
/// room for `keys + extra_room` keys, then `extra` seeded on top.
///
/// # Panics
///
/// Seeding fails (it cannot: the store is in memory and large enough).
#[must_use]
pub fn seeded_store(keys: usize, extra_room: usize, extra: &[(&str, u64)]) -> MarkStore {
    let store = MarkStore::builder().max_keys(keys + extra.len() + extra_room).in_memory();
    for i in 0..keys {
        store.seed(&key(i), 1).expect("room for every seeded key");
    }
    for &(key, token) in extra {
        store.seed(key, token).expect("room for the extra keys");
    }
    store
}

pub mod handwritten {
    //! The fencing check a user would write by hand: `axum::middleware::from_fn`
    //! with a `Mutex<HashMap<String, u64>>`, checking `token >= max` and raising it.
    //!
    //! It keeps invariant 1 (monotonic admission) but not invariant 2: a stale
    //! request that passed the check can still be inside the handler when a newer
    //! holder's request runs. It is here only as the cost baseline.

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, PoisonError};

    use axum::Router;
    use axum::extract::{Request, State};
    use axum::middleware::{Next, from_fn_with_state};
    use axum::response::{IntoResponse, Response};
    use http::{Method, StatusCode};

    /// The marks: path → highest token seen.
    pub type Marks = Arc<Mutex<HashMap<String, u64>>>;

    /// Marks for `keys` keys ([`key`](crate::key)`(0..keys)`, each at 1), plus `extra`.
    #[must_use]
    pub fn seeded(keys: usize, extra: &[(&str, u64)]) -> Marks {
        let mut map: HashMap<String, u64> = (0..keys).map(|i| (crate::key(i), 1)).collect();
        map.extend(extra.iter().map(|&(key, token)| (key.to_owned(), token)));
        Arc::new(Mutex::new(map))
    }

    async fn check(State(marks): State<Marks>, request: Request, next: Next) -> Response {
        if matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE) {
            return next.run(request).await;
        }
        let token = request.headers().get(crate::TOKEN_HEADER).map(|v| v.to_str().ok()?.parse::<u64>().ok());
        let token = match token {
            None => return StatusCode::PRECONDITION_REQUIRED.into_response(),
            Some(None) => return StatusCode::BAD_REQUEST.into_response(),
            Some(Some(token)) => token,
        };
        {
            let mut marks = marks.lock().unwrap_or_else(PoisonError::into_inner);
            let mark = marks.entry(request.uri().path().to_owned()).or_insert(0);
            if token < *mark {
                return (StatusCode::CONFLICT, format!("stale token {token}, highest seen {mark}"))
                    .into_response();
            }
            *mark = token;
        }
        next.run(request).await
    }

    /// [`routes`](crate::routes) behind the hand-written check over `marks`.
    pub fn router(marks: Marks) -> Router {
        crate::routes().route_layer(from_fn_with_state(marks, check))
    }
}

pub mod governor {
    //! The peer: tower_governor's keyed rate limiter, keyed by path like the
    //! fencing layer, on the same methods, with a quota that never triggers
    //! (a burst of `u32::MAX` refilled every nanosecond).

    use ::governor::middleware::NoOpMiddleware;
    use axum::Router;
    use http::{Method, Request};
    use tower_governor::GovernorError;
    use tower_governor::GovernorLayer;
    use tower_governor::governor::{GovernorConfig, GovernorConfigBuilder};
    use tower_governor::key_extractor::KeyExtractor;

    /// Keys by the request path, as a user of tower_governor would write it.
    #[derive(Debug, Clone, Copy)]
    pub struct PathKeyExtractor;

    impl KeyExtractor for PathKeyExtractor {
        type Key = String;

        fn extract<T>(&self, request: &Request<T>) -> Result<Self::Key, GovernorError> {
            Ok(request.uri().path().to_owned())
        }
    }

    /// The limiter's configuration, shared by the layer and by whoever seeds it.
    pub type Config = GovernorConfig<PathKeyExtractor, NoOpMiddleware>;

    /// A configuration whose limiter has seen `keys` keys ([`key`](crate::key)`(0..keys)`).
    ///
    /// # Panics
    ///
    /// The quota is rejected (it is not: neither period nor burst is zero).
    #[must_use]
    pub fn seeded(keys: usize) -> Config {
        let config = GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .methods(vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE])
            .key_extractor(PathKeyExtractor)
            .finish()
            .expect("a non-zero quota");
        for i in 0..keys {
            let _ = config.limiter().check_key(&crate::key(i));
        }
        config
    }

    /// [`routes`](crate::routes) behind the limiter of `config`.
    pub fn router(config: Config) -> Router {
        crate::routes().route_layer(GovernorLayer::new(config))
    }
}

pub mod load;

pub mod standin {
    //! The load generator's in-process target: an append-only log service with
    //! `demo-resource`'s write route, `POST /logs/{name}` (201 with the entry's
    //! index), and `GET /logs/{name}` (how many entries). Logs live in memory and
    //! keep their last [`KEEP`] entries, so a long run does not grow without bound.

    use std::collections::{HashMap, VecDeque};
    use std::sync::{Arc, Mutex, PoisonError};

    use axum::Router;
    use axum::extract::{Path, State};
    use axum::routing::post;
    use bytes::Bytes;
    use fencing_layer::{FencingLayer, FencingToken};
    use http::StatusCode;

    /// Entries kept per log.
    pub const KEEP: usize = 1024;

    #[derive(Default)]
    struct Log {
        appended: u64,
        entries: VecDeque<(Option<u64>, Bytes)>,
    }

    type Logs = Arc<Mutex<HashMap<String, Log>>>;

    async fn append(
        State(logs): State<Logs>,
        Path(name): Path<String>,
        token: Option<FencingToken>,
        body: Bytes,
    ) -> (StatusCode, String) {
        let index = {
            let mut logs = logs.lock().unwrap_or_else(PoisonError::into_inner);
            let log = logs.entry(name).or_default();
            if log.entries.len() == KEEP {
                log.entries.pop_front();
            }
            log.entries.push_back((token.map(FencingToken::get), body));
            log.appended += 1;
            log.appended - 1
        };
        (StatusCode::CREATED, format!("{{\"index\":{index}}}"))
    }

    async fn count(State(logs): State<Logs>, Path(name): Path<String>) -> (StatusCode, String) {
        let logs = logs.lock().unwrap_or_else(PoisonError::into_inner);
        match logs.get(&name) {
            Some(log) => (StatusCode::OK, format!("{{\"appended\":{}}}", log.appended)),
            None => (StatusCode::NOT_FOUND, String::new()),
        }
    }

    /// The service, behind a default [`FencingLayer`] when `fenced`.
    pub fn router(fenced: bool) -> Router {
        router_with(fenced.then(FencingLayer::new))
    }

    /// The unfenced service behind a layer that only burns `ns` nanoseconds of
    /// CPU per request: a known cost, to see how the loopback figures respond
    /// to one (`fencing-load --calibrate-ns`).
    pub fn router_spinning(ns: u64) -> Router {
        let spin = move |request: http::Request<axum::body::Body>| {
            let start = std::time::Instant::now();
            while start.elapsed().as_nanos() < u128::from(ns) {
                std::hint::spin_loop();
            }
            request
        };
        logs().route_layer(tower::util::MapRequestLayer::new(spin)).with_state(Logs::default())
    }

    /// The service, behind `layer` if there is one.
    pub fn router_with(layer: Option<FencingLayer>) -> Router {
        let routes = match layer {
            Some(layer) => logs().route_layer(layer),
            None => logs(),
        };
        routes.with_state(Logs::default())
    }

    /// The log routes, before their state.
    fn logs() -> Router<Logs> {
        Router::new().route("/logs/{name}", post(append).get(count))
    }
}
