//! The layer's contract at the gate, and what the gate forwards.

use std::time::Duration;

use demo_lock_service::{Config, LockService};

use crate::common::{Gate, Upstream, send};

/// The seed's story through the gate: A's lease runs out while A is paused; B
/// takes the lock and writes; A wakes and writes with its old token. The gate
/// refuses A's write, and the upstream never sees it.
#[tokio::test]
async fn a_paused_holders_late_write_is_refused_at_the_gate_and_never_reaches_the_upstream() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let dir = tempfile::tempdir().unwrap();
    let locks = LockService::open(Config::new(dir.path())).unwrap();
    let a = locks.acquire("files/report", "A", Duration::from_millis(200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // A is paused past its lease
    let b = locks.acquire("files/report", "B", Duration::from_secs(30)).await.unwrap();
    assert!(b.token > a.token);
    let written = send(&gate, "PUT", "/files/report", Some(b.token), "B: write under valid lease").await;
    assert_eq!(written.status, 200, "{written:?}");
    let late = send(&gate, "PUT", "/files/report", Some(a.token), "A: write from expired lease").await;
    assert_eq!(late.status, 409, "{late:?}");
    assert_eq!(late.headers["fencing-problem"], "stale-token");
    assert_eq!(late.headers["fencing-highest-token"], b.token.to_string().as_str());
    assert_eq!(late.problem()["presented_token"], a.token);
    let writes = upstream.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        (writes[0].token.as_str(), writes[0].body.as_str()),
        (&*b.token.to_string(), "B: write under valid lease")
    );
    // Reads pass through unfenced, and see B's write.
    let read = send(&gate, "GET", "/files/report", None, "").await;
    assert!(read.body.contains("B: write under valid lease"), "{read:?}");
}

#[tokio::test]
async fn the_contracts_refusals_come_from_the_gate() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let missing = send(&gate, "POST", "/logs/a", None, "x").await;
    assert_eq!(
        (missing.status, missing.problem()["type"].as_str()),
        (428, Some("urn:fencing:problem:missing-token"))
    );
    for bad in ["abc", "-1", "007", "18446744073709551616"] {
        let reply = reqwest::Client::new()
            .post(gate.url("/logs/a"))
            .header("fencing-token", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 400, "{bad}");
    }
    assert!(upstream.writes().is_empty(), "{:?}", upstream.writes());
}

#[tokio::test]
async fn hop_by_hop_fields_go_and_forwarding_fields_are_the_gates() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let reply = reqwest::Client::new()
        .get(gate.url("/headers"))
        .header("connection", "x-secret")
        .header("x-secret", "1")
        .header("x-forwarded-for", "6.6.6.6")
        .header("forwarded", "for=6.6.6.6")
        .header("if-match", "\"v1\"")
        .header("fencing-token", "3")
        .send()
        .await
        .unwrap();
    let seen: serde_json::Value = serde_json::from_str(&reply.text().await.unwrap()).unwrap();
    let seen: std::collections::HashMap<String, String> = seen
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().unwrap().to_owned()))
        .collect();
    assert!(!seen.contains_key("x-secret"), "{seen:?}");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1", "an untrusted peer's value is replaced");
    assert_eq!(seen["forwarded"], "for=127.0.0.1;proto=http");
    assert_eq!(seen["if-match"], "\"v1\"");
    assert_eq!(seen["fencing-token"], "3");
}

#[tokio::test]
async fn h2c_requests_are_fenced_alike() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let stream = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let mut statuses = Vec::new();
    for token in ["8", "7"] {
        let request = http::Request::post(gate.url("/h2/doc"))
            .header("fencing-token", token)
            .body(Full::new(bytes::Bytes::from(format!("over h2c with {token}"))))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        statuses.push(response.status().as_u16());
        response.into_body().collect().await.unwrap();
    }
    assert_eq!(statuses, [200, 409]);
    let writes = upstream.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].body, "over h2c with 8");
}

