//! fencing-gate: a reverse proxy that makes any HTTP service a fenced
//! resource, whatever it is written in.
//!
//! A lock service hands out fencing tokens; only the resource can refuse the
//! write of a holder whose lease ran out while it was paused. `fencing-gate`
//! stands in front of a service as its only way in and refuses, for it, every
//! request whose token is lower than the highest seen for its key: the
//! contract of [`fencing_layer`], which it wraps, unchanged.
//!
//! ```text
//! fencing-gate --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000
//! ```
//!
//! fences every unsafe method, keyed by path, with marks in memory;
//! `--config gate.toml` ([`GateConfig`]) sets routes and their keys, durable
//! or shared marks, bounds and limits.
//!
//! # The guarantee across the proxy
//!
//! A request is inside until its upstream exchange has ended, the response read
//! to its end: a client that leaves does not end it (the exchange goes on, on
//! a task that owns the request's place). An exchange whose outcome is unknown
//! (the upstream connection broke, or no answer came in time, after request
//! bytes were sent) keeps its key closed to higher tokens for
//! `[timeouts] quarantine_ms`, then opens it with the mark raised. The table
//! is in [`exchange`]'s docs; `docs/gate.md` has the residual and how to
//! deploy the gate.

#![deny(missing_docs, unsafe_code, unreachable_pub)]

mod body;
pub mod config;
pub mod exchange;
mod forward;
mod marks;
mod metrics;
mod problem;
mod proxy;
mod routes;
mod server;
mod tunnel;
mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

pub use crate::body::{BodyError, GateBody, Upstream};
pub use crate::config::{ConfigError, GateConfig};

use crate::exchange::Shared;
use crate::forward::Forwarder;
use crate::proxy::Proxy;
use crate::server::Front;

/// A gate, its marks open, ready to serve.
pub struct Gate {
    front: Arc<Front>,
    grace: Duration,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("grace", &self.grace).finish_non_exhaustive()
    }
}

impl Gate {
    /// Opens the marks `config` names (a database or cluster out of reach is
    /// an error now, not 503s later) and readies the upstream pool. Install a
    /// `metrics` recorder before, for the gate's series to reach it.
    ///
    /// # Errors
    ///
    /// The marks could not be opened, or the verifier's key read; in words.
    pub async fn new(config: &GateConfig) -> Result<Self, String> {
        let layer = marks::layer(config).await?;
        let shared = Arc::new(Shared {
            pool: upstream::Pool::new(&config.upstream, config.timeouts.connect()),
            timeouts: config.timeouts.clone(),
            metrics: metrics::GateMetrics::new(),
            tasks: TaskTracker::new(),
        });
        let fenced = tower_layer::Layer::layer(&layer, Proxy { shared: Arc::clone(&shared) });
        let front = Front {
            fenced,
            forwarder: Forwarder::new(config.forwarding.trusted_hops.clone()),
            limits: config.limits.clone(),
            upgrades: config.forwarding.upgrades,
            shared,
        };
        Ok(Self { front: Arc::new(front), grace: config.timeouts.shutdown() })
    }

    /// Serves `listener` until `shutdown` completes; then accepts nothing more
    /// and gives the requests inside up to `[timeouts] shutdown_ms` to finish.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        server::serve(listener, self.front, shutdown, self.grace).await;
    }

    /// Binds `address` and serves it, as [`serve`](Self::serve).
    ///
    /// # Errors
    ///
    /// The address could not be bound.
    pub async fn bind_and_serve(
        self,
        address: SocketAddr,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let listener = TcpListener::bind(address).await?;
        self.serve(listener, shutdown).await;
        Ok(())
    }
}

/// Serves `GET /metrics` (Prometheus text, from `handle`) on `listener`, and 404 to anything else.
pub async fn serve_metrics(listener: TcpListener, handle: metrics_exporter_prometheus::PrometheusHandle) {
    use http_body_util::Full;
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let handle = handle.clone();
        let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let response = if request.uri().path() == "/metrics" {
                http::Response::builder()
                    .header("content-type", "text/plain; version=0.0.4")
                    .body(Full::new(bytes::Bytes::from(handle.render())))
            } else {
                http::Response::builder().status(404).body(Full::new(bytes::Bytes::new()))
            };
            std::future::ready(response)
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}
