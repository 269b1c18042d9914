//! [`Running`]: a router served in a background task, and the way to stop it
//! (the lock service's [`RunningService`](crate::RunningService), and
//! demo-resource's servers).

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What a [`Running`] server serves: told once the server has stopped, so that
/// it can let go of what it holds.
pub trait Served {
    /// Called once, after the server stopped ([`Running::shutdown`], or the
    /// [`Running`] dropped without it). Does nothing unless implemented.
    fn stopped(&self) {}
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
    /// Binds `addr` (`127.0.0.1:0` picks a free port) and serves `router` in a
    /// background task until stopped, then lets open requests finish.
    ///
    /// # Errors
    ///
    /// The address cannot be bound.
    pub async fn start(addr: SocketAddr, served: T, router: axum::Router) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
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
