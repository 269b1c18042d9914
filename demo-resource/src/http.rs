//! The data routes and their handlers: logs and key-value pairs, each write counted in flight.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use fencing_layer::FencingToken;
use serde::Serialize;
use serde_json::json;

use crate::app::{App, InFlight};
use crate::data::DataError;
use crate::limits::{MAX_BODY_BYTES, MAX_NAME_BYTES};
use crate::problem::{Problem, parse_delay, problem_fallbacks, read_limited};
use crate::ready::readyz;

/// The data routes. The caller puts the fencing layer on them (or not).
pub(crate) fn routes() -> Router<App> {
    Router::new()
        .route("/logs/{name}", post(append).get(read_log))
        .route("/kv/{key}", put(put_value).get(get_value).delete(delete_value))
}

/// Adds the routes nobody fences, and problem+json for unknown routes and methods.
pub(crate) fn finish(routes: Router<App>, app: App) -> Router {
    let routes = routes.route("/healthz", get(|| async { "ok" })).route("/readyz", get(readyz));
    problem_fallbacks(routes).with_state(app)
}

/// `POST /logs/{name}`'s answer.
#[derive(Serialize)]
struct Appended {
    log: String,
    index: u64,
    token: Option<u64>,
}

/// `PUT /kv/{key}`'s answer.
#[derive(Serialize)]
struct Stored {
    key: String,
    token: Option<u64>,
}

/// `GET /kv/{key}`'s answer.
#[derive(Serialize)]
struct KeyValue {
    key: String,
    token: Option<u64>,
    value: String,
}

/// Handlers answer with a [`Problem`] or the data's own error response, so
/// both convert with `?`.
type Answer = Result<Response, Response>;

impl From<DataError> for Response {
    fn from(error: DataError) -> Self {
        match error {
            DataError::Stale { presented, highest } => {
                Problem::new(StatusCode::CONFLICT, "stale-token", "Stale fencing token")
                    .detail(error.to_string())
                    .with("presented_token", presented)
                    .with("highest_token", highest)
                    .into_response()
            }
            // fencing-postgres's answers: the layer's 409 for a stale token, 503
            // with Retry-After when the database is away or the pool exhausted.
            #[cfg(feature = "postgres")]
            DataError::Postgres(error) => error.into_response(),
            // The disk failed: the file is being reopened (`GET /readyz` says when it is back).
            DataError::Storage(fault) if fault.is_unavailable() => {
                tracing::error!(%fault, "data store unavailable");
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", "Store unavailable")
                    .detail(format!("the data store failed: {fault}"))
                    .retry_after(1)
                    .into_response()
            }
            DataError::Storage(_) | DataError::Task(_) => Problem::internal(error).into_response(),
        }
    }
}

/// A path parameter, or 400 when it does not decode or is too long.
fn name(path: Result<Path<String>, PathRejection>) -> Result<String, Problem> {
    let Path(name) = path.map_err(|e| Problem::bad_request("bad-path", e.body_text()))?;
    if name.len() > MAX_NAME_BYTES {
        return Err(Problem::bad_request(
            "name-too-long",
            format!("names are at most {MAX_NAME_BYTES} bytes"),
        ));
    }
    Ok(name)
}

/// Reads the whole body as UTF-8 text of at most [`MAX_BODY_BYTES`].
async fn read_text(body: Body) -> Result<String, Problem> {
    let bytes = read_limited(body, MAX_BODY_BYTES, "the body").await?;
    String::from_utf8(bytes.into()).map_err(|e| {
        Problem::bad_request("invalid-utf8", format!("the body must be UTF-8 text: {}", e.utf8_error()))
    })
}

/// A write the layer admitted, counted in flight and validated: what every
/// write route does before applying it. `in_flight` keeps the write counted
/// until it is dropped, after the commit; the backend waits out `delay` with it
/// (`InFlight::delay`) just before applying the write.
struct Write {
    /// The path parameter: the log's or the key's name.
    name: String,
    /// What the data's marks are kept for: `/logs/NAME` or `/kv/NAME`.
    resource: String,
    /// The token the layer validated (none when fencing is off).
    token: Option<u64>,
    in_flight: InFlight,
    delay: Duration,
    /// The body (empty for a delete).
    text: String,
}

impl FromRequest<App> for Write {
    type Rejection = Response;

    async fn from_request(request: Request, app: &App) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let name = name(Path::from_request_parts(&mut parts, app).await)?;
        // The route this handler serves (`/logs/{name}`, `/kv/{key}`), with the name in place of its parameter.
        let route = parts.extensions.get::<MatchedPath>().map_or("", MatchedPath::as_str);
        let resource = format!("{}/{name}", &route[..route.rfind('/').unwrap_or_default()]);
        // The token the layer admitted this request with (what `Option<FencingToken>` extracts).
        let token = FencingToken::current().map(FencingToken::get);
        let in_flight = app.enter(&resource);
        let delay = parse_delay(parts.uri.query())?;
        let text = read_text(body).await?;
        Ok(Self { name, resource, token, in_flight, delay, text })
    }
}

async fn append(State(app): State<App>, write: Write) -> Answer {
    let Write { name: log, resource, token, mut in_flight, delay, text } = write;
    let index = app.data.append(&resource, &log, token, text, in_flight.delay(delay)).await?;
    drop(in_flight);
    tracing::info!(log, index, token, "appended");
    Ok((StatusCode::CREATED, axum::Json(Appended { log, index, token })).into_response())
}

async fn read_log(State(app): State<App>, path: Result<Path<String>, PathRejection>) -> Answer {
    let log = name(path)?;
    match app.data.log(&log).await? {
        Some(entries) => Ok(axum::Json(json!({ "entries": entries })).into_response()),
        None => Err(Problem::new(StatusCode::NOT_FOUND, "unknown-log", "Unknown log")
            .detail(format!("nothing was ever appended to log {log:?}"))
            .into()),
    }
}

async fn put_value(State(app): State<App>, write: Write) -> Answer {
    let Write { name: key, resource, token, mut in_flight, delay, text } = write;
    let created = app.data.put(&resource, &key, token, text, in_flight.delay(delay)).await?;
    drop(in_flight);
    tracing::info!(key, token, created, "stored");
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(Stored { key, token })).into_response())
}

async fn get_value(State(app): State<App>, path: Result<Path<String>, PathRejection>) -> Answer {
    let key = name(path)?;
    match app.data.get(&key).await? {
        Some(entry) => {
            Ok(axum::Json(KeyValue { key, token: entry.token, value: entry.value }).into_response())
        }
        None => Err(unknown_key(&key).into()),
    }
}

async fn delete_value(State(app): State<App>, write: Write) -> Answer {
    let Write { name: key, resource, token, mut in_flight, delay, .. } = write;
    let deleted = app.data.delete(&resource, &key, token, in_flight.delay(delay)).await?;
    drop(in_flight);
    if !deleted {
        return Err(unknown_key(&key).into());
    }
    tracing::info!(key, token, "deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn unknown_key(key: &str) -> Problem {
    Problem::new(StatusCode::NOT_FOUND, "unknown-key", "Unknown key")
        .detail(format!("no value for key {key:?}"))
}
