//! Data and mark commit together or not at all, and nothing stays locked when
//! a transaction's connection goes away.

use std::time::{Duration, Instant};

use crate::common::{BOUND, TestDb, TestDbExt, lock_waiters, mark};
use fencing_postgres::{FenceError, PgFence, PoolLimits};
use tokio::time::timeout;
use tokio_postgres::Client;

async fn setup() -> Option<(TestDb, PgFence, Client)> {
    let db = TestDb::create().await?;
    let fence = db.fence().await;
    let client = db.connect().await;
    client
        .batch_execute("CREATE TABLE writes (seq BIGSERIAL PRIMARY KEY, key TEXT, token NUMERIC(20,0))")
        .await
        .unwrap();
    Some((db, fence, client))
}

/// Tokens of the rows written for `key`, in write order.
async fn written(client: &Client, key: &str) -> Vec<String> {
    let rows =
        client.query("SELECT token::text FROM writes WHERE key = $1 ORDER BY seq", &[&key]).await.unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

const INSERT: &str = "INSERT INTO writes (key, token) VALUES ($1, $2::text::numeric)";

#[tokio::test]
async fn the_write_and_the_raise_commit_together() {
    let Some((db, fence, mut client)) = setup().await else { return };
    let tx = client.transaction().await.unwrap();
    fence.fence(&tx, "k", 4).await.unwrap();
    tx.execute(INSERT, &[&"k", &"4"]).await.unwrap();

    // Before the commit, another connection sees neither.
    let observer = db.connect().await;
    assert_eq!(mark(&observer, "k").await, None);
    assert!(written(&observer, "k").await.is_empty());
    tx.commit().await.unwrap();
    assert_eq!(mark(&observer, "k").await.as_deref(), Some("4"));
    assert_eq!(written(&observer, "k").await, ["4"]);
}

#[tokio::test]
async fn a_rollback_leaves_the_mark_as_it_was() {
    let Some((_db, fence, mut client)) = setup().await else { return };
    let tx = client.transaction().await.unwrap();
    fence.fence(&tx, "k", 5).await.unwrap();
    tx.commit().await.unwrap();

    let tx = client.transaction().await.unwrap();
    assert!(fence.fence(&tx, "k", 9).await.unwrap().raised());
    tx.execute(INSERT, &[&"k", &"9"]).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(mark(&client, "k").await.as_deref(), Some("5"));
    assert!(written(&client, "k").await.is_empty());

    // A write that fails after the fence aborts the raise with it.
    let tx = client.transaction().await.unwrap();
    fence.fence(&tx, "k", 8).await.unwrap();
    let failed =
        tx.execute("INSERT INTO writes (seq, key) VALUES (1, 'k'), (1, 'k')", &[]).await.unwrap_err();
    assert!(matches!(FenceError::from(failed), FenceError::Database(_)));
    drop(tx);
    assert_eq!(mark(&client, "k").await.as_deref(), Some("5"));

    // Nothing of the undone raises remains: token 6 is not stale.
    let tx = client.transaction().await.unwrap();
    assert_eq!(fence.fence(&tx, "k", 6).await.unwrap().previous, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_mid_transaction_rolls_back_and_unlocks() {
    let Some((db, fence, observer)) = setup().await else { return };
    let (mut doomed, connection) = db.config().connect(tokio_postgres::NoTls).await.unwrap();
    let connection = tokio::spawn(connection);
    let tx = doomed.transaction().await.unwrap();
    fence.fence(&tx, "k", 9).await.unwrap();
    tx.execute(INSERT, &[&"k", &"9"]).await.unwrap();

    // Another replica's lower token waits on the row the doomed transaction holds.
    let pool = db.pool(PoolLimits::default());
    let waiter = tokio::spawn(async move {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let fenced = fence.fence(&tx, "k", 8).await;
        tx.commit().await.unwrap();
        fenced
    });
    lock_waiters(&observer, 1).await;
    assert!(!waiter.is_finished(), "the row must be locked while the transaction lives");

    // The process holding it dies: its socket closes with no ROLLBACK sent.
    let died = Instant::now();
    connection.abort();
    let _ = connection.await;
    drop(tx); // sends nothing: the connection is gone
    drop(doomed);

    let fenced = timeout(Duration::from_secs(5), waiter).await.expect("the lock must be released").unwrap();
    assert_eq!(fenced.unwrap().previous, 0, "the raise to 9 was never committed");
    assert!(died.elapsed() < Duration::from_secs(5));
    assert!(written(&observer, "k").await.is_empty(), "nothing half-applied");
    assert_eq!(mark(&observer, "k").await.as_deref(), Some("8"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_is_cut_off_and_the_key_freed() {
    let Some((db, fence, observer)) = setup().await else { return };
    let limits = PoolLimits { idle_in_transaction: Duration::from_millis(300), ..PoolLimits::default() };
    let pool = db.pool(limits);
    let mut paused = pool.get().await.unwrap();
    let tx = paused.transaction().await.unwrap();
    fence.fence(&tx, "k", 3).await.unwrap();

    // Like a GC pause or SIGSTOP: the transaction sits idle, holding the row.
    let mut newer = pool.get().await.unwrap();
    let started = Instant::now();
    let newer_tx = newer.transaction().await.unwrap();
    timeout(BOUND, fence.fence(&newer_tx, "k", 4)).await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    newer_tx.execute(INSERT, &[&"k", &"4"]).await.unwrap();
    newer_tx.commit().await.unwrap();

    // The paused holder wakes up and writes: its session is gone.
    let late = tx.execute(INSERT, &[&"k", &"3"]).await.map_err(FenceError::from).unwrap_err();
    assert!(late.is_retryable(), "{late:?}");
    assert_eq!(written(&observer, "k").await, ["4"]);
}
