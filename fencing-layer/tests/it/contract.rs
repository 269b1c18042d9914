//! Every row of the layer's HTTP contract, through `oneshot` and through a real server.

use std::time::Duration;

use crate::common::{Reply, Server, app};
use axum::Router;
use axum::body::Body;
use fencing_layer::{
    FencingLayer, MarkStore, Rejection, TokenError,
    key::HeaderKey,
    store::{MarkLog, StoreError},
};
use http::{HeaderName, Request, StatusCode};
use tower::ServiceExt;

/// The two ways in: `oneshot` on the router, or HTTP/1.1 over loopback.
enum Client {
    Oneshot(Router),
    Http(Server),
}

impl Client {
    async fn new(router: Router, http: bool) -> Self {
        if http { Self::Http(Server::start(router).await) } else { Self::Oneshot(router) }
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &[u8])]) -> Reply {
        match self {
            Self::Http(server) => server.send(method, path, headers).await,
            Self::Oneshot(router) => {
                let mut request = Request::builder().method(method).uri(path);
                for (name, value) in headers {
                    request = request.header(*name, http::HeaderValue::from_bytes(value).unwrap());
                }
                let response = router.clone().oneshot(request.body(Body::from("x")).unwrap()).await.unwrap();
                // The typed rejection travels with every refusal.
                let rejection = response.extensions().get::<Rejection>().cloned();
                let reply = Reply::read(response).await;
                assert_eq!(
                    rejection.is_some(),
                    reply.headers.get("content-type").is_some_and(|t| t == "application/problem+json")
                );
                if let Some(rejection) = rejection {
                    assert_eq!(rejection.status(), reply.status);
                    // Every refusal names its problem in a header, for clients that read no body.
                    assert_eq!(reply.headers["fencing-problem"], rejection.kind());
                    let highest = reply.headers.get("fencing-highest-token").map(|v| v.to_str().unwrap());
                    assert_eq!(highest.map(str::parse::<u64>).map(Result::unwrap), rejection.highest());
                } else {
                    assert!(reply.headers.get("fencing-problem").is_none());
                }
                reply
            }
        }
    }

    async fn post(&self, path: &str, token: &str) -> Reply {
        self.send("POST", path, &[("fencing-token", token.as_bytes())]).await
    }

    async fn stop(self) {
        if let Self::Http(server) = self {
            server.stop().await;
        }
    }
}

fn kind(reply: &Reply) -> String {
    let problem = reply.problem();
    problem["type"].as_str().unwrap().trim_start_matches("urn:fencing:problem:").to_owned()
}

async fn unfenced_methods_pass_and_writes_need_a_token(http: bool) {
    let (router, writes) = app(FencingLayer::new());
    let client = Client::new(router, http).await;
    for method in ["GET", "HEAD", "OPTIONS", "TRACE"] {
        assert_eq!(client.send(method, "/logs/a", &[]).await.status, StatusCode::OK, "{method}");
    }
    for method in ["POST", "PUT", "PATCH", "DELETE"] {
        let reply = client.send(method, "/logs/a", &[]).await;
        assert_eq!(reply.status, StatusCode::PRECONDITION_REQUIRED, "{method}");
        assert_eq!(kind(&reply), "missing-token");
    }
    assert_eq!(writes.seen(), vec![("a".to_owned(), None); 4]);
    client.stop().await;
}

async fn malformed_tokens_are_400(http: bool) {
    let (router, writes) = app(FencingLayer::new());
    let client = Client::new(router, http).await;
    let mut cases: Vec<&[u8]> = vec![
        b"",
        b"+5",
        b"-1",
        b"05",
        b"00",
        b"5 5",
        b"1e3",
        b"0x10",
        b"1.0",
        b"18446744073709551616",
        b"\xd9\xa5",
        b"\xc3\xa9",
    ];
    if !http {
        // Over HTTP the parser strips whitespace around a field value before any
        // service sees it (RFC 9110, 5.5); a header value built in-process keeps it.
        cases.extend([b" 5".as_slice(), b"5 ", b"\t5"]);
    }
    for token in cases {
        let reply = client.send("POST", "/logs/a", &[("fencing-token", token)]).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{token:?}");
        assert_eq!(kind(&reply), "invalid-token", "{token:?}");
    }
    // Two header lines, even with the same value.
    let reply = client.send("POST", "/logs/a", &[("fencing-token", b"1"), ("fencing-token", b"1")]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.problem()["detail"].as_str().unwrap().contains("more than once"));
    // The largest token is fine.
    assert_eq!(client.post("/logs/max", "18446744073709551615").await.status, StatusCode::OK);
    assert_eq!(writes.seen(), vec![("max".to_owned(), Some(u64::MAX))]);
    if http {
        // What the README says: spaces around the value are the parser's to strip, and the
        // token is admitted; only spaces inside it are refused (above).
        for token in [b" 7".as_slice(), b"7 ", b"\t7  "] {
            let reply = client.send("POST", "/logs/spaced", &[("fencing-token", token)]).await;
            assert_eq!(reply.status, StatusCode::OK, "{token:?}");
        }
    }
    client.stop().await;
}

