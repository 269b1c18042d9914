//! [`LockBackend`](crate::LockBackend) for the workspace's `demo-lock-service`, over HTTP.

use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::backend::{Grant, LockError, LockProtocol, LockStatus};

/// An HTTP client of the demo lock service.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencing_client::LockError> {
/// use std::time::Duration;
/// use fencing_client::{DemoLockClient, LockBackendExt};
///
/// let client = DemoLockClient::new("http://127.0.0.1:7000")?;
/// let lease = client.lease("billing", "worker-1", Duration::from_secs(10)).await?;
/// println!("token {}", lease.token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DemoLockClient {
    http: reqwest::Client,
    base: String,
}

impl DemoLockClient {
    /// A client of the service at `base_url` (e.g. `http://127.0.0.1:7000`).
    /// Proxies are never used; connecting is bounded to 5 s. Each call of the
    /// lease keeper carries its own timeout; direct calls are bounded to 30 s.
    pub fn new(base_url: impl Into<String>) -> Result<Self, LockError> {
        Ok(Self::with_client(http_client(Duration::from_secs(5), Duration::from_secs(30))?, base_url))
    }

    /// A client using a configured `reqwest::Client`.
    pub fn with_client(http: reqwest::Client, base_url: impl Into<String>) -> Self {
        DemoLockClient { http, base: without_trailing_slashes(base_url.into()) }
    }

    /// The service's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Who holds `name`, or `None` if it is free.
    pub async fn lock_status(&self, name: &str) -> Result<Option<LockStatus>, LockError> {
        let url = format!("{}/v1/locks/{}", self.base, segment(name));
        let r = self.http.get(url).send().await.map_err(transport)?;
        match r.status() {
            StatusCode::OK => {
                let b: StatusBody = parse(r).await?;
                Ok(Some(LockStatus {
                    name: b.name,
                    holder: b.holder,
                    token: b.token,
                    expires_in: Duration::from_millis(b.expires_in_ms),
                }))
            }
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(rejected(r).await),
        }
    }
}

impl LockProtocol for DemoLockClient {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
        let ttl_ms =
            u64::try_from(ttl.as_millis()).map_err(|_| LockError::InvalidArgument("ttl too long".into()))?;
        let r = self
            .http
            .post(format!("{}/v1/leases", self.base))
            .json(&json!({"name": name, "holder": holder, "ttl_ms": ttl_ms}))
            .send()
            .await
            .map_err(transport)?;
        match r.status() {
            StatusCode::CREATED => {
                let b: GrantBody = parse(r).await?;
                Ok(Grant {
                    lease_id: b.lease_id,
                    name: b.name,
                    holder: b.holder,
                    token: b.token,
                    ttl: Duration::from_millis(b.ttl_ms),
                    proof: b.proof,
                })
            }
            StatusCode::CONFLICT => {
                let retry_after = r
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|s| s.parse::<u64>().ok())
                    .map(Duration::from_secs);
                let b: Value = parse(r).await?;
                Err(LockError::Held {
                    holder: b["holder"].as_str().unwrap_or_default().to_owned(),
                    expires_in: Duration::from_millis(b["expires_in_ms"].as_u64().unwrap_or(0)),
                    retry_after,
                })
            }
            _ => Err(rejected(r).await),
        }
    }

    async fn keepalive(&self, grant: &Grant) -> Result<(), LockError> {
        let url = format!("{}/v1/leases/{}/keepalive", self.base, segment(&grant.lease_id));
        let r = self.http.post(url).send().await.map_err(transport)?;
        match r.status() {
            StatusCode::OK => {
                let b: KeepaliveBody = parse(r).await?;
                if b.token != grant.token || b.lease_id != grant.lease_id {
                    return Err(LockError::Protocol(format!(
                        "keepalive answered lease {} token {}, expected {} token {}",
                        b.lease_id, b.token, grant.lease_id, grant.token
                    )));
                }
                Ok(())
            }
            StatusCode::NOT_FOUND => Err(LockError::LeaseNotFound),
            _ => Err(rejected(r).await),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<(), LockError> {
        let url = format!("{}/v1/leases/{}", self.base, segment(&grant.lease_id));
        let r = self.http.delete(url).send().await.map_err(transport)?;
        match r.status() {
            StatusCode::NO_CONTENT => Ok(()),
            StatusCode::NOT_FOUND => Err(LockError::LeaseNotFound),
            _ => Err(rejected(r).await),
        }
    }
}

#[derive(Deserialize)]
struct GrantBody {
    lease_id: String,
    name: String,
    holder: String,
    token: u64,
    ttl_ms: u64,
    #[serde(default)]
    proof: Option<String>,
}

#[derive(Deserialize)]
struct KeepaliveBody {
    lease_id: String,
    token: u64,
}

#[derive(Deserialize)]
struct StatusBody {
    name: String,
    holder: String,
    token: u64,
    expires_in_ms: u64,
}

/// The service's HTTP client: never through a proxy, each step bounded.
pub(crate) fn http_client(connect: Duration, request: Duration) -> Result<reqwest::Client, LockError> {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(connect)
        .timeout(request)
        .build()
        .map_err(|e| LockError::Transport(e.to_string()))
}

/// `base` without trailing slashes, so that paths can be appended as `{base}/v1/…`.
pub(crate) fn without_trailing_slashes(mut base: String) -> String {
    while base.ends_with('/') {
        base.pop();
    }
    base
}

pub(crate) fn segment(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

fn transport(e: reqwest::Error) -> LockError {
    if e.is_timeout() { LockError::Timeout } else { LockError::Transport(e.to_string()) }
}

async fn parse<T: serde::de::DeserializeOwned>(r: Response) -> Result<T, LockError> {
    let bytes = r.bytes().await.map_err(transport)?;
    serde_json::from_slice(&bytes).map_err(|e| LockError::Protocol(format!("unexpected body: {e}")))
}

async fn rejected(r: Response) -> LockError {
    let status = r.status().as_u16();
    let detail = match r.bytes().await {
        Ok(b) => serde_json::from_slice::<Value>(&b)
            .ok()
            .and_then(|v| v["detail"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&b).into_owned()),
        Err(e) => e.to_string(),
    };
    LockError::Rejected { status, detail }
}
