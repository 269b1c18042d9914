//! One conformance suite for shared stores (claims engines), run against every
//! engine: PostgreSQL (`fencing-postgres`), etcd, and whichever comes next. An
//! engine implements [`Engine`] in its tests and writes one line,
//! `shared_store_conformance!(MyEngine);`, which expands one `#[tokio::test]`
//! per scenario under the scenario's name (as fencing-client's lock backends
//! share theirs).
//!
//! What it proves, for replicas that share nothing but the engine (each a real
//! axum server with its own layer and store, one [`Probe`] recording every
//! handler's entry and exit in one order):
//!
//! - the layer's HTTP contract holds across replicas: a token seen anywhere is
//!   stale everywhere, a raise waits for lower tokens inside on any replica
//!   (bounded by the drain bound, then 503), equal tokens share, a request cut
//!   off inside frees its place, and random routing keeps both invariants
//!   ([`Probe::assert_invariants`]);
//! - exclusion never rests on a session or connection staying alive: a claim
//!   outlives a handler longer than its term and a lost connection; a stalled
//!   replica stops its own requests (503 `claim-lost`) before its claim can
//!   expire; a killed replica's claim expires after about a term, not before;
//! - clients and workers cannot break it: a storm of raises whose clients give
//!   up leaves the key usable, a grant whose client left is released at once,
//!   a worker blocked for most of the term keeps its claim, and a handler that
//!   never yields past its claim never answers success; and 400 requests for
//!   new keys racing a replica limited to 2 keys get at most 2 claims.
//!
//! Every timing comes from the engine ([`Engine::timing`]), so an engine whose
//! shortest term is seconds (etcd leases) runs the same scenarios, longer.

// The scenarios await the engine's methods in the test's own future (never on a
// spawned task), so the futures need not be `Send`.
#![allow(async_fn_in_trait)]

mod bed;
mod clients;
mod contract;
mod limits;
mod sessions;
mod workers;

use std::net::SocketAddr;
use std::time::Duration;

use fencing_layer::claims::{ClaimStore, ClaimTiming};
use fencing_layer::store::SharedStore;

pub use clients::{
    a_grant_whose_client_left_is_released_at_once, a_raise_storm_cut_off_by_its_clients_leaves_the_key_usable,
};
pub use contract::{
    a_drain_past_its_bound_is_503_and_the_mark_stays_raised,
    a_raise_waits_for_lower_tokens_inside_on_any_replica_and_equal_ones_share,
    a_request_cut_off_inside_lets_the_next_holder_in, a_token_seen_by_one_replica_is_stale_on_every_other,
    random_routing_across_three_replicas_keeps_both_invariants,
};
pub use limits::the_key_limit_holds_against_400_concurrent_new_keys;
pub use sessions::{
    a_handler_longer_than_the_term_keeps_its_claim_and_the_raise_waits,
    a_killed_replicas_claim_expires_after_about_a_term, a_lost_connection_does_not_free_the_claim,
    a_stalled_replica_stops_its_requests_before_its_claim_expires,
};
pub use workers::{
    a_handler_that_never_yields_past_its_claim_does_not_answer_success,
    a_worker_blocked_for_most_of_the_term_keeps_its_claim,
};

#[allow(unused_imports)] // for the docs' links
use crate::replicas::Probe;

/// A claims engine the suite can start and build replicas' stores on.
pub trait Engine: Sized + Send + Sync + 'static {
    /// The engine's name, for messages.
    const NAME: &'static str;
    /// The claim term of the suite's replicas: the shortest the engine keeps
    /// honestly (PostgreSQL: 1 s; etcd's leases are whole seconds, 2 s at
    /// least). The suite's waits on claims are multiples of it.
    const TERM: Duration;
    /// How long past a claim's expiry the engine may still count it live
    /// (etcd revokes expired leases on a timer; PostgreSQL compares times as
    /// it grants). The killed replica's scenario allows this much more.
    const EXPIRY_SLACK: Duration = Duration::from_millis(500);
    /// The store of one replica.
    type Store: SharedStore + Clone;

    /// Starts the engine (a throwaway database, a throwaway server): `None`
    /// after the loud SKIPPED line (`CI=true`: a failure), see [`crate::skip`].
    async fn start() -> Option<Self>;
    /// The engine's address on 127.0.0.1: the suite puts a
    /// [`StallProxy`](crate::StallProxy) in front of it to stall or sever one
    /// replica's route.
    fn addr(&self) -> SocketAddr;
    /// One replica's store, reaching the engine only at `addr` (its own or a
    /// proxy's: every connection of the store, pool and session alike), named
    /// `name` where the engine shows names (PostgreSQL: `application_name`),
    /// with `timing`; ready (its background session open) when returned.
    async fn store(&self, addr: SocketAddr, name: &str, timing: ClaimTiming) -> Self::Store;
    /// The store's claims.
    fn claims(store: &Self::Store) -> &ClaimStore;
    /// `key`'s mark as the engine holds it, read directly (`None` before its first raise).
    async fn mark(&self, key: &str) -> Option<u64>;
    /// How many claim records on `key` the engine holds now, live or expired.
    async fn claims_on(&self, key: &str) -> usize;
    /// How many claim records the engine holds now, on every key, live or expired.
    async fn all_claims(&self) -> usize;
    /// The engine's own checks after a storm of raises on the replica named
    /// `name` whose clients gave up (PostgreSQL: no sessions left behind).
    async fn after_storm(&self, name: &str) {
        let _ = name;
    }

    /// The claim timing of the suite's replicas: the defaults for [`TERM`](Self::TERM).
    fn timing() -> ClaimTiming {
        ClaimTiming::for_term(Self::TERM)
    }
}

/// Every scenario of [`shared_store_suite`](self) as a test of the calling
/// module, for the engine `$engine` (an [`Engine`]). The caller depends on
/// `tokio` with the `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! shared_store_conformance {
    ($engine:ty) => {
        $crate::shared_store_conformance!(@each $engine;
            a_token_seen_by_one_replica_is_stale_on_every_other,
            a_raise_waits_for_lower_tokens_inside_on_any_replica_and_equal_ones_share,
            a_drain_past_its_bound_is_503_and_the_mark_stays_raised,
            a_request_cut_off_inside_lets_the_next_holder_in,
            random_routing_across_three_replicas_keeps_both_invariants,
            a_handler_longer_than_the_term_keeps_its_claim_and_the_raise_waits,
            a_stalled_replica_stops_its_requests_before_its_claim_expires,
            a_lost_connection_does_not_free_the_claim,
            a_killed_replicas_claim_expires_after_about_a_term,
            a_raise_storm_cut_off_by_its_clients_leaves_the_key_usable,
            a_grant_whose_client_left_is_released_at_once,
            a_worker_blocked_for_most_of_the_term_keeps_its_claim,
            a_handler_that_never_yields_past_its_claim_does_not_answer_success,
            the_key_limit_holds_against_400_concurrent_new_keys,
        );
    };
    (@each $engine:ty; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                $crate::shared_store_suite::$scenario::<$engine>().await
            }
        )*
    };
}
