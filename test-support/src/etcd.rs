//! A throwaway single-member etcd.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{ask, binary_or_skip, kill, log_tail, wait_until_serving};

/// A single-member etcd on ephemeral 127.0.0.1 ports in a temporary directory,
/// killed on drop (also on panic).
///
/// Without `etcd` on PATH (or in `$ETCD_BIN`): `None` after a loud SKIPPED line,
/// or a failure when `CI=true`.
pub struct Etcd {
    child: Option<Child>,
    /// The client URL, `http://127.0.0.1:{port}` (`https://` from `Etcd::start_tls`, feature `tls`).
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Etcd {
    /// Starts etcd and waits (at most 20 s a try) until it is healthy.
    pub async fn start() -> Option<Etcd> {
        Self::launch("http", None).await
    }

    /// Starts an etcd that serves its clients over TLS only (`https://127.0.0.1:{port}`), with
    /// `certs`' server certificate; with `client_certs`, it also asks each client for a certificate
    /// that `certs`' CA signed (`--client-cert-auth`). Its health is read over plain HTTP, on a
    /// metrics URL of its own.
    #[cfg(feature = "tls")]
    pub async fn start_tls(certs: &crate::TestCerts, client_certs: bool) -> Option<Etcd> {
        Self::launch("https", Some(&|command, dir| tls_args(command, dir, certs, client_certs))).await
    }

    /// Starts etcd serving its clients at `scheme://127.0.0.1:{port}`; `secure` adds the options
    /// (and files in etcd's directory) of TLS, and says on which port its health is read.
    async fn launch(scheme: &str, secure: Option<&Secure<'_>>) -> Option<Etcd> {
        let bin =
            binary_or_skip("ETCD_BIN", "etcd", "etcd not installed (put `etcd` on PATH or set ETCD_BIN)")?;
        // A port picked by binding :0 can be taken again before etcd binds it: retry with new ports.
        for attempt in 1..=3 {
            let dir = tempfile::tempdir().unwrap();
            let client_port = crate::free_port();
            let client_url = format!("{scheme}://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{}", crate::free_port());
            let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
            let mut command = Command::new(&bin);
            command
                .args(["--name", "fencing-test"])
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("fencing-test={peer_url}")]);
            let health_port = secure.map_or(client_port, |secure| secure(&mut command, dir.path()));
            let child = command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", PathBuf::from(&bin).display()));
            let mut etcd = Etcd { child: Some(child), endpoint: client_url, _dir: dir };
            if etcd.wait_ready(health_port).await {
                return Some(etcd);
            }
            let tail = log_tail(&etcd._dir.path().join("etcd.log"), 5);
            eprintln!("etcd attempt {attempt} did not come up; last log lines:\n{tail}");
        }
        panic!("etcd did not start in 3 attempts");
    }

    /// Polls until `/health` says it serves (it has a leader and answers reads);
    /// false if it exited or never did.
    async fn wait_ready(&mut self, port: u16) -> bool {
        let (within, per_try, pause) =
            (Duration::from_secs(20), Duration::from_millis(500), Duration::from_millis(100));
        wait_until_serving(&mut self.child, within, per_try, pause, || healthy(port)).await
    }

    /// Kills etcd (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        kill(&mut self.child);
    }
}

/// What adds TLS to etcd's command (options, and files in the directory given): the port
/// its health is then read on.
type Secure<'a> = dyn Fn(&mut Command, &Path) -> u16 + 'a;

/// The options that make etcd serve clients with `certs` (their files written into `dir`) and
/// its health on a plain metrics URL: that URL's port.
#[cfg(feature = "tls")]
fn tls_args(command: &mut Command, dir: &Path, certs: &crate::TestCerts, client_certs: bool) -> u16 {
    let (cert, key) = certs.write_server_files(dir);
    command.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
    if client_certs {
        command.arg("--client-cert-auth").arg("--trusted-ca-file").arg(&certs.ca_file);
    }
    let metrics_port = crate::free_port();
    command.args(["--listen-metrics-urls", &format!("http://127.0.0.1:{metrics_port}")]);
    metrics_port
}

/// `GET /health` on the client port; whether etcd says `"health":"true"`.
pub(crate) async fn healthy(port: u16) -> std::io::Result<bool> {
    let request = format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let answer = ask(port, request.as_bytes(), None).await?;
    let answer = String::from_utf8_lossy(&answer);
    Ok(answer.starts_with("HTTP/1.1 200") && answer.contains("\"health\":\"true\""))
}
