//! Clock jumps, made with libfaketime in a real `demo-lock-service` process.
//!
//! * Wall clock only (`FAKETIME_DONT_FAKE_MONOTONIC=1`): stepped back and
//!   forward an hour, run 10× fast and 10× slow, while a lease is held. Expiry
//!   is decided on the monotonic clock, so each lease ends after its TTL of
//!   real time: never early, never late. Restarted with the clock an hour
//!   back, the service's next token is above every earlier one.
//! * Both clocks (monotonic too): the service's own sense of time moves, which
//!   no lease protocol can see through. Stepped forward an hour, the held lease
//!   ends at once (early); a second holder gets a higher token, and a fenced
//!   resource refuses the first holder's writes: the fencing token is what keeps
//!   the resource safe. Stepped back, the service's clock does not follow (it
//!   carries on from the latest time it showed, `src/clock.rs`): leases keep
//!   their TTL of real time instead of living an hour longer. Linux's
//!   `CLOCK_MONOTONIC` never steps, so only this tool brings the second case.

use std::path::Path;
use std::time::{Duration, Instant};

use std::convert::Infallible;

use crate::fault_tools::{FAKETIME_SEEN_WITHIN, FakeClock, Service, log_offset_secs};
use axum::http::{Request, Response};
use fencing_layer::{FencingLayer, MarkStore};
use serde_json::{Value, json};
use tower::{Layer, ServiceExt};

const BIN: &str = env!("CARGO_BIN_EXE_demo-lock-service");
/// Long enough to move the clock and look at it mid-lease.
const TTL: Duration = Duration::from_millis(1500);
/// Polling, a debug build, and a loaded machine: how late an expiry may be seen.
const LATE: Duration = Duration::from_millis(600);

/// Whether the service's wall clock, this many seconds off ours, shows a move.
type WallCheck = fn(i64) -> bool;

struct Client {
    http: reqwest::Client,
    url: String,
}

