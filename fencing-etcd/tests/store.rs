//! `EtcdSharedStore` on a real etcd (one member, ephemeral loopback ports):
//! what etcd itself holds after each step, besides what the layer admits.
//! The HTTP scenarios shared with PostgreSQL are in `conformance.rs`.

use std::time::Duration;

use fencing_etcd::{ClaimTiming, EtcdSharedStore, connect_options, tls_options};
use fencing_layer::store::{SharedRefusal, SharedStore};
use test_support::{Etcd, TestCerts};
use tokio::time::{Instant, timeout};

const BOUND: Duration = Duration::from_secs(20);

fn timing() -> ClaimTiming {
    ClaimTiming::for_term(Duration::from_secs(2))
}

async fn replica(etcd: &Etcd, prefix: &str) -> EtcdSharedStore {
    let client =
        etcd_client::Client::connect([etcd.endpoint.as_str()], Some(connect_options())).await.unwrap();
    let store = EtcdSharedStore::with_timing(client, prefix, timing()).unwrap();
    timeout(BOUND, store.ready()).await.expect("ready in time").unwrap();
    store
}

async fn admit(store: &EtcdSharedStore, key: &str, token: u64, drain: Duration) -> Result<(), SharedRefusal> {
    let admission = match store.try_admit(key, token) {
        Some(done) => done,
        None => timeout(BOUND, store.admit(key, token, drain)).await.expect("an answer within the bound"),
    };
    admission.map(drop)
}

async fn etcd_keys(etcd: &Etcd, prefix: &str) -> Vec<(String, String, i64)> {
    let mut client = etcd_client::Client::connect([etcd.endpoint.as_str()], None).await.unwrap();
    let found = client.get(prefix, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    found
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().replace('\0', "|"), kv.value_str().unwrap().to_owned(), kv.lease()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_waits_for_the_other_replicas_claim_and_etcd_holds_one_lease_per_replica() {
    let Some(etcd) = Etcd::start().await else { return };
    let (one, two) = (replica(&etcd, "t/").await, replica(&etcd, "t/").await);
    let key = "/docs/7";
    let inside = timeout(BOUND, one.admit(key, 1, BOUND)).await.unwrap().expect("token 1 admitted");
    assert!(two.try_admit(key, 1).is_none(), "replica two holds no claim yet");
    admit(&two, key, 1, BOUND).await.expect("an equal token shares");
    let stored = etcd_keys(&etcd, "t/").await;
    assert_eq!(stored.len(), 3, "one mark, one claim per replica: {stored:?}");
    let leases: Vec<i64> =
        stored.iter().filter(|(k, _, _)| k.starts_with("t/c/")).map(|(_, _, l)| *l).collect();
    assert!(leases.iter().all(|lease| *lease != 0) && leases[0] != leases[1], "{stored:?}");

    let started = Instant::now();
    let raise = tokio::spawn({
        let two = two.clone();
        async move { admit(&two, key, 2, BOUND).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!raise.is_finished(), "token 2 admitted while token 1 was inside on replica one");
    assert_eq!(
        admit(&one, key, 1, BOUND).await,
        Err(SharedRefusal::Stale { highest: 2 }),
        "nobody more enters under 1"
    );
    drop(inside);
    raise.await.unwrap().expect("token 2 admitted once token 1 left");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(500), "{waited:?}");
    let mark = etcd_keys(&etcd, "t/m/").await;
    assert_eq!(mark, vec![("t/m//docs/7".to_owned(), format!("{:020}", 2), 0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_claim_ends_with_its_lease_and_stale_tokens_are_409_everywhere() {
    let Some(etcd) = Etcd::start().await else { return };
    let one = replica(&etcd, "d/").await;
    let two = replica(&etcd, "d/").await;
    admit(&two, "k", 5, BOUND).await.unwrap();
    assert_eq!(admit(&one, "k", 4, BOUND).await, Err(SharedRefusal::Stale { highest: 5 }));
    let inside = timeout(BOUND, one.admit("k", 5, BOUND)).await.unwrap().unwrap();
    // Replica one dies holding its claim: nothing renews its lease, nothing releases.
    std::mem::forget(inside);
    drop(one);
    let started = Instant::now();
    admit(&two, "k", 6, BOUND).await.expect("the raise gets in once the dead replica's lease ends");
    let waited = started.elapsed();
    // The lease is 2 s from its last keepalive; etcd checks expiry every 500 ms.
    assert!(waited >= Duration::from_millis(900), "a dead replica's claim ended early: {waited:?}");
    assert!(waited < Duration::from_secs(6), "{waited:?}");
    let claims = etcd_keys(&etcd, "d/c/").await;
    assert_eq!(claims.len(), 1, "only replica two's claim is left: {claims:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_etcd_cannot_hold_are_refused_before_any_round_trip() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = replica(&etcd, "r/").await;
    let long = "k".repeat(1025);
    assert_eq!(admit(&store, &long, 1, BOUND).await, Err(SharedRefusal::KeyTooLong { limit: 1024 }));
    assert!(matches!(admit(&store, "a\0b", 1, BOUND).await, Err(SharedRefusal::InvalidKey(_))));
    assert!(etcd_keys(&etcd, "r/").await.is_empty());
    admit(&store, &"k".repeat(1024), u64::MAX, BOUND).await.expect("the longest key and the highest token");
}

/// Over TLS: with the CA that signed the server's certificate the store is ready; with
/// another, `ready` fails saying why; a bad CA file is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_ready_with_its_ca_and_refused_with_another() {
    let certs = TestCerts::new(&["127.0.0.1"]);
    let Some(etcd) = Etcd::start_tls(&certs, false).await else { return };
    let tls = tls_options(Some(&certs.ca_file)).unwrap();
    let store = EtcdSharedStore::connect_tls([etcd.endpoint.as_str()], "tls/", tls).await.unwrap();
    timeout(BOUND, store.ready()).await.expect("ready in time").unwrap();
    admit(&store, "/docs/1", 1, BOUND).await.expect("admitted over TLS");

    // Another CA: the store is not ready (the keeper's warning says why), and a request
    // made with the same options fails with the TLS error.
    let other = tls_options(Some(&certs.other_ca_file)).unwrap();
    let store = EtcdSharedStore::connect_tls([etcd.endpoint.as_str()], "tls/", other.clone()).await.unwrap();
    assert!(timeout(BOUND, store.ready()).await.expect("an answer in time").is_err());
    let options = connect_options().with_tls(other);
    let mut client = etcd_client::Client::connect([etcd.endpoint.as_str()], Some(options)).await.unwrap();
    let refused = timeout(BOUND, client.get("tls/", None)).await.expect("an answer in time").unwrap_err();
    assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");

    let not_pem = certs.ca_file.with_file_name("server.pem.missing");
    let e = tls_options(Some(&not_pem)).unwrap_err().to_string();
    assert!(e.contains(&not_pem.display().to_string()) && e.contains("cannot read it"), "{e}");
}
