//! Exclusion that never rests on a session or a connection staying alive: a
//! handler longer than the term, a stalled route, a lost connection, a killed
//! replica.

use std::time::Duration;

use tokio::time::Instant;

use super::Engine;
use super::bed::{Bed, Spec};
use crate::BOUND;
use crate::replicas::{Probe, Workers};

/// A handler inside for three terms: its claim is renewed all along, so the
/// raise on another replica waits, and the handler is not stopped.
pub async fn a_handler_longer_than_the_term_keeps_its_claim_and_the_raise_waits<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let r = bed.replicas(2, BOUND).await;
    let slow = bed.held_inside(&r[0], 1, 1).await;
    let raise = r[1].spawn_post(1, 2);
    tokio::time::sleep(E::TERM * 3).await;
    assert!(!raise.is_finished(), "token 2 got an answer while token 1 was inside");
    bed.probe.release(1);
    assert_eq!(slow.await.unwrap().0, 200, "the long handler was stopped though its claim was renewed");
    assert_eq!(raise.await.unwrap().0, 200);
    bed.assert_left_before(1, 1, 2);
    bed.probe.assert_invariants();
}

/// One replica's route to the engine stalls (no reset: its driver sees
/// nothing). Its renewals stop arriving; before its claim can expire, it stops
/// its own request (503 claim-lost); the raise on the other replica gets in
/// only after that.
pub async fn a_stalled_replica_stops_its_requests_before_its_claim_expires<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let proxy = bed.proxy().await;
    let one = bed.replica(Spec { via: Some(proxy.addr), ..bed.spec(BOUND) }).await;
    let two = bed.replica(bed.spec(BOUND)).await;
    let stalled = bed.held_inside(&one, 1, 1).await;
    let since = Instant::now();
    proxy.stall();
    let raise = two.spawn_post(1, 2);
    let (status, problem) = stalled.await.unwrap();
    let stopped_after = since.elapsed();
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["type"], "urn:fencing:problem:claim-lost");
    assert!(stopped_after < E::TERM, "stopped only after {stopped_after:?}, past the term {:?}", E::TERM);
    assert_eq!(raise.await.unwrap().0, 200);
    bed.assert_left_before(1, 1, 2);
    bed.probe.assert_invariants();
    proxy.resume();
}

/// Every connection of one replica to the engine is closed while its request
/// is inside, and new ones are refused for half a renewal period: it connects
/// again and renews, and the raise on the other replica waits for the request
/// to leave, which it does with 200.
pub async fn a_lost_connection_does_not_free_the_claim<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let proxy = bed.proxy().await;
    let one = bed.replica(Spec { via: Some(proxy.addr), ..bed.spec(BOUND) }).await;
    let two = bed.replica(bed.spec(BOUND)).await;
    let held = bed.held_inside(&one, 1, 1).await;
    proxy.sever();
    let raise = two.spawn_post(1, 2);
    tokio::time::sleep(E::timing().renew_every / 2).await;
    proxy.restore();
    tokio::time::sleep(E::TERM * 2).await;
    assert!(!raise.is_finished(), "token 2 got an answer while token 1 was inside");
    assert_eq!(bed.probe.inside(1, 1), 1, "the request lost its claim with its connection");
    bed.probe.release(1);
    assert_eq!(held.await.unwrap().0, 200);
    assert_eq!(raise.await.unwrap().0, 200);
    bed.assert_left_before(1, 1, 2);
    bed.probe.assert_invariants();
}

/// Replica one holds a request inside and dies at once: its route severed for
/// good, its runtime and every task on it gone, its store dropped without
/// releasing anything. Its claim stays until it expires in the engine: the
/// raise on replica two gets in after about a term from the last renewal, not
/// before (which would mean the claim was freed by the death), and not much
/// later (which would mean a dead replica holds keys).
pub async fn a_killed_replicas_claim_expires_after_about_a_term<E: Engine>() {
    let Some(bed) = Bed::<E>::start(Probe::default()).await else { return };
    let proxy = bed.proxy().await;
    let spec = Spec { via: Some(proxy.addr), workers: Workers::OwnThread, ..bed.spec(BOUND) };
    let mut one = bed.replica_named(spec).await.1;
    let two = bed.replica(bed.spec(BOUND)).await;
    bed.probe.hold(1);
    // Posted from the test's runtime: the client outlives the replica.
    let client = tokio::spawn({
        let url = one.url.clone();
        async move { reqwest::Client::new().post(format!("{url}/r/1")).header("fencing-token", 1).send().await }
    });
    bed.probe.wait_inside(1, 1, 1).await;
    let killed = Instant::now();
    proxy.sever();
    one.kill();
    let (status, problem) = two.post(1, 2).await;
    let waited = killed.elapsed();
    assert_eq!(status, 200, "{problem}");
    let timing = E::timing();
    let earliest = E::TERM.saturating_sub(timing.renew_every * 2);
    assert!(
        waited >= earliest,
        "the raise got in {waited:?} after the kill: the dead replica's claim was freed"
    );
    let latest = E::TERM + E::EXPIRY_SLACK + Duration::from_secs(1);
    assert!(waited <= latest, "the raise waited {waited:?} for a dead replica's claim of term {:?}", E::TERM);
    assert!(client.await.unwrap().is_err(), "the killed replica answered");
    bed.probe.assert_invariants();
}