/// The service with `env` (a fake clock's), its data in `DIR/data` and its log
/// in `log` if given, and a client of it.
fn start(dir: &Path, env: &[(&str, String)], log: Option<&Path>) -> (Service, Client) {
    let data = dir.join("data");
    let args = ["--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap()];
    let service = Service::start(BIN, &args, None, env, log);
    let client = Client { http: reqwest::Client::new(), url: service.url.clone() };
    (service, client)
}

impl Client {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Value {
        let body = json!({"name": name, "holder": holder, "ttl_ms": ttl.as_millis() as u64});
        let response = self.http.post(format!("{}/v1/leases", self.url)).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 201, "acquire {name}");
        response.json().await.unwrap()
    }

    /// `(status, body)` of `GET /v1/locks/{name}`.
    async fn lock(&self, name: &str) -> (u16, Value) {
        let response = self.http.get(format!("{}/v1/locks/{name}", self.url)).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    /// The service's wall clock minus ours, in seconds: a grant of lock
    /// `witness`, and the timestamp of the log line it writes in `log`.
    async fn wall_offset(&self, log: &Path) -> i64 {
        let witness = self.acquire("witness", "w", Duration::from_millis(1)).await;
        let needle = format!("token={} ", witness["token"]);
        let logged = std::fs::read_to_string(log).unwrap();
        let line = logged.lines().find(|l| l.contains("granted") && l.contains(&needle));
        log_offset_secs(line.unwrap_or_else(|| panic!("no log line for the witness grant ({needle})")))
    }

    /// Real time from `start` until the lock is free (404).
    async fn until_free(&self, name: &str, start: Instant, limit: Duration) -> Duration {
        loop {
            if self.lock(name).await.0 == 404 {
                return start.elapsed();
            }
            assert!(start.elapsed() < limit, "{name} still held after {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_jumps_neither_shorten_nor_stretch_leases_and_tokens_keep_rising_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let Some(clock) = FakeClock::new(dir.path()) else { return };
    let mut env = clock.env(true);
    env.push(("RUST_LOG", "info".into()));
    let log = dir.path().join("service.log");
    let (service, client) = start(dir.path(), &env, Some(&log));
    let mut last_token = 0;
    // (spec, how the service's wall clock must look once it is applied)
    let moves: [(&str, WallCheck); 4] = [
        ("-1h", |offset| (-3700..=-3500).contains(&offset)),
        ("+1h", |offset| (3500..=3700).contains(&offset)),
        ("+0 x10", |_| true),
        ("+0 x0.1", |_| true),
    ];
    for (spec, moved) in moves {
        clock.set("+0");
        tokio::time::sleep(FAKETIME_SEEN_WITHIN).await;
        let name = format!("wall {spec}");
        let start = Instant::now();
        let grant = client.acquire(&name, "h", TTL).await;
        let token = grant["token"].as_u64().unwrap();
        assert!(token > last_token, "{spec}: token {token} after {last_token}");
        last_token = token;
        clock.set(spec);
        // The move is seen within the cache time, while the lease is held.
        tokio::time::sleep(FAKETIME_SEEN_WITHIN).await;
        let offset = client.wall_offset(&log).await;
        assert!(moved(offset), "{spec}: the service's wall clock is {offset} s off");
        let (status, held) = client.lock(&name).await;
        assert_eq!(status, 200, "{spec}: the lease ended early");
        let left = held["expires_in_ms"].as_u64().unwrap();
        assert!(left <= TTL.as_millis() as u64, "{spec}: {left} ms left of a {TTL:?} lease");
        let lived = client.until_free(&name, start, TTL + LATE).await;
        assert!(lived >= TTL - Duration::from_millis(50), "{spec}: the lease ended after {lived:?}");
        eprintln!("wall clock {spec} (seen as {offset:+} s): the {TTL:?} lease lived {lived:?} of real time");
    }

    // Restart with the wall clock an hour back: the counter does not care.
    service.kill9();
    clock.set("-1h");
    let (_service, client) = start(dir.path(), &env, Some(&log));
    let offset = client.wall_offset(&log).await;
    assert!((-3700..=-3500).contains(&offset), "restarted with the wall clock {offset} s off");
    let token = client.acquire("after restart", "h", TTL).await["token"].as_u64().unwrap();
    assert!(token > last_token, "token {token} after the restart is not above {last_token}");
    eprintln!("restart with the wall clock {offset:+} s: token {token} > {last_token}");
}

/// A fenced resource in this process: a tower service answering 200 behind the
/// fencing layer (its marks in memory), so a refused token gets the layer's 409.
type Handler = fn(Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>>;
type Resource = fencing_layer::Fencing<tower::util::ServiceFn<Handler>>;

fn resource() -> Resource {
    let written: Handler = |_| std::future::ready(Ok(Response::new("written".to_owned())));
    FencingLayer::new().store(MarkStore::in_memory()).layer(tower::service_fn(written))
}

async fn write(resource: &Resource, token: u64) -> u16 {
    let request = Request::post("/w").header("Fencing-Token", token).body(String::new()).unwrap();
    resource.clone().oneshot(request).await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monotonic_clock_jump_in_the_lock_service_is_caught_by_the_fencing_token() {
    let dir = tempfile::tempdir().unwrap();
    let Some(clock) = FakeClock::new(dir.path()) else { return };
    let (_service, client) = start(dir.path(), &clock.env(false), None);
    let resource = resource();

    // Both clocks an hour forward: the lease ends at once, long before its TTL of real time.
    let ttl = Duration::from_secs(60);
    let a = client.acquire("jump", "a", ttl).await;
    let token_a = a["token"].as_u64().unwrap();
    assert_eq!(write(&resource, token_a).await, 200);
    let start = Instant::now();
    clock.set("+1h");
    let lived = client.until_free("jump", start, Duration::from_secs(3)).await;
    assert!(lived < ttl / 10, "the service's hour forward did not end the lease ({lived:?})");
    let b = client.acquire("jump", "b", ttl).await;
    let token_b = b["token"].as_u64().unwrap();
    assert!(token_b > token_a);
    assert_eq!(write(&resource, token_b).await, 200, "the new holder writes");
    // The first holder still trusts its lease by its own clock; the resource does not.
    assert_eq!(write(&resource, token_a).await, 409, "the old holder's write must be refused");
    let keepalive =
        client.http.post(format!("{}/v1/leases/{}/keepalive", client.url, a["lease_id"].as_str().unwrap()));
    assert_eq!(keepalive.send().await.unwrap().status(), 404, "the old lease is gone at the service");
    eprintln!(
        "both clocks +1h: a {ttl:?} lease ended after {lived:?}; token {token_b} granted, {token_a} refused (409)"
    );

    // Both clocks back to real time (an hour back): the service's clock does not go back with
    // them (it carries on from the latest time it showed), so B's lease keeps its real TTL.
    clock.set("+0");
    tokio::time::sleep(FAKETIME_SEEN_WITHIN).await;
    let (status, held) = client.lock("jump").await;
    assert_eq!(status, 200);
    let left = Duration::from_millis(held["expires_in_ms"].as_u64().unwrap());
    assert!(left <= ttl, "B's lease lives long after the clock stepped back: {left:?} left of {ttl:?}");
    let refused = client
        .http
        .post(format!("{}/v1/leases", client.url))
        .json(&json!({"name": "jump", "holder": "c", "ttl_ms": 1000}));
    assert_eq!(refused.send().await.unwrap().status(), 409, "B still holds it");
    // A short lease granted after the step ends after its TTL of real time, not an hour late.
    let short = Duration::from_millis(1500);
    let d = client.acquire("short", "d", short).await;
    assert!(d["token"].as_u64().unwrap() > token_b);
    let start = Instant::now();
    let lived = client.until_free("short", start, Duration::from_secs(5)).await;
    assert!(lived >= short - LATE && lived <= short + LATE, "a {short:?} lease lived {lived:?}");
    eprintln!(
        "both clocks back 1h: the {ttl:?} lease has {left:?} left (not an hour more); others get 409; a {short:?} \
         lease granted after the step lived {lived:?}"
    );
}
