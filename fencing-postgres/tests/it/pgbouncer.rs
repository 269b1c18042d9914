//! fencing-postgres through PgBouncer (Debian's package, a stock configuration
//! of the test's own), in session and in transaction pooling: the shared-store
//! conformance suite in each mode, in-transaction fences racing through a
//! transaction pooler, replicas starting together, and what a replica hears.

use std::time::Duration;

use crate::common::engine::{Pg, SessionPooler, TransactionPooler};
use crate::common::replicas::ready_store;
use crate::common::{TestDb, with_port};
use fencing_layer::claims::ClaimTiming;
use fencing_postgres::{FenceError, PgFence, PoolLimits, Pooling};
use test_support::{PgBouncer, PoolMode, shared_store_conformance};

mod session_pooling {
    use super::*;
    shared_store_conformance!(Pg<SessionPooler>);
}

mod transaction_pooling {
    use super::*;
    shared_store_conformance!(Pg<TransactionPooler>);
}

fn transaction_limits() -> PoolLimits {
    PoolLimits { max_size: 8, ..PoolLimits::default() }.pooling(Pooling::Transaction)
}

/// A pool in session mode behind a transaction pooler is refused on its first
/// connection, and the refusal names the setting, the pooler and the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_pool_behind_a_transaction_pooler_is_refused_with_the_reason() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, PoolMode::Transaction).await else { return };
    let config = with_port(&db.config(), bouncer.port, "refused");
    let pool = fencing_postgres::pool(config, PoolLimits::default()).unwrap();
    let refused = FenceError::from(pool.get().await.expect_err("a session pool behind a transaction pooler"));
    let text = refused.to_string();
    for words in ["lock_timeout", "pool_mode = transaction", "Pooling::Transaction"] {
        assert!(text.contains(words), "{text}");
    }
    // And it stays refused: no connection of that pool goes on without the bound.
    assert!(pool.get().await.is_err());
}

/// Fenced transactions racing on one key through a transaction pooler, with
/// random tokens: no error but `Stale`, and the rows written are in token order
/// (a lower token never writes after a higher one). With named prepared
/// statements this failed ("prepared statement … does not exist").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_race_through_a_transaction_pooler_in_token_order() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, PoolMode::Transaction).await else { return };
    let admin = db.connect().await;
    admin
        .batch_execute("CREATE TABLE written (seq BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL)")
        .await
        .unwrap();
    let limits = transaction_limits();
    let pool = fencing_postgres::pool(with_port(&db.config(), bouncer.port, "racer"), limits).unwrap();
    let fence = PgFence::new().for_pool(&limits);
    fence.migrate(&pool.get().await.unwrap()).await.unwrap();
    let mut rng = crate::common::Rng::from_clock();
    let tasks: Vec<_> = (0..400)
        .map(|_| {
            let (pool, fence, token) = (pool.clone(), fence.clone(), 1 + rng.below(8));
            tokio::spawn(async move {
                let mut client = pool.get().await?;
                let tx = client.transaction().await?;
                fence.fence(&tx, "k", token).await?;
                tx.execute("INSERT INTO written (token) VALUES ($1)", &[&(token as i64)]).await?;
                tx.commit().await?;
                Ok::<_, FenceError>(())
            })
        })
        .collect();
    let (mut written, mut stale) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => written += 1,
            Err(FenceError::Stale { .. }) => stale += 1,
            Err(other) => panic!("a fence through the pooler failed: {other}"),
        }
    }
    let rows = admin.query("SELECT token FROM written ORDER BY seq", &[]).await.unwrap();
    let tokens: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    eprintln!("{written} written, {stale} stale");
    assert_eq!(tokens.len(), written);
    assert!(written >= 20, "too few writes to say anything of their order: {written}");
    assert!(
        tokens.windows(2).all(|pair| pair[0] <= pair[1]),
        "a lower token wrote after a higher one: {tokens:?}"
    );
}

/// Six replicas starting at once through a transaction pooler all migrate and
/// open their sessions. Their hint connections, through the pooler, hear
/// nothing, and each store says so; one whose session goes straight to
/// PostgreSQL hears its own test notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_start_together_through_a_transaction_pooler_and_know_whether_hints_arrive() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, PoolMode::Transaction).await else { return };
    let timing = ClaimTiming::for_term(Duration::from_secs(2));
    let starts = (0..6).map(|n| {
        let pool = with_port(&db.config(), bouncer.port, &format!("start{n}"));
        // The last one's session goes straight to PostgreSQL.
        let session = if n == 5 { db.config() } else { pool.clone() };
        tokio::spawn(ready_store(pool, session, transaction_limits(), timing))
    });
    let mut stores = Vec::new();
    for start in starts.collect::<Vec<_>>() {
        stores.push(start.await.expect("a replica did not start"));
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let heard: Vec<_> = stores.iter().map(|store| store.hints_arrive()).collect();
    assert_eq!(heard, [Some(false), Some(false), Some(false), Some(false), Some(false), Some(true)]);
}

/// A stock PgBouncer refuses a startup parameter it does not know: the error
/// says what the pooler said and what to do, not a bare "db error".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poolers_refusal_is_named_in_the_error() {
    let Some(db) = TestDb::create().await else { return };
    let Some(bouncer) = PgBouncer::start(5432, PoolMode::Session).await else { return };
    let mut config = with_port(&db.config(), bouncer.port, "refused");
    config.options("-c lock_timeout=1000");
    let pool = fencing_postgres::pool(config, PoolLimits::default()).unwrap();
    let text = FenceError::from(pool.get().await.expect_err("PgBouncer refuses `options`")).to_string();
    eprintln!("{text}");
    for words in ["unsupported startup parameter: options", "remove `options`"] {
        assert!(text.contains(words), "{text}");
    }
}
