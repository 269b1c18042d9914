//! `demo-resource serve --postgres URL` against a PostgreSQL that accepts only TLS (test-support's
//! `OwnPg::start_tls`, certificates made here): with `sslmode=verify-full&sslrootcert=ca.pem`, each
//! write fenced in its transaction, then with `--shared-marks` (the replica's claims sessions over
//! TLS too), answers a fenced write and refuses a stale one; a URL whose host the certificate does
//! not name stops the process at start-up, saying so.
//!
//! Without PostgreSQL's server binaries the test prints SKIPPED and passes, unless `CI=true`.

use std::process::{Command, Stdio};

use test_support::{ChildServer, OwnPg, TestCerts};

use crate::common::{Answer, client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_postgres_over_verified_tls_in_transactions_and_with_shared_marks() {
    let certs = TestCerts::new(&["127.0.0.1", "localhost"]);
    let Some(pg) = OwnPg::start_tls(&certs) else { return };
    let ca = certs.ca_file.display();
    let url =
        format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={ca}", pg.port);
    let http = client();
    for (name, args) in [("in-transaction", &[][..]), ("shared-marks", &["--shared-marks"][..])] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
        command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &url]).args(args);
        let server = ChildServer::start(command.env("RUST_LOG", "error").stderr(Stdio::inherit()));
        let log = format!("{}/logs/tls-{name}", server.base());
        let written = Answer::of(http.post(&log).header("Fencing-Token", 2).body("over TLS")).await;
        assert_eq!(written.status, 201, "{name}: {written:?}");
        Answer::of(http.post(&log).header("Fencing-Token", 1).body("stale"))
            .await
            .problem(409, "stale-token");
        let read = Answer::of(http.get(&log)).await;
        assert_eq!(read.body["entries"][0]["value"], "over TLS", "{name}: {read:?}");
    }

    // A host the certificate does not name (the address given apart): refused at start-up.
    let wrong = format!(
        "postgres://postgres@127.0.0.2:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={ca}",
        pg.port
    );
    for args in [&[][..], &["--shared-marks"][..]] {
        let refused = Command::new(env!("CARGO_BIN_EXE_demo-resource"))
            .args(["serve", "--listen", "127.0.0.1:0", "--postgres", &wrong])
            .args(args)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{stderr}");
        let named = format!(
            "TLS: the server's certificate is not valid for 127.0.0.2, only for 127.0.0.1 and localhost \
             (sslmode=verify-full, sslrootcert={ca})"
        );
        assert!(stderr.contains(&named), "{stderr}");
    }
}
