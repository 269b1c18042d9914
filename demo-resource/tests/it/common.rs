//! What the tests share: a client that never takes a proxy, and an answer read
//! whole with the problem+json check every error answer gets.

use std::time::Duration;

use reqwest::Client;
use serde_json::Value;

/// A client for 127.0.0.1: no proxy from the environment, a 20 s bound on each request.
pub(crate) fn client() -> Client {
    Client::builder().no_proxy().timeout(Duration::from_secs(20)).build().unwrap()
}

/// A status, headers of interest, and the body (JSON when it parses, else a string).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: String,
    pub(crate) retry_after: Option<String>,
    pub(crate) body: Value,
}

impl Answer {
    /// Sends `request` and reads the answer whole.
    pub(crate) async fn of(request: reqwest::RequestBuilder) -> Self {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
        let content_type = header("content-type").unwrap_or_default();
        let retry_after = header("retry-after");
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Self { status, content_type, retry_after, body }
    }

    /// Asserts a problem+json answer with this status and type suffix, and a detail.
    pub(crate) fn problem(&self, status: u16, kind: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.content_type, "application/problem+json", "{self:?}");
        assert_eq!(self.body["status"], status, "{self:?}");
        let ty = self.body["type"].as_str().unwrap_or_default();
        assert!(ty.ends_with(&format!(":{kind}")), "expected type {kind}: {self:?}");
        assert!(self.body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{self:?}");
    }
}
