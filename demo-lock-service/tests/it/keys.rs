//! The binary's `keygen` subcommand and the `--signing-key` and `--max-leases` flags,
//! run as a real process on 127.0.0.1.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use fencing_layer::verify::{Ed25519Verifier, ProofPublicKey};
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::ChildServer;

const BIN: &str = env!("CARGO_BIN_EXE_demo-lock-service");

fn keygen(secret: &Path, public: &Path) -> Output {
    Command::new(BIN)
        .arg("keygen")
        .arg("--secret")
        .arg(secret)
        .arg("--public")
        .arg(public)
        .env("RUST_LOG", "off")
        .output()
        .expect("run demo-lock-service keygen")
}

/// A child `demo-lock-service serve` with `args` (test-support's child server,
/// SIGKILLed when dropped) and its base URL.
fn serve(args: &[&std::ffi::OsStr]) -> (ChildServer, String) {
    let mut command = Command::new(BIN);
    command.args(["--listen", "127.0.0.1:0"]).args(args).env("RUST_LOG", "error");
    let server = ChildServer::start(command.stdin(Stdio::null()).stderr(Stdio::null()));
    let base = server.base();
    (server, base)
}

async fn acquire(base: &str, name: &str) -> (StatusCode, Option<String>, Value) {
    let c = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    let r = c
        .post(format!("{base}/v1/leases"))
        .json(&json!({"name": name, "holder": "h", "ttl_ms": 60_000}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, r.json().await.unwrap())
}

#[test]
fn keygen_writes_a_pair_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, public) = (dir.path().join("lock.key"), dir.path().join("lock.pub"));
    let out = keygen(&secret, &public);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let key = ProofPublicKey::read(&public).unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&key.to_base64()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let (secret_before, public_before) = (std::fs::read(&secret).unwrap(), std::fs::read(&public).unwrap());

    // Both exist, only the secret exists, only the public exists: refused, nothing written.
    let fresh = dir.path().join("fresh");
    for (s, p) in [(&secret, &public), (&secret, &fresh), (&fresh, &public)] {
        let out = keygen(s, p);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("exists") && stderr.contains("never overwrites"), "{stderr}");
        assert!(!fresh.exists(), "a refused keygen wrote {}", fresh.display());
    }
    assert_eq!(std::fs::read(&secret).unwrap(), secret_before);
    assert_eq!(std::fs::read(&public).unwrap(), public_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_key_flag_signs_every_grant_and_max_leases_bounds_them() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, public) = (dir.path().join("lock.key"), dir.path().join("lock.pub"));
    assert!(keygen(&secret, &public).status.success());
    let data = dir.path().join("data");
    let (_proc, base) = serve(&[
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--signing-key".as_ref(),
        secret.as_os_str(),
        "--max-leases".as_ref(),
        "2".as_ref(),
    ]);
    let verifier = Ed25519Verifier::new(ProofPublicKey::read(&public).unwrap());
    for name in ["a", "b"] {
        let (status, _, body) = acquire(&base, name).await;
        assert_eq!(status, StatusCode::CREATED);
        let token = body["token"].as_u64().unwrap();
        let proof = body["proof"].as_str().unwrap();
        assert_eq!(verifier.check(name, token, proof), Ok(()));
        assert!(verifier.check("c", token, proof).is_err());
    }
    let (status, retry_after, body) = acquire(&base, "c").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["type"], "urn:fencing:problem:lease-table-full");
    assert_eq!(retry_after.as_deref(), Some("60"));

    // A missing key file stops the service at start-up with a clear error.
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--signing-key"])
        .arg(dir.path().join("missing.key"))
        .arg("--data-dir")
        .arg(dir.path().join("data2"))
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.key"));
}
