//! Debian's `prometheus` package, for the tests: test-support's `promtool` and
//! `prometheus` finder and check, and a real Prometheus of the test's own on a
//! loopback port, in a temporary directory, killed when dropped.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use test_support::ChildServer;

pub use test_support::{prometheus_tool, promtool};

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// A running `demo-resource serve` (its own flags after `serve --listen 127.0.0.1:0`);
/// test-support's child server, killed when dropped.
pub struct Demo {
    _server: ChildServer,
    /// `127.0.0.1:port`.
    pub addr: SocketAddr,
}

impl Demo {
    pub fn start(bin: &str, args: &[&str]) -> Self {
        let mut command = Command::new(bin);
        command.args(args).env("RUST_LOG", "warn");
        let server = ChildServer::start(command.stderr(Stdio::null()));
        Self { addr: server.addr().parse().unwrap(), _server: server }
    }
}

/// A real Prometheus scraping one target and evaluating `rules`, both every
/// second; its data in a temporary directory. Killed (and the directory
/// removed) when dropped.
pub struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:port`.
    pub base: String,
}

impl Prometheus {
    pub fn start(bin: &Path, job: &str, target: SocketAddr, rules: &Path) -> Self {
        // A port picked by binding :0 can be taken before Prometheus binds it: retry with new ones.
        for attempt in 1..=3 {
            let dir = tempfile::tempdir().unwrap();
            let config = format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules:?}\n\
                 scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n",
            );
            std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
            let child = Command::new(bin)
                .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("prometheus starts");
            let mut prometheus = Self { child, dir, base: format!("http://127.0.0.1:{port}") };
            if prometheus.ready(Duration::from_secs(30)) {
                return prometheus;
            }
            eprintln!("prometheus attempt {attempt} did not come up:\n{}", prometheus.log());
        }
        panic!("prometheus did not start in 3 attempts");
    }

    /// Whether `/-/ready` answers 200 within `bound` (false as soon as the process exits).
    fn ready(&mut self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            if get(&format!("{}/-/ready", self.base)).is_some_and(|(status, _)| status == 200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// What Prometheus logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/{path}`'s `data`.
    pub fn api(&self, path: &str) -> Value {
        let (status, body) = get(&format!("{}/api/v1/{path}", self.base)).expect("prometheus answers");
        assert_eq!(status, 200, "{path}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["status"], "success", "{path}: {body}");
        body["data"].clone()
    }

    /// An instant query's result vector.
    pub fn query(&self, promql: &str) -> Vec<Value> {
        let encoded: String = form_urlencoded::byte_serialize(promql.as_bytes()).collect();
        let data = self.api(&format!("query?query={encoded}"));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// Polls `check` every 200 ms until it gives `Some`, for at most `bound`.
    pub fn wait_for<T>(&self, bound: Duration, what: &str, mut check: impl FnMut(&Self) -> Option<T>) -> T {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(found) = check(self) {
                return found;
            }
            assert!(Instant::now() < deadline, "no {what} within {bound:?}; prometheus log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking GET with a short timeout: the status and body, or `None` when nothing answered.
pub fn get(url: &str) -> Option<(u16, String)> {
    send(reqwest::Method::GET, url, None)
}

/// A blocking request, with `Fencing-Token: token` if given: the status and body,
/// or `None` when nothing answered.
pub fn send(method: reqwest::Method, url: &str, token: Option<&str>) -> Option<(u16, String)> {
    let (url, token) = (url.to_owned(), token.map(str::to_owned));
    // reqwest's async client on a throwaway runtime: these helpers (and the tests) are synchronous.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap();
        let mut request = http.request(method, url).body("x");
        if let Some(token) = token {
            request = request.header("fencing-token", token);
        }
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    })
}
