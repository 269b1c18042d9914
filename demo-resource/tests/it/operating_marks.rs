//! Operating the marks of a real `demo-resource serve` process: the admin
//! listener (off by default, never the public one), the `marks` command on a
//! stopped service's data directory, the stale check from a reset mark, and
//! `--verify-key` on the command line.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use fencing_layer::verify::ProofSigner;
use reqwest::Method;
use serde_json::{Value, json};
use test_support::ChildServer;

use crate::common::{Answer, client};

const MAX: u64 = u64::MAX;

/// A running `demo-resource serve` (test-support's child server, killed when
/// dropped), and its admin listener's address when it has one.
struct Server {
    process: ChildServer,
    base: String,
    admin: Option<String>,
}

impl Server {
    fn start(args: &[&str]) -> Self {
        let process = ChildServer::start(
            Command::new(env!("CARGO_BIN_EXE_demo-resource"))
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(args)
                .env("RUST_LOG", "warn")
                .stderr(Stdio::piped()),
        );
        let admin = args.contains(&"--admin-listen").then(|| {
            let line = process.next_line();
            let addr =
                line.strip_prefix("admin listening on ").unwrap_or_else(|| panic!("second line: {line:?}"));
            format!("http://{addr}")
        });
        Self { base: process.base(), process, admin }
    }

    fn admin(&self) -> &str {
        self.admin.as_deref().unwrap()
    }

    /// SIGTERM, then waits for a clean exit: every stdout line after `listening on`, and all of stderr.
    fn stop(mut self) -> (Vec<String>, String) {
        let exit = self.process.terminate();
        assert!(exit.success(), "serve exited with {exit}");
        (self.process.stdout_lines(), self.process.stderr())
    }
}

async fn write(base: &str, method: Method, path: &str, token: u64, proof: Option<&str>) -> Answer {
    let mut request =
        client().request(method, format!("{base}{path}")).header("Fencing-Token", token.to_string());
    if let Some(proof) = proof {
        request = request.header("Fencing-Proof", proof);
    }
    Answer::of(request.body(format!("written with {token}"))).await
}

async fn get(url: String) -> Answer {
    Answer::of(client().get(url)).await
}

async fn reset(admin: &str, content_type: Option<&str>, body: impl Into<reqwest::Body>) -> Answer {
    let mut request = client().post(format!("{admin}/marks/reset"));
    if let Some(content_type) = content_type {
        request = request.header("Content-Type", content_type);
    }
    Answer::of(request.body(body)).await
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
    Answer::of(client().get(format!("{admin}/marks/reset"))).await.problem(405, "method-not-allowed");
    Answer::of(client().delete(format!("{admin}/marks"))).await.problem(405, "method-not-allowed");
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
