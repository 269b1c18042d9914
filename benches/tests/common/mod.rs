//! What the tests running `fencing-load` as a program share: a server on
//! `127.0.0.1:0` in the test process, and one bounded run of the binary.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use serde_json::Value;

/// Serves `router` on an ephemeral loopback port until the test's runtime ends.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// What one run of the binary gave: exit code, stdout, stderr and its `--json` report.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub json: Value,
}

/// One round of one second, no warm-up: these runs check the tool, they measure nothing.
pub const ONE_SECOND: [&str; 6] = ["--duration", "1", "--rounds", "1", "--warmup-ms", "0"];

/// Runs `fencing-load` with `args` and `--json` (30 s at most).
pub async fn fencing_load(args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("report.json");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencing-load"))
        .args(args)
        .arg("--json")
        .arg(&json_path)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output).await.expect("a bounded run").unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let json = std::fs::read_to_string(&json_path).map_or(Value::Null, |s| serde_json::from_str(&s).unwrap());
    Run { code: output.status.code(), stdout, stderr, json }
}

/// The number at `pointer` in `json`.
pub fn f64_at(json: &Value, pointer: &str) -> f64 {
    json.pointer(pointer).and_then(Value::as_f64).unwrap_or_else(|| panic!("{pointer} in {json:#}"))
}
