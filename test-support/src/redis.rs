//! A throwaway `redis-server`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{ask, binary_or_skip, kill, wait_until_serving};

/// A `redis-server` on an ephemeral 127.0.0.1 port in a temporary directory (no RDB
/// snapshots), killed on drop. [`Redis::start`] makes it durable (AOF with
/// `appendfsync always`); [`Redis::start_with`] takes other settings.
///
/// Without `redis-server` on PATH (or in `$REDIS_SERVER_BIN`): `None` after a loud
/// SKIPPED line, or a failure when `CI=true`.
pub struct Redis {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    extra: Vec<String>,
    /// Serving TLS only: `port` is the TLS port, and no plain one is open.
    tls: bool,
    child: Option<Child>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Redis {
    /// A durable Redis (AOF, fsync on every write), or `None` after SKIPPED.
    pub async fn start() -> Option<Redis> {
        Self::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).await
    }

    /// A Redis with `settings` (command-line options), or `None` after SKIPPED.
    pub async fn start_with(settings: &[&str]) -> Option<Redis> {
        let mut redis = Self::new(settings, false)?;
        redis.run().await;
        Some(redis)
    }

    /// A durable Redis that serves TLS only (`--port 0`, `--tls-port`), with `certs`' server
    /// certificate, asking clients for none (`--tls-auth-clients no`); or `None` after SKIPPED.
    #[cfg(feature = "tls")]
    pub async fn start_tls(certs: &crate::TestCerts) -> Option<Redis> {
        let mut redis = Self::new(&["--appendonly", "yes", "--appendfsync", "always"], true)?;
        let (cert, key) = certs.write_server_files(redis.dir.path());
        for (option, file) in
            [("--tls-cert-file", &cert), ("--tls-key-file", &key), ("--tls-ca-cert-file", &certs.ca_file)]
        {
            redis.extra.extend([option.to_owned(), file.display().to_string()]);
        }
        redis.extra.extend(["--tls-auth-clients".to_owned(), "no".to_owned()]);
        redis.run().await;
        Some(redis)
    }

    /// A Redis not started yet, or `None` after SKIPPED.
    fn new(settings: &[&str], tls: bool) -> Option<Redis> {
        let missing = "redis-server not installed (put it on PATH or set REDIS_SERVER_BIN)";
        let bin = binary_or_skip("REDIS_SERVER_BIN", "redis-server", missing)?;
        Some(Redis {
            bin,
            dir: tempfile::tempdir().unwrap(),
            port: crate::free_port(),
            extra: settings.iter().map(|s| s.to_string()).collect(),
            tls,
            child: None,
        })
    }

    /// `redis://127.0.0.1:{port}` (`rediss://` from `Redis::start_tls`, feature `tls`).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The data directory (the AOF is in it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts (or restarts, on the same directory and port) and waits for `PING`.
    pub async fn run(&mut self) {
        for _ in 0..3 {
            let log = std::fs::File::create(self.dir.path().join("redis.log")).unwrap();
            let port = self.port.to_string();
            let mut command = Command::new(&self.bin);
            match self.tls {
                true => command.args(["--port", "0", "--tls-port", &port]),
                false => command.args(["--port", &port]),
            };
            let child = command
                .args(["--bind", "127.0.0.1", "--save", ""])
                .arg("--dir")
                .arg(self.dir.path())
                .args(&self.extra)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            self.child = Some(child);
            if self.ready().await {
                return;
            }
            self.kill();
            self.port = crate::free_port();
        }
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        panic!("redis-server did not start:\n{log}");
    }

    /// Polls (at most 5 s) until the server answers `PING` with `+PONG` (serving TLS: until
    /// it accepts a connection; a fresh server has no data to load first).
    async fn ready(&mut self) -> bool {
        let (within, per_try, pause) =
            (Duration::from_secs(5), Duration::from_millis(500), Duration::from_millis(50));
        let (port, tls) = (self.port, self.tls);
        let probe = || async move {
            match tls {
                true => tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map(|_| true),
                false => ping(port).await,
            }
        };
        wait_until_serving(&mut self.child, within, per_try, pause, probe).await
    }

    /// SIGKILL: no shutdown, no final AOF rewrite.
    pub fn kill(&mut self) {
        kill(&mut self.child);
    }
}

/// `PING` in Redis's inline protocol; whether the answer is `+PONG`.
async fn ping(port: u16) -> std::io::Result<bool> {
    Ok(ask(port, b"PING\r\n", Some(7)).await? == b"+PONG\r\n")
}
