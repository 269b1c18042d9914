//! Application workers that do not yield: a worker blocked for most of the
//! term, and a handler that never yields past its claim.

use std::time::Duration;

use super::Engine;
use super::bed::{Bed, Spec};
use crate::BOUND;
use crate::replicas::{Probe, Workers};

/// The replica's application workers are one thread, which a handler blocks
/// for 0.9 × the term, at five points of the renewal period. The renewals go
/// out on a thread of their own all along, so the claim never lapses, the
/// blocked request answers 200, and a raise on another replica gets in only
/// after it left.
pub async fn a_worker_blocked_for_most_of_the_term_keeps_its_claim<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let one = bed.replica(Spec { workers: Workers::OwnThread, ..bed.spec(BOUND) }).await;
    let two = bed.replica(bed.spec(BOUND)).await;
    let period = E::timing().renew_every;
    for (key, offset) in
        [(1, Duration::ZERO), (2, period / 4), (3, period / 2), (4, period * 3 / 4), (5, period * 19 / 20)]
    {
        // Token 1 holds the key's claim first; token 2 then blocks its worker.
        assert_eq!(one.post(key, 1).await.0, 200);
        tokio::time::sleep(offset).await;
        bed.probe.block(2, E::TERM * 9 / 10);
        let slow = one.spawn_post(key, 2);
        bed.probe.wait_inside(key, 2, 1).await;
        let raise = two.spawn_post(key, 3);
        assert_eq!(slow.await.unwrap().0, 200, "key {key}: the blocked request lost its claim");
        assert_eq!(raise.await.unwrap().0, 200, "key {key}");
        bed.assert_left_before(key, 2, 3);
    }
    bed.probe.assert_invariants();
}

/// A handler that never yields (its one worker blocked for 1.5 terms) while
/// its replica's route stalls: the claim is revoked on time, but nothing can
/// drop a future that is being polled, so it finishes anyway; its answer is
/// 503 claim-lost, never 200. (Its effect may have overlapped the next
/// holder's: only the resource's own check of the token covers that.)
pub async fn a_handler_that_never_yields_past_its_claim_does_not_answer_success<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let proxy = bed.proxy().await;
    let one =
        bed.replica(Spec { via: Some(proxy.addr), workers: Workers::OwnThread, ..bed.spec(BOUND) }).await;
    assert_eq!(one.post(1, 1).await.0, 200);
    bed.probe.block(1, E::TERM * 3 / 2);
    let stuck = one.spawn_post(1, 1);
    bed.probe.wait_inside(1, 1, 1).await;
    proxy.stall();
    let (status, problem) = stuck.await.unwrap();
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["type"], "urn:fencing:problem:claim-lost");
    assert_eq!(bed.probe.inside(1, 1), 0);
    proxy.resume();
}
