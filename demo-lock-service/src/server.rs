//! The service over HTTP: its routes served on a listener, in the foreground or a background task
//! ([`Running`]).

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::running::{Running, Served};
use crate::{LockService, http};

impl LockService {
    /// The HTTP routes of the service (see the crate docs).
    pub fn router(&self) -> axum::Router {
        http::router(self.clone())
    }

    /// Serves the routes on `listener` until `shutdown` completes, then waits for
    /// open connections to finish ([`Served::serve`]).
    pub async fn serve<F>(&self, listener: TcpListener, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Served::serve(self, listener, shutdown).await
    }

    /// Binds `addr` (use `127.0.0.1:0` for a free port) and serves in a background
    /// task. Once the returned [`RunningService`] is shut down (or dropped), the
    /// store is closed and the data directory can be opened again.
    pub async fn spawn(self, addr: SocketAddr) -> std::io::Result<RunningService> {
        let running = Running::start(addr, self).await?;
        tracing::info!(addr = %running.addr(), "lock service listening");
        Ok(running)
    }
}

/// Its routes; once its server has stopped, the service closes its store
/// ([`LockService::close`]): the data directory can be opened again at once.
/// Dropped without a shutdown, requests still in flight on open connections
/// then fail with 503.
impl Served for LockService {
    fn router(&self) -> axum::Router {
        LockService::router(self)
    }

    fn stopped(&self) {
        self.close();
    }
}

/// A service started by [`LockService::spawn`]: stopped and its store closed by
/// [`shutdown`](Running::shutdown), or at once when dropped.
pub type RunningService = Running<LockService>;

impl Running<LockService> {
    /// The service being served.
    pub fn service(&self) -> &LockService {
        self.served()
    }
}
