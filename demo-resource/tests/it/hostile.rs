//! Hostile input, bounded (proptest): the token parser against an oracle, the
//! resource's fenced write routes and the lock service's `POST /v1/leases` with
//! arbitrary bytes, headers and content types. Nothing panics, every answer is
//! one of the designed statuses, every error is `application/problem+json`
//! naming its own status, marks never go down and granted tokens only go up.
//!
//! `PROPTEST_CASES=N` raises the number of cases (defaults below keep CI short);
//! the unbounded libFuzzer targets are in `fuzz/` (see `RELIABILITY.md`).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use demo_lock_service::LockService;
use demo_resource::{Config, Resource};
use fencing_layer::{FencingToken, TokenError};
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::Value;
use test_support::canonical_token;
use tower::ServiceExt;

fn token_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..32),
        "[0-9]{0,22}".prop_map(String::into_bytes),
        "[-+ 0-9xXeE._\t]{0,24}".prop_map(String::into_bytes),
        "1844674407370955161[0-9]{1,2}".prop_map(String::into_bytes),
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        "\\PC{0,8}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn token_parser_agrees_with_the_contract(bytes in token_bytes()) {
        let parsed = FencingToken::parse_bytes(&bytes);
        prop_assert_eq!(parsed.as_ref().ok().map(|t| t.get()), canonical_token(&bytes), "{:?}", bytes);
        if bytes.is_empty() {
            prop_assert_eq!(parsed, Err(TokenError::Empty));
        }
    }

    #[test]
    fn tokens_round_trip_through_header_values(n in any::<u64>()) {
        let value = FencingToken::new(n).to_header_value();
        prop_assert_eq!(FencingToken::parse_bytes(value.as_bytes()).map(FencingToken::get), Ok(n));
    }

    #[test]
    fn header_values_none_one_or_repeated(values in proptest::collection::vec(token_bytes(), 0..4)) {
        let mut headers = HeaderMap::new();
        let name = HeaderName::from_static("fencing-token");
        let values: Vec<HeaderValue> =
            values.iter().filter_map(|v| HeaderValue::from_bytes(v).ok()).collect();
        for v in &values {
            headers.append(&name, v.clone());
        }
        let read = FencingToken::from_header_values(headers.get_all(&name));
        match values.as_slice() {
            [] => prop_assert_eq!(read, Ok(None)),
            [one] => prop_assert_eq!(read.map(|t| t.map(FencingToken::get)).ok(), canonical_token(one.as_bytes()).map(Some)),
            _ => prop_assert_eq!(read, Err(TokenError::Repeated)),
        }
    }
}

/// Sends `request`, checks the answer is designed (status in `allowed`, errors
/// as problem+json naming their status) and returns the status and body.
async fn send(router: &Router, request: Request<Body>, allowed: &[u16]) -> (u16, Vec<u8>) {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").map(|v| v.as_bytes().to_vec());
    let body = response.into_body().collect().await.unwrap().to_bytes().to_vec();
    assert!(allowed.contains(&status), "status {status}: {}", String::from_utf8_lossy(&body));
    if status >= 400 {
        assert_eq!(content_type.as_deref(), Some(&b"application/problem+json"[..]), "{status}");
        let problem: Value = serde_json::from_slice(&body).expect("problem bodies are JSON");
        assert_eq!(problem["status"], status, "{problem}");
    }
    (status, body)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// One hostile write: any method, a path segment from a small set (so marks
/// accumulate), any token header bytes (absent, once or repeated), any body.
#[derive(Debug, Clone)]
struct Write {
    method: Method,
    key: String,
    tokens: Vec<Vec<u8>>,
    body: Vec<u8>,
    query: String,
}

fn write() -> impl Strategy<Value = Write> {
    (
        prop_oneof![Just(Method::POST), Just(Method::PUT), Just(Method::DELETE), Just(Method::PATCH)],
        prop_oneof![
            Just("logs/a".to_owned()),
            Just("kv/a".to_owned()),
            "logs/[a-c%]{1,3}",
            "kv/[a-z0-9%.]{0,6}",
            Just(format!("kv/{}", "x".repeat(300))),
        ],
        proptest::collection::vec(
            prop_oneof![
                3 => (0u64..40).prop_map(|n| n.to_string().into_bytes()),
                1 => token_bytes(),
            ],
            0..3,
        ),
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            Just(vec![b'x'; demo_resource::MAX_BODY_BYTES + 1]),
        ],
        prop_oneof![Just(String::new()), Just("?delay_ms=1".to_owned()), "\\?[a-z_=0-9&]{0,12}"],
    )
        .prop_map(|(method, key, tokens, body, query)| Write { method, key, tokens, body, query })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_500, ..ProptestConfig::default() })]

    /// One in-memory resource takes every case in turn: its marks carry over.
    #[test]
    fn resource_write_routes_answer_hostile_requests_as_designed(write in write()) {
        thread_local! {
            static RESOURCE: (tokio::runtime::Runtime, Resource) = {
                let resource = Resource::open(Config::in_memory()).unwrap();
                (runtime(), resource)
            };
        }
        RESOURCE.with(|(rt, resource)| {
            let mut request = Request::builder().method(write.method.clone()).uri(format!("/{}{}", write.key, write.query));
            for token in &write.tokens {
                if let Ok(value) = HeaderValue::from_bytes(token) {
                    request = request.header("fencing-token", value);
                }
            }
            let Ok(request) = request.body(Body::from(write.body.clone())) else { return };
            let store = resource.mark_store().unwrap();
            let path = request.uri().path().to_owned();
            let before: Vec<_> = ["/logs/a", "/kv/a"].iter().map(|k| store.mark(k)).collect();
            let (status, _) = rt.block_on(send(
                &resource.router(),
                request,
                &[200, 201, 204, 400, 404, 405, 409, 413, 428, 503],
            ));
            let after: Vec<_> = ["/logs/a", "/kv/a"].iter().map(|k| store.mark(k)).collect();
            for (b, a) in before.iter().zip(&after) {
                assert!(a >= b, "{path}: a mark went down from {b:?} to {a:?} ({status})");
            }
        });
    }
}

