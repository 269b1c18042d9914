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
//! - `read`: that statement without its lock, a plain read of the mark row (a
//!   cost probe only: not a fence), beside the append;
//! - `lock-with-begin`: that row lock sent beside `BEGIN` instead, then the append;
//! - `key-share`: the row lock `FOR KEY SHARE` (a cost probe only);
//! - `advisory-2`: a shared advisory lock and a plain read of the mark, two
//!   prepared statements pipelined beside the append (a cost probe only).
//!
//! Per variant: transactions per second, and the CPU time per transaction of
//! PostgreSQL and of this process. PostgreSQL's is counted twice: its 16
//! backends alone (each one's run time in `/proc/<pid>/schedstat`, in ns: where
//! the statements run, and the steadier figure), and the whole instance (its
//! postmaster and every process it started, reaped ones included, in clock
//! ticks: the WAL writer, the checkpointer and autovacuum as well; no other
//! `postgres` on the machine). At the end, per variant, the median and range
//! over the rounds, and of each round against that round's `none`.
//!
//! To keep rounds alike, the bench's tables are left out of autovacuum and
//! each round starts with a `CHECKPOINT` (where the role may run one), so that
//! every round writes its pages' full images once, not only the round a
//! checkpoint happens to fall in. Run it on the database's machine, with
//! nothing else busy. An optional third argument picks variants (`none` first).
//!
//! Variants one after another are what a service sees, but a 3 s round on a
//! shared 2-core machine swings by ±20 %. `--together` runs the variants side
//! by side instead, each on a pool and keys of its own (16 tasks shared out,
//! at least 2 each; `FENCE_COST_TASKS=n` sets the number per variant), so
//! that every variant meets the same moment of the machine: the backends' CPU
//! per transaction is then comparable round by round (the instance's and this
//! process's are not, and print as `-`).
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres fence_cost
//! cargo run --release -p fencing-postgres --example fence_cost -- "host=127.0.0.1 user=postgres dbname=fence_cost" 10
//! cargo run --release -p fencing-postgres --example fence_cost -- "host=127.0.0.1 user=postgres dbname=fence_cost" 8 none,fence,select1,row-lock
//! cargo run --release -p fencing-postgres --example fence_cost -- "host=127.0.0.1 user=postgres dbname=fence_cost" 10 none,fence,select1,row-lock --together
//! ```

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use fencing_postgres::{FenceError, PgFence, PoolLimits};
use tokio_postgres::types::{ToSql, Type};

const TASKS: usize = 16;
const ROUND: Duration = Duration::from_secs(3);
const VARIANTS: [&str; 8] =
    ["none", "fence", "select1", "row-lock", "read", "lock-with-begin", "key-share", "advisory-2"];

/// The demo's append (`demo-resource/src/postgres.rs`), on tables of its own.
const APPEND: &str = "WITH head AS (
    INSERT INTO fence_cost_heads AS h (name, next) VALUES ($1, 1)
    ON CONFLICT (name) DO UPDATE SET next = h.next + 1 RETURNING next - 1 AS index)
INSERT INTO fence_cost_logs (name, index, token, value)
SELECT $1, index, $2 + 9223372036854775808, $3 FROM head RETURNING index";
const TABLES: &str = "DROP TABLE IF EXISTS fence_cost_logs, fence_cost_heads;
CREATE TABLE fence_cost_logs (name TEXT COLLATE \"C\" NOT NULL, index BIGINT NOT NULL,
    token NUMERIC(20,0), value BYTEA NOT NULL, PRIMARY KEY (name, index)) WITH (autovacuum_enabled = false);
