//! The etcd, Redis and ZooKeeper backends over TLS, against servers that the tests start on
//! ephemeral 127.0.0.1 ports with certificates made for the test (test-support's `TestCerts`:
//! a CA, a server certificate it signed for 127.0.0.1 and localhost, another CA). For each: a
//! token granted over TLS with the CA given, and a refusal naming the server and the TLS
//! error with the other CA.
//!
//! Without the servers these tests print SKIPPED and pass, unless `CI=true`.

use std::time::Duration;

use fencing_client::tls::ClientTls;
use fencing_client::{LockBackend, LockBackendExt, LockError};
use test_support::{BOUND, TestCerts};
use tokio::time::timeout;

/// A lease granted (a token), then released, within [`BOUND`].
async fn granted<L: LockBackendExt>(locks: &L, name: &str) -> u64 {
    let lease = timeout(BOUND, locks.lease(name, "tls-client", Duration::from_secs(5))).await.unwrap();
    let lease = lease.unwrap_or_else(|e| panic!("no lease over TLS: {e}"));
    let token = lease.token();
    assert!(token > 0);
    lease.release().await.unwrap();
    token
}

/// With `certs`' CA, a lease granted over TLS through `connect`; with the other CA, a
/// refusal (of the connect, or of the first request) naming `server` and the TLS error.
async fn granted_with_its_ca_refused_with_another<L: LockBackendExt>(
    certs: &TestCerts,
    server: &str,
    connect: impl AsyncFn(&ClientTls) -> Result<L, LockError>,
) {
    let tls = ClientTls::new().ca_file(&certs.ca_file).unwrap();
    granted(&connect(&tls).await.unwrap(), "over-tls").await;
    let other = ClientTls::new().ca_file(&certs.other_ca_file).unwrap();
    let refused =
        async { connect(&other).await?.acquire("over-tls", "tls-client", Duration::from_secs(5)).await };
    let refused = timeout(BOUND, refused).await.expect("refused within the bound");
    eprintln!("another CA: {}", refused_for_its_certificate(refused, server));
}

/// A failure of the TLS handshake: a transport error naming `server` and the TLS problem.
fn refused_for_its_certificate(result: Result<impl std::fmt::Debug, LockError>, server: &str) -> String {
    match result {
        Err(LockError::Transport(why)) => {
            assert!(why.contains(server), "the error names the server {server}: {why}");
            assert!(why.contains("UnknownIssuer"), "the error says the CA did not sign it: {why}");
            why
        }
        other => panic!("expected a refused TLS handshake with {server}, got {other:?}"),
    }
}

/// The bad files are refused before any connection, naming the file.
#[test]
fn a_bad_ca_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    for (file, says) in [(&missing, "cannot read it"), (&not_pem, "no PEM certificate in it")] {
        match ClientTls::new().ca_file(file) {
            Err(LockError::InvalidArgument(e)) => {
                assert!(e.contains(&file.display().to_string()) && e.contains(says), "{e}");
            }
            other => panic!("{}: {other:?}", file.display()),
        }
    }
    let certs = TestCerts::new(&["127.0.0.1"]);
    let e = ClientTls::new().identity_files(&certs.client_cert_file, &not_pem).unwrap_err();
    assert!(e.to_string().contains("client key file") && e.to_string().contains("no PEM private key"), "{e}");
}

#[cfg(feature = "etcd")]
mod etcd {
    use fencing_client::EtcdLockClient;
    use test_support::Etcd;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_grants_over_tls_with_its_ca_and_is_refused_with_another() {
        let certs = TestCerts::new(&["127.0.0.1", "localhost"]);
        let Some(etcd) = Etcd::start_tls(&certs, false).await else { return };
        assert!(etcd.endpoint.starts_with("https://"));
        let server = etcd.endpoint.trim_start_matches("https://");
        let connect =
            async |tls: &ClientTls| EtcdLockClient::connect_tls([etcd.endpoint.as_str()], tls).await;
        granted_with_its_ca_refused_with_another(&certs, server, connect).await;
        // The system's roots (`connect` to an https:// endpoint) do not know the test's CA either.
        let locks = EtcdLockClient::connect([etcd.endpoint.as_str()]).await.unwrap();
        refused_for_its_certificate(
            locks.acquire("over-tls", "tls-client", Duration::from_secs(5)).await,
            server,
        );
    }

