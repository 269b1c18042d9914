//! The admin routes: list, read and reset fencing marks, on a listener of
//! their own (`serve --admin-listen`), never on the public one.
//!
//! | route | success | errors |
//! |---|---|---|
//! | `GET /marks` | 200 `{"marks":[{"key","mark"}]}`, sorted by key | 400 a query other than `key` |
//! | `GET /marks?key=K` (K URL-encoded: `key=%2Flogs%2Fbilling`) | 200 `{"key","mark"}` | 404 no mark for K; 400 bad query |
//! | `POST /marks/reset`, `Content-Type: application/json`, `{"key":K,"to":N}` | 200 `{"key","old","new"}` | 415 not JSON; 400 bad JSON; 413 body over 16 KiB; 404 no mark for K; 503 + `Retry-After` while a raise of K is being recorded; 500 the mark log failed (nothing changed) |
//!
//! A key is the fencing layer's: the percent-decoded path (`/logs/billing`).
//! A reset sets the mark lower or higher; it is written to the durable mark
//! log before the answer, and logged at `warn` with the key, the old and new
//! mark and the peer's address. Only keys that have a mark can be reset: a
//! typo must not create one. Requiring `application/json` also keeps a web
//! page in the operator's browser from posting a reset (no CORS preflight is
//! ever answered).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fencing_layer::{MarkStore, store::StoreError};
use serde::{Deserialize, Serialize};

use crate::marks::ResetError;
use crate::problem::{Problem, read_limited, require_json};
use crate::store::Data;

/// What the admin routes share.
#[derive(Clone)]
struct Admin {
    marks: MarkStore,
    data: Arc<Data>,
}

/// Largest accepted reset body, in bytes: a key of the store's longest (1 KiB
/// by default), escaped, fits many times over.
pub(crate) const MAX_ADMIN_BODY_BYTES: usize = 16 * 1024;

/// The admin routes over `marks` and the data's fences.
pub(crate) fn router(marks: MarkStore, data: Arc<Data>) -> Router {
    Router::new()
        .route("/marks", get(read_marks))
        .route("/marks/reset", post(reset))
        .method_not_allowed_fallback(|| async {
            Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed")
                .detail("this route does not accept that method")
        })
        .fallback(|| async {
            Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found")
                .detail("no such admin route: GET /marks, GET /marks?key=K, POST /marks/reset")
        })
        .with_state(Admin { marks, data })
}

#[derive(Serialize)]
struct Mark {
    key: String,
    mark: u64,
}

#[derive(Serialize)]
struct Marks {
    marks: Vec<Mark>,
}

/// `POST /marks/reset`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRequest {
    key: String,
    to: u64,
}

/// `POST /marks/reset`'s answer.
#[derive(Serialize)]
struct Reset {
    key: String,
    old: u64,
    new: u64,
}

/// The `key` of `?key=K`, or `None` without a query; 400 for anything else.
fn key_query(query: Option<&str>) -> Result<Option<String>, Problem> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(None);
    };
    let mut key = None;
    for (param, value) in form_urlencoded::parse(query.as_bytes()) {
        if param != "key" {
            return Err(Problem::bad_request("bad-query", format!("unknown query parameter {param:?}")));
        }
        if key.replace(value.into_owned()).is_some() {
            return Err(Problem::bad_request("bad-query", "key given more than once"));
        }
    }
    Ok(key)
}

fn no_mark(key: &str) -> Problem {
    Problem::new(StatusCode::NOT_FOUND, "unknown-key", "Unknown key")
        .detail(format!("no mark for key {key:?}: no fenced request for it got this far"))
        .with("key", key)
}

async fn read_marks(State(admin): State<Admin>, RawQuery(query): RawQuery) -> Result<Response, Problem> {
    let marks = admin.marks;
    match key_query(query.as_deref())? {
        None => {
            let marks = marks.marks().into_iter().map(|(key, mark)| Mark { key, mark }).collect();
            Ok(axum::Json(Marks { marks }).into_response())
        }
        Some(key) => match marks.mark(&key) {
            Some(mark) => Ok(axum::Json(Mark { key, mark }).into_response()),
            None => Err(no_mark(&key)),
        },
    }
}

async fn reset(State(admin): State<Admin>, request: Request) -> Result<Response, Problem> {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|info| info.0);
    require_json(
        request.headers(),
        r#"send the reset as Content-Type: application/json, {"key": "/logs/billing", "to": 41}"#,
    )?;
    let bytes = read_limited(request.into_body(), MAX_ADMIN_BODY_BYTES, "a reset body").await?;
    let ResetRequest { key, to } = serde_json::from_slice(&bytes).map_err(|error| {
        Problem::bad_request(
            "bad-json",
            format!(r#"expected {{"key": "<mark key>", "to": <0 to 18446744073709551615>}}: {error}"#),
        )
    })?;
    // A durable reset commits to the mark file and the data file: blocking work.
    let reset_key = key.clone();
    let answer =
        tokio::task::spawn_blocking(move || crate::marks::reset(&admin.marks, &admin.data, &reset_key, to));
    let answer =
        answer.await.map_err(|error| Problem::internal(format!("the reset task failed: {error}")))?;
    match answer {
        Ok(old) => {
            let peer = peer.map(|peer| peer.to_string());
            tracing::warn!(key = ?key, old, new = to, peer, "fencing mark reset through the admin routes");
            Ok(axum::Json(Reset { key, old, new: to }).into_response())
        }
        Err(error) => Err(reset_error(&key, &error)),
    }
}

/// A refused or failed reset as a problem.
fn reset_error(key: &str, error: &ResetError) -> Problem {
    match error {
        ResetError::UnknownKey => no_mark(key),
        ResetError::Mark(StoreError::Busy) => {
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, "reset-busy", "Mark busy")
                .detail(format!("{error}: a raise of {key:?} is being recorded right now; try again"))
                .with("key", key)
                .retry_after(1)
        }
        ResetError::Mark(StoreError::KeyTooLong { .. }) => {
            Problem::bad_request("key-too-long", error.to_string())
        }
        _ => Problem::internal(format!("the reset of {key:?} failed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::header;

    use super::*;

    #[test]
    fn busy_is_a_503_with_retry_after() {
        let response = reset_error("/logs/billing", &ResetError::Mark(StoreError::Busy)).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        let failed = reset_error("/logs/billing", &ResetError::Mark(StoreError::Closed)).into_response();
        assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(failed.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn the_key_query_is_strict() {
        assert_eq!(key_query(None).unwrap(), None);
        assert_eq!(key_query(Some("")).unwrap(), None);
        assert_eq!(key_query(Some("key=%2Flogs%2Fa+b")).unwrap().as_deref(), Some("/logs/a b"));
        assert_eq!(key_query(Some("key=/kv/k")).unwrap().as_deref(), Some("/kv/k"));
        for bad in ["key=a&key=b", "mark=1", "key=a&x=1"] {
            assert_eq!(key_query(Some(bad)).unwrap_err().status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
