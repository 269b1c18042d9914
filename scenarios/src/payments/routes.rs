//! The provider's HTTP side: validation, the `Idempotency-Key` rules, problem+json.

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use super::ledger::{Charge, ChargeParams, Claim, Ledger, Saved};
use super::{MAX_AMOUNT, MAX_CHARGE_BODY_BYTES, MAX_KEY_CHARS, REPLAYED_HEADER};
use demo_resource::problem::{Problem, parse_delay, problem_fallbacks, read_limited, require_json};

type Answer = Result<Response, Problem>;

pub(crate) fn router(ledger: Ledger) -> Router {
    let routes = Router::new()
        .route("/v1/charges", get(list).post(create))
        .route("/v1/charges/{id}", get(one))
        .route("/healthz", get(|| async { "ok" }));
    problem_fallbacks(routes).with_state(ledger)
}

/// `POST /v1/charges`.
async fn create(
    State(ledger): State<Ledger>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Body,
) -> Answer {
    // Nothing is saved for a request that fails here: it never began executing,
    // so it is safe to retry with the same key (Stripe's rule).
    let delay = parse_delay(query.as_deref())?;
    let key = idempotency_key(&headers)?;
    let params = charge_params(&headers, body).await?;
    let Some(key) = key else {
        tokio::time::sleep(delay).await;
        let charge = ledger.charge(&params);
        tracing::info!(id = charge.id, customer = charge.customer, "charged (no idempotency key)");
        return Ok(json_answer(StatusCode::CREATED, to_json(&charge), false));
    };
    match ledger.claim(&key, &params) {
        Claim::Run(guard) => {
            // A slow provider: the key is held meanwhile; if the client goes away
            // now, the guard frees it and nothing is charged.
            tokio::time::sleep(delay).await;
            let saved = guard.charge(&params, |charge| Saved { status: 201, body: to_json(charge) });
            tracing::info!(key, customer = params.customer, "charged");
            Ok(json_answer(StatusCode::CREATED, saved.body, false))
        }
        Claim::Replay(saved) => {
            tracing::info!(key, customer = params.customer, "replayed: not charged again");
            let status = StatusCode::from_u16(saved.status).unwrap_or(StatusCode::OK);
            Ok(json_answer(status, saved.body, true))
        }
        Claim::InProgress => Err(Problem::new(StatusCode::CONFLICT, "idempotency-key-in-use", "Conflict")
            .detail("a request with this Idempotency-Key is still being processed; retry later")
            .with("idempotency_key", key)
            .retry_after(1)),
        Claim::Mismatch => Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "Idempotency-Key reused",
        )
        .detail("this Idempotency-Key was first used with other parameters; a key names one request")
        .with("idempotency_key", key)),
        Claim::Full => Err(Problem::new(StatusCode::SERVICE_UNAVAILABLE, "too-many-keys", "Too many keys")
            .detail("the idempotency table is full; retry later")
            .retry_after(1)),
    }
}

/// A charge as JSON, fields in their declared order.
fn to_json(charge: &Charge) -> String {
    // A struct of strings and numbers always serializes.
    serde_json::to_string(charge).unwrap_or_default()
}

fn json_answer(status: StatusCode, body: String, replayed: bool) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if replayed {
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    response
}

/// The `Idempotency-Key` header: absent, or once, 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else { return Ok(None) };
    let bad = |detail: String| Problem::bad_request("bad-idempotency-key", detail);
    if values.next().is_some() {
        return Err(bad("Idempotency-Key given more than once".into()));
    }
    let key = value.to_str().ok().filter(|key| key.bytes().all(|b| b.is_ascii_graphic()));
    let key = key.ok_or_else(|| bad("Idempotency-Key must be visible ASCII characters".into()))?;
    if key.is_empty() || key.len() > MAX_KEY_CHARS {
        return Err(bad(format!("Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters")));
    }
    Ok(Some(key.to_owned()))
}

/// The JSON body, checked field by field.
async fn charge_params(headers: &HeaderMap, body: Body) -> Result<ChargeParams, Problem> {
    require_json(headers, "the body must be application/json")?;
    let bytes = read_limited(body, MAX_CHARGE_BODY_BYTES, "the body").await?;
    let params: ChargeParams = serde_json::from_slice(&bytes)
        .map_err(|e| Problem::bad_request("bad-params", format!("not a charge: {e}")))?;
    let bad = |detail: String| Err(Problem::bad_request("bad-params", detail));
    let text_ok = |s: &str, max: usize| s.len() <= max && !s.chars().any(char::is_control);
    if params.customer.is_empty() || !text_ok(&params.customer, 255) {
        return bad("customer must be 1 to 255 bytes without control characters".into());
    }
    if params.amount == 0 || params.amount > MAX_AMOUNT {
        return bad(format!("amount must be from 1 to {MAX_AMOUNT} (the currency's smallest unit)"));
    }
    if params.currency.len() != 3 || !params.currency.bytes().all(|b| b.is_ascii_lowercase()) {
        return bad("currency must be a three-letter lowercase ISO 4217 code such as \"eur\"".into());
    }
    if params.description.as_deref().is_some_and(|d| !text_ok(d, 1000)) {
        return bad("description must be at most 1000 bytes without control characters".into());
    }
    Ok(params)
}

/// `GET /v1/charges`'s answer.
#[derive(Serialize)]
struct List {
    data: Vec<Charge>,
}

/// `GET /v1/charges[?customer=C]`: `{"data":[charge…]}`, oldest first.
async fn list(State(ledger): State<Ledger>, RawQuery(query): RawQuery) -> Answer {
    let mut customer = None;
    for (param, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*param {
            "customer" if customer.is_none() => customer = Some(value.into_owned()),
            "customer" => return Err(Problem::bad_request("bad-query", "customer given more than once")),
            other => {
                return Err(Problem::bad_request("bad-query", format!("unknown query parameter {other:?}")));
            }
        }
    }
    let mut charges = ledger.charges();
    if let Some(customer) = customer {
        charges.retain(|charge| charge.customer == customer);
    }
    Ok(axum::Json(List { data: charges }).into_response())
}

/// `GET /v1/charges/{id}`.
async fn one(State(ledger): State<Ledger>, id: Result<Path<String>, PathRejection>) -> Answer {
    let Path(id) = id.map_err(|e| Problem::bad_request("bad-path", e.body_text()))?;
    match ledger.charges().into_iter().find(|charge| charge.id == id) {
        Some(charge) => Ok(axum::Json(charge).into_response()),
        None => Err(Problem::new(StatusCode::NOT_FOUND, "unknown-charge", "Unknown charge")
            .detail("no charge has this id")),
    }
}
