//! The Redis the billing scenario locks on: the one at the given URL, or, when
//! none answers there, a private `redis-server` on an ephemeral loopback port in
//! a temporary directory, stopped when the scenario ends.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencing_client::RedisLockClient;

use crate::failure::Failure;

/// How long a private server gets to accept connections.
const START_BOUND: Duration = Duration::from_secs(10);

/// A lock client, and the private server behind it if one was started.
pub(super) struct Locks {
    pub(super) client: RedisLockClient,
    /// Where the client is connected, for the report.
    pub(super) url: String,
    /// Whether it is a private `redis-server` this scenario started.
    pub(super) private: bool,
    _server: Option<PrivateRedis>,
}

/// A `redis-server` of our own, killed on drop.
struct PrivateRedis {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to `url` with keys under `prefix`; if nothing answers there, starts a
/// private `redis-server` (found on `PATH`) and connects to it.
///
/// The token counter is a key of this run's own, deleted at the end: nothing that
/// lives longer than the run depends on it, so a server without `appendfsync
/// always` (the usual default) is accepted here. A job that keeps using one
/// counter across runs must not (docs/token-sources.md).
pub(super) async fn connect(url: &str, prefix: &str) -> Result<Locks, Failure> {
    let builder = |url: &str| {
        RedisLockClient::builder(url.to_owned()).prefix(prefix.to_owned()).accept_volatile_counter(true)
    };
    match builder(url).connect().await {
        Ok(client) => return Ok(Locks { client, url: url.to_owned(), private: false, _server: None }),
        Err(error) if is_unreachable(&error.to_string()) => {
            tracing::info!(url, %error, "no Redis there: starting a private redis-server");
        }
        Err(error) => return Err(Failure(format!("Redis at {url}: {error}"))),
    }
    let server = start_private()?;
    let port = server.1;
    let url = format!("redis://127.0.0.1:{port}");
    let connected = tokio::time::timeout(START_BOUND, async {
        loop {
            match builder(&url).connect().await {
                Err(error) if is_unreachable(&error.to_string()) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other,
            }
        }
    })
    .await;
    let client = connected
        .map_err(|_| Failure(format!("the private redis-server did not answer within {START_BOUND:?}")))?
        .map_err(|e| Failure(format!("the private redis-server: {e}")))?;
    Ok(Locks { client, url, private: true, _server: Some(server.0) })
}

fn is_unreachable(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    ["refused", "timed out", "timeout", "unreachable", "connect"].iter().any(|what| error.contains(what))
}

fn start_private() -> Result<(PrivateRedis, u16), Failure> {
    let bin = find("redis-server").ok_or_else(|| {
        Failure(
            "no Redis answers at the given URL, and no redis-server on PATH to start a private one".into(),
        )
    })?;
    let dir = tempfile::tempdir().map_err(|e| Failure(format!("temporary directory: {e}")))?;
    // A free port: bound, read, released; the server binds it a moment later.
    let port = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .and_then(|listener| listener.local_addr())
        .map_err(|e| Failure(format!("a free port for redis-server: {e}")))?
        .port();
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Failure(format!("starting redis-server: {e}")))?;
    Ok((PrivateRedis { child, _dir: dir }, port))
}

fn find(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|path| path.is_file())
}
