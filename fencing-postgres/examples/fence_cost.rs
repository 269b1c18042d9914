//! What one fence statement costs the smallest write transaction, next to what
//! any statement in its place costs (BENCHMARKS.md §13). No HTTP: 16 tasks,
//! each on its own key, run transactions on a pool of 16 connections in a
//! closed loop, one variant at a time, the variants interleaved round by round:
//!
//! - `none`: `BEGIN`, the demo's append, `COMMIT`;
//! - `fence`: the same with `PgFence::fence` sent beside the append
//!   (`try_join!(biased; fence, append)`), as `demo-resource serve --postgres` does;
//! - `select1`: the same with a prepared `SELECT $1, $2` in the fence's place:
//!   a statement that locks and reads nothing;
//! - `lock-with-begin`: the fence's plain row lock sent beside `BEGIN` instead,
//!   then the append.
//!
//! Per variant: transactions per second, and the CPU time per transaction of
//! every `postgres` process on this machine (from `/proc`) and of this one.
//! Run it on the database's machine, with nothing else busy.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres fence_cost
//! cargo run --release -p fencing-postgres --example fence_cost -- "host=127.0.0.1 user=postgres dbname=fence_cost" 10
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use fencing_postgres::{FenceError, PgFence, PoolLimits};
use tokio_postgres::types::{ToSql, Type};

const TASKS: usize = 16;
const ROUND: Duration = Duration::from_secs(3);
const VARIANTS: [&str; 4] = ["none", "fence", "select1", "lock-with-begin"];

/// The demo's append (`demo-resource/src/postgres.rs`), on tables of its own.
const APPEND: &str = "WITH head AS (
    INSERT INTO fence_cost_heads AS h (name, next) VALUES ($1, 1)
    ON CONFLICT (name) DO UPDATE SET next = h.next + 1 RETURNING next - 1 AS index)
INSERT INTO fence_cost_logs (name, index, token, value)
SELECT $1, index, $2 + 9223372036854775808, $3 FROM head RETURNING index";
const TABLES: &str = "DROP TABLE IF EXISTS fence_cost_logs, fence_cost_heads;
CREATE TABLE fence_cost_logs (name TEXT COLLATE \"C\" NOT NULL, index BIGINT NOT NULL,
    token NUMERIC(20,0), value BYTEA NOT NULL, PRIMARY KEY (name, index));
CREATE TABLE fence_cost_heads (name TEXT COLLATE \"C\" PRIMARY KEY, next BIGINT NOT NULL)";
const SELECT1: &str = "SELECT $1::text, $2::int8";
/// The statement `PgFence` sends for a token it fenced the key with last.
const LOCK: &str = "SELECT mark, way FROM fencing_marks WHERE key = $1 FOR NO KEY UPDATE";
const TOKEN: u64 = 1000;

/// One transaction of `variant` on `key`.
async fn transaction(variant: &str, pool: &Pool, fence: &PgFence, key: &str) -> Result<(), FenceError> {
    let mut client = pool.get().await?;
    let wire = (TOKEN ^ (1 << 63)) as i64;
    let value: &[u8] = b"xxxxxxxxxxxxxxxx";
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [(&key, Type::TEXT), (&wire, Type::INT8), (&value, Type::BYTEA)];
    if variant == "lock-with-begin" {
        let lock = client.prepare_typed_cached(LOCK, &[Type::TEXT]).await?;
        let key_param: [&(dyn ToSql + Sync); 1] = [&key];
        let rest = async {
            tokio::try_join!(biased; client.batch_execute("BEGIN"), client.query(&lock, &key_param))?;
            client.query_typed(APPEND, &params).await?;
            client.batch_execute("COMMIT").await
        };
        if let Err(error) = rest.await {
            // Not back to the pool inside a transaction.
            drop(deadpool_postgres::Object::take(client));
            return Err(error.into());
        }
        return Ok(());
    }
    let tx = client.transaction().await?;
    let write = async { tx.query_typed(APPEND, &params).await.map_err(FenceError::from) };
    match variant {
        "none" => drop(write.await?),
        "fence" => drop(tokio::try_join!(biased; fence.fence(&tx, key, TOKEN), write)?),
        "select1" => {
            let select = tx.prepare_typed_cached(SELECT1, &[Type::TEXT, Type::INT8]).await?;
            let beside = async { tx.query(&select, &[&key, &wire]).await.map_err(FenceError::from) };
            drop(tokio::try_join!(biased; beside, write)?);
        }
        other => unreachable!("{other}"),
    }
    Ok(tx.commit().await?)
}

/// CPU time (user + system, reaped children included) of every `postgres`
/// process, in clock ticks.
fn postgres_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| stat.contains("(postgres)"))
        .map(|stat| ticks(&stat, 4))
        .sum()
}

