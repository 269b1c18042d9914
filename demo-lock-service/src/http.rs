//! The HTTP surface: routes, strict extractors, RFC 9457 problem responses.

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use fencing_layer::respond::Problem;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::service::check_text;
use crate::{AcquireError, LockService, TokenCheck};

/// Largest accepted request body, in bytes; a larger body gets 413.
pub const MAX_BODY_BYTES: usize = 4096;

pub(crate) fn router(service: LockService) -> Router {
    let router = Router::new();
    let router = match service.config().metrics.clone() {
        Some(handle) => router.route("/metrics", get(move || async move { crate::metrics::render(&handle) })),
        None => router,
    };
    router
        .route("/v1/leases", post(acquire))
        .route("/v1/leases/{lease_id}/keepalive", post(keepalive))
        .route("/v1/leases/{lease_id}", delete(release))
        .route("/v1/locks/{name}", get(lock_status))
        .route("/v1/locks/{name}/tokens/{token}", get(check_token))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(service)
}

// Problem details in the fencing layer's shape (`urn:fencing:problem:…`, members in
// RFC 9457 order, then the extension members): one rendering for every service in
// the workspace, so a client reads the lock service's refusals as the resource's.

/// A problem of `kind`, answered with `status`.
fn problem(
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: impl Into<String>,
) -> Problem {
    Problem::new(status, kind, title).detail(detail)
}

fn bad_request(detail: impl Into<String>) -> Problem {
    problem(StatusCode::BAD_REQUEST, "bad-request", "Bad request", detail)
}

fn lease_not_found() -> Problem {
    problem(
        StatusCode::NOT_FOUND,
        "lease-not-found",
        "Lease not found",
        "the lease is expired, released or unknown",
    )
}

fn unavailable(detail: String) -> Problem {
    problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable", detail)
        .retry_after(Duration::from_secs(1))
}

fn json_response(status: StatusCode, value: impl Serialize) -> Response {
    let body = serde_json::to_string(&value).unwrap_or_default();
    let mut response = (status, body).into_response();
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A JSON object body: `Content-Type: application/json` (or `...+json`) required (else 415),
/// at most [`MAX_BODY_BYTES`] (else 413), and valid for `T` (else 400).
struct StrictJson<T>(T);

impl<S, T> FromRequest<S> for StrictJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = Problem;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Problem> {
        let too_large = || {
            problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("the body must be at most {MAX_BODY_BYTES} bytes"),
            )
        };
        if !is_json(req.headers().get(CONTENT_TYPE)) {
            return Err(problem(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
                "the body must be JSON, sent with Content-Type: application/json",
            ));
        }
        if let Some(len) = req.headers().get(CONTENT_LENGTH)
            && len
                .to_str()
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(too_large());
        }
        let body: Body = req.into_body();
        let bytes: Bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(too_large()),
            Err(e) => {
                return Err(bad_request(format!("failed to read the request body: {e}")));
            }
        };
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|e| bad_request(format!("invalid JSON body: {e}")))?;
        if !value.is_object() {
            // serde would also accept a struct written as an array.
            return Err(bad_request("the body must be a JSON object"));
        }
        serde_json::from_value(value)
            .map(StrictJson)
            .map_err(|e| bad_request(format!("invalid request: {e}")))
    }
}

fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(essence) = content_type.and_then(|v| v.to_str().ok()).and_then(|s| s.split(';').next()) else {
        return false;
    };
    let essence = essence.trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A path parameter whose rejection is a problem response.
struct ApiPath<T>(T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(bad_request(e.body_text())),
        }
    }
}

#[derive(Serialize)]
struct GrantBody<'a> {
    lease_id: &'a str,
    name: &'a str,
    holder: &'a str,
    token: u64,
    ttl_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    proof: Option<&'a str>,
}

#[derive(Serialize)]
struct RenewalBody<'a> {
    lease_id: &'a str,
    token: u64,
    ttl_ms: u64,
}

#[derive(Serialize)]
struct StatusBody<'a> {
    name: &'a str,
    holder: &'a str,
    token: u64,
    expires_in_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    name: String,
    holder: String,
    ttl_ms: u64,
}

