//! [`Served`]: a router to serve, in the foreground or in a background task;
//! [`Running`]: one served in the background, and the way to stop it (the lock
//! service's [`RunningService`](crate::RunningService), demo-resource's storage service and the
//! scenarios' payment stand-in).

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What a server serves: its routes, and what it lets go of once the server has
/// stopped. The one way to serve them, in the foreground ([`serve`](Self::serve))
/// or in a background task ([`spawn`](Self::spawn)), for the lock service and
/// the storage service (demo-resource) and the payment stand-in (scenarios) alike.
pub trait Served {
    /// The routes to serve.
    fn router(&self) -> axum::Router;

    /// Called once, after the server stopped ([`Running::shutdown`], or the
    /// [`Running`] dropped without it). Does nothing unless implemented.
    fn stopped(&self) {}

    /// Serves the [`router`](Self::router) on `listener` until `shutdown`
    /// completes, then waits for open connections to finish (a binary's `main`).
    fn serve<F>(
        &self,
        listener: TcpListener,
        shutdown: F,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'static
    where
        F: Future<Output = ()> + Send + 'static,
    {
        axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).into_future()
    }

    /// Binds `addr` (`127.0.0.1:0` picks a free port) and serves the
    /// [`router`](Self::router) in a background task ([`Running::start`]).
    ///
    /// # Errors
    ///
    /// The address cannot be bound.
    fn spawn(self, addr: SocketAddr) -> impl Future<Output = std::io::Result<Running<Self>>> + Send
    where
        Self: Sized + Send,
    {
        Running::start(addr, self)
    }
}

/// What [`start`](Self::start) started: the bound address, what it serves, and
/// its task. Dropping it stops the server without waiting; [`shutdown`](Self::shutdown) waits.
#[derive(Debug)]
pub struct Running<T: Served> {
    addr: SocketAddr,
    served: T,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl<T: Served> Running<T> {
    /// Binds `addr` (`127.0.0.1:0` picks a free port) and serves `served`'s
    /// [`router`](Served::router) in a background task until stopped, then lets
    /// open requests finish.
    ///
    /// # Errors
    ///
    /// The address cannot be bound.
    pub async fn start(addr: SocketAddr, served: T) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = served.serve(listener, async move {
            let _ = stopped.await;
        });
        let task = tokio::spawn(serving);
        Ok(Self { addr, served, stop: Some(stop), task })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What is being served.
    pub fn served(&self) -> &T {
        &self.served
    }

    /// Stops accepting connections, waits for open requests to finish, then
    /// tells what was served that it [`stopped`](Served::stopped).
    ///
    /// # Errors
    ///
    /// Serving failed, or the server task panicked.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = (&mut self.task).await.map_err(std::io::Error::other);
        self.served.stopped();
        served?
    }
}

impl<T: Served> Drop for Running<T> {
    fn drop(&mut self) {
        // Not shut down: stop accepting at once (requests in flight on open
        // connections are cut off), and let go.
        if self.stop.is_some() {
            self.task.abort();
            self.served.stopped();
        }
    }
}
