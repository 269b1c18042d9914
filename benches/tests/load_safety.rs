//! `fencing-load` against a service it must not harm and whose answers it must
//! not misreport (issue 36): keys of the run's own, the refusal of real keys,
//! `--first-token`, `--start-above-mark`, the 409 warning, and exit 3 when a
//! run measured nothing (connection refused, a 404 route). The binary runs
//! against axum servers in this test process on `127.0.0.1:0`; every run is at
//! most one second of loopback traffic on two or three connections.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use common::{ONE_SECOND, f64_at, fencing_load, serve};
use fencing_layer::FencingLayer;
use http::{HeaderMap, StatusCode, Uri};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What a server's handler saw: per path, each token, in order of arrival.
type Seen = Arc<Mutex<BTreeMap<String, Vec<u64>>>>;

/// `POST /api/docs/{name}`, recording what reaches the handler; behind a default
/// [`FencingLayer`] when `fenced` (then only admitted requests reach it).
async fn recording(fenced: bool) -> (SocketAddr, Seen) {
    async fn record(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> StatusCode {
        let token: Option<u64> = headers.get("fencing-token").and_then(|v| v.to_str().ok()?.parse().ok());
        seen.lock().unwrap().entry(uri.path().to_owned()).or_default().extend(token);
        StatusCode::CREATED
    }
    let seen = Seen::default();
    let routes = Router::new().route("/api/docs/{name}", post(record));
    let routes = if fenced { routes.route_layer(FencingLayer::new()) } else { routes };
    (serve(routes.with_state(Arc::clone(&seen))).await, seen)
}

/// One `POST path` with `Fencing-Token: token`, by hand; its status.
async fn post_token(addr: SocketAddr, path: &str, token: u64) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nfencing-token: {token}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer[9..12].parse().unwrap()
}

