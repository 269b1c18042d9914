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
