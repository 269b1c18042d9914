//! A PostgreSQL server of the test's own, for what must never be done to the
//! shared one: restarts, crashes, kill -9, standbys and failover.

use std::ffi::OsStr;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tokio_postgres::Config;

/// A PostgreSQL server of the test's own: `initdb` and `pg_ctl` of the installed
/// server (`pg_config --bindir`) in a temporary directory, on an ephemeral loopback
/// port, run as the `postgres` user when the tests run as root (PostgreSQL refuses
/// root); stopped and removed on drop.
pub struct OwnPg {
    dir: PathBuf,
    bindir: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Extra environment of the server's tools, hence of the server (libfaketime's).
    env: Vec<(String, String)>,
}

impl OwnPg {
    /// A fresh server, started. `None` after a loud SKIPPED line when this
    /// machine cannot run one (no server binaries, not root), unless `CI=true`.
    pub fn start() -> Option<OwnPg> {
        Self::start_with_env(|_| Vec::new())
    }

    /// A fresh server started with extra environment, made from its directory
    /// (which the server's user can read: where libfaketime's spec file goes).
    pub fn start_with_env(env: impl FnOnce(&Path) -> Vec<(&'static str, String)>) -> Option<OwnPg> {
        let mut pg = Self::fresh()?;
        pg.env = env(&pg.dir).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        pg.run("initdb", &["-D", &pg.data(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]);
        pg.pg_ctl("start");
        Some(pg)
    }

    /// A fresh server that accepts only TLS, started: `ssl = on` with `certs`' server
    /// certificate and key, and a `pg_hba.conf` that refuses every connection without TLS
    /// (`hostnossl … reject`) and trusts those with it (`hostssl … trust`) on loopback.
    /// `None` after a loud SKIPPED line, as [`start`](Self::start).
    #[cfg(feature = "tls")]
    pub fn start_tls(certs: &crate::TestCerts) -> Option<OwnPg> {
        use std::os::unix::fs::PermissionsExt as _;
        let pg = Self::fresh()?;
        pg.run("initdb", &["-D", &pg.data(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]);
        let data = Path::new(&pg.data()).to_owned();
        let (cert, key) = (data.join("server.crt"), data.join("server.key"));
        std::fs::write(&cert, &certs.server_cert).unwrap();
        std::fs::write(&key, &certs.server_key).unwrap();
        // PostgreSQL refuses a key that its group or others may read, or that another user owns.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        if is_root() {
            let chown = Command::new("chown").arg("postgres:postgres").args([&cert, &key]).status();
            assert!(chown.is_ok_and(|status| status.success()), "chown postgres {}", key.display());
        }
        let conf = "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n";
        std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap()
            .write_all(conf.as_bytes())
            .unwrap();
        // The tools' own connections (none with `pg_ctl -w`) come over the socket.
        let hba = "local all all trust\n\
                   hostnossl all all 0.0.0.0/0 reject\n\
                   hostnossl all all ::/0 reject\n\
                   hostssl all all 127.0.0.1/32 trust\n\
                   hostssl all all ::1/128 trust\n";
        std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
        pg.pg_ctl("start");
        Some(pg)
    }

    /// A streaming standby of this server (`pg_basebackup -R`), started. It
    /// names itself `name` to the primary (`application_name`), the name
    /// `synchronous_standby_names` lists.
    pub fn standby(&self, name: &str) -> OwnPg {
        let standby = Self::fresh().expect("the primary runs, so a standby can");
        let port = self.port.to_string();
        standby.run(
            "pg_basebackup",
            &["-D", &standby.data(), "-R", "-c", "fast", "-h", "127.0.0.1", "-p", &port],
        );
        // Appended after what -R wrote (the last setting wins). Promoted, it
        // has no standby of its own to wait for, whatever the primary had.
        let conninfo = format!(
            "primary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name={name}'\n\
             synchronous_standby_names = ''\n"
        );
        let auto = std::path::Path::new(&standby.data()).join("postgresql.auto.conf");
        std::fs::OpenOptions::new().append(true).open(auto).unwrap().write_all(conninfo.as_bytes()).unwrap();
        standby.pg_ctl("start");
        standby
    }

    /// A temp dir the postgres user owns and a free port; no server yet.
    fn fresh() -> Option<OwnPg> {
        let bindir = match Command::new("pg_config").arg("--bindir").output() {
            Ok(out) if out.status.success() => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
            _ => return skip("pg_config not found"),
        };
        if !bindir.join("initdb").exists() {
            return skip("initdb not found");
        }
        if is_root() && Command::new("runuser").arg("--help").output().is_err() {
            return skip("runuser not found (needed to run PostgreSQL as root's tests)");
        }
        let dir = std::env::temp_dir().join(format!("fencing-own-pg-{}-{}", std::process::id(), next()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let chown = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
            if !chown.is_ok_and(|status| status.success()) {
                return skip("cannot hand a directory to the postgres user");
            }
        }
        Some(OwnPg { dir, bindir, port: crate::free_port(), env: Vec::new() })
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// `tool` of the server's binaries, as the `postgres` user when root.
    fn tool(&self, tool: &str) -> Command {
        let mut command = if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]);
            command
        } else {
            Command::new("env")
        };
        if is_root() && !self.env.is_empty() {
            command.arg("env");
        }
        command.args(self.env.iter().map(|(k, v)| format!("{k}={v}"))).arg(self.bindir.join(tool));
        command
    }

    fn run<S: AsRef<OsStr> + fmt::Debug>(&self, tool: &str, args: &[S]) {
        let out = self.try_run(tool, args);
        assert!(out.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn try_run<S: AsRef<OsStr>>(&self, tool: &str, args: &[S]) -> std::process::Output {
        self.tool(tool).args(args).output().unwrap()
    }

    fn pg_ctl(&self, what: &str) {
        self.pg_ctl_mode(what, "fast");
    }

    fn pg_ctl_mode(&self, what: &str, mode: &str) {
        self.run("pg_ctl", &self.pg_ctl_args(what, mode));
    }

    fn pg_ctl_args(&self, what: &str, mode: &str) -> Vec<String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").display().to_string();
        ["-D", &self.data(), "-o", &options, "-l", &log, "-m", mode, "-w", what].map(str::to_owned).to_vec()
    }

    /// Stops the server (fast: every session ends) and starts it again.
    pub fn restart(&self) {
        self.pg_ctl("restart");
    }

    /// Stops the server (fast).
    pub fn stop(&self) {
        self.pg_ctl("stop");
    }

    /// Starts the stopped server again, on the same data and port.
    pub fn start_again(&self) {
        self.pg_ctl("start");
    }

    /// SIGKILL to the postmaster (no shutdown of any kind), then starts it again on the same
    /// data and port: tried for up to 30 s, while the killed server's backends still hold its
    /// shared memory.
    pub fn kill_9_and_start_again(&self) {
        let pid_file = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).unwrap();
        let pid = pid_file.lines().next().unwrap().trim().to_owned();
        let killed = Command::new("kill").args(["-9", &pid]).status().unwrap();
        assert!(killed.success(), "kill -9 {pid}");
        let args = self.pg_ctl_args("start", "fast");
        let started = Instant::now();
        loop {
            let out = self.try_run("pg_ctl", &args);
            if out.status.success() {
                return;
            }
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            assert!(started.elapsed() < Duration::from_secs(30), "PostgreSQL did not start again:\n{log}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Stops the server as a crash would (`-m immediate`: no checkpoint, no goodbye).
    pub fn crash(&self) {
        self.pg_ctl_mode("stop", "immediate");
    }

    /// Ends recovery on a standby: it becomes a primary (`pg_ctl promote`, waiting).
    pub fn promote(&self) {
        self.pg_ctl("promote");
    }

    /// Connection settings for the `postgres` database as `postgres`, connect timeout 3 s,
    /// plain TCP (`start_tls` makes a server that requires TLS).
    pub fn config(&self) -> Config {
        let mut config = Config::new();
        config.host("127.0.0.1").port(self.port).user("postgres").dbname("postgres");
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        config.connect_timeout(std::time::Duration::from_secs(3));
        config
    }
}

impl Drop for OwnPg {
    fn drop(&mut self) {
        let _ = self.try_run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the tests run as root (uid 0).
fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

fn next() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn skip(why: &str) -> Option<OwnPg> {
    crate::skip(&format!("cannot run a PostgreSQL server of the test's own: {why}"))
}
