//! The payment-provider stand-in over real HTTP: charges, the `Idempotency-Key`
//! rules (replay, 422 for other parameters, 409 while in progress), and bad
//! input answered with problem+json; plus arbitrary requests in-process.

use std::time::Duration;

use axum::body::Body;
use demo_resource::Served;
use proptest::prelude::*;
use reqwest::StatusCode;
use scenarios::payments::{Provider, ProviderConfig, RunningProvider};
use serde_json::{Value, json};
use tower::ServiceExt;

const BOUND: Duration = Duration::from_secs(10);

async fn start() -> (RunningProvider, reqwest::Client) {
    let running = Provider::default().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let http = reqwest::Client::builder().no_proxy().timeout(BOUND).build().unwrap();
    (running, http)
}

fn charge(customer: &str, amount: u64) -> Value {
    json!({ "customer": customer, "amount": amount, "currency": "eur" })
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = http.post(format!("{url}/v1/charges")).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.json().await.unwrap())
}

fn assert_problem(headers: &reqwest::header::HeaderMap, body: &Value, status: StatusCode) {
    assert_eq!(headers["content-type"], "application/problem+json", "{body}");
    assert_eq!(body["status"], status.as_u16(), "{body}");
    assert!(body["type"].as_str().is_some_and(|t| t.starts_with("urn:")), "{body}");
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
}

