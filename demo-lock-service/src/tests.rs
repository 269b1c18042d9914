//! In-process tests: the router driven with `oneshot`, time paused.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::service::lock;
use crate::table::parse_lease_id;
use crate::{Config, LockService, ProofSigner};

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

async fn send(app: &Router, req: Request<Body>) -> Reply {
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    Reply { status, headers, body }
}

async fn call(app: &Router, method: Method, uri: &str, json: Option<Value>) -> Reply {
    let mut b = Request::builder().method(method).uri(uri);
    let body = match json {
        Some(v) => {
            b = b.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    send(app, b.body(body).unwrap()).await
}

async fn acquire(app: &Router, name: &str, holder: &str, ttl_ms: u64) -> Reply {
    call(app, Method::POST, "/v1/leases", Some(json!({"name": name, "holder": holder, "ttl_ms": ttl_ms})))
        .await
}

fn open(dir: &std::path::Path) -> LockService {
    LockService::open(Config::new(dir)).unwrap()
}

fn assert_problem(r: &Reply, status: StatusCode) {
    assert_eq!(r.status, status, "body: {}", r.body);
    assert_eq!(r.headers.get("content-type").unwrap(), "application/problem+json");
    assert_eq!(r.body["status"], status.as_u16(), "body: {}", r.body);
    assert!(r.body["type"].as_str().unwrap().starts_with("urn:fencing:problem:"));
    assert!(!r.body["title"].as_str().unwrap().is_empty());
    assert!(!r.body["detail"].as_str().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn grant_shape_and_status_hides_lease_id() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    let r = acquire(&app, "orders", "worker-1", 5000).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.headers.get("content-type").unwrap(), "application/json");
    let lease_id = r.body["lease_id"].as_str().unwrap().to_owned();
    assert_eq!(lease_id.len(), 32);
    assert!(lease_id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(r.body["name"], "orders");
    assert_eq!(r.body["holder"], "worker-1");
    assert_eq!(r.body["ttl_ms"], 5000);
    assert_eq!(r.body["token"], 1);
    assert_eq!(r.headers.get("location").unwrap().to_str().unwrap(), format!("/v1/leases/{lease_id}"));

    tokio::time::advance(Duration::from_millis(1200)).await;
    let s = call(&app, Method::GET, "/v1/locks/orders", None).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.body, json!({"name": "orders", "holder": "worker-1", "token": 1, "expires_in_ms": 3800}));
    assert!(!s.body.to_string().contains(&lease_id));
}

#[tokio::test(start_paused = true)]
async fn held_until_ttl_minus_1ms_free_at_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    let first = acquire(&app, "l", "a", 1000).await;
    assert_eq!(first.status, StatusCode::CREATED);

    tokio::time::advance(Duration::from_millis(999)).await;
    let blocked = acquire(&app, "l", "b", 1000).await;
    assert_problem(&blocked, StatusCode::CONFLICT);
    assert_eq!(blocked.body["holder"], "a");
    assert_eq!(blocked.body["expires_in_ms"], 1);
    assert_eq!(blocked.headers.get("retry-after").unwrap(), "1");
    assert_eq!(call(&app, Method::GET, "/v1/locks/l", None).await.body["expires_in_ms"], 1);

    tokio::time::advance(Duration::from_millis(1)).await;
    assert_problem(&call(&app, Method::GET, "/v1/locks/l", None).await, StatusCode::NOT_FOUND);
    let second = acquire(&app, "l", "b", 1000).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(second.body["token"].as_u64() > first.body["token"].as_u64());
}

#[tokio::test(start_paused = true)]
async fn retry_after_rounds_up_to_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    acquire(&app, "l", "a", 2500).await;
    let r = acquire(&app, "l", "b", 1000).await;
    assert_problem(&r, StatusCode::CONFLICT);
    assert_eq!(r.body["expires_in_ms"], 2500);
    assert_eq!(r.headers.get("retry-after").unwrap(), "3");
}

