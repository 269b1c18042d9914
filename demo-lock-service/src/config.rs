//! How a [`LockService`](crate::LockService) is set up: data directory, bounds, signing key, metrics.

use std::path::PathBuf;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::ProofSigner;
use crate::metrics;

/// Default longest TTL a client may ask for: one hour.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(3600);

/// Default bound on leases held at once ([`Config::max_leases`]).
pub const DEFAULT_MAX_LEASES: usize = 100_000;

/// Configuration of a [`LockService`](crate::LockService).
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory holding the durable state (`locks.redb`); created if missing.
    pub data_dir: PathBuf,
    /// Longest TTL a client may ask for; longer requests get 400.
    pub max_ttl: Duration,
    /// Most leases held at once; a grant that needs one more gets 503 (a live lease
    /// is never evicted). Leases restored at start-up count, even past the bound.
    pub max_leases: usize,
    /// Signs every grant's (lock name, token) when set: the grant's `proof`.
    pub signer: Option<ProofSigner>,
    /// Serves `GET /metrics` (Prometheus text) from this handle when set; see [`install_prometheus`](crate::install_prometheus).
    pub metrics: Option<PrometheusHandle>,
}

impl Config {
    /// A configuration with the given data directory, the default maximum TTL, the
    /// default bound on leases and no signing key.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Config {
            data_dir: data_dir.into(),
            max_ttl: DEFAULT_MAX_TTL,
            max_leases: DEFAULT_MAX_LEASES,
            signer: None,
            metrics: None,
        }
    }

    /// Serves `GET /metrics` from `handle`: grants, conflicts, expiries,
    /// keepalives and releases, as counted by the recorder it belongs to.
    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        metrics::describe();
        self.metrics = Some(handle);
        self
    }

    /// Sets the most leases held at once.
    pub fn with_max_leases(mut self, max_leases: usize) -> Self {
        self.max_leases = max_leases;
        self
    }

    /// Signs every grant with `signer` (see [`Grant::proof`](crate::Grant::proof)).
    pub fn with_signer(mut self, signer: ProofSigner) -> Self {
        self.signer = Some(signer);
        self
    }

    /// Sets the longest TTL a client may ask for.
    pub fn with_max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }
}
