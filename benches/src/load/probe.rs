//! What `fencing-load` asks a target before measuring it: whether it answers
//! at all, and (`--start-above-mark`) each key's current mark.
//!
//! Reading a mark takes one write: the layer has no read route, but it answers
//! a token below the mark with 409 and names the mark in its problem+json body
//! (`"highest_token": 41`). So each key gets one request, the run's own method,
//! headers and body, with [`PROBE_TOKEN`] (0): a 409 gives the mark, and the
//! run starts that key's tokens one above it; a 2xx means the key had no mark
//! above 0 (the write went through, and left the mark at 0) or the target is not
//! fenced, and the key starts at the run's first token.
//!
//! ```
//! use fencing_benches::load::probe::highest_token;
//!
//! let body = br#"{"type":"urn:fencing:problem:stale-token","status":409,"highest_token":41}"#;
//! assert_eq!(highest_token(body), Some(41));
//! assert_eq!(highest_token(b"stale"), None);
//! ```

use std::time::Duration;

use http::HeaderValue;
use http_body_util::BodyExt;

use super::runner::{Plan, open};
use super::target::Target;

/// The token of the probe: below every mark but 0.
pub const PROBE_TOKEN: &str = "0";

/// How long a connection or one probe may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Connects once to every replica of `target`.
///
/// # Errors
///
/// Names the first replica that refused (or did not answer within 5 s).
pub async fn reachable(target: &Target) -> Result<(), String> {
    for (addr, _) in &target.replicas {
        match tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(format!("{} ({addr}): {e}: is the service running there?", target.label));
            }
            Err(_) => return Err(format!("{} ({addr}): no connection within {TIMEOUT:?}", target.label)),
        }
    }
    Ok(())
}

/// The `highest_token` of a 409's problem+json body.
#[must_use]
pub fn highest_token(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(body).ok()?.get("highest_token")?.as_u64()
}

/// Each key's mark on `target` as the probe found it (`None`: no mark above 0, or not fenced),
/// keys `0..keys` spread over up to `connections` connections (key `k` through connection
/// `k % connections`, whose number `{conn}` expands to, with `{seq}` 0).
///
/// # Errors
///
/// A connection failed, a probe got no answer, or an answer other than 2xx or a 409
/// naming the mark.
pub async fn marks(
    target: &Target,
    plan: &std::sync::Arc<Plan>,
    keys: u32,
    connections: u32,
) -> Result<Vec<Option<u64>>, String> {
    let workers = connections.min(keys).max(1);
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (target, plan) = (target.clone(), std::sync::Arc::clone(plan));
            tokio::spawn(async move {
                let (addr, host) = &target.replicas[w as usize % target.replicas.len()];
                let (mut sender, driver) =
                    open(*addr).await.map_err(|e| format!("{} ({addr}): {e}", target.label))?;
                let mut found = Vec::new();
                for key in (w..keys).step_by(workers as usize) {
                    let path = target.template.expand(key % connections, 0, key);
                    let request = plan.request(host, path.clone(), HeaderValue::from_static(PROBE_TOKEN));
                    let exchange = async {
                        sender.ready().await.ok()?;
                        let response = sender.send_request(request).await.ok()?;
                        let status = response.status();
                        Some((status, response.into_body().collect().await.ok()?.to_bytes()))
                    };
                    let answer = match tokio::time::timeout(TIMEOUT, exchange).await {
                        Ok(Some((status, _))) if status.is_success() => None,
                        Ok(Some((status, body))) if status == http::StatusCode::CONFLICT => {
                            Some(highest_token(&body).ok_or_else(|| {
                                format!(
                                    "--start-above-mark: {} {path} answered 409 without a \
                                     highest_token in its body: {}",
                                    target.label,
                                    String::from_utf8_lossy(&body[..body.len().min(300)])
                                )
                            })?)
                        }
                        Ok(Some((status, _))) => {
                            return Err(format!(
                                "--start-above-mark: {} {path} answered {status} to the probe \
                                 (token {PROBE_TOKEN}); expected 2xx, or 409 naming the mark",
                                target.label
                            ));
                        }
                        _ => return Err(format!("--start-above-mark: {} {path}: no answer", target.label)),
                    };
                    found.push((key, answer));
                }
                driver.abort();
                Ok::<_, String>(found)
            })
        })
        .collect();
    let mut marks = vec![None; keys as usize];
    for task in tasks {
        let found = task.await.map_err(|e| format!("--start-above-mark: {e}"))??;
        for (key, mark) in found {
            marks[key as usize] = mark;
        }
    }
    Ok(marks)
}
