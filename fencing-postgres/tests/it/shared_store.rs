//! What `PgSharedStore` adds to the shared-store contract (which
//! `conformance.rs` runs: test-support's suite): requests inside hold no pooled
//! connection, and a database that is not there is a 503 before any handler.

use std::sync::Arc;
use std::time::Duration;

use crate::common::TestDb;
use crate::common::replicas::{PgReplica, Probe, Replica, Workers};
use fencing_layer::FencingLayer;
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};
use tokio::net::TcpListener;

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
    let down = Replica::with_layer(&probe, FencingLayer::new().shared_store(store), Workers::Shared).await;
    let before = probe.events().len();
    let (status, problem) = down.post(1, 9).await;
    assert_eq!(status, 503);
    assert_eq!(problem["type"], "urn:fencing:problem:store-unavailable");
    assert_eq!(probe.events().len(), before, "a request reached the handler without the database");
}
