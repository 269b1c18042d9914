//! The fence's contract on one connection at a time: stale, equal, higher;
//! the whole u64 range; migrations and table names; errors a retry cures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{TestDb, TestDbExt, mark};
use fencing_postgres::{FenceError, Fenced, MAX_KEY_BYTES, PgFence, PoolLimits};
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, IsolationLevel};

/// Fences `key` with `token` in a transaction of its own and commits.
async fn fence_once(
    fence: &PgFence,
    client: &mut Client,
    key: &str,
    token: u64,
) -> Result<Fenced, FenceError> {
    let tx = client.transaction().await?;
    let fenced = fence.fence(&tx, key, token).await?;
    tx.commit().await?;
    Ok(fenced)
}

#[tokio::test]
async fn stale_is_refused_equal_admitted_higher_raises() {
    let Some(db) = TestDb::create().await else { return };
    let fence = db.fence().await;
    let mut client = db.connect().await;

    let first = fence_once(&fence, &mut client, "/docs/a", 5).await.unwrap();
    assert_eq!(first, Fenced { token: 5, previous: 0 });
    assert!(first.raised());
    let again = fence_once(&fence, &mut client, "/docs/a", 5).await.unwrap();
    assert_eq!(again, Fenced { token: 5, previous: 5 });
    assert!(!again.raised());
    let higher = fence_once(&fence, &mut client, "/docs/a", 7).await.unwrap();
    assert_eq!(higher, Fenced { token: 7, previous: 5 });

    let tx = client.transaction().await.unwrap();
    match fence.fence(&tx, "/docs/a", 6).await {
        Err(FenceError::Stale { key, presented, highest }) => {
            assert_eq!((key.as_str(), presented, highest), ("/docs/a", 6, 7));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    assert_eq!(mark(&client, "/docs/a").await.as_deref(), Some("7"));
    // Keys are independent: a new key starts at 0, so any token is admitted.
    assert_eq!(fence_once(&fence, &mut client, "/docs/b", 1).await.unwrap().previous, 0);
    assert_eq!(
        fence_once(&fence, &mut client, "/docs/c", 0).await.unwrap(),
        Fenced { token: 0, previous: 0 }
    );
}

#[tokio::test]
async fn tokens_keep_their_u64_order_and_value() {
    let Some(db) = TestDb::create().await else { return };
    let fence = db.fence().await;
    let mut client = db.connect().await;
    let tokens = [0, 1, (1 << 63) - 1, 1 << 63, u64::MAX];

    let mut previous = 0;
    for token in tokens {
        let fenced = fence_once(&fence, &mut client, "k", token).await.unwrap();
        assert_eq!(fenced, Fenced { token, previous });
        assert_eq!(mark(&client, "k").await, Some(token.to_string()), "stored as the token itself");
        previous = token;
    }
    for lower in &tokens[..4] {
        let error = fence_once(&fence, &mut client, "k", *lower).await.unwrap_err();
        assert!(
            matches!(error, FenceError::Stale { presented, highest: u64::MAX, .. } if presented == *lower)
        );
    }

    // One key per token, fenced in reverse: SQL orders the marks as u64 does.
    for (i, token) in tokens.iter().rev().enumerate() {
        fence_once(&fence, &mut client, &format!("order/{i}"), *token).await.unwrap();
    }
    let rows = client
        .query("SELECT mark::text AS t FROM fencing_marks WHERE key LIKE 'order/%' ORDER BY mark", &[])
        .await
        .unwrap();
    let sorted: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(sorted, tokens.map(|t| t.to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_even_when_replicas_start_at_once() {
    let Some(db) = TestDb::create().await else { return };
    let client = db.connect().await;
    let fence = PgFence::new();
    fence.migrate(&client).await.unwrap();
    fence.migrate(&client).await.unwrap();

    // Concurrent CREATE TABLE IF NOT EXISTS alone can fail on a catalog unique index.
    let racing = PgFence::new().table("raced").unwrap();
    let start = Arc::new(Barrier::new(6));
    let mut replicas = JoinSet::new();
    for _ in 0..6 {
        let (client, racing, start) = (db.connect().await, racing.clone(), Arc::clone(&start));
        replicas.spawn(async move {
            start.wait().await;
            racing.migrate(&client).await
        });
    }
    while let Some(migrated) = replicas.join_next().await {
        migrated.unwrap().unwrap();
    }
}

#[tokio::test]
async fn custom_and_schema_qualified_tables_hold_their_own_marks() {
    let Some(db) = TestDb::create().await else { return };
    let mut client = db.connect().await;
    client.batch_execute("CREATE SCHEMA ops").await.unwrap();
    let default = db.fence().await;
    let custom = PgFence::new().table("Custom_Marks").unwrap();
    let qualified = PgFence::new().table("ops.marks").unwrap();
    assert_eq!(qualified.table_name(), "ops.marks");
    for fence in [&custom, &qualified] {
        fence.migrate(&client).await.unwrap();
    }

    fence_once(&default, &mut client, "k", 9).await.unwrap();
    fence_once(&custom, &mut client, "k", 3).await.unwrap();
    fence_once(&qualified, &mut client, "k", 5).await.unwrap();
    for (table, expected) in [(r#""Custom_Marks""#, "3"), ("ops.marks", "5"), ("public.fencing_marks", "9")] {
        let row =
            client.query_one(&format!("SELECT mark::text FROM {table} WHERE key = 'k'"), &[]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), expected, "{table}");
    }
    let error = fence_once(&qualified, &mut client, "k", 4).await.unwrap_err();
    assert!(matches!(error, FenceError::Stale { highest: 5, .. }), "{error:?}");
}

#[test]
fn invalid_table_names_are_refused_before_any_sql() {
    for bad in
        ["", "a.b.c", "1marks", "marks;drop table users", "my-marks", "ma rks", "\"marks\"", "märks", "a."]
    {
        let error = PgFence::new().table(bad).unwrap_err();
        assert!(error.to_string().starts_with("invalid fencing mark table name"), "{bad:?}: {error}");
    }
    assert!(PgFence::new().table(&"m".repeat(64)).is_err(), "PostgreSQL would truncate it");
    assert_eq!(PgFence::new().table_name(), "fencing_marks");
}

#[tokio::test]
async fn keys_the_table_cannot_hold_are_refused() {
    let Some(db) = TestDb::create().await else { return };
    let fence = db.fence().await;
    let mut client = db.connect().await;
    let long = "k".repeat(MAX_KEY_BYTES + 1);
    let error = fence_once(&fence, &mut client, &long, 1).await.unwrap_err();
    assert!(matches!(error, FenceError::KeyTooLong { limit: MAX_KEY_BYTES }), "{error:?}");
    let error = fence_once(&fence, &mut client, "a\0b", 1).await.unwrap_err();
    assert!(matches!(error, FenceError::KeyHasNul), "{error:?}");
    fence_once(&fence, &mut client, &"k".repeat(MAX_KEY_BYTES), 1).await.unwrap();
}

#[tokio::test]
async fn lock_timeout_bounds_the_wait_and_asks_for_a_retry() {
    let Some(db) = TestDb::create().await else { return };
    let fence = db.fence().await;
    let limits = PoolLimits { lock_timeout: Duration::from_millis(200), ..PoolLimits::default() };
    let pool = db.pool(limits);
    let mut holder = pool.get().await.unwrap();
    let held = holder.transaction().await.unwrap();
    fence.fence(&held, "k", 3).await.unwrap();

    let mut waiter = pool.get().await.unwrap();
    let tx = waiter.transaction().await.unwrap();
    let started = Instant::now();
    let error = fence.fence(&tx, "k", 4).await.unwrap_err();
    assert!(matches!(error, FenceError::Retry(_)) && error.is_retryable(), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[tokio::test]
async fn repeatable_read_sees_a_concurrent_raise_as_a_retry() {
    let Some(db) = TestDb::create().await else { return };
    let fence = db.fence().await;
    let mut other = db.connect().await;
    fence_once(&fence, &mut other, "k", 1).await.unwrap();

    let mut client = db.connect().await;
    let tx =
        client.build_transaction().isolation_level(IsolationLevel::RepeatableRead).start().await.unwrap();
    tx.batch_execute("SELECT 1").await.unwrap(); // takes the snapshot
    fence_once(&fence, &mut other, "k", 2).await.unwrap();
    let error = fence.fence(&tx, "k", 3).await.unwrap_err();
    assert!(
        matches!(&error, FenceError::Retry(e) if e.code().map(|c| c.code()) == Some("40001")),
        "{error:?}"
    );
    drop(tx);
    // The retry, in a new transaction, goes through.
    assert_eq!(fence_once(&fence, &mut client, "k", 3).await.unwrap().previous, 2);
}

/// The row's version (`xmin`, the transaction that wrote it) and its mark.
async fn row_version(client: &Client, key: &str) -> (String, String) {
    let row = client
        .query_one("SELECT xmin::text, mark::text FROM fencing_marks WHERE key = $1", &[&key])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// A database with the mark table, a client that fences, and one that watches.
async fn with_observer() -> Option<(TestDb, PgFence, Client, Client)> {
    let db = TestDb::create().await?;
    let fence = db.fence().await;
    let (client, observer) = (db.connect().await, db.connect().await);
    Some((db, fence, client, observer))
}

#[tokio::test]
async fn an_equal_token_locks_the_row_without_rewriting_it() {
    let Some((_db, fence, mut client, observer)) = with_observer().await else { return };

    fence_once(&fence, &mut client, "/docs/a", 5).await.unwrap();
    let written = row_version(&observer, "/docs/a").await;
    // An equal token: admitted, the row locked until the end, but not rewritten.
    let tx = client.transaction().await.unwrap();
    assert_eq!(fence.fence(&tx, "/docs/a", 5).await.unwrap(), Fenced { token: 5, previous: 5 });
    let free = observer
        .query("SELECT 1 FROM fencing_marks WHERE key = '/docs/a' FOR UPDATE SKIP LOCKED", &[])
        .await
        .unwrap();
    assert!(free.is_empty(), "the fence must hold the row's lock until the transaction ends");
    tx.commit().await.unwrap();
    assert_eq!(row_version(&observer, "/docs/a").await, written, "an equal token rewrote the row");
    // A stale one neither.
    let tx = client.transaction().await.unwrap();
    assert!(matches!(fence.fence(&tx, "/docs/a", 4).await, Err(FenceError::Stale { .. })));
    tx.commit().await.unwrap();
    assert_eq!(row_version(&observer, "/docs/a").await, written);
    // A higher one raises: a new row version.
    fence_once(&fence, &mut client, "/docs/a", 6).await.unwrap();
    let raised = row_version(&observer, "/docs/a").await;
    assert_ne!(raised.0, written.0);
    assert_eq!(raised.1, "6");
}

/// The statements prepared on a connection (but this one), and how often each ran.
const PREPARED: &str = "SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements
    WHERE statement NOT LIKE '%pg_prepared_statements%' ORDER BY statement";

/// The token a `PgFence` remembers per key only picks the statement; the row's
/// mark decides, even when it changed behind the process's back.
#[tokio::test]
async fn a_remembered_token_is_a_hint_and_the_row_decides() {
    let Some((db, fence, mut client, observer)) = with_observer().await else { return };
    let key = "/docs/hint";
    fence_once(&fence, &mut client, key, 5).await.unwrap();
    // A raise to 7 rolled back: 7 is remembered, the row still says 5.
    let tx = client.transaction().await.unwrap();
    assert_eq!(fence.fence(&tx, key, 7).await.unwrap(), Fenced { token: 7, previous: 5 });
    tx.rollback().await.unwrap();
    assert_eq!(mark(&observer, key).await.as_deref(), Some("5"));
    assert_eq!(fence_once(&fence, &mut client, key, 7).await.unwrap(), Fenced { token: 7, previous: 5 });
    assert_eq!(mark(&observer, key).await.as_deref(), Some("7"));
    // An operator deleted the row: 7 creates it again.
    observer.execute("DELETE FROM fencing_marks WHERE key = $1", &[&key]).await.unwrap();
    assert_eq!(fence_once(&fence, &mut client, key, 7).await.unwrap(), Fenced { token: 7, previous: 0 });
    assert_eq!(mark(&observer, key).await.as_deref(), Some("7"));
    // An operator raised it: the remembered 7 is stale.
    observer.execute("UPDATE fencing_marks SET mark = 9 WHERE key = $1", &[&key]).await.unwrap();
    let stale = fence_once(&fence, &mut client, key, 7).await;
    assert!(matches!(stale, Err(FenceError::Stale { presented: 7, highest: 9, .. })), "{stale:?}");
    // Another process (another PgFence) raised it: the same.
    fence_once(&db.fence().await, &mut client, key, 10).await.unwrap();
    let stale = fence_once(&fence, &mut client, key, 9).await;
    assert!(matches!(stale, Err(FenceError::Stale { presented: 9, highest: 10, .. })), "{stale:?}");
}

#[tokio::test]
async fn a_pooled_transaction_prepares_the_statements_once_per_connection() {
    let Some(db) = TestDb::create().await else { return };
    let fence = db.fence().await;
    let pool = db.pool(PoolLimits { max_size: 1, ..PoolLimits::default() });
    for token in [3, 3, 4, 4] {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        assert_eq!(fence.fence(&tx, "/docs/p", token).await.unwrap().token, token);
        tx.commit().await.unwrap();
    }
    let client = pool.get().await.unwrap();
    // Each statement prepared once, and how often the prepared one ran: the
    // plain lock for the repeated tokens, the full statement for the first use
    // and the raise; the first use of each went out unprepared beside its
    // preparation (so that it was sent at once), the second used it.
    let prepared: Vec<(String, i64)> = client
        .query(PREPARED, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get(1)))
        .collect();
    assert_eq!(prepared.len(), 2, "the fence's two statements on the pool's one connection: {prepared:?}");
    assert!(prepared[0].0.starts_with("SELECT") && prepared[0].1 == 1, "{prepared:?}");
    assert!(prepared[1].0.starts_with("WITH cur AS") && prepared[1].1 == 1, "{prepared:?}");
    // A stale token through the cached statement is refused as before.
    let mut client = client;
    let tx = client.transaction().await.unwrap();
    assert!(matches!(fence.fence(&tx, "/docs/p", 2).await, Err(FenceError::Stale { highest: 4, .. })));
}

/// A write sent beside the fence (`try_join!(biased; fence, write)`) runs after
/// it even on a connection whose statement cache is empty: the fence does not
/// wait for its preparation. The write asks whether this transaction has
/// already created, raised or locked the key's mark row; only the fence can have.
#[tokio::test]
async fn on_a_fresh_connection_the_fence_goes_out_before_a_write_beside_it() {
    let Some(db) = TestDb::create().await else { return };
    let fence = db.fence().await;
    let touched_by_me = "SELECT xmin::text = me OR xmax::text = me FROM fencing_marks,
        (SELECT (pg_current_xact_id()::text::bigint % 4294967296)::text AS me) AS this WHERE key = $1";
    // The first use (the full statement), the same token again (the plain lock),
    // a raise (the full statement): each on a new pool, so a new connection.
    for (token, previous) in [(3, 0), (3, 3), (4, 3)] {
        let pool = db.pool(PoolLimits { max_size: 1, ..PoolLimits::default() });
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        // Typed parameters: the write goes out at once too, with no round trip to prepare it.
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&"/docs/fresh", Type::TEXT)];
        let write = async { tx.query_typed(touched_by_me, &params).await.map_err(FenceError::from) };
        let (fenced, rows) = tokio::try_join!(biased; fence.fence(&tx, "/docs/fresh", token), write).unwrap();
        assert_eq!(fenced, Fenced { token, previous });
        let seen: Vec<bool> = rows.iter().map(|row| row.get(0)).collect();
        assert_eq!(seen, [true], "token {token} after {previous}: the write ran before the fence");
        tx.commit().await.unwrap();
    }
}
