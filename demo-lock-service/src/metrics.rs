//! What the lock service counts (through the `metrics` facade), and `GET /metrics`.
//!
//! | name | meaning |
//! |---|---|
//! | `lock_service_grants_total` | leases granted (each with a new token) |
//! | `lock_service_conflicts_total` | acquisitions refused 409: the lock is held by another holder |
//! | `lock_service_expiries_total` | expired leases forgotten: swept by a grant, or released after expiring |
//! | `lock_service_keepalives_total` | leases renewed |
//! | `lock_service_releases_total` | live leases released |

use axum::http::header;
use axum::response::IntoResponse;
use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

const GRANTS: &str = "lock_service_grants_total";
const CONFLICTS: &str = "lock_service_conflicts_total";
const EXPIRIES: &str = "lock_service_expiries_total";
const KEEPALIVES: &str = "lock_service_keepalives_total";
const RELEASES: &str = "lock_service_releases_total";

pub(crate) fn granted() {
    metrics::counter!(GRANTS).increment(1);
}

pub(crate) fn conflicted() {
    metrics::counter!(CONFLICTS).increment(1);
}

pub(crate) fn expired(count: usize) {
    metrics::counter!(EXPIRIES).increment(count as u64);
}

pub(crate) fn kept_alive() {
    metrics::counter!(KEEPALIVES).increment(1);
}

pub(crate) fn released() {
    metrics::counter!(RELEASES).increment(1);
}

/// Describes the counters to the installed recorder, and registers them at 0,
/// so that a scrape shows each from the start.
pub(crate) fn describe() {
    metrics::describe_counter!(GRANTS, Unit::Count, "Leases granted, each with a new fencing token");
    metrics::describe_counter!(CONFLICTS, Unit::Count, "Acquisitions refused: the lock is held by another");
    metrics::describe_counter!(EXPIRIES, Unit::Count, "Expired leases forgotten");
    metrics::describe_counter!(KEEPALIVES, Unit::Count, "Leases renewed");
    metrics::describe_counter!(RELEASES, Unit::Count, "Live leases released");
    for name in [GRANTS, CONFLICTS, EXPIRIES, KEEPALIVES, RELEASES] {
        metrics::counter!(name).absolute(0);
    }
}

/// Buckets for every `*_seconds` histogram (the fencing layer's drain and
/// durable-record waits): from a fsync on a fast disk to the drain bound.
const SECONDS_BUCKETS: [f64; 11] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0];

/// Installs a Prometheus recorder as the process's global recorder, and keeps
/// its histograms trimmed (its upkeep, every 5 s, on the current tokio runtime).
/// Histograms in seconds are Prometheus histograms (buckets add up across
/// replicas, where summaries' quantiles do not). `GET /metrics` renders the
/// handle it returns ([`Config::with_metrics`](crate::Config::with_metrics)).
///
/// # Errors
///
/// A global recorder is installed already.
pub fn install_prometheus() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// `GET /metrics`: the Prometheus text format.
pub(crate) fn render(handle: &PrometheusHandle) -> impl IntoResponse + use<> {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render())
}
