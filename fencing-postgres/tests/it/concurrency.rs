//! Invariants 1 and 2 across replicas: several pools on one database, racing
//! writes to one key inside fenced transactions.

use std::time::Duration;

use crate::common::{BOUND, Rng, TestDb, TestDbExt, lock_waiters};
use deadpool_postgres::Pool;
use fencing_postgres::{FenceError, Fenced, PgFence, PoolLimits};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tokio_postgres::Client;

const KEY: &str = "/logs/shared";
/// `seq` is drawn when the row is written, after the fence: seq order is admission order.
const WRITES: &str =
    "CREATE TABLE writes (seq BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, token NUMERIC(20,0) NOT NULL)";
const INSERT: &str = "INSERT INTO writes (key, token) VALUES ($1, $2::text::numeric)";

async fn setup() -> Option<(TestDb, PgFence, Client)> {
    let db = TestDb::create().await?;
    let fence = db.fence().await;
    let observer = db.connect().await;
    observer.batch_execute(WRITES).await.unwrap();
    Some((db, fence, observer))
}

async fn written(client: &Client) -> Vec<u64> {
    let rows = client.query("SELECT token::text FROM writes ORDER BY seq", &[]).await.unwrap();
    rows.iter().map(|row| row.get::<_, String>(0).parse().unwrap()).collect()
}

/// How a racing writer holds its fenced transaction open before writing.
#[derive(Debug, Clone, Copy)]
enum Hold {
    None,
    /// In the process (a pause), for so many milliseconds.
    InProcess(u64),
    /// In the database (a slow statement).
    InDatabase(u64),
}

