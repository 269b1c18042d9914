//! Replicas on PostgreSQL: test-support's replicas (a real axum server on
//! 127.0.0.1 each, one `Probe` for all) with a `PgSharedStore` and a pool of
//! their own, built as each PostgreSQL test needs (a pool and a background
//! session routed apart, pool limits).

use fencing_layer::FencingLayer;
use fencing_layer::claims::{ClaimStore, ClaimTiming};
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};
use tokio_postgres::Config;

pub use test_support::replicas::{Probe, Workers};

/// A replica whose store is a `PgSharedStore`.
pub type Replica = test_support::replicas::Replica<PgSharedStore>;

/// How a replica is built beyond its probe and layer.
pub struct Setup {
    /// The pool's database.
    pub pool: Config,
    /// The background session's database (the pool's, unless a test routes it elsewhere).
    pub session: Config,
    pub limits: PoolLimits,
    pub timing: ClaimTiming,
    /// Serve on a runtime of its own with one worker thread (which a handler can block).
    pub one_worker: bool,
}

impl Setup {
    pub fn new(config: Config, timing: ClaimTiming) -> Self {
        Self {
            pool: config.clone(),
            session: config,
            limits: PoolLimits::default(),
            timing,
            one_worker: false,
        }
    }
}

/// The PostgreSQL ways to build a [`Replica`].
pub trait PgReplica: Sized {
    /// A replica on the database `config` names, with the default claim timing.
    async fn start(probe: &Probe, config: Config, layer: FencingLayer, limits: PoolLimits) -> Self {
        Self::with_timing(probe, config, layer, limits, ClaimTiming::default()).await
    }

    /// A replica on the database `config` names.
    async fn with_timing(
        probe: &Probe,
        config: Config,
        layer: FencingLayer,
        limits: PoolLimits,
        timing: ClaimTiming,
    ) -> Self {
        Self::build(probe, layer, Setup { limits, ..Setup::new(config, timing) }).await
    }

    /// A replica as `setup` says, its session open before it serves.
    async fn build(probe: &Probe, layer: FencingLayer, setup: Setup) -> Self;
}

impl PgReplica for Replica {
    async fn build(probe: &Probe, layer: FencingLayer, setup: Setup) -> Self {
        let store = ready_store(setup.pool, setup.session, setup.limits, setup.timing).await;
        let workers = if setup.one_worker { Workers::OwnThread } else { Workers::Shared };
        Replica::serve(probe, layer, store, claims_of, workers).await
    }
}

/// A migrated store with its session open: pool on `pool`, session on `session`.
pub async fn ready_store(
    pool: Config,
    session: Config,
    limits: PoolLimits,
    timing: ClaimTiming,
) -> PgSharedStore {
    let pool = fencing_postgres::pool(pool, limits).unwrap();
    let store = PgSharedStore::with_timing(pool, session, PgFence::new(), timing).unwrap();
    tokio::time::timeout(super::BOUND, store.migrate()).await.expect("migrate hung").unwrap();
    store.ready().await.unwrap();
    store
}

/// The store's claims, as `Replica::serve` asks.
pub fn claims_of(store: &PgSharedStore) -> &ClaimStore {
    store.claims()
}