/// This process's CPU time, in clock ticks.
fn own_ticks() -> u64 {
    std::fs::read_to_string("/proc/self/stat").map(|stat| ticks(&stat, 2)).unwrap_or(0)
}

/// The sum of the first `fields` of utime, stime, cutime, cstime in a `/proc/<pid>/stat` line.
fn ticks(stat: &str, fields: usize) -> u64 {
    let after_name = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    after_name.split(' ').skip(11).take(fields).filter_map(|field| field.parse::<u64>().ok()).sum()
}

/// One round of `variant`: transactions per second, and CPU µs per transaction
/// of PostgreSQL and of this process.
async fn round(variant: &'static str, pool: &Pool, fence: &PgFence) -> Result<(f64, f64, f64), FenceError> {
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (pool, fence, stop, done) = (pool.clone(), fence.clone(), Arc::clone(&stop), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            let key = format!("/cost/{task}");
            while !stop.load(Ordering::Relaxed) {
                transaction(variant, &pool, &fence, &key).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, FenceError>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // warm-up, left out
    let (pg, own, count, started) =
        (postgres_ticks(), own_ticks(), done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(ROUND).await;
    let elapsed = started.elapsed().as_secs_f64();
    let n = (done.load(Ordering::Relaxed) - count) as f64;
    let (pg, own) = (postgres_ticks() - pg, own_ticks() - own);
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a task panicked")?;
    }
    let per_tick_us = 1e6 / 100.0; // USER_HZ is 100 on Linux
    Ok((n / elapsed, pg as f64 * per_tick_us / n, own as f64 * per_tick_us / n))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: fence_cost '<loopback PostgreSQL config>' [rounds]")?;
    let rounds: usize = args.next().map_or(Ok(10), |n| n.parse())?;
    let config: tokio_postgres::Config = url.parse()?;
    let loopback = config.get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => name == "127.0.0.1" || name == "localhost",
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !loopback || rounds == 0 {
        return Err("a loopback database and at least one round, please".into());
    }
    let pool = fencing_postgres::pool(config, PoolLimits::default())?;
    let fence = PgFence::new();
    {
        let client = pool.get().await?;
        fence.migrate(&client).await?;
        client.batch_execute("SET client_min_messages = warning").await?;
        client.batch_execute(TABLES).await?;
        client.batch_execute("RESET client_min_messages").await?;
    }
    for task in 0..TASKS {
        // Each key's mark row, and this PgFence's memory of the token.
        transaction("fence", &pool, &fence, &format!("/cost/{task}")).await?;
    }
    let mut results: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); VARIANTS.len()];
    for number in 1..=rounds {
        for (variant, result) in VARIANTS.iter().zip(&mut results) {
            let (rate, pg, own) = round(variant, &pool, &fence).await?;
            println!(
                "round {number:2} {variant:16} {rate:7.0} tx/s  postgres {pg:5.0} µs/tx  this process {own:4.0} µs/tx"
            );
            result.push((rate, pg, own));
        }
    }
    println!("median over {rounds} rounds (ratio: median of per-round ratios to `none`)");
    for (variant, result) in VARIANTS.iter().zip(&results) {
        let ratio = median(result.iter().zip(&results[0]).map(|(this, none)| this.0 / none.0).collect());
        println!(
            "{variant:16} {:7.0} tx/s  ratio {ratio:.3}  postgres {:5.0} µs/tx  this process {:4.0} µs/tx",
            median(result.iter().map(|r| r.0).collect()),
            median(result.iter().map(|r| r.1).collect()),
            median(result.iter().map(|r| r.2).collect()),
        );
    }
    Ok(())
}
