//! The seed's scenario with tokens from PostgreSQL, Redis and ZooKeeper: each test
//! starts what it needs with test-support (a database of its own on the local
//! PostgreSQL; a redis-server and a ZooKeeper on ephemeral 127.0.0.1 ports in
//! temporary directories) and expects
//! the same three outcomes as with the demo lock service.
//!
//! Without the server these tests print SKIPPED and pass, unless `CI=true`.

use std::time::Duration;

use scenarios::scenario::{self, A_WRITE, B_WRITE, Report, TokenSource};
use test_support::{Redis, TestDb, ZooKeeper};

use crate::common::scenario_within;

/// The scenario's outcomes, as with the demo lock service.
fn check(report: &Report) {
    print!("{report}");
    assert!(report.problems().is_empty(), "{:?}", report.problems());
    let fenced = &report.with_fencing;
    assert!(fenced.b_token > fenced.a_token);
    assert_eq!(fenced.a.status, 409);
    assert_eq!(report.without_fencing.values(), [B_WRITE, A_WRITE]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_with_postgres_tokens() {
    let Some(db) = TestDb::create().await else { return };
    check(
        &scenario_within(
            Duration::from_secs(60),
            scenario::run_with(TokenSource::Postgres { url: db.url() }),
        )
        .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_with_redis_tokens() {
    let Some(redis) = Redis::start().await else { return };
    let source = TokenSource::Redis { url: redis.url(), accept_volatile_counter: false, ca_file: None };
    check(&scenario_within(Duration::from_secs(30), scenario::run_with(source)).await);
}

/// 100 ms ticks: A's 200 ms TTL is a 200 ms session (the minimum is two ticks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_with_zookeeper_tokens() {
    let Some(zookeeper) = ZooKeeper::start().await else { return };
    let source = TokenSource::ZooKeeper { cluster: zookeeper.cluster(), ca_file: None };
    check(&scenario_within(Duration::from_secs(60), scenario::run_with(source)).await);
}
