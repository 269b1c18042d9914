//! A PostgreSQL server of the test's own, for what must never be done to the
//! shared one: restarts and terminated sessions. `initdb` and `pg_ctl` of the
//! installed server (`pg_config --bindir`), run as the `postgres` user, in a
//! temporary directory, on an ephemeral loopback port; stopped on drop.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use tokio_postgres::Config;

pub struct OwnPg {
    dir: PathBuf,
    bindir: PathBuf,
    pub port: u16,
}

impl OwnPg {
    /// A fresh server, started. `None` after a loud SKIPPED line when this
    /// machine cannot run one (no server binaries, not root), unless `CI=true`.
    pub fn start() -> Option<OwnPg> {
        let pg = Self::fresh()?;
        pg.run("initdb", &["-D", &pg.data(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]);
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
        if !bindir.join("initdb").exists() || Command::new("runuser").arg("--help").output().is_err() {
            return skip("initdb or runuser not found");
        }
        let dir = std::env::temp_dir().join(format!("fencing-own-pg-{}-{}", std::process::id(), next()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let chown = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
        if !chown.is_ok_and(|status| status.success()) {
            return skip("cannot hand a directory to the postgres user (not root?)");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Some(OwnPg { dir, bindir, port })
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bindir.join(tool))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn pg_ctl(&self, what: &str) {
        self.pg_ctl_mode(what, "fast");
    }

    fn pg_ctl_mode(&self, what: &str, mode: &str) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").display().to_string();
        self.run("pg_ctl", &["-D", &self.data(), "-o", &options, "-l", &log, "-m", mode, "-w", what]);
    }

    /// Stops the server (fast: every session ends) and starts it again.
    pub fn restart(&self) {
        self.pg_ctl("restart");
    }

    pub fn stop(&self) {
        self.pg_ctl("stop");
    }

    pub fn start_again(&self) {
        self.pg_ctl("start");
    }

    /// Stops the server as a crash would (`-m immediate`: no checkpoint, no goodbye).
    pub fn crash(&self) {
        self.pg_ctl_mode("stop", "immediate");
    }

    /// Ends recovery on a standby: it becomes a primary (`pg_ctl promote`, waiting).
    pub fn promote(&self) {
        self.pg_ctl("promote");
    }

    pub fn config(&self) -> Config {
        let mut config = Config::new();
        config.host("127.0.0.1").port(self.port).user("postgres").dbname("postgres");
        config.connect_timeout(std::time::Duration::from_secs(3));
        config
    }
}

impl Drop for OwnPg {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bindir.join("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn next() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn skip(why: &str) -> Option<OwnPg> {
    let message = format!("cannot run a PostgreSQL server of the test's own: {why}");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true and {message}");
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {message} ***\n");
    None
}
