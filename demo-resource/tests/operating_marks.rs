//! Operating the marks of a real `demo-resource serve` process: the admin
//! listener (off by default, never the public one), the `marks` command on a
//! stopped service's data directory, the stale check from a reset mark, and
//! `--verify-key` on the command line.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use fencing_layer::verify::ProofSigner;
use reqwest::{Client, Method};
use serde_json::{Value, json};

const MAX: u64 = u64::MAX;

/// A running `demo-resource serve`; killed when dropped, so a failed assertion
/// never leaves it behind.
struct Server {
    child: Child,
    base: String,
    admin: Option<String>,
    /// Every stdout line after `listening on`, and all of stderr.
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_demo-resource"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("demo-resource starts");
        let (stdout, stderr) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(String::new())));
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let lines = Arc::clone(&stdout);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut err = child.stderr.take().unwrap();
        let text = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = err.read(&mut buffer) {
                text.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        let next = || rx.recv_timeout(Duration::from_secs(30)).expect("a line on stdout within 30 s");
        let line = next();
        let addr = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {line:?}"));
        let base = format!("http://{addr}");
        let admin = args.contains(&"--admin-listen").then(|| {
            let line = next();
            let addr =
                line.strip_prefix("admin listening on ").unwrap_or_else(|| panic!("second line: {line:?}"));
            format!("http://{addr}")
        });
        Self { child, base, admin, stdout, stderr }
    }

    fn admin(&self) -> &str {
        self.admin.as_deref().unwrap()
    }

    /// SIGTERM, then waits (at most 20 s) for a clean exit.
    fn stop(mut self) -> (Vec<String>, String) {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let start = Instant::now();
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(exit.success(), "serve exited with {exit}");
        // The reader threads end with the pipes; give them a moment to copy the last bytes.
        std::thread::sleep(Duration::from_millis(100));
        let stdout = self.stdout.lock().unwrap().clone();
        let stderr = self.stderr.lock().unwrap().clone();
        (stdout, stderr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> Client {
    Client::builder().no_proxy().timeout(Duration::from_secs(20)).build().unwrap()
}

#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    retry_after: Option<String>,
    body: Value,
}

impl Answer {
    fn problem(&self, status: u16, kind: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.content_type, "application/problem+json", "{self:?}");
        assert_eq!(self.body["status"], status, "{self:?}");
        let ty = self.body["type"].as_str().unwrap_or_default();
        assert!(ty.ends_with(&format!(":{kind}")), "expected type {kind}: {self:?}");
        assert!(self.body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{self:?}");
    }
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
    let content_type = header("content-type").unwrap_or_default();
    let retry_after = header("retry-after");
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer { status, content_type, retry_after, body }
}

async fn write(base: &str, method: Method, path: &str, token: u64, proof: Option<&str>) -> Answer {
    let mut request =
        client().request(method, format!("{base}{path}")).header("Fencing-Token", token.to_string());
    if let Some(proof) = proof {
        request = request.header("Fencing-Proof", proof);
    }
    send(request.body(format!("written with {token}"))).await
}

async fn get(url: String) -> Answer {
    send(client().get(url)).await
}

async fn reset(admin: &str, content_type: Option<&str>, body: impl Into<reqwest::Body>) -> Answer {
    let mut request = client().post(format!("{admin}/marks/reset"));
    if let Some(content_type) = content_type {
        request = request.header("Content-Type", content_type);
    }
    send(request.body(body)).await
}

/// Runs `demo-resource ARGS…` to completion.
fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_demo-resource")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn path(dir: &Path) -> &str {
    dir.to_str().unwrap()
}

