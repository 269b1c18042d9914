//! Clients that give up: a storm of raises cut off while a lower token is
//! inside, and a raise granted after its client left.

use std::time::Duration;

use fencing_layer::claims::ClaimTiming;
use tokio::time::Instant;

use super::Engine;
use super::bed::{Bed, Spec};
use crate::BOUND;
use crate::replicas::Probe;

/// How long the cut-off clients wait for an answer.
const PATIENCE: Duration = Duration::from_millis(40);

/// Thirty raises whose clients give up after 40 ms while a lower token is
/// inside: none is answered, the engine's own checks hold a term later (no
/// sessions left behind, say), and once the lower token leaves, the last
/// raise gets in within the drain bound.
pub async fn a_raise_storm_cut_off_by_its_clients_leaves_the_key_usable<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let (name, one) = bed.replica_named(bed.spec(BOUND)).await;
    let one = std::sync::Arc::new(one);
    let held = bed.held_inside(&one, 1, 1).await;
    for token in 2..32_u64 {
        let cut = one.post_within(1, token, PATIENCE).await;
        assert!(cut.is_none(), "token {token} was answered while token 1 was inside: {cut:?}");
    }
    tokio::time::sleep(E::TERM).await;
    bed.engine.after_storm(&name).await;
    bed.probe.release(1);
    assert_eq!(held.await.unwrap().0, 200);
    assert_eq!(one.post(1, 31).await.0, 200);
    assert_eq!(bed.engine.mark("/r/1").await, Some(31));
    bed.probe.assert_invariants();
}

/// A raise whose claim reaches the engine only after its client left (the
/// replica's route stalled for a while, the client gone after 40 ms) is
/// granted and released at once: no claim record stays, and the next raise
/// waits for nobody. With a 5 s term, a claim left behind would hold it for seconds.
pub async fn a_grant_whose_client_left_is_released_at_once<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let timing = ClaimTiming::for_term(Duration::from_secs(5).max(E::TERM));
    let proxy = bed.proxy().await;
    let one = bed.replica(Spec { timing, ..bed.spec(BOUND) }).await;
    let two = bed.replica(Spec { via: Some(proxy.addr), timing, ..bed.spec(BOUND) }).await;
    assert_eq!(one.post(1, 1).await.0, 200);
    // Token 1's claim is released once idle; then the raise is granted, not told to wait.
    wait_for(timing.term, "token 1's idle claim was never released", async || {
        bed.engine.claims_on("/r/1").await == 0
    })
    .await;
    proxy.stall();
    assert!(
        two.post_within(1, 2, PATIENCE).await.is_none(),
        "the raise was answered through a stalled route"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.resume();
    // The claim goes on without its client, is granted, and is released.
    let released =
        async || bed.engine.mark("/r/1").await == Some(2) && bed.engine.claims_on("/r/1").await == 0;
    wait_for(Duration::from_secs(2), "the abandoned grant's claim stayed", released).await;
    let since = Instant::now();
    assert_eq!(one.post(1, 3).await.0, 200);
    assert!(since.elapsed() < Duration::from_secs(1), "the next raise waited {:?}", since.elapsed());
    assert!(bed.probe.events().iter().all(|e| e.1 != 2), "the abandoned raise reached a handler");
}

/// Polls `done` every 10 ms until it holds, failing with `what` after `bound`.
async fn wait_for(bound: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let waited = tokio::time::timeout(bound, async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    waited.await.unwrap_or_else(|_| panic!("{what} (within {bound:?})"));
}