CREATE TABLE fence_cost_heads (name TEXT COLLATE \"C\" PRIMARY KEY, next BIGINT NOT NULL)
    WITH (autovacuum_enabled = false)";
const SELECT1: &str = "SELECT $1::text, $2::int8";
/// The statement `PgFence` sent for a token it fenced the key with last, up to issue 39.
const LOCK: &str =
    "SELECT (mark - 9223372036854775808)::int8, way FROM fencing_marks WHERE key = $1 FOR NO KEY UPDATE";
const KEY_SHARE: &str =
    "SELECT (mark - 9223372036854775808)::int8, way FROM fencing_marks WHERE key = $1 FOR KEY SHARE";
const ADVISORY: &str = "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))";
const READ: &str = "SELECT (mark - 9223372036854775808)::int8, way FROM fencing_marks WHERE key = $1";
/// `READ` with the parameters of the others.
const READ_2: &str = "SELECT (mark - 9223372036854775808)::int8, way FROM fencing_marks WHERE key = $1 AND $2::int8 IS NOT NULL";
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
        "select1" | "row-lock" | "read" | "key-share" => {
            let sql = match variant {
                "select1" => SELECT1,
                "row-lock" => LOCK,
                "read" => READ_2,
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

/// The run time of `backends` so far, in ns (`/proc/<pid>/schedstat`'s first field).
fn backend_ns(backends: &[u32]) -> Result<u64, String> {
    backends
        .iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
                .map_err(|error| format!("backend {pid} is gone (a connection was replaced?): {error}"))?;
            stat.split(' ')
                .next()
                .and_then(|ns| ns.trim().parse::<u64>().ok())
                .ok_or(format!("backend {pid}: {stat}"))
        })
        .sum()
}

/// One variant's share of a round, and what it measured: transactions per
/// second, and CPU µs per transaction of its PostgreSQL backends, of the whole
/// instance and of this process (these two only when it ran alone: `NaN` otherwise).
#[derive(Debug, Clone, Copy)]
struct Round {
    rate: f64,
    backends: f64,
    instance: f64,
    own: f64,
}

/// A variant as it runs: its tasks, each on a key of its own, on `pool`,
/// whose connections' backends are `backends`.
struct Group {
    variant: &'static str,
    pool: Pool,
    backends: Vec<u32>,
    keys: Vec<String>,
}

/// Per group, its backends' run time (ns) and its transactions so far; then
/// the instance's and this process's CPU ticks.
type Sample = (Vec<(u64, u64)>, u64, u64);

/// One round of `groups`, side by side.
async fn round(groups: &[&Group], fence: &PgFence, pg: &Instance) -> Result<Vec<Round>, Box<dyn Error>> {
    if pg.checkpoint {
        groups[0].pool.get().await?.batch_execute("CHECKPOINT").await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (mut tasks, mut counts) = (Vec::new(), Vec::new());
    for group in groups {
        let done = Arc::new(AtomicU64::new(0));
        for key in &group.keys {
            let (pool, fence, stop, done, key) =
                (group.pool.clone(), fence.clone(), Arc::clone(&stop), Arc::clone(&done), key.clone());
            let variant = group.variant;
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    transaction(variant, &pool, &fence, &key).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, FenceError>(())
            }));
        }
        counts.push(done);
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // warm-up, left out
    let sample = || -> Result<Sample, String> {
        let groups = groups.iter().zip(&counts);
        let per_group = groups
            .map(|(group, done)| Ok((backend_ns(&group.backends)?, done.load(Ordering::Relaxed))))
            .collect::<Result<_, String>>()?;
        Ok((per_group, postgres_ticks(pg.postmaster), own_ticks()))
    };
    let (before, started) = (sample()?, Instant::now());
    tokio::time::sleep(ROUND).await;
    let (after, elapsed) = (sample()?, started.elapsed().as_secs_f64());
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a task panicked")?;
    }
    let per_tick_us = 1e6 / 100.0; // USER_HZ is 100 on Linux
    let alone = groups.len() == 1;
    let rounds = before.0.iter().zip(&after.0).map(|(&(ns_before, n_before), &(ns_after, n_after))| {
        let n = (n_after - n_before) as f64;
        let whole = |ticks: u64| if alone { ticks as f64 * per_tick_us / n } else { f64::NAN };
        Round {
            rate: n / elapsed,
            backends: (ns_after - ns_before) as f64 / 1e3 / n,
            instance: whole(after.1 - before.1),
            own: whole(after.2 - before.2),
        }
    });
    Ok(rounds.collect())
}

/// The PostgreSQL instance measured: its postmaster, and whether this role may run `CHECKPOINT`.
struct Instance {
    postmaster: u32,
    checkpoint: bool,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `median [min–max]` of `values`.
fn spread(values: Vec<f64>) -> String {
    if values.iter().any(|v| v.is_nan()) {
        return "-".to_owned();
    }
    let (min, max) =
        values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    format!("{:5.1} [{min:5.1}–{max:5.1}]", median(values))
}

/// `n` connections of `pool` opened, and their backends' pids.
async fn backends(pool: &Pool, n: usize) -> Result<Vec<u32>, Box<dyn Error>> {
    // Held together, so that each is a connection of its own.
    let (mut clients, mut backends) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let client = pool.get().await?;
        let pid: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
        backends.push(u32::try_from(pid)?);
        clients.push(client);
    }
    Ok(backends)
}