/// Bodies for `POST /v1/leases`: arbitrary bytes, near-valid JSON, valid JSON
/// with hostile field values, oversized bodies.
fn lease_body() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        Just("\"n\"".to_owned()),
        "\"\\PC{0,6}\"".prop_map(|s| serde_json::to_string(&s[1..s.len() - 1]).unwrap()),
        Just(format!("\"{}\"", "y".repeat(300))),
        Just("\"a\\u0000b\"".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        Just("null".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just("18446744073709551616".to_owned()),
    ];
    let ttl = prop_oneof![
        (1u64..5000).prop_map(|n| n.to_string()),
        Just("0".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("-1".to_owned()),
        Just("1e3".to_owned()),
        Just("\"100\"".to_owned()),
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..80),
        (field.clone(), field.clone(), ttl.clone())
            .prop_map(|(n, h, t)| { format!("{{\"name\":{n},\"holder\":{h},\"ttl_ms\":{t}}}").into_bytes() }),
        (field, ttl).prop_map(|(f, t)| format!("{{\"name\":{f},\"ttl_ms\":{t},\"extra\":1}}").into_bytes()),
        (0usize..3).prop_map(|i| [
            "[\"n\",\"h\",5]",
            "{\"name\":\"n\"",
            "{\"name\":\"n\",\"name\":\"m\",\"holder\":\"h\",\"ttl_ms\":5}"
        ][i]
            .as_bytes()
            .to_vec()),
        Just(format!("{{\"name\":\"n\",\"holder\":\"{}\",\"ttl_ms\":5}}", "z".repeat(5000)).into_bytes()),
    ]
}

fn content_type() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        3 => Just(Some(b"application/json".to_vec())),
        1 => Just(None),
        1 => Just(Some(b"application/problem+json; charset=utf-8".to_vec())),
        1 => Just(Some(b"text/plain".to_vec())),
        1 => Just(Some(b"APPLICATION/JSON ; x=y".to_vec())),
        1 => proptest::collection::vec(any::<u8>(), 0..24).prop_map(Some),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_500, ..ProptestConfig::default() })]

    /// One lock service (real redb file) takes every case: grants keep going up.
    #[test]
    fn lock_service_answers_hostile_lease_requests_as_designed(body in lease_body(), ct in content_type()) {
        thread_local! {
            static SERVICE: (tokio::runtime::Runtime, LockService, tempfile::TempDir) = {
                let dir = tempfile::tempdir().unwrap();
                let service = LockService::open(demo_lock_service::Config::new(dir.path())).unwrap();
                (runtime(), service, dir)
            };
        }
        static LAST_TOKEN: AtomicU64 = AtomicU64::new(0);
        SERVICE.with(|(rt, service, _)| {
            let mut request = Request::builder().method(Method::POST).uri("/v1/leases");
            if let Some(ct) = ct.as_ref().and_then(|ct| HeaderValue::from_bytes(ct).ok()) {
                request = request.header("content-type", ct);
            }
            let request = request.body(Body::from(body.clone())).unwrap();
            let (status, answer) =
                rt.block_on(send(&service.router(), request, &[201, 400, 409, 413, 415]));
            if status == 201 {
                let grant: Value = serde_json::from_slice(&answer).unwrap();
                let token = grant["token"].as_u64().unwrap();
                let last = LAST_TOKEN.swap(token, Ordering::SeqCst);
                assert!(token > last, "token {token} after {last}");
            }
        });
    }
}