fn seen(seen: &Seen) -> BTreeMap<String, Vec<u64>> {
    seen.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_without_key_is_refused_unless_real_keys_are_allowed() {
    let (addr, handler) = recording(true).await;
    let hot = format!("http://{addr}/api/docs/hot");
    let in_query = format!("http://{addr}/api/docs/hot?k={{key}}");
    let keyed = format!("http://{addr}/api/docs/{{key}}");
    for args in [&["--url", &hot][..], &["--url", &in_query][..], &["--url", &keyed, "--key-prefix", ""][..]]
    {
        let run = fencing_load(&[args, &ONE_SECOND[..]].concat()).await;
        assert_eq!(run.code, Some(1), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("fencing-load: refusing "), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("--allow-real-keys"), "{}", run.stderr);
        assert!(run.stderr.contains("never evicts a mark"), "{}", run.stderr);
    }
    assert!(seen(&handler).is_empty(), "nothing was sent: {:?}", seen(&handler));

    // Allowed: every request writes the real key, at the first token.
    let run = fencing_load(
        &[&["--url", &hot, "--connections", "2", "--allow-real-keys"][..], &ONE_SECOND].concat(),
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let seen = seen(&handler);
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["/api/docs/hot"]);
    assert!(seen["/api/docs/hot"].iter().all(|&t| t == 1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_run_writes_to_keys_named_after_its_own_run_id() {
    let (addr, handler) = recording(true).await;
    let url = format!("http://{addr}/api/docs/{{key}}");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let run = fencing_load(&[&["--url", &url, "--connections", "2"][..], &ONE_SECOND].concat()).await;
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let id = run.json["run_id"].as_str().unwrap().to_owned();
        assert!(id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        let (first, last) = (format!("/api/docs/load-{id}-0"), format!("/api/docs/load-{id}-1"));
        assert!(run.stderr.contains(&format!("run id {id}: 2 keys, {first} to {last}")), "{}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "left behind, if the target is fenced: marks on 2 keys, {first} to {last}"
            )),
            "{}",
            run.stderr
        );
        assert_eq!(run.json["left_behind"]["last"], Value::from(last));
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "each run has a fresh id");
    let expected: Vec<String> =
        ids.iter().flat_map(|id| (0..2).map(move |n| format!("/api/docs/load-{id}-{n}"))).collect();
    let mut paths: Vec<String> = seen(&handler).into_keys().collect();
    paths.sort();
    let mut expected = expected;
    expected.sort();
    assert_eq!(paths, expected, "the server saw the runs' own keys and nothing else");

    // A run id of one's own.
    let run = fencing_load(
        &[&["--url", &url, "--connections", "1", "--run-id", "nightly-7"][..], &ONE_SECOND].concat(),
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(seen(&handler).contains_key("/api/docs/load-nightly-7-0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_token_is_every_holders_first() {
    let (addr, handler) = recording(true).await;
    let url = format!("http://{addr}/api/docs/{{key}}");
    let args = ["--url", &url, "--connections", "2", "--first-token", "42", "--new-holder-every", "5"];
    let run = fencing_load(&[&args[..], &ONE_SECOND].concat()).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.json["first_tokens"], serde_json::json!([[42, 42]]));
    let seen = seen(&handler);
    assert_eq!(seen.len(), 2);
    for (key, tokens) in &seen {
        assert_eq!(tokens[0], 42, "{key}");
        assert!(tokens.windows(2).all(|w| w[0] <= w[1]) && *tokens.last().unwrap() > 43, "{key}: {tokens:?}");
    }
    let zero = fencing_load(&["--url", &url, "--first-token", "0"]).await;
    assert_eq!(zero.code, Some(2), "{}", zero.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_above_mark_reads_each_keys_mark_and_starts_one_above() {
    let (addr, handler) = recording(true).await;
    // An earlier run's keys: two with marks, one never written.
    assert_eq!(post_token(addr, "/api/docs/load-again-0", 5000).await, 201);
    assert_eq!(post_token(addr, "/api/docs/load-again-1", 7000).await, 201);
    let url = format!("http://{addr}/api/docs/{{key}}");
    let args = [
        "--url",
        &url,
        "--connections",
        "3",
        "--run-id",
        "again",
        "--first-token",
        "10",
        "--start-above-mark",
    ];
    let run = fencing_load(&[&args[..], &ONE_SECOND].concat()).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("3 keys of target probed, 2 had a mark (the highest 7000)"),
        "{}",
        run.stderr
    );
    assert_eq!(run.json["first_tokens"], serde_json::json!([[10, 7001]]));
    assert_eq!(f64_at(&run.json, "/targets/0/status_409"), 0.0, "no request below a mark");
    assert!(!run.stderr.contains("warning:"), "{}", run.stderr);
    let seen = seen(&handler);
    // The handler saw the earlier marks, then (the probes with token 0 refused) one above them;
    // the fresh key admitted its probe (token 0), then the first token.
    assert_eq!(seen["/api/docs/load-again-0"][..2], [5000, 5001]);
    assert_eq!(seen["/api/docs/load-again-1"][..2], [7000, 7001]);
    assert_eq!(seen["/api/docs/load-again-2"][..2], [0, 10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_into_higher_marks_warns_about_its_409s() {
    let (addr, _) = recording(true).await;
    for key in 0..2 {
        assert_eq!(post_token(addr, &format!("/api/docs/load-old-{key}"), 5000).await, 201);
    }
    let url = format!("http://{addr}/api/docs/{{key}}");
    // The same keys again, at the default first token (1000): every answer is a 409.
    let run =
        fencing_load(&[&["--url", &url, "--connections", "2", "--run-id", "old"][..], &ONE_SECOND].concat())
            .await;
    assert_eq!(run.code, Some(0), "a warning, not a failure: {}", run.stderr);
    assert!(f64_at(&run.json, "/targets/0/status_409") > 0.0);
    assert!(
        run.stderr.contains(
            "warning: target: 100.0 % of answers were 409 (stale token) where the schedule expects 0.0 %"
        ),
        "{}",
        run.stderr
    );
    assert_eq!(run.json["warnings"].as_array().map(Vec::len), Some(1));

    // A new run on the same server, with its fresh keys: no 409, no warning.
    let run = fencing_load(&[&["--url", &url, "--connections", "2"][..], &ONE_SECOND].concat()).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(f64_at(&run.json, "/targets/0/status_409"), 0.0);
    assert!(!run.stderr.contains("warning:"), "{}", run.stderr);

    // The 409s a --stale-pct asks for are expected.
    let run = fencing_load(
        &[&["--url", &url, "--connections", "2", "--stale-pct", "30"][..], &ONE_SECOND].concat(),
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(f64_at(&run.json, "/targets/0/status_409") > 0.0);
    assert!(!run.stderr.contains("warning:"), "{}", run.stderr);
}

#[tokio::test]
async fn a_refused_connection_exits_3_and_says_so() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // The listener is closed: connections to the port are refused.
    let run =
        fencing_load(&[&["--url", &format!("http://127.0.0.1:{port}")][..], &ONE_SECOND].concat()).await;
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(run.stderr.contains("fencing-load: nothing measured: target (127.0.0.1:"), "{}", run.stderr);
    assert!(run.stderr.contains("refused"), "{}", run.stderr);
}

/// The last `n` numbers on the row of the summary table (`text`, after its header) starting with `label`.
fn summary_counts(text: &str, label: &str, n: usize) -> Vec<u64> {
    let line = text.lines().skip(1).find(|l| l.split_whitespace().next() == Some(label)).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    fields[fields.len() - n..].iter().map(|f| f.parse().unwrap()).collect()
}

/// The number after `name ` in `line`.
fn count_after(line: &str, name: &str) -> u64 {
    let rest = &line[line.find(&format!(" {name} ")).unwrap() + name.len() + 2..];
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_route_exits_3_and_counts_404s_alike_in_rounds_summary_and_json() {
    let (addr, handler) = recording(true).await;
    let url = format!("http://{addr}/nope/{{key}}");
    let run = fencing_load(&[&["--url", &url, "--connections", "2"][..], &ONE_SECOND].concat()).await;
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(seen(&handler).is_empty());
    let requests = f64_at(&run.json, "/targets/0/requests") as u64;
    assert!(requests > 0);
    // One way of counting everywhere: 404s are `other`, never `errors`.
    let round = run.stderr.lines().find(|l| l.starts_with("round 1/1 target")).unwrap();
    assert_eq!((count_after(round, "other"), count_after(round, "errors")), (requests, 0), "{round}");
    assert_eq!(summary_counts(&run.stdout, "target", 5), [0, 0, 0, requests, 0], "{}", run.stdout);
    assert!(
        run.stdout.lines().next().unwrap().ends_with("2xx    409    400  other errors"),
        "{}",
        run.stdout
    );
    assert_eq!(f64_at(&run.json, "/targets/0/status_other") as u64, requests);
    assert_eq!(f64_at(&run.json, "/targets/0/status_other_by_code/404") as u64, requests);
    assert_eq!(f64_at(&run.json, "/rounds_detail/0/status_other") as u64, requests);
    assert_eq!(f64_at(&run.json, "/targets/0/errors"), 0.0);
    let cause = format!("100.0 % of {requests} answers were outside 2xx, 409 and 400 (404 ×{requests})");
    assert!(
        run.stderr.contains(&format!("invalid run: target (http://{addr}/nope/{{key}}): {cause}")),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("is the path template or the method right?"), "{}", run.stderr);
    assert_eq!(run.json["invalid"].as_array().map(Vec::len), Some(1));

    // Under --max-other-share 1 the same run is a measurement (of 404s).
    let run = fencing_load(
        &[&["--url", &url, "--connections", "2", "--max-other-share", "1"][..], &ONE_SECOND].concat(),
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}
