//! PostgreSQL over TLS, against a server of the test's own that accepts ONLY TLS (test-support's
//! `OwnPg::start_tls`: `ssl = on`, `hostnossl … reject`), with certificates made here: a CA, a
//! server certificate it signed for 127.0.0.1 and localhost, and another CA.
//!
//! - plain TCP (`sslmode=disable`) is refused, and the error says why (the server's
//!   `pg_hba.conf` line, "no encryption");
//! - `prefer` (the default, a `tokio_postgres::Config` too) and `require` connect, encrypted;
//! - `verify-full` with the CA connects to 127.0.0.1, in both forms of connection string;
//! - `verify-full` for a name the certificate does not have (127.0.0.2, db.example.test, the
//!   address given apart as `hostaddr`) is refused, and the error names the name; `verify-ca`
//!   takes the same certificate;
//! - the wrong CA is refused by `verify-full`, `verify-ca` and `require` with that `sslrootcert`
//!   (libpq's rule), and the error names the CA file;
//! - through the pool, `PgSharedStore` and `PgLockClient`, over `verify-full`: a fence commits,
//!   the store's session opens and grants a claim, the lock client grants a token; and their
//!   errors for a refused certificate name it.
//!
//! Without PostgreSQL's server binaries these tests print SKIPPED and pass, unless `CI=true`.

use std::path::Path;
use std::time::Duration;

use fencing_client::{LockBackendExt, PgLockClient};
use fencing_layer::store::SharedStore;
use fencing_postgres::connect::{SslMode, describe_error};
use fencing_postgres::{FenceError, PgConnect, PgFence, PgSharedStore, PoolLimits};
use test_support::{BOUND, OwnPg, TestCerts};

/// The server's certificate is for these names only.
const NAMES: &[&str] = &["127.0.0.1", "localhost"];

/// `postgres://postgres@HOST:PORT/postgres?QUERY`, where HOST may differ from the address
/// connected to (`hostaddr=127.0.0.1` in `query`).
fn url(pg: &OwnPg, host: &str, query: &str) -> String {
    format!("postgres://postgres@{host}:{}/postgres?connect_timeout=5&{query}", pg.port)
}

/// `query` with `sslrootcert=` the file, percent-encoded as a URL's query wants it.
fn root(file: &Path) -> String {
    let path = file.display().to_string();
    format!("sslrootcert={}", path.replace('%', "%25").replace('&', "%26").replace(' ', "%20"))
}

/// Connects with `conninfo`: whether the session is encrypted, or the error as a person reads it.
async fn try_connect(conninfo: &str) -> Result<bool, String> {
    let connect: PgConnect = conninfo.parse().map_err(|e| format!("{e}"))?;
    encrypted(&connect).await
}

async fn encrypted(connect: &PgConnect) -> Result<bool, String> {
    let connecting = tokio::time::timeout(BOUND, connect.connect()).await.expect("connects or fails in time");
    let (client, connection) = connecting.map_err(|e| describe_error(&e))?;
    tokio::spawn(connection);
    let row = client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await;
    Ok(row.map_err(|e| describe_error(&e))?.get(0))
}

