//! Routes, handlers and problem+json errors.

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use fencing_layer::FencingToken;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::backend::DataError;
use crate::{App, MAX_BODY_BYTES, MAX_DELAY_MS, MAX_NAME_BYTES};

/// The data routes. The caller puts the fencing layer on them (or not).
pub(crate) fn routes() -> Router<App> {
    Router::new()
        .route("/logs/{name}", post(append).get(read_log))
        .route("/kv/{key}", put(put_value).get(get_value).delete(delete_value))
}

/// Adds the routes nobody fences, and problem+json for unknown routes and methods.
pub(crate) fn finish(routes: Router<App>, app: App) -> Router {
    let routes = routes.route("/healthz", get(|| async { "ok" })).route("/readyz", get(crate::ready::readyz));
    problem_fallbacks(routes).with_state(app)
}

/// `routes`, answering an unknown route (404) or a method a route does not take
/// (405) with problem+json, as every other error (the resource's and the payment
/// provider's routes alike).
pub(crate) fn problem_fallbacks<S: Clone + Send + Sync + 'static>(routes: Router<S>) -> Router<S> {
    routes
        .method_not_allowed_fallback(|| async {
            Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed")
                .detail("this route does not accept that method")
        })
        .fallback(|| async {
            Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found").detail("no such route")
        })
}

/// An RFC 9457 problem details response.
#[derive(Debug)]
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    body: ProblemBody,
    /// `Retry-After`, in seconds.
    retry_after: Option<u64>,
}

/// The problem object, fields in the RFC's order, then the extension members.
#[derive(Debug, Serialize)]
struct ProblemBody {
    r#type: String,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, kind: &str, title: &'static str) -> Self {
        let body = ProblemBody {
            r#type: format!("urn:demo-resource:problem:{kind}"),
            title,
            status: status.as_u16(),
            detail: String::new(),
            extra: Map::new(),
        };
        Self { status, body, retry_after: None }
    }

    pub(crate) fn detail(mut self, detail: impl Into<String>) -> Self {
        self.body.detail = detail.into();
        self
    }

    pub(crate) fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.body.extra.insert(field.into(), value.into());
        self
    }

    pub(crate) fn bad_request(kind: &str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, kind, "Bad request").detail(detail)
    }

    pub(crate) fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!("{error}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error").detail(error.to_string())
    }

    /// Asks the client to retry after `seconds`.
    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&self.body).unwrap_or_default();
        let mut response = (self.status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
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

impl From<Problem> for Response {
    fn from(problem: Problem) -> Self {
        problem.into_response()
    }
}

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

/// A 415 problem saying `detail`, unless the body is declared JSON
/// (`Content-Type: application/json`, parameters such as a charset allowed): the
/// admin reset and the payment provider's charges take nothing else.
pub(crate) fn require_json(headers: &axum::http::HeaderMap, detail: &'static str) -> Result<(), Problem> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if json {
        return Ok(());
    }
    Err(Problem::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "Unsupported media type")
        .detail(detail))
}

/// Parses the query of a write route: only `delay_ms`, at most once, a decimal
/// number of milliseconds up to [`MAX_DELAY_MS`].
pub(crate) fn parse_delay(query: Option<&str>) -> Result<Duration, Problem> {
    let mut delay = None;
    for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
        let (param, value) = pair.split_once('=').unwrap_or((pair, ""));
        if param != "delay_ms" {
            return Err(Problem::bad_request("bad-query", format!("unknown query parameter {param:?}")));
        }
        if delay.is_some() {
            return Err(Problem::bad_request("bad-query", "delay_ms given more than once"));
        }
        let ms = Some(value)
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms <= MAX_DELAY_MS)
            .ok_or_else(|| {
                Problem::bad_request(
                    "bad-query",
                    format!("delay_ms must be a whole number of milliseconds from 0 to {MAX_DELAY_MS}"),
                )
            })?;
        delay = Some(Duration::from_millis(ms));
    }
    Ok(delay.unwrap_or_default())
}

/// The whole body, at most `max` bytes: past it a 413 problem saying what
/// (`the body`, `a reset body`) must be at most `max` bytes, with `max_bytes`.
pub(crate) async fn read_limited(body: Body, max: usize, what: &str) -> Result<Bytes, Problem> {
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => {
            Err(Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large", "Body too large")
                .detail(format!("{what} must be at most {max} bytes"))
                .with("max_bytes", max))
        }
        Err(error) => Err(Problem::bad_request("bad-body", format!("cannot read the body: {error}"))),
    }
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
    in_flight: crate::InFlight,
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
        // The layer puts the token it admitted in the extensions (what `Option<FencingToken>` extracts).
        let token = parts.extensions.get::<FencingToken>().copied().map(FencingToken::get);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_ms_is_validated() {
        assert_eq!(parse_delay(None).unwrap(), Duration::ZERO);
        assert_eq!(parse_delay(Some("")).unwrap(), Duration::ZERO);
        assert_eq!(parse_delay(Some("delay_ms=250")).unwrap(), Duration::from_millis(250));
        assert_eq!(parse_delay(Some("delay_ms=10000")).unwrap(), Duration::from_secs(10));
        for bad in [
            "delay_ms=10001",
            "delay_ms=",
            "delay_ms",
            "delay_ms=-1",
            "delay_ms=+1",
            "delay_ms=1.5",
            "delay_ms=abc",
            "delay_ms=99999999999999999999999",
            "delay_ms=1&delay_ms=2",
            "delay=1",
        ] {
            let problem = parse_delay(Some(bad)).unwrap_err();
            assert_eq!(problem.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
