//! Every route and its bad inputs, over real HTTP against an in-process server:
//! each test runs twice, on the in-memory storage and on PostgreSQL (a database
//! of its own; SKIPPED when PostgreSQL is not reachable, unless `CI=true`).

use std::time::Duration;

use demo_resource::{Config, MAX_BODY_BYTES, Resource, RunningResource, Served};
use reqwest::{Client, Method};
use serde_json::json;
use test_support::TestDb;

use crate::common::{Answer, client};

/// Where the server under test keeps its data.
#[derive(Debug, Clone, Copy)]
enum Data {
    InMemory,
    Postgres,
}

/// Runs the test `$name(Data)` once per storage, as `$name::in_memory` and `$name::postgres`.
macro_rules! on_each_storage {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn in_memory() {
                super::$name(super::Data::InMemory).await;
            }

            #[tokio::test]
            async fn postgres() {
                super::$name(super::Data::Postgres).await;
            }
        }
    )*};
}

on_each_storage!(
    logs_append_in_order_and_refuse_stale_tokens,
    key_values_put_get_delete,
    fenced_routes_need_a_valid_current_token,
    bad_inputs_get_problem_json,
    unknown_routes_and_methods_never_touch_the_marks,
    delay_ms_holds_the_write_inside_the_handler,
    a_newer_token_waits_for_an_older_write_in_flight,
    without_fencing_stale_and_tokenless_writes_get_through,
);

struct Server {
    running: RunningResource,
    http: Client,
    /// Dropped after the server: the database of a PostgreSQL run.
    _db: Option<TestDb>,
}

impl Server {
    /// A server on `data`, fenced or not; `None` when PostgreSQL is not reachable (SKIPPED).
    async fn start(data: Data, fencing: bool) -> Option<Self> {
        let (config, db) = match data {
            Data::InMemory => (Config::in_memory(), None),
            Data::Postgres => {
                let db = TestDb::create().await?;
                (Config::postgres(db.url()), Some(db))
            }
        };
        let config = if fencing { config } else { config.without_fencing() };
        let resource = Resource::connect(config).await.unwrap();
        let running = resource.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
        Some(Self { running, http: client(), _db: db })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: impl Into<Vec<u8>>,
    ) -> Answer {
        let mut request = self.http.request(method, format!("{}{path}", self.running.base_url()));
        if let Some(token) = token {
            request = request.header("Fencing-Token", token);
        }
        Answer::of(request.body(body.into())).await
    }

    async fn post(&self, path: &str, token: Option<&str>, body: impl Into<Vec<u8>>) -> Answer {
        self.call(Method::POST, path, token, body).await
    }

    async fn put(&self, path: &str, token: Option<&str>, body: impl Into<Vec<u8>>) -> Answer {
        self.call(Method::PUT, path, token, body).await
    }

    async fn get(&self, path: &str) -> Answer {
        self.call(Method::GET, path, None, "").await
    }

    async fn delete(&self, path: &str, token: Option<&str>) -> Answer {
        self.call(Method::DELETE, path, token, "").await
    }

    async fn stop(self) {
        tokio::time::timeout(Duration::from_secs(20), self.running.shutdown()).await.unwrap().unwrap();
    }
}

async fn logs_append_in_order_and_refuse_stale_tokens(data: Data) {
    let Some(s) = Server::start(data, true).await else { return };
    let a = s.post("/logs/billing", Some("3"), "first").await;
    assert_eq!((a.status, a.body.clone()), (201, json!({"log": "billing", "index": 0, "token": 3})));
    assert_eq!(s.post("/logs/billing", Some("3"), "same holder again").await.status, 201);
    assert_eq!(s.post("/logs/billing", Some("5"), "newer holder").await.body["index"], 2);
    let stale = s.post("/logs/billing", Some("3"), "stale").await;
    stale.problem(409, "stale-token");
    assert_eq!(
        (stale.body["presented_token"].clone(), stale.body["highest_token"].clone()),
        (json!(3), json!(5))
    );
    // Another log has its own mark.
    assert_eq!(s.post("/logs/other", Some("1"), "").await.status, 201);
    // Percent-encoded paths are the same log, and the same mark.
    s.post("/logs/bil%6Cing", Some("4"), "stale, spelled differently").await.problem(409, "stale-token");

    let log = s.get("/logs/billing").await;
    assert_eq!(log.status, 200);
    assert_eq!(log.content_type, "application/json");
    assert_eq!(
        log.body,
        json!({"entries": [
            {"token": 3, "value": "first"},
            {"token": 3, "value": "same holder again"},
            {"token": 5, "value": "newer holder"},
        ]})
    );
    assert_eq!(s.get("/logs/other").await.body, json!({"entries": [{"token": 1, "value": ""}]}));
    s.stop().await;
}