#[tokio::test]
async fn without_a_key_every_request_charges() {
    let (running, http) = start().await;
    let url = running.base_url();
    for _ in 0..2 {
        let (status, headers, body) = post(&http, &url, None, &charge("cus_1", 1999)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert!(headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(running.served().charges().len(), 2);
    let list: Value =
        http.get(format!("{url}/v1/charges?customer=cus_1")).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["ch_000001", "ch_000002"]);
    let one: Value =
        http.get(format!("{url}/v1/charges/ch_000002")).send().await.unwrap().json().await.unwrap();
    assert_eq!(one["customer"], "cus_1");
    let missing = http.get(format!("{url}/v1/charges/ch_999999")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_same_key_replays_the_first_answer_and_charges_once() {
    let (running, http) = start().await;
    let url = running.base_url();
    let (status, headers, first) = post(&http, &url, Some("run-1:cus_1"), &charge("cus_1", 1999)).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert!(headers.get("idempotent-replayed").is_none());
    // A fencing token changes nothing: the provider cannot check it.
    let again = http
        .post(format!("{url}/v1/charges"))
        .header("Idempotency-Key", "run-1:cus_1")
        .header("Fencing-Token", "1")
        .json(&charge("cus_1", 1999))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    // Another key is another charge.
    let (status, _, other) = post(&http, &url, Some("run-1:cus_2"), &charge("cus_2", 1999)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(other["id"], first["id"]);
    assert_eq!(running.served().charges().len(), 2);
}

#[tokio::test]
async fn the_same_key_with_other_parameters_is_422() {
    let (running, http) = start().await;
    let url = running.base_url();
    post(&http, &url, Some("k"), &charge("cus_1", 1999)).await;
    for body in [
        charge("cus_1", 2000),
        charge("cus_2", 1999),
        json!({"customer":"cus_1","amount":1999,"currency":"usd"}),
    ] {
        let (status, headers, problem) = post(&http, &url, Some("k"), &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
        assert_problem(&headers, &problem, status);
        assert_eq!(problem["idempotency_key"], "k");
    }
    // Field order is not a difference: the parameters are compared, not the bytes.
    let reordered = json!({ "currency": "eur", "amount": 1999, "customer": "cus_1" });
    let (status, headers, _) = post(&http, &url, Some("k"), &reordered).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(running.served().charges().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_while_the_first_is_in_progress_is_409_and_a_dropped_first_frees_the_key() {
    let (running, http) = start().await;
    let url = running.base_url();
    let slow = |http: reqwest::Client, url: String| async move {
        http.post(format!("{url}/v1/charges?delay_ms=10000"))
            .header("Idempotency-Key", "slow")
            .json(&charge("cus_1", 1999))
            .send()
            .await
    };
    let first = tokio::spawn(slow(http.clone(), url.clone()));
    // The first holds the key (it waits out its delay before charging).
    tokio::time::timeout(BOUND, async {
        while running.served().keys_in_progress() == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the first request holds the key");
    let (status, headers, conflict) = post(&http, &url, Some("slow"), &charge("cus_1", 1999)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(headers["retry-after"], "1");
    assert_problem(&headers, &conflict, StatusCode::CONFLICT);
    // The first client goes away before the provider charged: nothing charged, the key is free.
    first.abort();
    tokio::time::timeout(BOUND, async {
        while running.served().keys_in_progress() != 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the key is freed");
    let freed = post(&http, &url, Some("slow"), &charge("cus_1", 1999)).await;
    assert_eq!(freed.0, StatusCode::CREATED, "{}", freed.2);
    assert!(freed.1.get("idempotent-replayed").is_none());
    assert_eq!(running.served().charges().len(), 1);
}

#[tokio::test]
async fn bad_requests_are_problems_and_save_nothing() {
    let (running, http) = start().await;
    let url = running.base_url();
    let raw = |key: Option<&'static str>, content_type: &'static str, body: Vec<u8>| {
        let mut request =
            http.post(format!("{url}/v1/charges")).header("content-type", content_type).body(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request
    };
    let long_key = "k".repeat(256);
    let cases: Vec<(reqwest::RequestBuilder, StatusCode)> = vec![
        (raw(Some("k"), "application/json", b"{not json".to_vec()), StatusCode::BAD_REQUEST),
        (
            raw(
                Some("k"),
                "application/json",
                br#"{"customer":"c","amount":1,"currency":"eur","x":1}"#.to_vec(),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            raw(Some("k"), "application/json", br#"{"customer":"c","amount":0,"currency":"eur"}"#.to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            raw(Some("k"), "application/json", br#"{"customer":"c","amount":-5,"currency":"eur"}"#.to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            raw(
                Some("k"),
                "application/json",
                br#"{"customer":"c","amount":100000000,"currency":"eur"}"#.to_vec(),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            raw(Some("k"), "application/json", br#"{"customer":"c","amount":1,"currency":"EUR"}"#.to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            raw(Some("k"), "application/json", br#"{"customer":"","amount":1,"currency":"eur"}"#.to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            raw(
                Some("k"),
                "application/json",
                "{\"customer\":\"a\\nb\",\"amount\":1,\"currency\":\"eur\"}".into(),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            raw(Some("k"), "text/plain", br#"{"customer":"c","amount":1,"currency":"eur"}"#.to_vec()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (raw(Some("k"), "application/json", vec![b' '; 20_000]), StatusCode::PAYLOAD_TOO_LARGE),
        (raw(None, "application/json", b"{}".to_vec()), StatusCode::BAD_REQUEST),
        (
            http.post(format!("{url}/v1/charges"))
                .header("Idempotency-Key", long_key.as_str())
                .json(&charge("c", 1)),
            StatusCode::BAD_REQUEST,
        ),
        (
            http.post(format!("{url}/v1/charges")).header("Idempotency-Key", "a b").json(&charge("c", 1)),
            StatusCode::BAD_REQUEST,
        ),
        (
            http.post(format!("{url}/v1/charges"))
                .header("Idempotency-Key", "a")
                .header("Idempotency-Key", "b")
                .json(&charge("c", 1)),
            StatusCode::BAD_REQUEST,
        ),
        (http.post(format!("{url}/v1/charges?delay_ms=abc")).json(&charge("c", 1)), StatusCode::BAD_REQUEST),
        (http.post(format!("{url}/v1/charges?x=1")).json(&charge("c", 1)), StatusCode::BAD_REQUEST),
        (http.delete(format!("{url}/v1/charges")), StatusCode::METHOD_NOT_ALLOWED),
        (http.get(format!("{url}/v2/nothing")), StatusCode::NOT_FOUND),
        (http.get(format!("{url}/v1/charges?limit=3")), StatusCode::BAD_REQUEST),
    ];
    for (i, (request, expected)) in cases.into_iter().enumerate() {
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body: Value = response.json().await.unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(status, expected, "case {i}: {body}");
        assert_problem(&headers, &body, expected);
    }
    // None of them began executing: nothing charged, and key "k" is still unused.
    assert!(running.served().charges().is_empty());
    let (status, headers, _) = post(&http, &url, Some("k"), &charge("c", 1)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
}

#[tokio::test]
async fn keys_are_forgotten_after_the_retention() {
    let provider = Provider::new(ProviderConfig { retention: Duration::from_millis(50), max_keys: 1 });
    let running = provider.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let http = reqwest::Client::builder().no_proxy().timeout(BOUND).build().unwrap();
    let url = running.base_url();
    assert_eq!(post(&http, &url, Some("a"), &charge("c", 1)).await.0, StatusCode::CREATED);
    // The table holds one key: another is refused until the first expires.
    let (status, headers, body) = post(&http, &url, Some("b"), &charge("c", 1)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_problem(&headers, &body, status);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(post(&http, &url, Some("b"), &charge("c", 1)).await.0, StatusCode::CREATED);
    let (status, headers, _) = post(&http, &url, Some("a"), &charge("c", 1)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the table is full of b");
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(running.served().charges().len(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any body, key and content type: an answer, never a panic; an error is problem+json;
    /// a charge only for a valid request.
    #[test]
    fn arbitrary_requests_get_an_answer(
        body in prop::collection::vec(any::<u8>(), 0..200),
        key in prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
        json_type in any::<bool>(),
        valid in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let provider = Provider::default();
            let body = if valid { serde_json::to_vec(&charge("cus_1", 5)).unwrap() } else { body };
            let mut request = axum::http::Request::post("/v1/charges")
                .header("content-type", if json_type { "application/json" } else { "text/plain" });
            if let Some(key) = &key
                && let Ok(value) = axum::http::HeaderValue::from_bytes(key)
            {
                request = request.header("idempotency-key", value);
            }
            let response = provider.router().oneshot(request.body(Body::from(body)).unwrap()).await.unwrap();
            let status = response.status();
            let content_type = response.headers().get("content-type").cloned();
            if status.is_success() {
                prop_assert_eq!(status.as_u16(), 201);
                prop_assert_eq!(provider.charges().len(), 1);
            } else {
                prop_assert!([400, 413, 415].contains(&status.as_u16()), "{}", status);
                prop_assert_eq!(content_type.unwrap(), "application/problem+json");
                prop_assert!(provider.charges().is_empty());
            }
            Ok(())
        })?;
    }
}
