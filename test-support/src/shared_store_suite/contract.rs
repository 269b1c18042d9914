//! The layer's HTTP contract kept by replicas that share only the engine.

use std::time::Duration;

use super::Engine;
use super::bed::Bed;
use crate::BOUND;
use crate::replicas::{Probe, Rng};

/// A token admitted on one replica is 409 on another, with the problem's
/// fields; the holder's own token is admitted everywhere, and another key has
/// its own mark.
pub async fn a_token_seen_by_one_replica_is_stale_on_every_other<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let r = bed.replicas(3, BOUND).await;
    assert_eq!(r[0].post(1, 7).await.0, 200);
    let (status, problem) = r[1].post(1, 5).await;
    assert_eq!(status, 409, "{}: {problem}", E::NAME);
    assert_eq!(problem["type"], "urn:fencing:problem:stale-token");
    assert_eq!((problem["presented_token"].as_u64(), problem["highest_token"].as_u64()), (Some(5), Some(7)));
    assert_eq!(r[2].post(1, 7).await.0, 200, "the holder's own token is admitted everywhere");
    assert_eq!(r[2].post(2, 1).await.0, 200, "another key has its own mark");
    assert_eq!(bed.probe.events().iter().filter(|e| e.2).count(), 3);
    assert_eq!(bed.engine.mark("/r/1").await, Some(7));
}

/// Two requests with one token inside at once on two replicas; a raise on a
/// third raises the mark at once (every replica refuses the old token) but
/// enters only once both have left.
pub async fn a_raise_waits_for_lower_tokens_inside_on_any_replica_and_equal_ones_share<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let r = bed.replicas(3, BOUND).await;
    bed.probe.hold(7);
    let first = r[0].spawn_post(1, 7);
    let second = r[1].spawn_post(1, 7);
    bed.probe.wait_inside(1, 7, 2).await; // equal tokens inside at once, on two replicas
    let raise = r[2].spawn_post(1, 8);
    for replica in &r {
        replica.hears(1, 8).await;
    }
    assert_eq!(r[0].post(1, 7).await.0, 409);
    assert_eq!(r[1].post(1, 7).await.0, 409);
    assert!(!raise.is_finished(), "8 was answered while two 7s were inside");
    bed.probe.release(7);
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
    assert_eq!(raise.await.unwrap().0, 200);
    bed.assert_left_before(1, 7, 8);
}

/// A raise that cannot drain within its bound is 503 drain-timeout; the mark
/// stays raised (the old token is 409), and once drained the raise gets in.
pub async fn a_drain_past_its_bound_is_503_and_the_mark_stays_raised<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let r = bed.replicas(2, Duration::from_millis(300)).await;
    let holder = bed.held_inside(&r[0], 1, 3).await;
    let (status, problem) = r[1].post(1, 4).await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["type"], "urn:fencing:problem:drain-timeout");
    assert_eq!(r[1].post(1, 3).await.0, 409, "the mark went back down");
    bed.probe.release(3);
    assert_eq!(holder.await.unwrap().0, 200);
    assert_eq!(r[1].post(1, 4).await.0, 200, "drained now");
}

/// The client of a request inside goes away: the server drops its future, and
/// with it its place; the next holder gets in on another replica.
pub async fn a_request_cut_off_inside_lets_the_next_holder_in<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let r = bed.replicas(2, BOUND).await;
    let gone = bed.held_inside(&r[0], 1, 5).await;
    gone.abort();
    assert_eq!(r[1].post(1, 6).await.0, 200);
    assert_eq!(bed.probe.inside(1, 5), 0);
    bed.assert_left_before(1, 5, 6);
}

/// Three replicas, requests routed at random, raises, repeated and stale
/// tokens on three keys: per key admitted tokens never decrease and no two
/// tokens are ever inside at once, in the probe's one order.
pub async fn random_routing_across_three_replicas_keeps_both_invariants<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::jittery()).await else { return };
    let r = bed.replicas(3, BOUND).await;
    let mut rng = Rng::from_clock();
    let mut tasks = Vec::new();
    for worker in 0..16_u64 {
        let (r, mut rng) = (r.clone(), rng.fork());
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for round in 0..30_u64 {
                let key = rng.below(3);
                let token = round / 5 + rng.below(3) + worker % 2;
                statuses.push(r[rng.below(3) as usize].post(key, token).await.0);
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    assert!(statuses.iter().all(|s| [200, 409].contains(s)), "{statuses:?}");
    assert!(statuses.iter().filter(|s| **s == 200).count() > 12, "{statuses:?}");
    bed.probe.assert_invariants();
}