async fn acquire(State(service): State<LockService>, StrictJson(body): StrictJson<AcquireBody>) -> Response {
    match service.acquire(&body.name, &body.holder, Duration::from_millis(body.ttl_ms)).await {
        Ok(grant) => {
            let mut response = json_response(
                StatusCode::CREATED,
                GrantBody {
                    lease_id: &grant.lease_id,
                    name: &grant.name,
                    holder: &grant.holder,
                    token: grant.token,
                    ttl_ms: body.ttl_ms,
                    proof: grant.proof.as_deref(),
                },
            );
            if let Ok(location) = HeaderValue::from_str(&format!("/v1/leases/{}", grant.lease_id)) {
                response.headers_mut().insert(LOCATION, location);
            }
            response
        }
        Err(AcquireError::Invalid(detail)) => bad_request(detail).into_response(),
        Err(AcquireError::Held { holder, expires_in }) => {
            let expires_in_ms = ceil_ms(expires_in);
            problem(
                StatusCode::CONFLICT,
                "lock-held",
                "Lock held by another holder",
                format!("lock {:?} is held by {holder:?} for another {expires_in_ms} ms", body.name),
            )
            .number("expires_in_ms", expires_in_ms)
            .text("holder", holder)
            .retry_after(Duration::from_millis(expires_in_ms))
            .into_response()
        }
        Err(AcquireError::Full { max_leases, retry_after }) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "lease-table-full",
            "Too many leases held",
            format!("{max_leases} leases are held, the most this service keeps; none was evicted"),
        )
        .number("max_leases", max_leases as u64)
        .retry_after(retry_after)
        .into_response(),
        Err(AcquireError::Unavailable(detail)) => unavailable(detail).into_response(),
    }
}

async fn keepalive(State(service): State<LockService>, ApiPath(lease_id): ApiPath<String>) -> Response {
    match service.keepalive(&lease_id) {
        Some(r) => json_response(
            StatusCode::OK,
            RenewalBody { lease_id: &r.lease_id, token: r.token, ttl_ms: ceil_ms(r.ttl) },
        ),
        None => lease_not_found().into_response(),
    }
}

async fn release(State(service): State<LockService>, ApiPath(lease_id): ApiPath<String>) -> Response {
    match service.release(&lease_id).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => lease_not_found().into_response(),
        Err(e) => unavailable(e.to_string()).into_response(),
    }
}

async fn lock_status(State(service): State<LockService>, ApiPath(name): ApiPath<String>) -> Response {
    match service.lock_status(&name) {
        Some(s) => json_response(
            StatusCode::OK,
            StatusBody {
                name: &s.name,
                holder: &s.holder,
                token: s.token,
                expires_in_ms: ceil_ms(s.expires_in),
            },
        ),
        None => {
            problem(StatusCode::NOT_FOUND, "lock-free", "Lock is free", format!("lock {name:?} is not held"))
                .into_response()
        }
    }
}

/// The answer of the token check: `valid` plus, when valid, the time left on the
/// lease, and when not, why (`"free"`: not held; `"other-token"`: held under
/// another token).
#[derive(Serialize)]
struct CheckBody<'a> {
    lock: &'a str,
    token: u64,
    valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_in_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
}

async fn check_token(
    State(service): State<LockService>,
    ApiPath((name, token)): ApiPath<(String, String)>,
) -> Response {
    if let Err(AcquireError::Invalid(detail)) = check_text("lock name", &name) {
        return bad_request(detail).into_response();
    }
    let Some(token) = parse_token(&token) else {
        return bad_request(format!(
            "token {token:?} is not a canonical decimal u64 (digits only, no leading zeros, at most 18446744073709551615)"
        ))
        .into_response();
    };
    let check = service.check_token(&name, token);
    let (expires_in_ms, reason) = match check {
        TokenCheck::Live { expires_in } => (Some(ceil_ms(expires_in)), None),
        TokenCheck::Free => (None, Some("free")),
        TokenCheck::OtherToken => (None, Some("other-token")),
    };
    json_response(
        StatusCode::OK,
        CheckBody { lock: &name, token, valid: check.is_valid(), expires_in_ms, reason },
    )
}

/// A fencing token as the fencing layer accepts it: ASCII digits, no sign, no
/// leading zeros (`0` itself is fine), no overflow.
fn parse_token(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 while the store takes grants; 503 `not-ready` while it is closed (after a
/// disk failure, until it reopens; or shut down). `/healthz` stays 200 either way.
async fn readyz(State(service): State<LockService>) -> Response {
    match service.ready().await {
        Ok(()) => "ready\n".into_response(),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "not-ready", "Not ready", e.to_string())
            .retry_after(Duration::from_secs(1))
            .into_response(),
    }
}

async fn not_found(req: Request) -> Problem {
    problem(StatusCode::NOT_FOUND, "not-found", "Not found", format!("no route for {}", req.uri().path()))
}

async fn method_not_allowed(req: Request) -> Problem {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// Milliseconds in `d`, rounded up (so a live lease never shows 0).
fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
