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
//! - `row-lock`: the fence's equal-token statement alone (the mark row locked
//!   `FOR NO KEY UPDATE`), prepared, beside the append;
//! - `lock-with-begin`: that row lock sent beside `BEGIN` instead, then the append;
//! - `key-share`: the row lock `FOR KEY SHARE` (a cost probe only);
//! - `advisory-2`: a shared advisory lock and a plain read of the mark, two
//!   prepared statements pipelined beside the append (a cost probe only).
//!
//! Per variant: transactions per second, and the CPU time per transaction of
//! the PostgreSQL instance connected to (its postmaster and the processes it
//! started, from `/proc`; no other `postgres` on the machine) and of this one;
//! at the end, per variant, the median and range over the rounds, and of each
//! round against that round's `none`. Run it on the database's machine, with
//! nothing else busy. An optional third argument picks variants (`none` first).
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres fence_cost
//! cargo run --release -p fencing-postgres --example fence_cost -- "host=127.0.0.1 user=postgres dbname=fence_cost" 10
//! cargo run --release -p fencing-postgres --example fence_cost -- "host=127.0.0.1 user=postgres dbname=fence_cost" 8 none,fence,select1,row-lock
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use fencing_postgres::{FenceError, PgFence, PoolLimits};
use tokio_postgres::types::{ToSql, Type};

const TASKS: usize = 16;
const ROUND: Duration = Duration::from_secs(3);
const VARIANTS: [&str; 7] =
    ["none", "fence", "select1", "row-lock", "lock-with-begin", "key-share", "advisory-2"];

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
/// The statement `PgFence` sent for a token it fenced the key with last, up to issue 39.
const LOCK: &str =
    "SELECT (mark - 9223372036854775808)::int8, way FROM fencing_marks WHERE key = $1 FOR NO KEY UPDATE";
const KEY_SHARE: &str =
    "SELECT (mark - 9223372036854775808)::int8, way FROM fencing_marks WHERE key = $1 FOR KEY SHARE";
const ADVISORY: &str = "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))";
const READ: &str = "SELECT (mark - 9223372036854775808)::int8, way FROM fencing_marks WHERE key = $1";
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
        "select1" | "row-lock" | "key-share" => {
            let sql = match variant {
                "select1" => SELECT1,
                "row-lock" => LOCK,
                _ => KEY_SHARE,
            };
            let select = tx.prepare_typed_cached(sql, &[Type::TEXT, Type::INT8]).await?;
            let beside = async { tx.query(&select, &[&key, &wire]).await.map_err(FenceError::from) };
            drop(tokio::try_join!(biased; beside, write)?);
        }
        "advisory-2" => {
            let lock = tx.prepare_typed_cached(ADVISORY, &[Type::TEXT]).await?;
            let read = tx.prepare_typed_cached(READ, &[Type::TEXT]).await?;
            let locked = async { tx.query(&lock, &[&key]).await.map_err(FenceError::from) };
            let mark = async { tx.query(&read, &[&key]).await.map_err(FenceError::from) };
            drop(tokio::try_join!(biased; locked, mark, write)?);
        }
        other => unreachable!("{other}"),
    }
    Ok(tx.commit().await?)
}

/// CPU time (user + system, reaped children included) of the PostgreSQL
/// instance under test, in clock ticks: its postmaster and every process the
/// postmaster started (backends, WAL writer, checkpointer...), and no other
/// `postgres` on the machine.
fn postgres_ticks(postmaster: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| stat_pid(stat) == Some(postmaster) || parent(stat) == Some(postmaster))
        .map(|stat| ticks(&stat, 4))
        .sum()
}

fn stat_pid(stat: &str) -> Option<u32> {
    stat.split(' ').next()?.parse().ok()
}

