//! The layer's HTTP contract kept by several replicas together through
//! `PgSharedStore`: each replica is a real axum server with its own layer and
//! its own pool; the database is the only thing they share.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::replicas::{Probe, Replica};
use common::{Rng, TestDb};
use fencing_layer::FencingLayer;
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

async fn replicas(db: &TestDb, probe: &Probe, n: usize, drain: Duration) -> Vec<Arc<Replica>> {
    let mut all = Vec::new();
    for _ in 0..n {
        let layer = FencingLayer::new().drain_timeout(drain);
        all.push(Arc::new(Replica::start(probe, db.config(), layer, PoolLimits::default()).await));
    }
    all
}

/// A throwaway database, a probe, and `n` replicas on them draining for at most `drain`.
async fn started(n: usize, drain: Duration) -> Option<(TestDb, Probe, Vec<Arc<Replica>>)> {
    let db = TestDb::create().await?;
    let probe = Probe::default();
    let replicas = replicas(&db, &probe, n, drain).await;
    Some((db, probe, replicas))
}

/// A request with `token` on key 1, sent to `replica` and held inside its handler.
async fn held_inside(
    replica: &Arc<Replica>,
    probe: &Probe,
    token: u64,
) -> JoinHandle<(u16, serde_json::Value)> {
    probe.hold(token);
    let request = replica.spawn_post(1, token);
    probe.wait_inside(1, token, 1).await;
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_seen_by_one_replica_is_stale_on_every_other() {
    let Some((_db, probe, r)) = started(3, Duration::from_secs(5)).await else { return };
    assert_eq!(r[0].post(1, 7).await.0, 200);
    let (status, problem) = r[1].post(1, 5).await;
    assert_eq!(status, 409);
    assert_eq!(problem["type"], "urn:fencing:problem:stale-token");
    assert_eq!((problem["presented_token"].as_u64(), problem["highest_token"].as_u64()), (Some(5), Some(7)));
    assert_eq!(r[2].post(1, 7).await.0, 200, "the holder's own token is admitted everywhere");
    assert_eq!(r[2].post(2, 1).await.0, 200, "another key has its own mark");
    assert_eq!(probe.events().iter().filter(|e| e.2).count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_raise_waits_for_lower_tokens_inside_on_any_replica_and_equal_ones_share() {
    let Some((_db, probe, r)) = started(3, Duration::from_secs(10)).await else { return };
    probe.hold(7);
    let first = r[0].spawn_post(1, 7);
    let second = r[1].spawn_post(1, 7);
    probe.wait_inside(1, 7, 2).await; // equal tokens inside at once, on two replicas

    let raise = r[2].spawn_post(1, 8);
    // The mark rose at once, and every replica hears of it: 7 is refused
    // everywhere though two 7s are still inside.
    for replica in &r {
        replica.hears(1, 8).await;
    }
    assert_eq!(r[0].post(1, 7).await.0, 409);
    assert_eq!(r[1].post(1, 7).await.0, 409);
    assert!(!raise.is_finished());
    probe.release(7);
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
    assert_eq!(raise.await.unwrap().0, 200);
    let events = probe.events();
    let enter8 = events.iter().position(|e| *e == (1, 8, true)).unwrap();
    let last_exit7 = events.iter().rposition(|e| *e == (1, 7, false)).unwrap();
    assert!(last_exit7 < enter8, "8 entered while a 7 was inside: {events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_past_its_bound_is_503_and_the_mark_stays_raised() {
    let Some((_db, probe, r)) = started(2, Duration::from_millis(300)).await else { return };
    let holder = held_inside(&r[0], &probe, 3).await;
    let (status, problem) = r[1].post(1, 4).await;
    assert_eq!(status, 503);
    assert_eq!(problem["type"], "urn:fencing:problem:drain-timeout");
    assert_eq!(r[1].post(1, 3).await.0, 409, "the mark went back down");
    probe.release(3);
    assert_eq!(holder.await.unwrap().0, 200);
    assert_eq!(r[1].post(1, 4).await.0, 200, "drained now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_cut_off_inside_lets_the_next_holder_in() {
    let Some((_db, probe, r)) = started(2, Duration::from_secs(10)).await else { return };
    let gone = held_inside(&r[0], &probe, 5).await;
    // The client goes away: the server drops the request's future, and with it the permit.
    gone.abort();
    assert_eq!(r[1].post(1, 6).await.0, 200);
    assert_eq!(probe.inside(1, 5), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_inside_hold_no_connection_and_a_database_that_is_down_is_503() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::default();
    let limits = PoolLimits { max_size: 1, wait: Duration::from_millis(200), ..PoolLimits::default() };
    let one = Arc::new(Replica::start(&probe, db.config(), FencingLayer::new(), limits).await);
    probe.hold(2);
    // With a pool of one connection, 50 requests are inside at once under one claim,
    // and another key is still claimed through that connection.
    let holders: Vec<_> = (0..50).map(|_| one.spawn_post(1, 2)).collect();
    probe.wait_inside(1, 2, 50).await;
    assert_eq!(one.post(2, 1).await.0, 200);
    probe.release(2);
    for holder in holders {
        assert_eq!(holder.await.unwrap().0, 200);
    }

    // A database that is not there: a closed loopback port.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let config: tokio_postgres::Config =
        format!("host=127.0.0.1 port={closed} user=postgres").parse().unwrap();
    let store = PgSharedStore::new(
        fencing_postgres::pool(config.clone(), PoolLimits::default()).unwrap(),
        config,
        PgFence::new(),
    );
    let router = probe.router(FencingLayer::new().shared_store(store));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let down = Replica { url, server, store: None, stop: None };
    let before = probe.events().len();
    let (status, problem) = down.post(1, 9).await;
    assert_eq!(status, 503);
    assert_eq!(problem["type"], "urn:fencing:problem:store-unavailable");
    assert_eq!(probe.events().len(), before, "a request reached the handler without the database");
}

/// Three replicas, requests routed at random, raises, repeated and stale
/// tokens on three keys; the handlers' events, in one order, must show that
/// per key admitted tokens never decrease and no two tokens are ever inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_routing_across_three_replicas_keeps_both_invariants() {
    let Some(db) = TestDb::create().await else { return };
    let probe = Probe::jittery();
    let r = replicas(&db, &probe, 3, Duration::from_secs(10)).await;
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
    probe.assert_invariants();
}
