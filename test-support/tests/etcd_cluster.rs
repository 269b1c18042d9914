//! `EtcdCluster`'s faults do what they say, seen from etcd's own client:
//! a partitioned member loses its leader and its writes, while the others
//! elect and serve; a killed leader is replaced and comes back.

use std::time::Duration;

use test_support::EtcdCluster;
use tokio::time::{Instant, sleep};

const ONE_SECOND: Duration = Duration::from_secs(1);

/// Polls `check` every 100 ms until it holds, at most `within`.
async fn eventually<F, P>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> P,
    P: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        sleep(Duration::from_millis(100)).await;
    }
}

async fn put(cluster: &EtcdCluster, i: usize, key: &str) -> Result<String, String> {
    cluster.etcdctl(i, &["put", key, "v"], ONE_SECOND).await
}

/// Cuts `cut` off and checks that it is: it names no leader and cannot
/// write, the others still have a leader among them and write; then heals.
async fn partition_isolates(cluster: &EtcdCluster, cut: usize) {
    cluster.partition(cut);
    let others: Vec<usize> = (0..cluster.size()).filter(|i| *i != cut).collect();
    eventually(Duration::from_secs(5), "the cut member names no leader", || async {
        let status = cluster.etcdctl(cut, &["endpoint", "status", "-w", "fields"], ONE_SECOND).await;
        status.is_ok_and(|fields| fields.contains("\"Leader\" : 0\n"))
    })
    .await;
    for attempt in 0..3 {
        let refused = put(cluster, cut, &format!("cut-{cut}-{attempt}")).await;
        assert!(refused.is_err(), "the cut member {cut} wrote: {refused:?}");
    }
    let leader = cluster.wait_leader(Duration::from_secs(5)).await.expect("the majority has a leader");
    assert!(others.contains(&leader), "leader {leader} is the cut member {cut}");
    for i in others {
        eventually(Duration::from_secs(5), "the majority writes", || async {
            put(cluster, i, "majority").await.is_ok()
        })
        .await;
    }
    cluster.heal(cut);
    eventually(Duration::from_secs(10), "the healed member writes", || async {
        put(cluster, cut, "healed").await.is_ok()
    })
    .await;
}

#[tokio::test]
async fn a_partitioned_member_loses_its_leader_and_its_writes_while_the_others_serve() {
    let Some(cluster) = EtcdCluster::start(3).await else { return };
    let leader = cluster.wait_leader(Duration::from_secs(5)).await.expect("a leader");
    partition_isolates(&cluster, (leader + 1) % 3).await;
    // The leader cut off steps down; the others elect one of their own.
    let leader = cluster.wait_leader(Duration::from_secs(5)).await.expect("a leader");
    partition_isolates(&cluster, leader).await;
}

#[tokio::test]
async fn a_killed_leader_is_replaced_and_a_frozen_one_too_and_compaction_reaches_the_head() {
    let Some(mut cluster) = EtcdCluster::start(3).await else { return };
    let leader = cluster.wait_leader(Duration::from_secs(5)).await.expect("a leader");
    cluster.kill9(leader);
    let next = cluster.wait_leader(Duration::from_secs(5)).await.expect("a new leader");
    assert_ne!(next, leader);
    cluster.restart(leader).await;
    put(&cluster, leader, "back").await.expect("the restarted member writes");

    cluster.sigstop(next);
    let after = cluster.wait_leader(Duration::from_secs(5)).await.expect("a leader while one is frozen");
    assert_ne!(after, next);
    assert!(put(&cluster, next, "frozen").await.is_err(), "a frozen member answered");
    cluster.sigcont(next);
    eventually(Duration::from_secs(5), "the thawed member writes", || async {
        put(&cluster, next, "thawed").await.is_ok()
    })
    .await;

    let revision = cluster.compact().await;
    let old = cluster.etcdctl(after, &["get", "back", "--rev=1"], ONE_SECOND).await;
    assert!(old.is_err_and(|e| e.contains("compacted")), "revision 1 was compacted away ({revision})");
}
