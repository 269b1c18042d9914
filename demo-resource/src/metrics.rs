//! `GET /metrics`: the fencing layer's counters in Prometheus text.

use axum::http::header;
use axum::response::IntoResponse;
use metrics_exporter_prometheus::PrometheusHandle;

/// The Prometheus text format of everything `handle`'s recorder holds.
pub(crate) fn render(handle: &PrometheusHandle) -> impl IntoResponse + use<> {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render())
}