#[tokio::test(start_paused = true)]
async fn keepalive_extends_keeps_token_and_fails_after_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    let g = acquire(&app, "l", "a", 1000).await;
    let id = g.body["lease_id"].as_str().unwrap().to_owned();
    let token = g.body["token"].clone();
    let ka = format!("/v1/leases/{id}/keepalive");

    tokio::time::advance(Duration::from_millis(900)).await;
    let r = call(&app, Method::POST, &ka, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, json!({"lease_id": id, "token": token, "ttl_ms": 1000}));

    // Renewed at 900 ms: still held at 1899 ms, long past the original expiry.
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(acquire(&app, "l", "b", 1000).await.status, StatusCode::CONFLICT);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_problem(&call(&app, Method::POST, &ka, None).await, StatusCode::NOT_FOUND);
    assert_eq!(acquire(&app, "l", "b", 1000).await.status, StatusCode::CREATED);
    // Releasing an expired (and replaced) lease: 404.
    assert_problem(
        &call(&app, Method::DELETE, &format!("/v1/leases/{id}"), None).await,
        StatusCode::NOT_FOUND,
    );
}

#[tokio::test(start_paused = true)]
async fn release_frees_at_once_and_twice_is_404() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    let g = acquire(&app, "l", "a", 60_000).await;
    let id = g.body["lease_id"].as_str().unwrap().to_owned();
    let r = call(&app, Method::DELETE, &format!("/v1/leases/{id}"), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(r.body, Value::Null);
    assert_problem(&call(&app, Method::GET, "/v1/locks/l", None).await, StatusCode::NOT_FOUND);
    assert_eq!(acquire(&app, "l", "b", 1000).await.status, StatusCode::CREATED);
    assert_problem(
        &call(&app, Method::DELETE, &format!("/v1/leases/{id}"), None).await,
        StatusCode::NOT_FOUND,
    );
    assert_problem(
        &call(&app, Method::POST, &format!("/v1/leases/{id}/keepalive"), None).await,
        StatusCode::NOT_FOUND,
    );
}

#[tokio::test(start_paused = true)]
async fn same_holder_reacquires_with_higher_token_and_old_lease_dies() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    let a1 = acquire(&app, "l", "a", 1000).await;
    let a2 = acquire(&app, "l", "a", 1000).await;
    assert_eq!(a2.status, StatusCode::CREATED);
    assert!(a2.body["token"].as_u64().unwrap() > a1.body["token"].as_u64().unwrap());
    assert_ne!(a1.body["lease_id"], a2.body["lease_id"]);
    let old = format!("/v1/leases/{}/keepalive", a1.body["lease_id"].as_str().unwrap());
    assert_eq!(call(&app, Method::POST, &old, None).await.status, StatusCode::NOT_FOUND);
    let new = format!("/v1/leases/{}/keepalive", a2.body["lease_id"].as_str().unwrap());
    assert_eq!(call(&app, Method::POST, &new, None).await.status, StatusCode::OK);
    // Other locks are independent and share the one counter.
    let m = acquire(&app, "m", "b", 1000).await;
    assert_eq!(m.status, StatusCode::CREATED);
    assert!(m.body["token"].as_u64().unwrap() > a2.body["token"].as_u64().unwrap());
}

#[tokio::test(start_paused = true)]
async fn restart_keeps_counter_and_blocks_held_lock_for_full_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let svc = open(dir.path());
    let app = svc.router();
    let mut last = 0;
    for name in ["x", "y", "z"] {
        let r = acquire(&app, name, "a", 10_000).await;
        let t = r.body["token"].as_u64().unwrap();
        assert!(t > last);
        last = t;
    }
    let held = acquire(&app, "held", "a", 10_000).await;
    let held_id = held.body["lease_id"].as_str().unwrap().to_owned();
    last = held.body["token"].as_u64().unwrap();
    let released = acquire(&app, "released", "a", 10_000).await;
    last = last.max(released.body["token"].as_u64().unwrap());
    let rel = format!("/v1/leases/{}", released.body["lease_id"].as_str().unwrap());
    assert_eq!(call(&app, Method::DELETE, &rel, None).await.status, StatusCode::NO_CONTENT);

    // 6 s into the 10 s lease, the service stops.
    tokio::time::advance(Duration::from_secs(6)).await;
    drop(app);
    drop(svc);

    let app = open(dir.path()).router();
    // The released lock is free; its grant consumed a token all the same.
    let r = acquire(&app, "released", "b", 1000).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(r.body["token"].as_u64().unwrap() > last);
    last = r.body["token"].as_u64().unwrap();

    // The held lock blocks others for a full TTL from start-up (not 4 s).
    tokio::time::advance(Duration::from_millis(9_999)).await;
    let blocked = acquire(&app, "held", "b", 1000).await;
    assert_problem(&blocked, StatusCode::CONFLICT);
    assert_eq!(blocked.body["holder"], "a");
    // The holder may keep its lease alive with the same lease_id.
    let ka = format!("/v1/leases/{held_id}/keepalive");
    let r = call(&app, Method::POST, &ka, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["token"], held.body["token"]);
    tokio::time::advance(Duration::from_millis(10_000)).await;
    let r = acquire(&app, "held", "b", 1000).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(r.body["token"].as_u64().unwrap() > last);
}

