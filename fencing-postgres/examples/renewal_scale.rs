//! How a replica's renewal behaves with many claims (BENCHMARKS.md §13): one
//! `PgSharedStore` holds a request inside on each of N keys (20,000 by
//! default) for S seconds, with the default timing (a 5 s term, renewed every
//! second, each renewal bounded by a second). It prints each renewal's time
//! and how many claims it extended, the WAL PostgreSQL wrote per second, and
//! how many requests lost their claim (there should be none).
//!
//! The marks live in tables of their own (`renewal_scale_marks`,
//! `renewal_scale_marks_claims`), dropped at the end.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres fencing_scale
//! cargo run --release -p fencing-postgres --example renewal_scale -- "host=127.0.0.1 user=postgres dbname=fencing_scale" 20000 10
//! ```

use std::time::{Duration, Instant};

use fencing_layer::store::SharedStore;
use fencing_postgres::{PgFence, PgSharedStore, PoolLimits};

const TABLE: &str = "renewal_scale_marks";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("fencing_layer=info,fencing_postgres=info").init();
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "host=127.0.0.1 user=postgres".into());
    let claims: usize = args.next().map_or(Ok(20_000), |n| n.parse())?;
    let seconds: u64 = args.next().map_or(Ok(10), |n| n.parse())?;
    let config: fencing_postgres::PgConnect = url.parse()?;
    let pool = fencing_postgres::pool(config.clone(), PoolLimits::default())?;
    let fence = PgFence::new().table(TABLE)?;
    let store = PgSharedStore::new(pool.clone(), config, fence);
    store.migrate().await?;
    store.ready().await?;

    let started = Instant::now();
    let mut permits = Vec::with_capacity(claims);
    let keys: Vec<String> = (0..claims).map(|i| format!("/scale/{i}")).collect();
    for chunk in keys.chunks(64) {
        let admissions: Vec<_> =
            chunk.iter().map(|key| tokio::spawn(store.admit(key, 1, Duration::from_secs(10)))).collect();
        for admission in admissions {
            permits.push(admission.await?.map_err(|refusal| format!("{refusal:?}"))?);
        }
    }
    println!("{claims} claims taken in {:.1} s", started.elapsed().as_secs_f64());
    // Past the setup's own load: every claim renewed at least once since.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let admin = pool.get().await?;
    let wal_sql = "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8";
    let wal_at: i64 = admin.query_one(wal_sql, &[]).await?.get(0);
    let mut renewals = Vec::new();
    let mut seen = None;
    let until = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let last = store.claims().last_renewal();
        if last != seen {
            if let Some(report) = last {
                renewals.push(report);
            }
            seen = last;
        }
    }
    let wal = admin.query_one(wal_sql, &[]).await?.get::<_, i64>(0) - wal_at;
    let mut took: Vec<Duration> = renewals.iter().map(|report| report.took).collect();
    took.sort();
    // A claim still valid admits its token in memory.
    let valid = keys.iter().filter(|key| matches!(store.try_admit(key, 1), Some(Ok(_)))).count();
    let lost = claims - valid;
    println!(
        "renewals: {} in {seconds} s; took p50 {:?}, max {:?}; the last extended {} of the {} it asked for",
        renewals.len(),
        took.get(took.len() / 2).copied().unwrap_or_default(),
        took.last().copied().unwrap_or_default(),
        renewals.last().map_or(0, |report| report.extended),
        renewals.last().map_or(0, |report| report.claims),
    );
    let asked: usize = renewals.iter().map(|report| report.claims).sum();
    println!(
        "claims per renewal: {:.0} on average; WAL: {:.1} MB/s; claims still valid: {valid} of {claims} ({lost} lost)",
        asked as f64 / renewals.len().max(1) as f64,
        wal as f64 / 1e6 / seconds as f64
    );
    drop(permits);
    drop(store);
    admin.batch_execute(&format!("DROP TABLE IF EXISTS {TABLE}_claims, {TABLE}")).await?;
    Ok(())
}
