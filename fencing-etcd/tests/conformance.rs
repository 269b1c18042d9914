//! test-support's shared-store conformance suite on etcd: every scenario
//! against `EtcdSharedStore`, each on a throwaway one-member etcd.

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use fencing_etcd::{ClaimStore, ClaimTiming, EtcdSharedStore, connect_options};
use test_support::Etcd;
use test_support::shared_store_conformance;
use test_support::shared_store_suite::Engine;

/// Every replica's marks and claims, under one prefix.
const PREFIX: &str = "suite/";

/// A throwaway etcd, and a client that reads what the replicas wrote.
struct EtcdEngine {
    etcd: Etcd,
    admin: Client,
}

impl Engine for EtcdEngine {
    const NAME: &'static str = "etcd";
    /// etcd's leases last whole seconds, and its minimum TTL is 2 s with the
    /// default election timeout.
    const TERM: Duration = Duration::from_secs(2);
    /// etcd's lessor looks for expired leases twice a second, then commits the
    /// revoke through raft.
    const EXPIRY_SLACK: Duration = Duration::from_secs(1);
    type Store = EtcdSharedStore;

    async fn start() -> Option<Self> {
        let etcd = Etcd::start().await?;
        let admin = Client::connect([etcd.endpoint.as_str()], None).await.unwrap();
        Some(Self { etcd, admin })
    }

    fn addr(&self) -> SocketAddr {
        self.etcd.endpoint.trim_start_matches("http://").parse().unwrap()
    }

    async fn store(&self, addr: SocketAddr, _name: &str, timing: ClaimTiming) -> EtcdSharedStore {
        let client = Client::connect([format!("http://{addr}")], Some(connect_options())).await.unwrap();
        let store = EtcdSharedStore::with_timing(client, PREFIX, timing).unwrap();
        store.ready().await.unwrap();
        store
    }

    fn claims(store: &EtcdSharedStore) -> &ClaimStore {
        store.claims()
    }

    async fn mark(&self, key: &str) -> Option<u64> {
        let found = self.admin.clone().get(format!("{PREFIX}m/{key}"), None).await.unwrap();
        found.kvs().first().map(|kv| kv.value_str().unwrap().parse().unwrap())
    }

    async fn claims_on(&self, key: &str) -> usize {
        let options = GetOptions::new().with_prefix().with_count_only();
        let found = self.admin.clone().get(format!("{PREFIX}c/{key}\0"), Some(options)).await.unwrap();
        usize::try_from(found.count()).unwrap()
    }

    async fn all_claims(&self) -> usize {
        let options = GetOptions::new().with_prefix().with_count_only();
        let found = self.admin.clone().get(format!("{PREFIX}c/"), Some(options)).await.unwrap();
        usize::try_from(found.count()).unwrap()
    }
}

shared_store_conformance!(EtcdEngine);
