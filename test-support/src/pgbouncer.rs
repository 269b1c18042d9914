//! A throwaway PgBouncer in front of a PostgreSQL server, as Debian ships it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{binary_or_skip, exited, kill, log_tail, wait_until_serving};

/// PgBouncer's pooling modes the tests run through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// `pool_mode = session`: a client keeps one server session until it disconnects.
    Session,
    /// `pool_mode = transaction`: each transaction may run on another server session.
    Transaction,
}

impl PoolMode {
    fn name(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// `pgbouncer` on an ephemeral 127.0.0.1 port, every database forwarded to a
/// PostgreSQL on 127.0.0.1:`upstream`, with the package's own defaults
/// otherwise (no `ignore_startup_parameters`, pools of 20, LIFO server reuse),
/// trust auth; run as the `postgres` user when the tests run as root (it
/// refuses root). Killed on drop.
///
/// Without `pgbouncer` on PATH (or in `$PGBOUNCER_BIN`): `None` after a loud
/// SKIPPED line, or a failure when `CI=true`.
pub struct PgBouncer {
    dir: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
}

impl PgBouncer {
    /// Started in `mode` in front of 127.0.0.1:`upstream`, and accepting connections.
    pub async fn start(upstream: u16, mode: PoolMode) -> Option<PgBouncer> {
        let missing = "pgbouncer not installed (Debian's pgbouncer package, or set PGBOUNCER_BIN)";
        let bin = binary_or_skip("PGBOUNCER_BIN", "pgbouncer", missing)?;
        let root = crate::is_root();
        if root && crate::process::on_path("setpriv").is_none() {
            return crate::skip("setpriv not found (needed to run pgbouncer as root's tests)");
        }
        let dir = std::env::temp_dir().join(format!(
            "fencing-pgbouncer-{}-{}",
            std::process::id(),
            crate::free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let port = crate::free_port();
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={upstream}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {dir}/userlist.txt\n\
             pool_mode = {mode}\nmax_client_conn = 500\nlogfile = {dir}/pgbouncer.log\n",
            dir = dir.display(),
            mode = mode.name(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        let mut command = if root {
            let chown = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
            assert!(chown.is_ok_and(|s| s.success()), "chown {}", dir.display());
            let mut command = Command::new("setpriv");
            command.args(["--reuid=postgres", "--regid=postgres", "--init-groups"]).arg(&bin);
            command
        } else {
            Command::new(&bin)
        };
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut bouncer = PgBouncer { dir, port, child: Some(child.unwrap()) };
        let up = wait_until_serving(
            &mut bouncer.child,
            Duration::from_secs(10),
            Duration::from_secs(1),
            Duration::from_millis(50),
            || async move { tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map(|_| true) },
        )
        .await;
        assert!(up, "pgbouncer did not start: {}", bouncer.log(20));
        Some(bouncer)
    }

    /// `host=127.0.0.1 port={port} user=postgres dbname={dbname}`: through the pooler (plain TCP).
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={dbname} connect_timeout=5 sslmode=disable",
            self.port
        )
    }

    /// The last `lines` lines of its log.
    pub fn log(&self, lines: usize) -> String {
        log_tail(&self.dir.join("pgbouncer.log"), lines)
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        !exited(&mut self.child)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        kill(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
