//! The seed's scenario with tokens from PostgreSQL, Redis and ZooKeeper: each test
//! starts what it needs (a database of its own on the local PostgreSQL; a redis-server
//! and a ZooKeeper on ephemeral 127.0.0.1 ports in temporary directories) and expects
//! the same three outcomes as with the demo lock service.
//!
//! Without the server these tests print SKIPPED and pass, unless `CI=true`.

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use demo_resource::scenario::{self, A_WRITE, B_WRITE, Report, TokenSource};
use tokio::time::{sleep, timeout};

fn skip<T>(what: &str) -> Option<T> {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true and {what}");
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {what} ***\n");
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// A child process killed on drop (also on panic).
struct Server(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The scenario's outcomes, as with the demo lock service.
fn check(report: &Report) {
    print!("{report}");
    assert!(report.problems().is_empty(), "{:?}", report.problems());
    let fenced = &report.with_fencing;
    assert!(fenced.b_token > fenced.a_token);
    assert_eq!(fenced.a.status, 409);
    assert_eq!(report.without_fencing.values(), [B_WRITE, A_WRITE]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_with_postgres_tokens() {
    let server = "host=127.0.0.1 port=5432 user=postgres connect_timeout=3";
    let admin =
        match tokio_postgres::connect(&format!("{server} dbname=postgres"), tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                client
            }
            Err(e) => {
                skip::<()>(&format!("PostgreSQL not reachable at 127.0.0.1:5432: {e}"));
                return;
            }
        };
    let db = format!("fencing_scenario_{}", std::process::id());
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await.unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {db}")).await.unwrap();
    let report = scenario::run_with(TokenSource::Postgres { url: format!("{server} dbname={db}") }).await;
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await.unwrap();
    check(&report.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_with_redis_tokens() {
    let Some(bin) = find("redis-server").or_else(|| skip("redis-server not installed")) else { return };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Server(child, dir);
    let url = format!("redis://127.0.0.1:{port}");
    let source = TokenSource::Redis { url: url.clone(), accept_volatile_counter: false };
    let report = timeout(Duration::from_secs(30), async {
        loop {
            match scenario::run_with(source.clone()).await {
                // Not listening yet ("connection refused"): wait for it.
                Err(e) if e.to_string().contains("refused") => sleep(Duration::from_millis(50)).await,
                other => break other,
            }
        }
    })
    .await
    .expect("redis-server did not come up");
    check(&report.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_with_zookeeper_tokens() {
    let jar = PathBuf::from("/usr/share/java/zookeeper.jar");
    let Some(java) =
        find("java").filter(|_| jar.is_file()).or_else(|| skip("java or ZooKeeper not installed"))
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // 100 ms ticks: A's 200 ms TTL is a 200 ms session (the minimum is two ticks).
    let cfg = format!(
        "tickTime=100\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n",
        dir.path().join("data").display()
    );
    std::fs::write(dir.path().join("zoo.cfg"), cfg).unwrap();
    let child = Command::new(java)
        .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp"])
        .arg(format!("{}:/usr/share/java/slf4j-nop.jar", jar.display()))
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(dir.path().join("zoo.cfg"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Server(child, dir);
    let source = TokenSource::ZooKeeper { cluster: format!("127.0.0.1:{port}") };
    let report = timeout(Duration::from_secs(60), async {
        loop {
            match scenario::run_with(source.clone()).await {
                Err(e) if e.to_string().contains("ZooKeeper lock client") => {
                    sleep(Duration::from_millis(200)).await
                }
                other => break other,
            }
        }
    })
    .await
    .expect("ZooKeeper did not come up");
    check(&report.unwrap());
}