#[tokio::test]
async fn second_open_of_the_same_dir_fails() {
    let dir = tempfile::tempdir().unwrap();
    let _svc = open(dir.path());
    assert!(LockService::open(Config::new(dir.path())).is_err());
}

#[tokio::test]
async fn bad_inputs_get_problem_json() {
    let dir = tempfile::tempdir().unwrap();
    let svc = LockService::open(Config::new(dir.path()).with_max_ttl(Duration::from_secs(60))).unwrap();
    let app = svc.router();
    let long = "n".repeat(257);
    let ok256 = "n".repeat(256);
    let cases: Vec<(Value, StatusCode)> = vec![
        (json!({"holder": "h", "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": "", "holder": "h", "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "", "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h"}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h", "ttl_ms": 0}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h", "ttl_ms": 60_001}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h", "ttl_ms": -5}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h", "ttl_ms": 1.5}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h", "ttl_ms": "1000"}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h", "ttl_ms": u64::MAX}), StatusCode::BAD_REQUEST),
        (json!({"name": long, "holder": "h", "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": long, "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": "a\nb", "holder": "h", "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": null, "holder": "h", "ttl_ms": 1000}), StatusCode::BAD_REQUEST),
        (json!({"name": "n", "holder": "h", "ttl_ms": 1000, "x": 1}), StatusCode::BAD_REQUEST),
        (json!(["n", "h", 1000]), StatusCode::BAD_REQUEST),
        (
            json!({"name": "n", "holder": "h", "ttl_ms": 1000, "pad": "p".repeat(5000)}),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (body, status) in cases {
        let r = call(&app, Method::POST, "/v1/leases", Some(body.clone())).await;
        assert_problem(&r, status);
        assert!(r.body["detail"].is_string(), "{body}");
    }
    // The limits themselves are accepted.
    let r = acquire(&app, &ok256, &ok256, 60_000).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    let raw = |ct: Option<&str>, body: &str| {
        let mut b = Request::builder().method(Method::POST).uri("/v1/leases");
        if let Some(ct) = ct {
            b = b.header("content-type", ct);
        }
        b.body(Body::from(body.to_owned())).unwrap()
    };
    let good = r#"{"name":"ct","holder":"h","ttl_ms":1000}"#;
    assert_problem(&send(&app, raw(Some("application/json"), "{\"name\":")).await, StatusCode::BAD_REQUEST);
    assert_problem(&send(&app, raw(Some("application/json"), "")).await, StatusCode::BAD_REQUEST);
    assert_problem(&send(&app, raw(Some("application/json"), "not json")).await, StatusCode::BAD_REQUEST);
    assert_problem(&send(&app, raw(None, good)).await, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_problem(&send(&app, raw(Some("text/plain"), good)).await, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_problem(
        &send(&app, raw(Some("application/jsonx"), good)).await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
    );
    // Requests built here carry no Content-Length, so the cases above exercised the
    // streaming limit; a declared Content-Length past the limit is refused up front.
    let big = Request::builder()
        .method(Method::POST)
        .uri("/v1/leases")
        .header("content-type", "application/json")
        .header("content-length", "5000")
        .body(Body::from(good))
        .unwrap();
    assert_problem(&send(&app, big).await, StatusCode::PAYLOAD_TOO_LARGE);
    // Content type with parameters is fine.
    assert_eq!(
        send(&app, raw(Some("Application/JSON; charset=utf-8"), good)).await.status,
        StatusCode::CREATED
    );

    // Unknown lease, unknown route, wrong method, bad path encoding.
    assert_problem(&call(&app, Method::POST, "/v1/leases/nope/keepalive", None).await, StatusCode::NOT_FOUND);
    assert_problem(&call(&app, Method::DELETE, "/v1/leases/nope", None).await, StatusCode::NOT_FOUND);
    assert_problem(&call(&app, Method::GET, "/v1/locks/free", None).await, StatusCode::NOT_FOUND);
    assert_problem(&call(&app, Method::GET, "/v2/nothing", None).await, StatusCode::NOT_FOUND);
    assert_problem(&call(&app, Method::GET, "/v1/leases", None).await, StatusCode::METHOD_NOT_ALLOWED);
    assert_problem(&call(&app, Method::GET, "/v1/locks/%FF%FE", None).await, StatusCode::BAD_REQUEST);

    // Nothing above changed state: only two grants happened.
    let h = call(&app, Method::GET, "/healthz", None).await;
    assert_eq!(h.status, StatusCode::OK);
    let r = acquire(&app, "last", "h", 1000).await;
    assert_eq!(r.body["token"], 3);
}

#[tokio::test]
async fn lock_names_are_percent_decoded_in_the_read_route() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    assert_eq!(acquire(&app, "jobs/billing run", "h", 10_000).await.status, StatusCode::CREATED);
    let r = call(&app, Method::GET, "/v1/locks/jobs%2Fbilling%20run", None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["name"], "jobs/billing run");
}

#[tokio::test]
async fn close_frees_the_data_dir_and_refuses_grants_with_503() {
    let dir = tempfile::tempdir().unwrap();
    let svc = open(dir.path());
    let app = svc.router();
    let g = acquire(&app, "l", "a", 60_000).await;
    assert_eq!(g.status, StatusCode::CREATED);
    svc.close();
    let r = acquire(&app, "m", "a", 1000).await;
    assert_problem(&r, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers.contains_key("retry-after"));
    let id = g.body["lease_id"].as_str().unwrap();
    assert_problem(
        &call(&app, Method::DELETE, &format!("/v1/leases/{id}"), None).await,
        StatusCode::SERVICE_UNAVAILABLE,
    );
    // `app` (a clone) is still alive, yet the directory can be reopened.
    let again = open(dir.path()).router();
    let r = acquire(&again, "m", "b", 1000).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body["token"], 2);
}

#[tokio::test(start_paused = true)]
async fn grants_forget_expired_leases_of_other_locks() {
    let dir = tempfile::tempdir().unwrap();
    let svc = open(dir.path());
    let app = svc.router();
    let old = acquire(&app, "abandoned", "a", 1000).await;
    let old_id = old.body["lease_id"].as_str().unwrap().to_owned();
    acquire(&app, "kept", "a", 60_000).await;
    tokio::time::advance(Duration::from_millis(1000)).await;
    // This grant sweeps the expired "abandoned" lease from memory and disk.
    assert_eq!(acquire(&app, "other", "b", 60_000).await.status, StatusCode::CREATED);
    assert!(!lock(&svc.inner.table).by_name.contains_key("abandoned"));
    assert!(!lock(&svc.inner.table).by_id.contains_key(&parse_lease_id(&old_id).unwrap()));
    assert!(lock(&svc.inner.table).by_name.contains_key("kept"));
    drop(app);
    drop(svc);

    let svc = open(dir.path());
    let app = svc.router();
    // Free at once after the restart; the live ones are still held.
    assert_eq!(acquire(&app, "abandoned", "c", 1000).await.status, StatusCode::CREATED);
    assert_eq!(acquire(&app, "kept", "c", 1000).await.status, StatusCode::CONFLICT);
    assert_eq!(acquire(&app, "other", "c", 1000).await.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn a_huge_max_ttl_never_overflows() {
    let dir = tempfile::tempdir().unwrap();
    let svc = LockService::open(Config::new(dir.path()).with_max_ttl(Duration::MAX)).unwrap();
    let app = svc.router();
    assert_problem(&acquire(&app, "l", "a", u64::MAX).await, StatusCode::BAD_REQUEST);
    let century_ms = 100 * 365 * 24 * 3600 * 1000;
    let r = acquire(&app, "l", "a", century_ms).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let id = r.body["lease_id"].as_str().unwrap();
    let ka = call(&app, Method::POST, &format!("/v1/leases/{id}/keepalive"), None).await;
    assert_eq!(ka.status, StatusCode::OK);
    assert_eq!(acquire(&app, "l", "b", 1000).await.status, StatusCode::CONFLICT);
}

fn open_with(dir: &std::path::Path, f: impl FnOnce(Config) -> Config) -> LockService {
    LockService::open(f(Config::new(dir))).unwrap()
}

#[tokio::test]
async fn signed_grants_carry_a_proof_for_their_lock_and_token_only() {
    use fencing_layer::verify::Ed25519Verifier;
    let dir = tempfile::tempdir().unwrap();
    let signer = ProofSigner::generate().unwrap();
    let app = open_with(dir.path(), |c| c.with_signer(signer.clone())).router();
    let r = acquire(&app, "orders", "worker-1", 5000).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let token = r.body["token"].as_u64().unwrap();
    let proof = r.body["proof"].as_str().expect("a signed grant has a proof").to_owned();
    let verifier = Ed25519Verifier::new(signer.public_key());
    assert_eq!(verifier.check("orders", token, &proof), Ok(()));
    assert!(verifier.check("orders", token + 1, &proof).is_err(), "another token");
    assert!(verifier.check("orders", token - 1, &proof).is_err(), "a lower token");
    assert!(verifier.check("payroll", token, &proof).is_err(), "another lock");
    let stranger = Ed25519Verifier::new(ProofSigner::generate().unwrap().public_key());
    assert!(stranger.check("orders", token, &proof).is_err(), "another key pair");
    // The library's grant carries the same proof.
    let svc = open_with(tempfile::tempdir().unwrap().path(), |c| c.with_signer(signer.clone()));
    let g = svc.acquire("orders", "w", Duration::from_secs(1)).await.unwrap();
    assert_eq!(g.proof.as_deref(), Some(signer.sign("orders", g.token).as_str()));

    // Without a signing key: no proof field at all.
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    let r = acquire(&app, "orders", "worker-1", 5000).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(r.body.get("proof").is_none(), "{}", r.body);
    assert_eq!(r.body.as_object().unwrap().len(), 5, "{}", r.body);
}

#[tokio::test(start_paused = true)]
async fn token_check_is_valid_only_for_the_live_grant() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path()).router();
    let g = acquire(&app, "jobs/billing", "a", 1000).await;
    let t = g.body["token"].as_u64().unwrap();
    let check = |token: String| {
        let app = app.clone();
        async move { call(&app, Method::GET, &format!("/v1/locks/jobs%2Fbilling/tokens/{token}"), None).await }
    };

    let r = check(t.to_string()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers.get("content-type").unwrap(), "application/json");
    assert_eq!(r.body, json!({"lock": "jobs/billing", "token": t, "valid": true, "expires_in_ms": 1000}));
    // A forged higher token, and a lower one: held under another token.
    for other in [t + 1, u64::MAX, t - 1, 0] {
        let r = check(other.to_string()).await;
        assert_eq!(
            r.body,
            json!({"lock": "jobs/billing", "token": other, "valid": false, "reason": "other-token"})
        );
    }
    // An unknown lock.
    let r = call(&app, Method::GET, &format!("/v1/locks/nobody/tokens/{t}"), None).await;
    assert_eq!(r.body, json!({"lock": "nobody", "token": t, "valid": false, "reason": "free"}));
    // Still valid 1 ms before expiry; invalid at expiry (nobody else acquired it).
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(check(t.to_string()).await.body["expires_in_ms"], 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(check(t.to_string()).await.body["reason"], "free");
    // Released: invalid at once.
    let g = acquire(&app, "jobs/billing", "b", 60_000).await;
    let t2 = g.body["token"].as_u64().unwrap();
    assert_eq!(check(t2.to_string()).await.body["valid"], true);
    let id = g.body["lease_id"].as_str().unwrap();
    assert_eq!(
        call(&app, Method::DELETE, &format!("/v1/leases/{id}"), None).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(check(t2.to_string()).await.body["reason"], "free");

    // Bad input: problem+json, never a guess.
    for bad in ["01", "+1", "-1", "1.0", "0x1", "%201", "1%20", "18446744073709551616", "abc", "%FF"] {
        assert_problem(&check(bad.into()).await, StatusCode::BAD_REQUEST);
    }
    let long = "n".repeat(257);
    assert_problem(
        &call(&app, Method::GET, &format!("/v1/locks/{long}/tokens/1"), None).await,
        StatusCode::BAD_REQUEST,
    );
    assert_problem(&call(&app, Method::GET, "/v1/locks/a%0Ab/tokens/1", None).await, StatusCode::BAD_REQUEST);
    assert_problem(
        &call(&app, Method::POST, "/v1/locks/a/tokens/1", None).await,
        StatusCode::METHOD_NOT_ALLOWED,
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_lease_table_answers_503_and_keeps_every_live_lease() {
    let dir = tempfile::tempdir().unwrap();
    let svc = open_with(dir.path(), |c| c.with_max_leases(2));
    let app = svc.router();
    let a = acquire(&app, "a", "h", 90_000).await;
    let b = acquire(&app, "b", "h", 120_000).await;
    assert_eq!((a.status, b.status), (StatusCode::CREATED, StatusCode::CREATED));

    let r = acquire(&app, "c", "h", 1000).await;
    assert_problem(&r, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.body["type"], "urn:fencing:problem:lease-table-full");
    assert_eq!(r.body["max_leases"], 2);
    // The earliest slot frees in 90 s; Retry-After says at most a minute.
    assert_eq!(r.headers.get("retry-after").unwrap(), "60");
    assert_eq!(svc.leases_in_memory(), 2);
    assert_problem(&call(&app, Method::GET, "/v1/locks/c", None).await, StatusCode::NOT_FOUND);

    // Both live leases are intact: readable, renewable, and they still block others.
    for (name, g) in [("a", &a), ("b", &b)] {
        let s = call(&app, Method::GET, &format!("/v1/locks/{name}"), None).await;
        assert_eq!(s.body["token"], g.body["token"]);
        let id = g.body["lease_id"].as_str().unwrap();
        let ka = call(&app, Method::POST, &format!("/v1/leases/{id}/keepalive"), None).await;
        assert_eq!(ka.status, StatusCode::OK);
        assert_eq!(acquire(&app, name, "other", 1000).await.status, StatusCode::CONFLICT);
    }
    // Re-acquiring a held lock takes no new slot.
    let a2 = acquire(&app, "a", "h", 30_000).await;
    assert_eq!(a2.status, StatusCode::CREATED);
    // Retry-After follows the earliest expiry (now a's 30 s).
    assert_eq!(acquire(&app, "c", "h", 1000).await.headers.get("retry-after").unwrap(), "30");
    // A release frees a slot at once.
    let id = b.body["lease_id"].as_str().unwrap();
    assert_eq!(
        call(&app, Method::DELETE, &format!("/v1/leases/{id}"), None).await.status,
        StatusCode::NO_CONTENT
    );
    let c = acquire(&app, "c", "h", 1000).await;
    assert_eq!(c.status, StatusCode::CREATED);
    assert!(c.body["token"].as_u64() > a2.body["token"].as_u64());
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_slot_is_reused_and_forgotten_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let svc = open_with(dir.path(), |c| c.with_max_leases(2));
    let app = svc.router();
    let short = acquire(&app, "short", "h", 1000).await;
    acquire(&app, "long", "h", 60_000).await;
    let r = acquire(&app, "new", "h", 60_000).await;
    assert_problem(&r, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers.get("retry-after").unwrap(), "1");

    tokio::time::advance(Duration::from_millis(1000)).await;
    let new = acquire(&app, "new", "h", 1000).await;
    assert_eq!(new.status, StatusCode::CREATED);
    assert_eq!(svc.leases_in_memory(), 2);
    assert!(!lock(&svc.inner.table).by_name.contains_key("short"));
    let short_id = parse_lease_id(short.body["lease_id"].as_str().unwrap()).unwrap();
    assert!(!lock(&svc.inner.table).by_id.contains_key(&short_id));
    assert_eq!(lock(&svc.inner.table).by_expiry.len(), 2);

    // Unique names past the bound, each expiring: the table never grows past it and
    // every grant finds a slot once the previous leases have lapsed.
    let mut last = new.body["token"].as_u64().unwrap();
    for round in 0..20 {
        tokio::time::advance(Duration::from_millis(1000)).await;
        let r = acquire(&app, &format!("burst-{round}"), "h", 1000).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        let t = r.body["token"].as_u64().unwrap();
        assert!(t > last);
        last = t;
        assert!(svc.leases_in_memory() <= 2);
    }
    drop(app);
    drop(svc);

    // On disk too: after a restart only the live leases are there, and the counter
    // never went back.
    let svc = open_with(dir.path(), |c| c.with_max_leases(2));
    {
        let table = lock(&svc.inner.table);
        let mut names: Vec<&str> = table.by_name.keys().map(|n| &**n).collect();
        names.sort_unstable();
        assert_eq!(names, ["burst-19", "long"]);
    }
    let app = svc.router();
    // burst-19 was restored for a full TTL from start-up; once it lapses, its slot is reused.
    tokio::time::advance(Duration::from_millis(1000)).await;
    let r = acquire(&app, "short", "other", 1000).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert!(r.body["token"].as_u64().unwrap() > last);
}