#[tokio::test]
async fn only_tls_gets_in_and_each_sslmode_checks_what_it_says() {
    let certs = TestCerts::new(NAMES);
    let Some(pg) = OwnPg::start_tls(&certs) else { return };
    let (ca, other_ca) = (root(&certs.ca_file), root(&certs.other_ca_file));

    // (a) Plain TCP: the server refuses it, and says so.
    let refused = try_connect(&url(&pg, "127.0.0.1", "sslmode=disable")).await.unwrap_err();
    assert!(refused.contains("pg_hba.conf") && refused.contains("no encryption"), "{refused}");
    eprintln!("sslmode=disable: {refused}");

    // (b) No check: prefer (the default, in a string or a Config) and require encrypt.
    for query in ["sslmode=prefer", "sslmode=require", ""] {
        assert_eq!(try_connect(&url(&pg, "127.0.0.1", query)).await, Ok(true), "{query}");
    }
    // A Config of the driver's, its sslmode left at the driver's default.
    let config: tokio_postgres::Config =
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", pg.port).parse().unwrap();
    assert_eq!(PgConnect::from(config.clone()).ssl_mode(), SslMode::Prefer);
    assert_eq!(encrypted(&PgConnect::from(config)).await, Ok(true), "a Config, sslmode=prefer");
    // require checks nothing: not the name, not the CA.
    let anyone = url(&pg, "127.0.0.2", "hostaddr=127.0.0.1&sslmode=require");
    assert_eq!(try_connect(&anyone).await, Ok(true));

    // (c) verify-full with the CA, to the name in the certificate, in both forms.
    let full = format!("sslmode=verify-full&{ca}");
    assert_eq!(try_connect(&url(&pg, "127.0.0.1", &full)).await, Ok(true));
    let localhost = format!("hostaddr=127.0.0.1&{full}");
    assert_eq!(try_connect(&url(&pg, "localhost", &localhost)).await, Ok(true));
    let pairs = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert='{}'",
        pg.port,
        certs.ca_file.display()
    );
    assert_eq!(try_connect(&pairs).await, Ok(true), "{pairs}");

    // (d) verify-full to a name the certificate does not have: refused, the name named.
    for host in ["127.0.0.2", "db.example.test"] {
        let wrong = try_connect(&url(&pg, host, &format!("hostaddr=127.0.0.1&{full}"))).await.unwrap_err();
        let expected = format!(
            "TLS: the server's certificate is not valid for {host}, only for 127.0.0.1 and localhost \
             (sslmode=verify-full, sslrootcert={})",
            certs.ca_file.display()
        );
        assert_eq!(wrong, expected);
    }
    // verify-ca checks the chain only: the same certificate, any name.
    let chain_only = format!("hostaddr=127.0.0.1&sslmode=verify-ca&{ca}");
    assert_eq!(try_connect(&url(&pg, "127.0.0.2", &chain_only)).await, Ok(true));

    // (e) Another CA: refused by every mode that checks the chain (require too, given a CA).
    for mode in ["verify-full", "verify-ca", "require"] {
        let wrong_ca = try_connect(&url(&pg, "127.0.0.1", &format!("sslmode={mode}&{other_ca}"))).await;
        let wrong_ca = wrong_ca.unwrap_err();
        let expected = format!(
            "TLS: the server's certificate is not signed by a CA in sslrootcert={path} \
             (sslmode={mode}, sslrootcert={path})",
            path = certs.other_ca_file.display()
        );
        assert_eq!(wrong_ca, expected);
    }
    // No sslrootcert: the system's CAs, which never signed this test's certificate.
    match try_connect(&url(&pg, "127.0.0.1", "sslmode=verify-full")).await {
        Err(refused) => assert!(refused.contains("the system's trust store"), "{refused}"),
        Ok(encrypted) => panic!("a certificate of the test's own CA taken (encrypted: {encrypted})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_the_shared_store_and_the_lock_client_work_over_verified_tls() {
    let certs = TestCerts::new(NAMES);
    let Some(pg) = OwnPg::start_tls(&certs) else { return };
    let verified = url(&pg, "127.0.0.1", &format!("sslmode=verify-full&{}", root(&certs.ca_file)));
    let connect: PgConnect = verified.parse().unwrap();

    // A fence through the pool, committed.
    let pool = fencing_postgres::pool(connect.clone(), PoolLimits::default()).unwrap();
    let fence = PgFence::new();
    let mut client = pool.get().await.unwrap();
    fence.migrate(&client).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let fenced = fence.fence(&tx, "/tls/doc", 7).await.unwrap();
    assert_eq!((fenced.previous, fenced.token), (0, 7));
    tx.commit().await.unwrap();
    let ssl: bool = client
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(ssl, "the pool's connection is encrypted");
    drop(client);

    // The shared store: its two sessions (renewals, hints) open over TLS, and a claim is granted.
    let store = PgSharedStore::new(pool.clone(), connect.clone(), PgFence::new());
    store.migrate().await.unwrap();
    tokio::time::timeout(BOUND, store.ready()).await.unwrap().unwrap();
    let permit = store.admit("/tls/job", 3, Duration::from_secs(5)).await.expect("a claim on token 3");
    drop(permit);
    let sessions: i64 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE NOT ssl AND backend_type = 'client backend'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(sessions, 0, "every session is encrypted");

    // (g) PgLockClient, from the same URL: a token.
    let locks = PgLockClient::connect(&verified).unwrap();
    locks.migrate().await.unwrap();
    let lease = locks.lease("tls-report", "worker-1", Duration::from_secs(10)).await.unwrap();
    assert!(lease.token() >= 1);
    lease.release().await.unwrap();

    // A certificate for another name: each says so, not "error performing TLS handshake".
    let wrong =
        url(&pg, "127.0.0.2", &format!("hostaddr=127.0.0.1&sslmode=verify-full&{}", root(&certs.ca_file)));
    let named = "the server's certificate is not valid for 127.0.0.2, only for 127.0.0.1 and localhost";
    let pool = fencing_postgres::pool(wrong.parse::<PgConnect>().unwrap(), PoolLimits::default()).unwrap();
    let refused = FenceError::from(pool.get().await.unwrap_err()).to_string();
    assert!(refused.contains(named) && !refused.contains("error performing"), "{refused}");
    eprintln!("the pool: {refused}");
    let store = PgSharedStore::new(pool, wrong.parse::<PgConnect>().unwrap(), PgFence::new());
    assert!(store.migrate().await.unwrap_err().to_string().contains(named));
    let locks = PgLockClient::connect(&wrong).unwrap();
    let refused = locks.migrate().await.unwrap_err().to_string();
    assert!(refused.contains(named) && !refused.contains("error performing"), "{refused}");
    eprintln!("the lock client: {refused}");
}
