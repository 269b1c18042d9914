//! The key limit under concurrency: `max_keys` holds however many requests
//! for new keys race.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fencing_layer::store::{SharedRefusal, SharedStore, StoreError};

use super::Engine;
use crate::BOUND;

/// Requests for new keys sent at once.
const RACERS: usize = 400;

/// A replica with `max_keys(2)` and 400 requests for 400 new keys at once,
/// each admitted one holding its place for 200 ms: at most 2 are admitted,
/// the others get 503 (the key table is full), and the engine never holds
/// more than 2 claim records, sampled while they race. (When the limit was
/// checked before the round trip and counted after it, 24 racers got 24
/// claims.)
pub async fn the_key_limit_holds_against_400_concurrent_new_keys<E: Engine>() {
    let Some(engine) = E::start().await else { return };
    let engine = Arc::new(engine);
    let store = engine.store(engine.addr(), "limited", E::timing()).await;
    let _limited = E::claims(&store).clone().max_keys(2);
    let (admitted, full) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let racing = Arc::new(AtomicBool::new(true));
    let racers: Vec<_> = (0..RACERS)
        .map(|n| {
            let (store, admitted, full) = (store.clone(), Arc::clone(&admitted), Arc::clone(&full));
            tokio::spawn(async move {
                match store.admit(&format!("/limit/{n}"), 1, BOUND).await {
                    Ok(permit) => {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        drop(permit);
                    }
                    Err(SharedRefusal::Unavailable(StoreError::KeyTableFull { limit: 2 })) => {
                        full.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => eprintln!("racer {n}: {other:?}"),
                }
            })
        })
        .collect();
    // Sampled in this future: the engine's calls need not be `Send`.
    let (most, ()) = tokio::join!(most_claims_while(&*engine, &racing), async {
        for racer in racers {
            racer.await.unwrap();
        }
        racing.store(false, Ordering::SeqCst);
    });
    let (admitted, full) = (admitted.load(Ordering::SeqCst), full.load(Ordering::SeqCst));
    assert!(admitted <= 2, "{admitted} of {RACERS} racing new keys were admitted past a limit of 2");
    assert!(admitted >= 1, "no racer was admitted");
    assert_eq!(admitted + full, RACERS, "every other racer is told the key table is full (others above)");
    assert!(most <= 2, "{} held {most} claim records of a replica limited to 2 keys", E::NAME);
    assert!(E::claims(&store).claims() <= 2);
}

/// The most claim records the engine held at once, sampled every few
/// milliseconds while `racing`, then once more.
async fn most_claims_while<E: Engine>(engine: &E, racing: &AtomicBool) -> usize {
    let mut most = 0;
    loop {
        let done = !racing.load(Ordering::SeqCst);
        most = most.max(engine.all_claims().await);
        if done {
            return most;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