async fn key_values_put_get_delete(data: Data) {
    let Some(s) = Server::start(data, true).await else { return };
    let created = s.put("/kv/owner", Some("2"), "worker-1").await;
    assert_eq!((created.status, created.body), (201, json!({"key": "owner", "token": 2})));
    assert_eq!(s.put("/kv/owner", Some("4"), "worker-2").await.status, 200);
    assert_eq!(s.get("/kv/owner").await.body, json!({"key": "owner", "token": 4, "value": "worker-2"}));
    s.put("/kv/owner", Some("2"), "stale").await.problem(409, "stale-token");
    s.delete("/kv/owner", Some("3")).await.problem(409, "stale-token");
    assert_eq!(s.get("/kv/owner").await.body["value"], "worker-2");
    let deleted = s.delete("/kv/owner", Some("4")).await;
    assert_eq!(deleted.status, 204);
    s.get("/kv/owner").await.problem(404, "unknown-key");
    s.delete("/kv/owner", Some("4")).await.problem(404, "unknown-key");
    s.stop().await;
}

async fn fenced_routes_need_a_valid_current_token(data: Data) {
    let Some(s) = Server::start(data, true).await else { return };
    for (method, path) in [(Method::POST, "/logs/l"), (Method::PUT, "/kv/k"), (Method::DELETE, "/kv/k")] {
        s.call(method.clone(), path, None, "x").await.problem(428, "missing-token");
        for bad in ["", "01", "-1", "1.0", "0x10", "18446744073709551616", "1 2"] {
            s.call(method.clone(), path, Some(bad), "x").await.problem(400, "invalid-token");
        }
    }
    // Nothing above was written.
    s.get("/logs/l").await.problem(404, "unknown-log");
    s.get("/kv/k").await.problem(404, "unknown-key");
    s.stop().await;
}

async fn bad_inputs_get_problem_json(data: Data) {
    let Some(s) = Server::start(data, true).await else { return };
    // Body size: exactly the limit is fine, one byte more is 413.
    assert_eq!(s.post("/logs/big", Some("1"), vec![b'a'; MAX_BODY_BYTES]).await.status, 201);
    let too_big = s.post("/logs/big", Some("1"), vec![b'a'; MAX_BODY_BYTES + 1]).await;
    too_big.problem(413, "body-too-large");
    assert_eq!(too_big.body["max_bytes"], MAX_BODY_BYTES);
    s.put("/kv/big", Some("1"), vec![b'a'; MAX_BODY_BYTES + 1]).await.problem(413, "body-too-large");
    // Invalid UTF-8.
    s.post("/logs/text", Some("1"), vec![b'o', b'k', 0xff]).await.problem(400, "invalid-utf8");
    s.put("/kv/text", Some("1"), vec![0xc3]).await.problem(400, "invalid-utf8");
    // Bad delay_ms.
    for query in
        ["delay_ms=10001", "delay_ms=-5", "delay_ms=abc", "delay_ms=", "delay_ms=1&delay_ms=1", "wait=1"]
    {
        s.post(&format!("/logs/q?{query}"), Some("1"), "x").await.problem(400, "bad-query");
        s.put(&format!("/kv/q?{query}"), Some("1"), "x").await.problem(400, "bad-query");
        s.call(Method::DELETE, &format!("/kv/q?{query}"), Some("1"), "").await.problem(400, "bad-query");
    }
    // Unknown routes and methods.
    s.get("/nope").await.problem(404, "not-found");
    s.post("/logs", Some("1"), "x").await.problem(404, "not-found");
    s.post("/logs/a/b", Some("1"), "x").await.problem(404, "not-found");
    s.post("/nope", None, "x").await.problem(404, "not-found");
    s.call(Method::PATCH, "/kv/k", Some("1"), "x").await.problem(405, "method-not-allowed");
    // Names that do not decode, or are too long.
    s.get("/logs/%ff").await.problem(400, "bad-path");
    s.post("/logs/%ff", Some("1"), "x").await.problem(400, "missing-key");
    s.post(&format!("/logs/{}", "n".repeat(257)), Some("1"), "x").await.problem(400, "name-too-long");
    s.get(&format!("/kv/{}", "n".repeat(257))).await.problem(400, "name-too-long");
    // GET of unknown log or key.
    s.get("/logs/never").await.problem(404, "unknown-log");
    s.get("/kv/never").await.problem(404, "unknown-key");
    // None of the refused writes left data behind.
    for log in ["text", "q", "a"] {
        s.get(&format!("/logs/{log}")).await.problem(404, "unknown-log");
    }
    for key in ["big", "text", "q"] {
        s.get(&format!("/kv/{key}")).await.problem(404, "unknown-key");
    }
    assert_eq!(s.get("/logs/big").await.body["entries"].as_array().unwrap().len(), 1);
    let health = s.get("/healthz").await;
    assert_eq!((health.status, health.body), (200, json!("ok")));
    s.stop().await;
}