/// One fenced write arriving after `arrival_ms`: `Ok(Some(token))` committed,
/// `Ok(None)` refused as stale.
async fn write(
    pool: Pool,
    fence: PgFence,
    token: u64,
    arrival_ms: u64,
    hold: Hold,
) -> Result<Option<u64>, FenceError> {
    tokio::time::sleep(Duration::from_millis(arrival_ms)).await;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    match fence.fence(&tx, KEY, token).await {
        Ok(_) => {}
        Err(FenceError::Stale { presented, highest, .. }) => {
            assert!(highest > presented && presented == token);
            return Ok(None);
        }
        Err(error) => return Err(error),
    }
    match hold {
        Hold::None => {}
        Hold::InProcess(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        Hold::InDatabase(ms) => {
            tx.execute("SELECT pg_sleep($1::float8 / 1000)", &[&(ms as f64)]).await?;
        }
    }
    tx.execute(INSERT, &[&KEY, &token.to_string()]).await?;
    tx.commit().await?;
    Ok(Some(token))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replicas_commit_tokens_in_order() {
    let Some((db, fence, observer)) = setup().await else { return };
    // Three replicas, three connections each.
    let replicas: Vec<Pool> =
        (0..3).map(|_| db.pool(PoolLimits { max_size: 3, ..PoolLimits::default() })).collect();
    let mut rng = Rng::from_clock();
    let mut writers = JoinSet::new();
    let mut highest_drawn = 0;
    for i in 0..80 {
        // Holders come and go: tokens trend upward as writers arrive, and
        // overlap enough that late, lower ones race the newer ones.
        let token = 1 + i / 4 + rng.below(8);
        highest_drawn = highest_drawn.max(token);
        let arrival = i * 2 + rng.below(10);
        let ms = rng.below(15);
        let hold = [Hold::None, Hold::InProcess(ms), Hold::InDatabase(ms)][rng.below(3) as usize];
        writers.spawn(write(replicas[i as usize % 3].clone(), fence.clone(), token, arrival, hold));
    }

    let mut committed = 0;
    let mut stale = 0;
    let collected = timeout(BOUND, async {
        while let Some(outcome) = writers.join_next().await {
            match outcome.unwrap() {
                Ok(Some(_)) => committed += 1,
                Ok(None) => stale += 1,
                Err(error) => panic!("a writer failed: {error:?}"),
            }
        }
    });
    collected.await.expect("the writers must finish");
    eprintln!("{committed} committed, {stale} refused as stale");

    let tokens = written(&observer).await;
    assert_eq!(tokens.len(), committed);
    assert!(tokens.windows(2).all(|pair| pair[0] <= pair[1]), "tokens went down in commit order: {tokens:?}");
    assert_eq!(tokens.last(), Some(&highest_drawn), "the highest token is never stale");
    assert_eq!(crate::common::mark(&observer, KEY).await, Some(highest_drawn.to_string()));
}

/// Invariant 2's wait, on both of the fence's statements: the lower holder's
/// first fence (the statement that creates or raises the row) and a later one
/// with the same token (the plain lock of a remembered token, every write of a
/// holder but its first). `FENCING_MUTANT=unlocked-fence` leaves the plain
/// lock out, and fails the second (`fencing-postgres/fence-mutants.sh`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_token_waits_until_the_lower_one_committed() {
    let Some((db, fence, observer)) = setup().await else { return };
    let pool = db.pool(PoolLimits::default());
    for repeated in [false, true] {
        let key = format!("{KEY}/repeated-{repeated}");
        if repeated {
            // The holder's earlier write: its token is now the mark, and remembered.
            let mut client = pool.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            fence.fence(&tx, &key, 5).await.unwrap();
            tx.commit().await.unwrap();
        }
        let mut lower = pool.get().await.unwrap();
        let lower_tx = lower.transaction().await.unwrap();
        let previous = if repeated { 5 } else { 0 };
        assert_eq!(fence.fence(&lower_tx, &key, 5).await.unwrap(), Fenced { token: 5, previous });

        let (higher_pool, higher_fence, higher_key) = (pool.clone(), fence.clone(), key.clone());
        let higher = tokio::spawn(async move {
            let mut client = higher_pool.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            let fenced = higher_fence.fence(&tx, &higher_key, 7).await.unwrap();
            // What the newer holder sees the moment its fence returns.
            let seen = tx
                .query_one("SELECT count(*) FROM writes WHERE key = $1 AND token = 5", &[&higher_key])
                .await
                .unwrap()
                .get::<_, i64>(0);
            tx.execute(INSERT, &[&higher_key, &"7"]).await.unwrap();
            tx.commit().await.unwrap();
            (fenced, seen)
        });
        // Blocked on the lower holder's lock; without it, the raise commits here.
        let blocked = timeout(BOUND, async {
            while !higher.is_finished() && !crate::common::blocked_on_lock(&observer).await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        blocked.await.expect("the higher token neither waited nor finished");
        // The stalled lower-token holder writes only now, while the higher one waits.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !higher.is_finished(),
            "the higher token's fence returned while the lower one was inside ({key})"
        );
        lower_tx.execute(INSERT, &[&key, &"5"]).await.unwrap();
        lower_tx.commit().await.unwrap();

        let (fenced, seen) = timeout(BOUND, higher).await.unwrap().unwrap();
        assert_eq!(fenced, Fenced { token: 7, previous: 5 });
        assert_eq!(seen, 1, "the lower holder's write had committed before the higher fence returned");
        let tokens = observer
            .query("SELECT token::text FROM writes WHERE key = $1 ORDER BY seq", &[&key])
            .await
            .unwrap();
        let tokens: Vec<String> = tokens.iter().map(|row| row.get(0)).collect();
        assert_eq!(tokens, ["5", "7"], "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_token_waiting_behind_a_higher_one_learns_its_outcome() {
    let Some((db, fence, observer)) = setup().await else { return };
    let pool = db.pool(PoolLimits::default());
    for commit in [true, false] {
        let key = format!("{KEY}/{commit}");
        let mut setup = pool.get().await.unwrap();
        let tx = setup.transaction().await.unwrap();
        fence.fence(&tx, &key, 2).await.unwrap();
        tx.commit().await.unwrap();

        let mut higher = pool.get().await.unwrap();
        let higher_tx = higher.transaction().await.unwrap();
        fence.fence(&higher_tx, &key, 9).await.unwrap();
        let (lower_pool, lower_fence, lower_key) = (pool.clone(), fence.clone(), key.clone());
        let lower = tokio::spawn(async move {
            let mut client = lower_pool.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            lower_fence.fence(&tx, &lower_key, 4).await
        });
        lock_waiters(&observer, 1).await;
        if commit {
            higher_tx.commit().await.unwrap();
        } else {
            higher_tx.rollback().await.unwrap();
        }

        let outcome = timeout(BOUND, lower).await.unwrap().unwrap();
        if commit {
            assert!(
                matches!(outcome, Err(FenceError::Stale { presented: 4, highest: 9, .. })),
                "{outcome:?}"
            );
        } else {
            // The raise to 9 never happened: 4 is the newest token the database knows.
            assert_eq!(outcome.unwrap(), Fenced { token: 4, previous: 2 });
        }
    }
}

/// A key's first use, with the write sent behind the fence (`try_join!`, as
/// `demo-resource` does): the fence creates the row before the write runs, so
/// the second transaction waits at its fence for the first. Once that commits,
/// the lower token of the two is refused and its write rolled back with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_uses_racing_with_pipelined_writes_keep_only_the_higher_token() {
    let Some((db, fence, observer)) = setup().await else { return };
    let pool = db.pool(PoolLimits::default());
    for (first, second) in [(6, 5), (5, 6)] {
        let key = format!("{KEY}/first-use-{first}-{second}");
        let mut a = pool.get().await.unwrap();
        let a_tx = a.transaction().await.unwrap();
        let fenced = fence_and_insert(&fence, &a_tx, &key, first).await.unwrap();
        assert_eq!(fenced, Fenced { token: first, previous: 0 });

        let (b_pool, b_fence, b_key) = (pool.clone(), fence.clone(), key.clone());
        let b = tokio::spawn(async move {
            let mut client = b_pool.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            let outcome = fence_and_insert(&b_fence, &tx, &b_key, second).await;
            if outcome.is_ok() {
                tx.commit().await.unwrap();
            }
            outcome
        });
        // B's fence waits on A's uncommitted row.
        lock_waiters(&observer, 1).await;
        a_tx.commit().await.unwrap();
        let outcome = timeout(BOUND, b).await.unwrap().unwrap();
        let rows = observer
            .query("SELECT token::text FROM writes WHERE key = $1 ORDER BY seq", &[&key])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<_, String>(0))
            .collect::<Vec<_>>();
        if second < first {
            assert!(
                matches!(outcome, Err(FenceError::Stale { presented: 5, highest: 6, .. })),
                "{outcome:?}"
            );
            assert_eq!(rows, ["6"], "the refused write must roll back with its fence");
        } else {
            assert_eq!(outcome.unwrap(), Fenced { token: 6, previous: 5 });
            assert_eq!(rows, ["5", "6"]);
        }
        assert_eq!(crate::common::mark(&observer, &key).await, Some(first.max(second).to_string()));
    }
}

/// The fence and the write sent together: the write goes out right behind the
/// fence's first statement.
async fn fence_and_insert(
    fence: &PgFence,
    tx: &deadpool_postgres::Transaction<'_>,
    key: &str,
    token: u64,
) -> Result<Fenced, FenceError> {
    let insert = async { tx.execute(INSERT, &[&key, &token.to_string()]).await.map_err(FenceError::from) };
    let (fenced, _) = tokio::try_join!(fence.fence(tx, key, token), insert)?;
    Ok(fenced)
}