    /// An etcd that asks for client certificates (`--client-cert-auth`) grants to a client
    /// showing one its CA signed, and refuses one that shows none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_with_client_certificates_grants_only_to_a_client_with_one() {
        let certs = TestCerts::new(&["127.0.0.1"]);
        let Some(etcd) = Etcd::start_tls(&certs, true).await else { return };
        let tls = ClientTls::new().ca_file(&certs.ca_file).unwrap();
        let with_cert = tls.clone().identity_files(&certs.client_cert_file, &certs.client_key_file).unwrap();
        let locks = EtcdLockClient::connect_tls([etcd.endpoint.as_str()], &with_cert).await.unwrap();
        granted(&locks, "mutual").await;

        let locks = EtcdLockClient::connect_tls([etcd.endpoint.as_str()], &tls).await.unwrap();
        let refused =
            timeout(BOUND, locks.acquire("mutual", "tls-client", Duration::from_secs(5))).await.unwrap();
        match refused {
            Err(LockError::Transport(why)) => eprintln!("etcd, no client certificate: {why}"),
            other => panic!("a client without a certificate: {other:?}"),
        }
    }
}

#[cfg(feature = "redis")]
mod redis {
    use fencing_client::RedisLockClient;
    use test_support::Redis;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_grants_over_tls_with_its_ca_and_is_refused_with_another() {
        let certs = TestCerts::new(&["127.0.0.1", "localhost"]);
        let Some(redis) = Redis::start_tls(&certs).await else { return };
        let url = redis.url();
        assert!(url.starts_with("rediss://"));
        let server = url.trim_start_matches("rediss://");
        let connect = async |tls: &ClientTls| RedisLockClient::builder(&url).tls(tls.clone()).connect().await;
        granted_with_its_ca_refused_with_another(&certs, server, connect).await;
        // The redis crate's `#insecure`: no certificate checked.
        let insecure = RedisLockClient::connect(&format!("{url}/#insecure")).await.unwrap();
        granted(&insecure, "insecure").await;
        // The system's roots do not know the test's CA.
        refused_for_its_certificate(timeout(BOUND, RedisLockClient::connect(&url)).await.unwrap(), server);
        // TLS settings with a URL that does not say TLS.
        let plain = url.replacen("rediss://", "redis://", 1);
        let tls = ClientTls::new().ca_file(&certs.ca_file).unwrap();
        match RedisLockClient::builder(&plain).tls(tls).connect().await {
            Err(LockError::InvalidArgument(e)) => assert!(e.contains("rediss://"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}

#[cfg(feature = "zookeeper-tls")]
mod zookeeper {
    use fencing_client::ZkLockClient;
    use test_support::ZooKeeper;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_grants_over_tls_with_its_ca_and_is_refused_with_another() {
        let certs = TestCerts::new(&["127.0.0.1", "localhost"]);
        let Some(zk) = ZooKeeper::start_tls(&certs).await else { return };
        let cluster = zk.tls_cluster();
        let server = cluster.trim_start_matches("tcp+tls://");
        let connect = async |tls: &ClientTls| ZkLockClient::connect_tls(&cluster, tls).await;
        granted_with_its_ca_refused_with_another(&certs, server, connect).await;
        // No CA, and a TLS server without TLS settings: refused before any connection.
        let no_ca = ZkLockClient::connect_tls(&cluster, &ClientTls::new()).await;
        assert!(
            matches!(&no_ca, Err(LockError::InvalidArgument(e)) if e.contains("needs a CA")),
            "{no_ca:?}"
        );
        let plain = ZkLockClient::connect(&cluster).await;
        assert!(
            matches!(&plain, Err(LockError::InvalidArgument(e)) if e.contains("connect_tls")),
            "{plain:?}"
        );
    }
}