#[tokio::test]
async fn admin_routes_list_read_and_reset_then_the_stale_check_works_from_the_new_mark() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&["--data-dir", path(dir.path()), "--admin-listen", "127.0.0.1:0"]);
    let (base, admin) = (server.base.clone(), server.admin().to_owned());
    assert_ne!(base, admin);

    // Without --verify-key a forged token bricks the key: the honest holder gets 409.
    assert_eq!(write(&base, Method::POST, "/logs/billing", MAX, None).await.status, 201);
    write(&base, Method::POST, "/logs/billing", 7, None).await.problem(409, "stale-token");
    assert_eq!(write(&base, Method::PUT, "/kv/k", 3, None).await.status, 201);

    // The admin routes are not on the public listener.
    get(format!("{base}/marks")).await.problem(404, "not-found");
    let json = r#"{"key": "/logs/billing", "to": 6}"#;
    reset(&base, Some("application/json"), json).await.problem(404, "not-found");

    let listed = get(format!("{admin}/marks")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(listed.content_type, "application/json");
    assert_eq!(
        listed.body,
        json!({"marks": [{"key": "/kv/k", "mark": 3}, {"key": "/logs/billing", "mark": MAX}]})
    );
    let one = get(format!("{admin}/marks?key=%2Flogs%2Fbilling")).await;
    assert_eq!(one.body, json!({"key": "/logs/billing", "mark": MAX}), "{one:?}");
    get(format!("{admin}/marks?key=%2Flogs%2Fnope")).await.problem(404, "unknown-key");
    get(format!("{admin}/marks?prefix=%2F")).await.problem(400, "bad-query");
    get(format!("{admin}/marks?key=a&key=b")).await.problem(400, "bad-query");

    // Bad resets: each a problem, none changes a mark.
    reset(&admin, None, json).await.problem(415, "unsupported-media-type");
    reset(&admin, Some("text/plain"), json).await.problem(415, "unsupported-media-type");
    for bad in [
        "",
        "{",
        "[]",
        r#"{"key": "/logs/billing"}"#,
        r#"{"to": 6}"#,
        r#"{"key": "/logs/billing", "to": -1}"#,
        r#"{"key": "/logs/billing", "to": 1.5}"#,
        r#"{"key": "/logs/billing", "to": "6"}"#,
        r#"{"key": "/logs/billing", "to": 18446744073709551616}"#,
        r#"{"key": "/logs/billing", "to": 6, "force": true}"#,
        r#"{"key": 7, "to": 6}"#,
    ] {
        reset(&admin, Some("application/json"), bad).await.problem(400, "bad-json");
    }
    let typo = reset(&admin, Some("application/json"), r#"{"key": "/logs/biling", "to": 6}"#).await;
    typo.problem(404, "unknown-key");
    let huge = format!(r#"{{"key": "{}", "to": 6}}"#, "x".repeat(20 * 1024));
    reset(&admin, Some("application/json"), huge).await.problem(413, "body-too-large");
    send(client().get(format!("{admin}/marks/reset"))).await.problem(405, "method-not-allowed");
    send(client().delete(format!("{admin}/marks"))).await.problem(405, "method-not-allowed");
    get(format!("{admin}/logs/billing")).await.problem(404, "not-found");
    let unchanged = get(format!("{admin}/marks?key=%2Flogs%2Fbilling")).await;
    assert_eq!(unchanged.body["mark"], MAX);

    // The repair.
    let answer = reset(&admin, Some("application/json; charset=utf-8"), json).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.retry_after.is_none());
    assert_eq!(answer.body, json!({"key": "/logs/billing", "old": MAX, "new": 6}));

    // The stale check carries on from the new mark.
    let stale = write(&base, Method::POST, "/logs/billing", 5, None).await;
    stale.problem(409, "stale-token");
    assert_eq!(stale.body["highest_token"], 6);
    assert_eq!(write(&base, Method::POST, "/logs/billing", 7, None).await.status, 201);
    write(&base, Method::POST, "/logs/billing", 6, None).await.problem(409, "stale-token");
    let after = get(format!("{admin}/marks?key=%2Flogs%2Fbilling")).await;
    assert_eq!(after.body["mark"], 7);

    let (_, stderr) = server.stop();
    // Logged by the store and by the route (with the peer).
    assert!(stderr.contains("fencing mark reset"), "{stderr}");
    assert!(stderr.contains("admin routes") && stderr.contains("peer"), "{stderr}");
    assert!(stderr.contains("old=18446744073709551615 new=6"), "{stderr}");

    // The reset and the raise after it are in the mark file.
    let got = cli(&["marks", "get", "/logs/billing", "--data-dir", path(dir.path())]);
    assert!(got.status.success(), "{got:?}");
    assert_eq!(text(&got.stdout), "/logs/billing 7\n");
}

#[tokio::test]
async fn the_marks_command_repairs_a_stopped_services_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = path(dir.path());
    // No --admin-listen: no admin listener, and no admin route on the public one.
    let server = Server::start(&["--data-dir", data]);
    assert!(server.admin.is_none());
    let base = server.base.clone();
    get(format!("{base}/marks")).await.problem(404, "not-found");
    assert_eq!(write(&base, Method::PUT, "/kv/k", MAX, None).await.status, 201);
    assert_eq!(write(&base, Method::POST, "/logs/a%20b", 3, None).await.status, 201);
    assert_eq!(write(&base, Method::POST, "/logs/line%0Abreak", 4, None).await.status, 201);
    write(&base, Method::PUT, "/kv/k", 9, None).await.problem(409, "stale-token");

    // While the service runs it holds the mark file: a clear refusal, naming it.
    let refused = cli(&["marks", "list", "--data-dir", data]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = text(&refused.stderr);
    let file = dir.path().join("marks.redb");
    assert!(stderr.contains(file.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("stop it first"), "{stderr}");

    let (stdout, _) = server.stop();
    assert!(stdout.iter().all(|line| !line.contains("admin")), "{stdout:?}");

    let list = cli(&["marks", "list", "--data-dir", data]);
    assert!(list.status.success(), "{list:?}");
    assert_eq!(text(&list.stdout), "/kv/k 18446744073709551615\n/logs/a b 3\n/logs/line\\nbreak 4\n");
    let list = cli(&["marks", "--json", "list", "--data-dir", data]);
    let listed: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(
        listed,
        json!({"marks": [
            {"key": "/kv/k", "mark": MAX},
            {"key": "/logs/a b", "mark": 3},
            {"key": "/logs/line\nbreak", "mark": 4},
        ]})
    );
    let got = cli(&["marks", "get", "/logs/a b", "--data-dir", data, "--json"]);
    assert_eq!(serde_json::from_slice::<Value>(&got.stdout).unwrap(), json!({"key": "/logs/a b", "mark": 3}));

    // Mistakes change nothing.
    for args in [
        &["marks", "get", "/kv/nope", "--data-dir", data][..],
        &["marks", "reset", "/kv/nope", "--to", "1", "--data-dir", data][..],
    ] {
        let failed = cli(args);
        assert_eq!(failed.status.code(), Some(1), "{args:?}: {failed:?}");
        assert!(text(&failed.stderr).contains("no mark for key \"/kv/nope\""), "{failed:?}");
        assert!(failed.stdout.is_empty());
    }
    for args in [
        &["marks", "reset", "/kv/k", "--data-dir", data][..],
        &["marks", "reset", "/kv/k", "--to", "-1", "--data-dir", data][..],
        &["marks", "reset", "/kv/k", "--to", "18446744073709551616", "--data-dir", data][..],
    ] {
        assert_eq!(cli(args).status.code(), Some(2), "{args:?}: usage error");
    }
    let elsewhere = dir.path().join("elsewhere");
    let missing = cli(&["marks", "list", "--data-dir", elsewhere.to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains(elsewhere.join("marks.redb").to_str().unwrap()), "{missing:?}");
    assert!(!elsewhere.exists(), "looking must not create a data directory");
    let list = cli(&["marks", "list", "--data-dir", data]);
    assert_eq!(text(&list.stdout), "/kv/k 18446744073709551615\n/logs/a b 3\n/logs/line\\nbreak 4\n");

    // The repair prints the old and the new mark, and logs it.
    let reset = cli(&["marks", "reset", "/kv/k", "--to", "10", "--data-dir", data]);
    assert!(reset.status.success(), "{reset:?}");
    assert_eq!(text(&reset.stdout), "/kv/k 18446744073709551615 -> 10\n");
    let log = text(&reset.stderr);
    assert!(log.contains("fencing mark reset") && log.contains("new=10"), "{log}");
    // The data's own fence of the path, checked in each write's transaction, is reset too.
    assert!(log.contains("data fence reset") && log.contains("old_fence=18446744073709551615"), "{log}");
    let again = cli(&["marks", "reset", "/kv/k", "--to", "10", "--json", "--data-dir", data]);
    assert_eq!(
        serde_json::from_slice::<Value>(&again.stdout).unwrap(),
        json!({"key": "/kv/k", "old": 10, "new": 10})
    );

    // The service, started again, fences from the new mark.
    let server = Server::start(&["--data-dir", data]);
    let stale = write(&server.base, Method::PUT, "/kv/k", 9, None).await;
    stale.problem(409, "stale-token");
    assert_eq!(stale.body["highest_token"], 10);
    assert_eq!(write(&server.base, Method::PUT, "/kv/k", 11, None).await.status, 200);
    server.stop();
    let got = cli(&["marks", "get", "/kv/k", "--data-dir", data]);
    assert_eq!(text(&got.stdout), "/kv/k 11\n");
}

#[tokio::test]
async fn serve_with_a_verify_key_refuses_forged_raises() {
    let dir = tempfile::tempdir().unwrap();
    let signer = ProofSigner::generate().unwrap();
    let (secret, public) = (dir.path().join("lock.key"), dir.path().join("lock.pub"));
    signer.write_key_pair(&secret, &public).unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--verify-key",
        public.to_str().unwrap(),
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = server.base.clone();
    let proof = signer.sign("billing", 5);
    assert_eq!(write(&base, Method::POST, "/logs/billing", 5, Some(&proof)).await.status, 201);
    let forged = write(&base, Method::POST, "/logs/billing", MAX, None).await;
    forged.problem(403, "unverified-token");
    assert_eq!(forged.body["key"], "/logs/billing");
    write(&base, Method::POST, "/logs/billing", 6, Some(&proof)).await.problem(403, "unverified-token");
    let other = ProofSigner::generate().unwrap().sign("billing", 6);
    write(&base, Method::POST, "/logs/billing", 6, Some(&other)).await.problem(403, "unverified-token");
    assert_eq!(write(&base, Method::POST, "/logs/billing", 5, None).await.status, 201);
    let marks = get(format!("{}/marks", server.admin())).await;
    assert_eq!(marks.body, json!({"marks": [{"key": "/logs/billing", "mark": 5}]}));
    server.stop();
}

#[test]
fn bad_flag_combinations_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let missing_key = dir.path().join("missing.pub");
    let missing_key = missing_key.to_str().unwrap();
    let serve = |args: &[&str]| {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        cli(&all)
    };

    let public = serve(&["--data-dir", data, "--admin-listen", "0.0.0.0:0"]);
    assert_eq!(public.status.code(), Some(1), "{public:?}");
    assert!(text(&public.stderr).contains("loopback"), "{public:?}");

    let unreadable = serve(&["--data-dir", data, "--verify-key", missing_key]);
    assert_eq!(unreadable.status.code(), Some(1), "{unreadable:?}");
    assert!(text(&unreadable.stderr).contains(missing_key), "{unreadable:?}");

    let not_a_key = dir.path().join("not-a-key.pub");
    std::fs::write(&not_a_key, "hello\n").unwrap();
    let bad = serve(&["--data-dir", data, "--verify-key", not_a_key.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(text(&bad.stderr).contains("not-a-key.pub"), "{bad:?}");

    for args in [
        &["--data-dir", data, "--no-fencing", "--admin-listen", "127.0.0.1:0"][..],
        &["--data-dir", data, "--no-fencing", "--verify-key", missing_key][..],
        &["--postgres", "postgres://postgres@127.0.0.1/x", "--admin-listen", "127.0.0.1:0"][..],
    ] {
        let refused = serve(args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {refused:?}");
        assert!(text(&refused.stderr).contains("cannot be used with"), "{refused:?}");
    }
    assert!(!Path::new(data).exists(), "no refused start creates the data directory");
}
