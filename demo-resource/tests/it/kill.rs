//! `kill -9` a real `demo-resource serve` process and restart it on the same data
//! directory: raised marks and acknowledged writes are still there.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::Client;
use serde_json::{Value, json};
use test_support::ChildServer;

/// A running `demo-resource serve` on `data_dir` (test-support's child server:
/// SIGKILLed when dropped, so a failed assertion never leaves it behind).
fn start(data_dir: &Path) -> ChildServer {
    start_with(&[std::ffi::OsStr::new("--data-dir"), data_dir.as_os_str()])
}

/// A running `demo-resource serve` with `args`.
fn start_with(args: &[impl AsRef<std::ffi::OsStr>]) -> ChildServer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
    command.args(["serve", "--listen", "127.0.0.1:0"]).args(args).env("RUST_LOG", "warn");
    ChildServer::start(command.stderr(Stdio::null()))
}

fn client() -> Client {
    Client::builder().no_proxy().timeout(Duration::from_secs(20)).build().unwrap()
}

/// Polls `/healthz` a bounded number of times.
async fn healthy(http: &Client, server: &ChildServer) {
    for _ in 0..100 {
        if let Ok(response) = http.get(format!("{}/healthz", server.base())).send().await
            && response.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never became healthy", server.base());
}

async fn write(
    http: &Client,
    method: &str,
    url: String,
    token: u64,
    body: impl Into<Vec<u8>>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let response =
        http.request(method, url).header("Fencing-Token", token).body(body.into()).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn read(http: &Client, url: String) -> (u16, Value) {
    let response = http.get(url).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn marks_and_acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();

    let mut server = start(dir.path());
    healthy(&http, &server).await;
    let base = server.base();
    assert_eq!(write(&http, "POST", format!("{base}/logs/audit"), 3, "one").await.0, 201);
    assert_eq!(write(&http, "POST", format!("{base}/logs/audit"), 3, "two").await.0, 201);
    assert_eq!(write(&http, "PUT", format!("{base}/kv/owner"), 3, "A").await.0, 201);
    assert_eq!(write(&http, "POST", format!("{base}/logs/audit"), 7, "three").await.0, 201);
    // A raise without data: the layer admits token 9 (raising the mark on disk),
    // then the handler refuses the invalid UTF-8 body.
    assert_eq!(write(&http, "PUT", format!("{base}/kv/owner"), 9, vec![0xff]).await.0, 400);
    assert_eq!(write(&http, "POST", format!("{base}/logs/audit"), 3, "stale").await.0, 409);
    server.kill_9();

    let mut server = start(dir.path());
    healthy(&http, &server).await;
    let base = server.base();
    // The stale tokens are still refused, naming the marks from before the crash.
    let (status, problem) = write(&http, "POST", format!("{base}/logs/audit"), 3, "stale").await;
    assert_eq!((status, &problem["highest_token"]), (409, &json!(7)), "{problem}");
    let (status, problem) = write(&http, "PUT", format!("{base}/kv/owner"), 8, "B").await;
    assert_eq!((status, &problem["highest_token"]), (409, &json!(9)), "{problem}");
    // Every acknowledged write is there, nothing else.
    assert_eq!(
        read(&http, format!("{base}/logs/audit")).await,
        (
            200,
            json!({"entries": [
                {"token": 3, "value": "one"},
                {"token": 3, "value": "two"},
                {"token": 7, "value": "three"},
            ]})
        )
    );
    assert_eq!(
        read(&http, format!("{base}/kv/owner")).await,
        (200, json!({"key": "owner", "token": 3, "value": "A"}))
    );
    // The current holder still writes.
    assert_eq!(write(&http, "POST", format!("{base}/logs/audit"), 7, "four").await.0, 201);
    assert_eq!(write(&http, "PUT", format!("{base}/kv/owner"), 9, "C").await.0, 200);
    server.kill_9();

    // And once more, with the writes made after the first restart.
    let server = start(dir.path());
    healthy(&http, &server).await;
    let base = server.base();
    let (_, log) = read(&http, format!("{base}/logs/audit")).await;
    let values: Vec<&str> =
        log["entries"].as_array().unwrap().iter().map(|e| e["value"].as_str().unwrap()).collect();
    assert_eq!(values, ["one", "two", "three", "four"]);
    assert_eq!(read(&http, format!("{base}/kv/owner")).await.1["value"], "C");
    assert_eq!(write(&http, "POST", format!("{base}/logs/audit"), 6, "stale").await.0, 409);
    drop(server);
}

#[tokio::test]
async fn in_memory_forgets_everything_on_restart() {
    let http = client();
    let mut server = start_with(&["--in-memory"]);
    healthy(&http, &server).await;
    let base = server.base();
    assert_eq!(write(&http, "POST", format!("{base}/logs/l"), 5, "lost").await.0, 201);
    assert_eq!(write(&http, "POST", format!("{base}/logs/l"), 4, "stale").await.0, 409);
    server.kill_9();

    let server = start_with(&["--in-memory"]);
    healthy(&http, &server).await;
    let base = server.base();
    assert_eq!(read(&http, format!("{base}/logs/l")).await.0, 404);
    assert_eq!(write(&http, "POST", format!("{base}/logs/l"), 4, "accepted again").await.0, 201);
}

#[tokio::test]
async fn a_second_process_cannot_open_a_data_dir_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let server = start(dir.path());
    healthy(&http, &server).await;
    let mut second = Command::new(env!("CARGO_BIN_EXE_demo-resource"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut exit = None;
    for _ in 0..200 {
        exit = second.try_wait().unwrap();
        if exit.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = second.kill();
    let _ = second.wait();
    let exit = exit.expect("the second process exits instead of serving");
    assert!(!exit.success());
    drop(server);
}