async fn unknown_routes_and_methods_never_touch_the_marks(data: Data) {
    let Some(s) = Server::start(data, true).await else { return };
    let marks = s.running.served().mark_store().unwrap().clone();
    s.post("/nope", Some("9"), "x").await.problem(404, "not-found");
    s.call(Method::PATCH, "/kv/k", Some("9"), "x").await.problem(405, "method-not-allowed");
    s.call(Method::POST, "/kv/k", Some("9"), "x").await.problem(405, "method-not-allowed");
    assert_eq!((marks.len(), marks.mark("/kv/k")), (0, None));
    // So a lower token is still admitted afterwards.
    assert_eq!(s.put("/kv/k", Some("1"), "v").await.status, 201);
    assert_eq!(marks.mark("/kv/k"), Some(1));
    s.stop().await;
}

async fn delay_ms_holds_the_write_inside_the_handler(data: Data) {
    let Some(s) = Server::start(data, true).await else { return };
    let resource = s.running.served().clone();
    let url = format!("{}/logs/slow?delay_ms=10000", s.running.base_url());
    let write = tokio::spawn(s.http.post(url).header("Fencing-Token", "1").body("late").send());
    tokio::time::timeout(Duration::from_secs(10), resource.wait_in_flight("/logs/slow", 1)).await.unwrap();
    // Admitted, but not applied while it waits.
    s.get("/logs/slow").await.problem(404, "unknown-log");
    assert_eq!(resource.in_flight("/logs/slow"), 1);
    resource.finish_delays();
    let response = write.await.unwrap().unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(resource.in_flight("/logs/slow"), 0);
    assert_eq!(s.get("/logs/slow").await.body, json!({"entries": [{"token": 1, "value": "late"}]}));

    // A short delay really waits (tokio's clock).
    let started = tokio::time::Instant::now();
    assert_eq!(s.put("/kv/slow?delay_ms=150", Some("1"), "v").await.status, 201);
    assert!(started.elapsed() >= Duration::from_millis(150));
    s.stop().await;
}

async fn a_newer_token_waits_for_an_older_write_in_flight(data: Data) {
    let Some(s) = Server::start(data, true).await else { return };
    let resource = s.running.served().clone();
    let base = s.running.base_url();
    let old = tokio::spawn(
        s.http.post(format!("{base}/logs/l?delay_ms=10000")).header("Fencing-Token", "1").body("old").send(),
    );
    tokio::time::timeout(Duration::from_secs(10), resource.wait_in_flight("/logs/l", 1)).await.unwrap();
    let new =
        tokio::spawn(s.http.post(format!("{base}/logs/l")).header("Fencing-Token", "2").body("new").send());
    let marks = resource.mark_store().unwrap().clone();
    tokio::time::timeout(Duration::from_secs(10), async {
        while marks.mark("/logs/l") != Some(2) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap();
    // The newer write is held at the layer: the older one is still the only one inside.
    assert_eq!(resource.in_flight("/logs/l"), 1);
    s.post("/logs/l", Some("1"), "another old one").await.problem(409, "stale-token");
    resource.finish_delays();
    assert_eq!(old.await.unwrap().unwrap().status(), 201);
    assert_eq!(new.await.unwrap().unwrap().status(), 201);
    assert_eq!(
        s.get("/logs/l").await.body,
        json!({"entries": [{"token": 1, "value": "old"}, {"token": 2, "value": "new"}]})
    );
    s.stop().await;
}

async fn without_fencing_stale_and_tokenless_writes_get_through(data: Data) {
    let Some(s) = Server::start(data, false).await else { return };
    assert!(s.running.served().mark_store().is_none());
    assert_eq!(s.post("/logs/l", Some("5"), "newer").await.status, 201);
    assert_eq!(s.post("/logs/l", Some("1"), "stale").await.status, 201);
    assert_eq!(s.post("/logs/l", None, "no token").await.status, 201);
    assert_eq!(
        s.get("/logs/l").await.body,
        json!({"entries": [
            {"token": null, "value": "newer"},
            {"token": null, "value": "stale"},
            {"token": null, "value": "no token"},
        ]})
    );
    assert_eq!(s.put("/kv/k", None, "v").await.status, 201);
    assert_eq!(s.delete("/kv/k", None).await.status, 204);
    // The same validation applies.
    s.post("/logs/l", None, vec![0xff]).await.problem(400, "invalid-utf8");
    s.post("/nope", None, "x").await.problem(404, "not-found");
    s.stop().await;
}

#[tokio::test]
async fn on_postgres_names_cannot_hold_nul_but_values_can() {
    let Some(s) = Server::start(Data::Postgres, true).await else { return };
    // PostgreSQL text cannot hold NUL: such a name cannot be fenced or written, and was never written.
    s.post("/logs/a%00b", Some("1"), "x").await.problem(400, "invalid-key");
    s.put("/kv/a%00b", Some("1"), "x").await.problem(400, "invalid-key");
    s.get("/logs/a%00b").await.problem(404, "unknown-log");
    s.get("/kv/a%00b").await.problem(404, "unknown-key");
    // Values are bytes: any UTF-8 body comes back as it was sent.
    assert_eq!(s.put("/kv/nul", Some("1"), "a\0b").await.status, 201);
    assert_eq!(s.get("/kv/nul").await.body, json!({"key": "nul", "token": 1, "value": "a\u{0}b"}));
    s.stop().await;
}