#[test]
fn check_config_names_the_line_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gate.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:8000\"\n\n[timeouts]\nupstrem_ms = 10\n",
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_fencing-gate"))
        .arg("--check-config")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("line 5") && stderr.contains("unknown field `upstrem_ms`"), "{stderr}");
    std::fs::write(&file, "listen = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:8000\"\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_fencing-gate"))
        .arg("--check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(output.status.success());
}

#[tokio::test]
async fn routes_key_by_template_or_header_and_pass_some_through() {
    let upstream = Upstream::start();
    let gate = Gate::start(
        &upstream.url(),
        r#"
[[route]]
path = "/accounts/{id}/{*rest}"
key = "account:{id}"

[[route]]
path = "/tenants/{*rest}"
key_header = "x-tenant"
methods = ["POST"]

[[route]]
path = "/health"
fenced = false
"#,
    );
    assert_eq!(send(&gate, "POST", "/accounts/7/ledger", Some(3), "a").await.status, 200);
    // Another path of the same account is the same key.
    assert_eq!(send(&gate, "PUT", "/accounts/7/profile", Some(2), "b").await.status, 409);
    assert_eq!(send(&gate, "PUT", "/accounts/8/profile", Some(2), "c").await.status, 200);
    let tenant = |token: u64, tenant: &'static str, method: &'static str| {
        let request = reqwest::Client::new()
            .request(method.parse().unwrap(), gate.url("/tenants/x"))
            .header("fencing-token", token)
            .header("x-tenant", tenant);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(tenant(4, "acme", "POST").await, 200);
    assert_eq!(tenant(3, "acme", "POST").await, 409);
    assert_eq!(tenant(3, "other", "POST").await, 200);
    assert_eq!(tenant(1, "acme", "PUT").await, 200, "PUT is not fenced on this route");
    let no_header = send(&gate, "POST", "/tenants/x", Some(9), "").await;
    assert_eq!(no_header.status, 400);
    assert!(no_header.problem()["detail"].as_str().unwrap().contains("x-tenant"), "{no_header:?}");
    assert_eq!(send(&gate, "POST", "/health", None, "").await.status, 200, "a pass-through route");
}

#[tokio::test]
async fn a_raise_needs_the_lock_services_proof_when_a_key_is_configured() {
    use fencing_layer::verify::ProofSigner;
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let signer = ProofSigner::generate().unwrap();
    let (secret, public) = (dir.path().join("lock.key"), dir.path().join("lock.pub"));
    signer.write_key_pair(&secret, &public).unwrap();
    let gate = Gate::start(&upstream.url(), &format!("[fencing]\nverify_key = {public:?}"));
    let forged = send(&gate, "POST", "/files/v", Some(u64::MAX), "forged").await;
    assert_eq!(forged.status, 403, "{forged:?}");
    let proof = signer.sign("/files/v", 5);
    let proved = reqwest::Client::new()
        .post(gate.url("/files/v"))
        .header("fencing-token", "5")
        .header("fencing-proof", proof)
        .body("proved")
        .send()
        .await
        .unwrap();
    assert_eq!(proved.status(), 200);
    let tokens: Vec<_> = upstream.writes().into_iter().map(|w| w.token).collect();
    assert_eq!(tokens, ["5"]);
}

#[tokio::test]
async fn the_key_table_and_the_connections_are_bounded() {
    let upstream = Upstream::start();
    let gate = Gate::start(
        &upstream.url(),
        "[marks]\nkind = \"memory\"\nmax_keys = 1\n[limits]\nmax_connections = 1",
    );
    assert_eq!(send(&gate, "POST", "/a", Some(1), "").await.status, 200);
    let full = send(&gate, "POST", "/b", Some(1), "").await;
    assert_eq!(
        (full.status, full.problem()["type"].as_str()),
        (503, Some("urn:fencing:problem:key-table-full"))
    );
    // One connection held open: the next one is not served until it closes.
    let held = std::net::TcpStream::connect(gate.addr).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = tokio::spawn(async move {
        let started = std::time::Instant::now();
        reqwest::get(gate.url("/a")).await.unwrap();
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(held);
    let waited = waiting.await.unwrap();
    assert!(waited >= Duration::from_millis(450), "served beside the held connection after {waited:?}");
}
