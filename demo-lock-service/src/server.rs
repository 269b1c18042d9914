//! The service over HTTP: its routes served on a listener, in the foreground or a background task.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{LockService, http};

impl LockService {
    /// The HTTP routes of the service (see the crate docs).
    pub fn router(&self) -> axum::Router {
        http::router(self.clone())
    }

    /// Serves the routes on `listener` until `shutdown` completes, then waits for
    /// open connections to finish.
    pub async fn serve<F>(&self, listener: TcpListener, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).await
    }

    /// Binds `addr` (use `127.0.0.1:0` for a free port) and serves in a background
    /// task. Once the returned [`RunningService`] is shut down (or dropped), the
    /// store is closed and the data directory can be opened again.
    pub async fn spawn(self, addr: SocketAddr) -> std::io::Result<RunningService> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let service = self.clone();
        let task = tokio::spawn(async move {
            self.serve(listener, async {
                let _ = rx.await;
            })
            .await
        });
        tracing::info!(%addr, "lock service listening");
        Ok(RunningService { addr, service, shutdown: Some(tx), task })
    }
}

/// A service started by [`LockService::spawn`].
#[derive(Debug)]
pub struct RunningService {
    addr: SocketAddr,
    service: LockService,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningService {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The service being served.
    pub fn service(&self) -> &LockService {
        &self.service
    }

    /// Stops accepting connections, waits for open ones to finish, then closes the
    /// store ([`LockService::close`]): the data directory can be opened again at once.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let served = match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        };
        self.service.close();
        served
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        // Dropped without `shutdown`: stop accepting at once and close the store
        // (requests still in flight on open connections then fail with 503).
        self.task.abort();
        self.service.close();
    }
}
