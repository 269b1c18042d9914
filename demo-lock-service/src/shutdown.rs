//! Graceful shutdown for the binaries: the lock service's and the resource's.

use std::fmt;

/// The signal that asked a binary to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ctrl-C (SIGINT).
    CtrlC,
    /// SIGTERM.
    Terminate,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CtrlC => "Ctrl-C",
            Self::Terminate => "SIGTERM",
        })
    }
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM, for `axum::serve`'s graceful shutdown,
/// with the signal, which the caller logs (under its own target: the storage
/// service's stop is not the lock service's). A signal that cannot be listened for
/// is logged and never fires.
pub async fn shutdown_signal() -> Signal {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => Signal::CtrlC,
        () = terminate => Signal::Terminate,
    }
}
