//! `FenceError` as an axum response: the layer's 409 byte for byte, 503 with
//! Retry-After when the database is away or the pool exhausted. Two replicas
//! (each with its own per-process layer) share one database.

#![cfg(feature = "axum")]

use std::time::Duration;

use crate::common::{TestDb, TestDbExt};
use axum::Router;
use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use deadpool_postgres::Pool;
use fencing_layer::{FencingLayer, FencingToken, Rejection, respond::ProblemJson};
use fencing_postgres::{FenceError, PgFence, PoolLimits};
use tower::ServiceExt;

#[derive(Clone)]
struct App {
    pool: Pool,
    fence: PgFence,
}

/// The handler of the crate docs: begin, fence, write, commit.
async fn put_doc(
    State(app): State<App>,
    Path(name): Path<String>,
    token: FencingToken,
    body: String,
) -> Result<StatusCode, FenceError> {
    let mut client = app.pool.get().await?;
    let tx = client.transaction().await?;
    app.fence.fence(&tx, &format!("/docs/{name}"), token.get()).await?;
    tx.execute(
        "INSERT INTO docs (name, token, body) VALUES ($1, $2, $3)",
        &[&name, &token.to_string(), &body],
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

fn replica(pool: Pool) -> Router {
    Router::new()
        .route("/docs/{name}", put(put_doc))
        .route_layer(FencingLayer::new())
        .with_state(App { pool, fence: PgFence::new() })
}

async fn send(app: &Router, token: u64) -> (StatusCode, Option<String>, Bytes) {
    let request = Request::put("/docs/a").header("fencing-token", token).body(Body::from("x")).unwrap();
    split(app.clone().oneshot(request).await.unwrap()).await
}

async fn split(response: Response) -> (StatusCode, Option<String>, Bytes) {
    let status = response.status();
    let retry_after = response.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_owned());
    if !status.is_success() {
        let content_type = &response.headers()[header::CONTENT_TYPE];
        assert_eq!(content_type, "application/problem+json");
    }
    (status, retry_after, to_bytes(response.into_body(), 1 << 16).await.unwrap())
}

#[tokio::test]
async fn stale_and_key_too_long_answer_with_the_layers_bodies() {
    let stale = FenceError::Stale { key: "/docs/a".into(), presented: 5, highest: 7 };
    let rejection = Rejection::Stale { key: "/docs/a".into(), presented: 5, highest: 7 };
    assert_eq!(stale.rejection(), Some(rejection.clone()));
    let (status, retry_after, body) = split(stale.into_response()).await;
    assert_eq!((status, retry_after), (StatusCode::CONFLICT, None));
    assert_eq!(body, ProblemJson::body(&rejection));

    let too_long = FenceError::KeyTooLong { limit: 1024 };
    let (status, _, body) = split(too_long.into_response()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body, ProblemJson::body(&Rejection::KeyTooLong { limit: 1024 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_never_saw_the_newer_token_still_answers_409() {
    let Some(db) = TestDb::create().await else { return };
    db.fence().await;
    let setup = db.connect().await;
    setup.batch_execute("CREATE TABLE docs (seq BIGSERIAL, name TEXT, token TEXT, body TEXT)").await.unwrap();
    let (a, b) = (replica(db.pool(PoolLimits::default())), replica(db.pool(PoolLimits::default())));

    assert_eq!(send(&a, 7).await.0, StatusCode::NO_CONTENT);
    // Replica A's own layer knows 7 and refuses 5 itself.
    let from_layer = send(&a, 5).await;
    assert_eq!(from_layer.0, StatusCode::CONFLICT);
    // Replica B's layer has never seen 7 and admits 5: the transaction refuses it.
    let from_transaction = send(&b, 5).await;
    assert_eq!(from_transaction, from_layer, "the same 409, whichever check refused");
    assert_eq!(send(&b, 7).await.0, StatusCode::NO_CONTENT);

    let rows = setup.query("SELECT token FROM docs ORDER BY seq", &[]).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.get(0)).collect::<Vec<String>>(), ["7", "7"]);
}

#[tokio::test]
async fn an_exhausted_pool_is_a_503_with_retry_after() {
    let Some(db) = TestDb::create().await else { return };
    db.fence().await;
    let limits = PoolLimits { max_size: 1, wait: Duration::from_millis(200), ..PoolLimits::default() };
    let pool = db.pool(limits);
    let app = replica(pool.clone());
    let _busy = pool.get().await.unwrap();

    let (status, retry_after, body) = send(&app, 1).await;
    assert_eq!((status, retry_after.as_deref()), (StatusCode::SERVICE_UNAVAILABLE, Some("1")));
    assert!(
        std::str::from_utf8(&body).unwrap().contains("urn:fencing:problem:database-unavailable"),
        "{body:?}"
    );
}

#[tokio::test]
async fn a_database_that_is_down_is_a_503_with_retry_after() {
    // A loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config: tokio_postgres::Config = format!("host=127.0.0.1 port={port} user=postgres").parse().unwrap();
    let app = replica(fencing_postgres::pool(config, PoolLimits::default()).unwrap());

    let (status, retry_after, body) = send(&app, 1).await;
    assert_eq!((status, retry_after.as_deref()), (StatusCode::SERVICE_UNAVAILABLE, Some("1")));
    let body = std::str::from_utf8(&body).unwrap();
    assert!(body.starts_with(r#"{"type":"urn:fencing:problem:database-unavailable","#), "{body}");
    assert!(!body.contains("refused"), "the driver's error stays in the log: {body}");
}

#[tokio::test]
async fn other_database_errors_are_a_500_without_details() {
    let Some(db) = TestDb::create().await else { return };
    db.fence().await; // but no `docs` table: the handler's insert fails
    let app = replica(db.pool(PoolLimits::default()));
    let (status, retry_after, body) = send(&app, 1).await;
    assert_eq!((status, retry_after), (StatusCode::INTERNAL_SERVER_ERROR, None));
    assert!(!std::str::from_utf8(&body).unwrap().contains("docs"));
}