/// The instance `pool` is connected to: the postmaster, the parent of its backends.
async fn instance(pool: &Pool) -> Result<Instance, Box<dyn Error>> {
    let client = pool.get().await?;
    let backend: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let stat = std::fs::read_to_string(format!("/proc/{backend}/stat"))
        .map_err(|error| format!("the backend's /proc entry (is the database on this machine?): {error}"))?;
    let postmaster = parent(&stat).ok_or("no parent in the backend's /proc entry")?;
    let checkpoint = client.batch_execute("CHECKPOINT").await.is_ok();
    if !checkpoint {
        eprintln!("this role may not run CHECKPOINT: rounds start without one");
    }
    Ok(Instance { postmaster, checkpoint })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let together = args.iter().any(|arg| arg == "--together");
    args.retain(|arg| arg != "--together");
    let mut args = args.into_iter();
    let usage =
        "usage: fence_cost '<loopback PostgreSQL config>' [rounds] [variant,variant,...] [--together]";
    let url = args.next().ok_or(usage)?;
    let rounds: usize = args.next().map_or(Ok(10), |n| n.parse())?;
    let variants: Vec<&'static str> = match args.next() {
        None => VARIANTS.to_vec(),
        Some(list) => list
            .split(',')
            .map(|name| VARIANTS.iter().copied().find(|known| *known == name).ok_or(usage))
            .collect::<Result<_, _>>()?,
    };
    let config: fencing_postgres::PgConnect = url.parse()?;
    let loopback = config.config().get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => name == "127.0.0.1" || name == "localhost",
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !loopback || rounds == 0 || variants.first() != Some(&"none") {
        return Err("a loopback database, at least one round, and `none` first, please".into());
    }
    let fence = PgFence::new();
    // One after another: every variant on one pool of TASKS connections, a key
    // per task. Together: each variant on a pool of its own, its share of the tasks.
    let tasks = match std::env::var("FENCE_COST_TASKS") {
        Ok(n) => n.parse()?,
        Err(_) if together => (TASKS / variants.len()).max(2),
        Err(_) => TASKS,
    };
    let shared =
        fencing_postgres::pool(config.clone(), PoolLimits { max_size: tasks, ..PoolLimits::default() })?;
    {
        let client = shared.get().await?;
        fence.migrate(&client).await?;
        client.batch_execute("SET client_min_messages = warning").await?;
        client.batch_execute(TABLES).await?;
        client.batch_execute("RESET client_min_messages").await?;
    }
    let pg = instance(&shared).await?;
    let mut groups = Vec::new();
    for (number, variant) in variants.iter().enumerate() {
        let pool = match (together, number) {
            (false, _) | (true, 0) => shared.clone(),
            (true, _) => fencing_postgres::pool(
                config.clone(),
                PoolLimits { max_size: tasks, ..PoolLimits::default() },
            )?,
        };
        let keys: Vec<String> = (0..tasks)
            .map(|task| if together { format!("/cost/{number}/{task}") } else { format!("/cost/{task}") })
            .collect();
        for key in &keys {
            // Each key's mark row, and this PgFence's memory of the token.
            transaction("fence", &pool, &fence, key).await?;
        }
        groups.push(Group { variant, backends: backends(&pool, tasks).await?, pool, keys });
    }
    let mut results: Vec<Vec<Round>> = vec![Vec::new(); variants.len()];
    for number in 1..=rounds {
        let measured = if together {
            round(&groups.iter().collect::<Vec<_>>(), &fence, &pg).await?
        } else {
            let mut measured = Vec::new();
            for group in &groups {
                measured.extend(round(&[group], &fence, &pg).await?);
            }
            measured
        };
        for ((group, r), result) in groups.iter().zip(measured).zip(&mut results) {
            println!(
                "round {number:2} {:16} {:7.0} tx/s  postgres backends {:5.1} µs/tx, instance {:5.0} µs/tx  this process {:4.0} µs/tx",
                group.variant, r.rate, r.backends, r.instance, r.own
            );
            result.push(r);
        }
    }
    let how = if together { "side by side, each on its own pool" } else { "one after another" };
    println!(
        "{} tasks a variant, {how}; over {rounds} rounds, median [min–max]; ratio and `over none`: of each round against that round's `none`",
        tasks
    );
    println!(
        "{:16} {:>7} {:>20} {:>24} {:>24} {:>24} {:>24} {:>20}",
        "variant",
        "tx/s",
        "ratio to none",
        "backends µs/tx",
        "backends over none",
        "instance µs/tx",
        "instance over none",
        "this process µs/tx"
    );
    for (variant, result) in variants.iter().zip(&results) {
        let paired = |f: &dyn Fn(&Round, &Round) -> f64| {
            result.iter().zip(&results[0]).map(|(this, none)| f(this, none)).collect::<Vec<_>>()
        };
        let ratio = paired(&|this, none| this.rate / none.rate);
        let (lo, hi) =
            ratio.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
        println!(
            "{variant:16} {:7.0} {:.3} [{lo:.3}–{hi:.3}] {:>24} {:>24} {:>24} {:>24} {:>20}",
            median(result.iter().map(|r| r.rate).collect()),
            median(ratio),
            spread(result.iter().map(|r| r.backends).collect()),
            spread(paired(&|this, none| this.backends - none.backends)),
            spread(result.iter().map(|r| r.instance).collect()),
            spread(paired(&|this, none| this.instance - none.instance)),
            spread(result.iter().map(|r| r.own).collect()),
        );
    }
    Ok(())
}