async fn stale_tokens_are_409_and_equal_or_higher_pass(http: bool) {
    let layer = FencingLayer::new();
    let store = layer.mark_store().clone();
    let (router, writes) = app(layer);
    let client = Client::new(router, http).await;
    assert_eq!(client.post("/logs/s", "5").await.status, StatusCode::OK);
    let reply = client.post("/logs/s", "4").await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    let problem = reply.problem();
    assert_eq!(problem["presented_token"], 4);
    assert_eq!(problem["highest_token"], 5);
    assert_eq!(problem["key"], "/logs/s");
    assert_eq!(reply.headers["fencing-problem"], "stale-token");
    assert_eq!(reply.headers["fencing-highest-token"], "5");
    assert_eq!(client.post("/logs/s", "5").await.status, StatusCode::OK);
    assert_eq!(client.post("/logs/s", "6").await.status, StatusCode::OK);
    assert_eq!(client.post("/logs/s", "5").await.status, StatusCode::CONFLICT);
    // Keys are independent, and a percent-encoded spelling is the same key.
    assert_eq!(client.post("/logs/other", "1").await.status, StatusCode::OK);
    assert_eq!(client.post("/logs/%73", "5").await.status, StatusCode::CONFLICT);
    assert_eq!(store.mark("/logs/s"), Some(6));
    assert_eq!(store.mark("/logs/other"), Some(1));
    let tokens: Vec<_> = writes.seen().into_iter().map(|(_, t)| t.unwrap()).collect();
    assert_eq!(tokens, [5, 5, 6, 1]);
    // Unknown routes are 404 and leave the key table alone.
    assert_eq!(client.post("/nope", "9").await.status, StatusCode::NOT_FOUND);
    assert_eq!(store.len(), 2);
    client.stop().await;
}

async fn missing_keys_are_400(http: bool) {
    let layer = FencingLayer::new().key_extractor(HeaderKey::new(HeaderName::from_static("x-resource")));
    let (router, writes) = app(layer);
    let client = Client::new(router, http).await;
    let reply = client.post("/logs/a", "1").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(kind(&reply), "missing-key");
    assert_eq!(reply.problem()["detail"], "no resource key in the request: header x-resource is missing");
    let twice = [("fencing-token", b"1".as_slice()), ("x-resource", b"a"), ("x-resource", b"b")];
    let reply = client.send("POST", "/logs/a", &twice).await;
    assert_eq!(
        reply.problem()["detail"],
        "no resource key in the request: header x-resource appears more than once"
    );
    let with_key = [("fencing-token", b"1".as_slice()), ("x-resource", b"orders")];
    assert_eq!(client.send("POST", "/logs/a", &with_key).await.status, StatusCode::OK);
    assert_eq!(writes.seen().len(), 1);
    client.stop().await;
}

async fn overlong_new_keys_are_400(http: bool) {
    let store = MarkStore::builder().max_key_bytes(16).in_memory();
    let (router, writes) = app(FencingLayer::new().store(store.clone()));
    let client = Client::new(router, http).await;
    let reply = client.post("/logs/abcdefghijklmnop", "1").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(kind(&reply), "key-too-long");
    assert_eq!(client.post("/logs/abcdefghij", "1").await.status, StatusCode::OK);
    assert_eq!((store.len(), writes.seen().len()), (1, 1));
    client.stop().await;
}

async fn allow_unfenced_passes_tokenless_writes_but_checks_tokens(http: bool) {
    let (router, writes) = app(FencingLayer::new().allow_unfenced(true));
    let client = Client::new(router, http).await;
    assert_eq!(client.send("POST", "/logs/a", &[]).await.status, StatusCode::OK);
    assert_eq!(client.post("/logs/a", "3").await.status, StatusCode::OK);
    assert_eq!(client.post("/logs/a", "2").await.status, StatusCode::CONFLICT);
    assert_eq!(client.post("/logs/a", "x").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(writes.seen(), [("a".to_owned(), None), ("a".to_owned(), Some(3))]);
    client.stop().await;
}

async fn a_full_key_table_refuses_new_keys_only(http: bool) {
    let store = MarkStore::builder().max_keys(2).in_memory();
    let (router, _) = app(FencingLayer::new().store(store.clone()));
    let client = Client::new(router, http).await;
    assert_eq!(client.post("/logs/k1", "1").await.status, StatusCode::OK);
    assert_eq!(client.post("/logs/k2", "1").await.status, StatusCode::OK);
    let reply = client.post("/logs/k3", "1").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(kind(&reply), "key-table-full");
    assert_eq!(client.post("/logs/k1", "2").await.status, StatusCode::OK);
    assert_eq!(client.post("/logs/k2", "0").await.status, StatusCode::CONFLICT);
    assert_eq!((store.len(), store.mark("/logs/k3")), (2, None));
    client.stop().await;
}

/// A log whose disk is gone.
struct BrokenLog;

impl MarkLog for BrokenLog {
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(vec![("/logs/known".into(), 4)])
    }

    fn record(&self, _: &[(&str, u64)]) -> Result<(), StoreError> {
        Err(StoreError::log(std::io::Error::other("disk unplugged")))
    }
}

