//! A throwaway standalone ZooKeeper.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{ask, binary_or_skip, kill, wait_until_serving};

/// A standalone ZooKeeper (`ZooKeeperServerMain` on a JRE) on an ephemeral
/// 127.0.0.1 port in a temporary directory, killed on drop. Ticks are 100 ms, so
/// sessions can be as short as 200 ms.
///
/// Needs `java` on PATH (or `$JAVA_BIN`) and the ZooKeeper jar (`/usr/share/java/zookeeper.jar`, or
/// `$ZOOKEEPER_JAR`); without them `None` after a loud SKIPPED line, or a failure
/// when `CI=true`.
pub struct ZooKeeper {
    java: PathBuf,
    classpath: String,
    dir: tempfile::TempDir,
    port: u16,
    /// With `ZooKeeper::start_tls` (feature `tls`): the TLS port, and the zoo.cfg lines of its certificates.
    secure: Option<(u16, String)>,
    child: Option<Child>,
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        self.kill();
    }
}

impl ZooKeeper {
    /// Starts ZooKeeper and waits until it serves.
    pub async fn start() -> Option<ZooKeeper> {
        Self::launch(|_| None).await
    }

    /// Starts a ZooKeeper that also serves TLS, on a secure client port of its own
    /// ([`tls_cluster`](Self::tls_cluster)), with `certs`' server certificate (a PEM key
    /// store, which ZooKeeper reads since 3.5.5), asking clients for none; its plain port
    /// stays open, for its readiness. The TLS port needs Netty (`NettyServerCnxnFactory`),
    /// which Debian's jar names in its manifest, but for its codec (`netty-codec.jar`, put on
    /// the class path from the jar's folder).
    #[cfg(feature = "tls")]
    pub async fn start_tls(certs: &crate::TestCerts) -> Option<ZooKeeper> {
        Self::launch(|dir| {
            let store = dir.join("keystore.pem");
            std::fs::write(&store, format!("{}{}", certs.server_key, certs.server_cert)).unwrap();
            Some(format!(
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=none\n",
                store.display(),
                certs.ca_file.display()
            ))
        })
        .await
    }

    /// Starts ZooKeeper; `secure` writes what TLS needs into its directory and says the zoo.cfg
    /// lines that name it (none: no TLS port).
    async fn launch(secure: impl FnOnce(&Path) -> Option<String>) -> Option<ZooKeeper> {
        let java = binary_or_skip("JAVA_BIN", "java", "java not installed (ZooKeeper needs a JRE)")?;
        let jar = std::env::var_os("ZOOKEEPER_JAR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/share/java/zookeeper.jar"));
        if !jar.is_file() {
            return crate::skip(&format!(
                "ZooKeeper not installed ({} missing; set ZOOKEEPER_JAR)",
                jar.display()
            ));
        }
        // The jar's manifest names its dependencies; slf4j-nop, if there, silences logging.
        // Netty's codec is missing from Debian's manifest, and Netty's handlers (the TLS
        // port's) need it: the same package (libnetty-java) has it beside the others.
        let mut classpath = jar.display().to_string();
        for extra in ["slf4j-nop.jar", "netty-codec.jar"] {
            let extra = jar.with_file_name(extra);
            if extra.is_file() {
                classpath = format!("{classpath}:{}", extra.display());
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let secure = secure(dir.path()).map(|lines| (0, lines));
        let mut zk = ZooKeeper { java, classpath, dir, port: 0, secure, child: None };
        for _ in 0..3 {
            zk.port = crate::free_port();
            if let Some((port, _)) = &mut zk.secure {
                *port = crate::free_port();
            }
            if zk.run().await {
                return Some(zk);
            }
        }
        let log = std::fs::read_to_string(zk.dir.path().join("zk.log")).unwrap_or_default();
        panic!("ZooKeeper did not start:\n{log}");
    }

    /// The connect string, `127.0.0.1:{port}`.
    pub fn cluster(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The TLS connect string, `tcp+tls://127.0.0.1:{port}` (from [`ZooKeeper::start_tls`]).
    #[cfg(feature = "tls")]
    pub fn tls_cluster(&self) -> String {
        let (port, _) = self.secure.as_ref().expect("a ZooKeeper started with start_tls");
        format!("tcp+tls://127.0.0.1:{port}")
    }

    /// The server's directory (its config, log and `data/`).
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts (or restarts on the same data and port) and waits (at most 60 s) until
    /// it serves; false if it exited or never did.
    pub async fn run(&mut self) -> bool {
        let dir = self.dir.path();
        let mut cfg = format!(
            "tickTime=100\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             maxSessionTimeout=60000\nadmin.enableServer=false\n4lw.commands.whitelist=srvr\n",
            dir.join("data").display(),
            self.port
        );
        if let Some((port, lines)) = &self.secure {
            cfg += &format!("secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n{lines}");
        }
        std::fs::write(dir.join("zoo.cfg"), cfg).unwrap();
        let log = std::fs::File::create(dir.join("zk.log")).unwrap();
        let child = Command::new(&self.java)
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", &self.classpath])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let (within, per_try, pause) =
            (Duration::from_secs(60), Duration::from_secs(2), Duration::from_millis(100));
        let port = self.port;
        let serves = wait_until_serving(&mut self.child, within, per_try, pause, || serving(port)).await;
        if !serves {
            self.kill();
        }
        serves
    }

    /// SIGKILL: no shutdown of any kind.
    pub fn kill(&mut self) {
        kill(&mut self.child);
    }
}

/// The `srvr` four-letter command: a serving server names its mode; one still
/// loading its data says it is "not currently serving requests".
async fn serving(port: u16) -> std::io::Result<bool> {
    Ok(String::from_utf8_lossy(&ask(port, b"srvr", None).await?).contains("Mode: "))
}