/// The parent's pid in a `/proc/<pid>/stat` line.
fn parent(stat: &str) -> Option<u32> {
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
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
async fn round(
    variant: &'static str,
    pool: &Pool,
    fence: &PgFence,
    postmaster: u32,
) -> Result<(f64, f64, f64), FenceError> {
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
        (postgres_ticks(postmaster), own_ticks(), done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(ROUND).await;
    let elapsed = started.elapsed().as_secs_f64();
    let n = (done.load(Ordering::Relaxed) - count) as f64;
    let (pg, own) = (postgres_ticks(postmaster) - pg, own_ticks() - own);
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a task panicked")?;
    }
    let per_tick_us = 1e6 / 100.0; // USER_HZ is 100 on Linux
    Ok((n / elapsed, pg as f64 * per_tick_us / n, own as f64 * per_tick_us / n))
}

/// One round's transactions per second, PostgreSQL µs and this process's µs per transaction.
type Round = (f64, f64, f64);

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `median [min–max]` of `values`.
fn spread(values: Vec<f64>) -> String {
    let (min, max) =
        values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    format!("{:4.0} [{min:4.0}–{max:4.0}]", median(values))
}

/// The postmaster of the instance `client` is connected to: its backend's parent.
async fn postmaster(client: &tokio_postgres::Client) -> Result<u32, Box<dyn std::error::Error>> {
    let backend: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let stat = std::fs::read_to_string(format!("/proc/{backend}/stat"))
        .map_err(|error| format!("the backend's /proc entry (is the database on this machine?): {error}"))?;
    Ok(parent(&stat).ok_or("no parent in the backend's /proc entry")?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: fence_cost '<loopback PostgreSQL config>' [rounds] [variant,variant,...]";
    let url = args.next().ok_or(usage)?;
    let rounds: usize = args.next().map_or(Ok(10), |n| n.parse())?;
    let variants: Vec<&'static str> = match args.next() {
        None => VARIANTS.to_vec(),
        Some(list) => list
            .split(',')
            .map(|name| VARIANTS.iter().copied().find(|known| *known == name).ok_or(usage))
            .collect::<Result<_, _>>()?,
    };
    let config: tokio_postgres::Config = url.parse()?;
    let loopback = config.get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => name == "127.0.0.1" || name == "localhost",
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !loopback || rounds == 0 || variants.first() != Some(&"none") {
        return Err("a loopback database, at least one round, and `none` first, please".into());
    }
    let pool = fencing_postgres::pool(config, PoolLimits::default())?;
    let fence = PgFence::new();
    let postmaster = {
        let client = pool.get().await?;
        fence.migrate(&client).await?;
        client.batch_execute("SET client_min_messages = warning").await?;
        client.batch_execute(TABLES).await?;
        client.batch_execute("RESET client_min_messages").await?;
        postmaster(&client).await?
    };
    for task in 0..TASKS {
        // Each key's mark row, and this PgFence's memory of the token.
        transaction("fence", &pool, &fence, &format!("/cost/{task}")).await?;
    }
    let mut results: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); variants.len()];
    for number in 1..=rounds {
        for (variant, result) in variants.iter().zip(&mut results) {
            let (rate, pg, own) = round(variant, &pool, &fence, postmaster).await?;
            println!(
                "round {number:2} {variant:16} {rate:7.0} tx/s  postgres {pg:5.0} µs/tx  this process {own:4.0} µs/tx"
            );
            result.push((rate, pg, own));
        }
    }
    println!(
        "over {rounds} rounds, median [min–max]; ratio and `over none`: of each round against that round's `none`"
    );
    println!(
        "{:16} {:>7} {:>20} {:>23} {:>23} {:>20}",
        "variant", "tx/s", "ratio to none", "postgres µs/tx", "postgres over none", "this process µs/tx"
    );
    for (variant, result) in variants.iter().zip(&results) {
        let paired = |f: &dyn Fn(&Round, &Round) -> f64| {
            result.iter().zip(&results[0]).map(|(this, none)| f(this, none)).collect::<Vec<_>>()
        };
        let ratio = paired(&|this, none| this.0 / none.0);
        let (lo, hi) =
            ratio.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
        println!(
            "{variant:16} {:7.0} {:.3} [{lo:.3}–{hi:.3}] {:>23} {:>23} {:>20}",
            median(result.iter().map(|r| r.0).collect()),
            median(ratio),
            spread(result.iter().map(|r| r.1).collect()),
            spread(paired(&|this, none| this.1 - none.1)),
            spread(result.iter().map(|r| r.2).collect()),
        );
    }
    Ok(())
}