async fn a_failing_store_admits_nothing_it_cannot_record(http: bool) {
    let store = MarkStore::builder().durable(BrokenLog).unwrap();
    let (router, writes) = app(FencingLayer::new().store(store.clone()));
    let client = Client::new(router, http).await;
    // The recorded mark needs no write, so it still works.
    assert_eq!(client.post("/logs/known", "4").await.status, StatusCode::OK);
    for _ in 0..2 {
        let reply = client.post("/logs/known", "5").await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(kind(&reply), "store-unavailable");
        assert!(reply.headers.contains_key("retry-after"));
    }
    // The mark rose in memory at once (failing closed), so the old token is stale now.
    assert_eq!(client.post("/logs/known", "4").await.status, StatusCode::CONFLICT);
    assert_eq!(store.mark("/logs/known"), Some(5));
    assert_eq!(writes.seen(), [("known".to_owned(), Some(4))]);
    client.stop().await;
}

async fn a_drain_past_its_bound_is_503_with_retry_after(http: bool) {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let entered = std::sync::Arc::new(tokio::sync::Notify::new());
    let (g, e) = (gate.clone(), entered.clone());
    let router = Router::new()
        .route(
            "/slow",
            axum::routing::post(move || {
                let (gate, entered) = (g.clone(), e.clone());
                async move {
                    entered.notify_one();
                    gate.notified().await;
                }
            }),
        )
        .route_layer(
            FencingLayer::new()
                .drain_timeout(Duration::from_millis(200))
                .retry_after(Duration::from_millis(1500)),
        );
    let client = std::sync::Arc::new(Client::new(router, http).await);
    let holder = tokio::spawn({
        let client = client.clone();
        async move { client.post("/slow", "1").await.status }
    });
    entered.notified().await;
    let reply = client.post("/slow", "2").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(kind(&reply), "drain-timeout");
    assert_eq!(reply.headers["retry-after"], "2");
    // The mark stayed raised: the old holder's next write is refused at once.
    assert_eq!(client.post("/slow", "1").await.status, StatusCode::CONFLICT);
    gate.notify_one();
    assert_eq!(holder.await.unwrap(), StatusCode::OK);
    // Drained now, so the new holder gets in.
    let entered_again = entered.notified();
    let (reply, ()) = tokio::join!(client.post("/slow", "2"), async {
        entered_again.await;
        gate.notify_one();
    });
    assert_eq!(reply.status, StatusCode::OK);
    if let Ok(client) = std::sync::Arc::try_unwrap(client) {
        client.stop().await;
    }
}

macro_rules! both_ways {
    ($($name:ident),* $(,)?) => {
        mod via_oneshot {
            $(#[tokio::test]
            async fn $name() {
                super::$name(false).await;
            })*
        }
        mod via_http {
            $(#[tokio::test]
            async fn $name() {
                super::$name(true).await;
            })*
        }
    };
}

both_ways!(
    unfenced_methods_pass_and_writes_need_a_token,
    malformed_tokens_are_400,
    stale_tokens_are_409_and_equal_or_higher_pass,
    missing_keys_are_400,
    overlong_new_keys_are_400,
    allow_unfenced_passes_tokenless_writes_but_checks_tokens,
    a_full_key_table_refuses_new_keys_only,
    a_failing_store_admits_nothing_it_cannot_record,
    a_drain_past_its_bound_is_503_with_retry_after,
);

#[tokio::test]
async fn a_custom_responder_replaces_the_body_but_not_the_contract() {
    let layer =
        FencingLayer::new().drain_timeout(Duration::from_secs(1)).on_rejection(|rejection: &Rejection| {
            http::Response::builder()
                .status(rejection.status())
                .body(Body::from(format!("no: {}", rejection.kind())))
                .unwrap()
        });
    let (router, _) = app(layer);
    let client = Client::Oneshot(router.clone());
    assert_eq!(client.post("/logs/a", "2").await.status, StatusCode::OK);
    let request = Request::post("/logs/a").header("fencing-token", "1").body(Body::empty()).unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.extensions().get::<Rejection>().and_then(Rejection::highest), Some(2));
    // The layer's headers stay, whichever the responder.
    assert_eq!(response.headers()["fencing-problem"], "stale-token");
    assert_eq!(response.headers()["fencing-highest-token"], "2");
    assert_eq!(&Reply::read(response).await.body[..], b"no: stale-token");
}

#[test]
fn token_errors_name_what_is_wrong() {
    assert_eq!(Rejection::InvalidToken(TokenError::Repeated).status(), StatusCode::BAD_REQUEST);
    assert_eq!(Rejection::MissingToken.status(), StatusCode::PRECONDITION_REQUIRED);
}
