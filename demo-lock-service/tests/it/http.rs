//! Over-the-wire tests on 127.0.0.1: concurrency, restart, and kill -9 of the binary.

use std::process::{Command, Stdio};
use std::time::Duration;

use demo_lock_service::{Config, LockService, RunningService};
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::ChildServer;

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap()
}

async fn start(dir: &std::path::Path) -> RunningService {
    LockService::open(Config::new(dir)).unwrap().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

async fn acquire(
    c: &reqwest::Client,
    base: &str,
    name: &str,
    holder: &str,
    ttl_ms: u64,
) -> (StatusCode, Value) {
    let r = c
        .post(format!("{base}/v1/leases"))
        .json(&json!({"name": name, "holder": holder, "ttl_ms": ttl_ms}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_exactly_one_wins_and_tokens_increase() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let base = svc.base_url();
    let c = client();

    const N: usize = 16;
    let mut tasks = Vec::new();
    for i in 0..N {
        let (c, base) = (c.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            acquire(&c, &base, "contended", &format!("worker-{i}"), 30_000).await
        }));
    }
    let mut winners = Vec::new();
    let mut losers = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            StatusCode::CREATED => winners.push(body),
            StatusCode::CONFLICT => {
                losers += 1;
                assert!(body["holder"].as_str().unwrap().starts_with("worker-"));
                assert!(body["expires_in_ms"].as_u64().unwrap() > 0);
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(losers, N - 1);
    let winner = &winners[0];

    // The lock reports the winner.
    let s: Value = c.get(format!("{base}/v1/locks/contended")).send().await.unwrap().json().await.unwrap();
    assert_eq!(s["holder"], winner["holder"]);
    assert_eq!(s["token"], winner["token"]);

    // Successive grants (release, then the next acquirer) get strictly higher tokens.
    let mut last = winner["token"].as_u64().unwrap();
    let mut lease_id = winner["lease_id"].as_str().unwrap().to_owned();
    for i in 0..8 {
        let r = c.delete(format!("{base}/v1/leases/{lease_id}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let (status, body) = acquire(&c, &base, "contended", &format!("next-{i}"), 30_000).await;
        assert_eq!(status, StatusCode::CREATED);
        let token = body["token"].as_u64().unwrap();
        assert!(token > last, "{token} after {last}");
        last = token;
        lease_id = body["lease_id"].as_str().unwrap().to_owned();
    }
    drop(c);
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_of_many_locks_get_distinct_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let svc = start(dir.path()).await;
    let base = svc.base_url();
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (c, base) = (c.clone(), base.clone());
        tasks.push(tokio::spawn(async move { acquire(&c, &base, &format!("lock-{i}"), "h", 30_000).await }));
    }
    let mut tokens = Vec::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        tokens.push(body["token"].as_u64().unwrap());
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 16, "a token was issued twice: {tokens:?}");
    drop(c);
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restart_on_the_same_dir() {
    let dir = tempfile::tempdir().unwrap();
    let c = client();
    let svc = start(dir.path()).await;
    let base = svc.base_url();
    let mut max_token = 0;
    for i in 0..5 {
        let (status, body) = acquire(&c, &base, &format!("r{i}"), "a", 60_000).await;
        assert_eq!(status, StatusCode::CREATED);
        max_token = max_token.max(body["token"].as_u64().unwrap());
    }
    drop(c);
    svc.shutdown().await.unwrap();

    // Reopening works only because the first instance closed its store.
    let c = client();
    let svc = start(dir.path()).await;
    let base = svc.base_url();
    let (status, body) = acquire(&c, &base, "r0", "b", 1000).await;
    assert_eq!(status, StatusCode::CONFLICT, "held lock granted after restart: {body}");
    assert_eq!(body["holder"], "a");
    let (status, body) = acquire(&c, &base, "fresh", "b", 1000).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(body["token"].as_u64().unwrap() > max_token);
    drop(c);
    svc.shutdown().await.unwrap();
}

/// A child `demo-lock-service` (test-support's child server, SIGKILLed when
/// dropped), once `/healthz` answers.
async fn spawn_binary(dir: &std::path::Path) -> ChildServer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_demo-lock-service"));
    command.args(["--listen", "127.0.0.1:0", "--data-dir"]).arg(dir).env("RUST_LOG", "warn");
    let proc = ChildServer::start(command.stdin(Stdio::null()).stderr(Stdio::inherit()));
    // Ready once /healthz answers; bounded number of tries.
    let c = client();
    for _ in 0..100 {
        if let Ok(r) = c.get(format!("{}/healthz", proc.base())).send().await
            && r.status() == StatusCode::OK
        {
            return proc;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("demo-lock-service never became healthy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_restart_never_reissues_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let c = client();

    let mut p = spawn_binary(dir.path()).await;
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let (status, body) = acquire(&c, &p.base(), &format!("k{}", i % 4), &format!("h{i}"), 60_000).await;
        if status == StatusCode::CREATED {
            acknowledged.push(body["token"].as_u64().unwrap());
        } else {
            assert_eq!(status, StatusCode::CONFLICT, "{body}");
        }
    }
    assert_eq!(acknowledged.len(), 4);
    // Grants racing with the kill: whatever was acknowledged must not be reissued.
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let racing = {
        let (c, base) = (c.clone(), p.base());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..200 {
                match c
                    .post(format!("{base}/v1/leases"))
                    .json(&json!({"name": format!("race{i}"), "holder": "r", "ttl_ms": 60_000}))
                    .send()
                    .await
                {
                    Ok(r) if r.status() == StatusCode::CREATED => {
                        if let Ok(v) = r.json::<Value>().await {
                            acked.push(v["token"].as_u64().unwrap());
                            let _ = first_tx.send(());
                        }
                    }
                    _ => break,
                }
            }
            acked
        })
    };
    // Kill while grants are flowing: after the first racing grant is acknowledged.
    tokio::time::timeout(Duration::from_secs(10), first_rx.recv())
        .await
        .expect("no racing grant")
        .expect("racing task ended early");
    p.kill_9();
    acknowledged.extend(racing.await.unwrap());
    let max_acked = *acknowledged.iter().max().unwrap();
    drop(p);

    let p = spawn_binary(dir.path()).await;
    let (status, body) = acquire(&c, &p.base(), "after-kill", "h", 1000).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let token = body["token"].as_u64().unwrap();
    assert!(
        token > max_acked,
        "token {token} after restart, but {max_acked} was acknowledged before kill -9"
    );
    // A lock held before the kill is still held by its holder.
    let (status, body) = acquire(&c, &p.base(), "k0", "intruder", 1000).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    drop(p);
}
