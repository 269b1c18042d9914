//! The real processes the tests run: the Python upstream (`tests/upstream.py`)
//! and the gate binary, each on an ephemeral loopback port, killed on drop.

use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Python's standard-library server appending each write to a journal.
pub(crate) struct Upstream {
    child: Child,
    pub(crate) port: u16,
    journal: PathBuf,
    _dir: tempfile::TempDir,
}

/// One line of the upstream's journal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Write {
    pub(crate) start: f64,
    pub(crate) end: f64,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) token: String,
    pub(crate) body: String,
}

impl Upstream {
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&journal)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the test upstream");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("listening on ").and_then(|p| p.parse().ok()).expect(&line);
        Self { child, port, journal, _dir: dir }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every write the upstream recorded, in order.
    pub(crate) fn writes(&self) -> Vec<Write> {
        let text = std::fs::read_to_string(&self.journal).unwrap_or_default();
        text.lines()
            .map(|line| {
                let mut fields = line.splitn(6, ' ');
                let mut next = || fields.next().unwrap_or_default().to_owned();
                let (start, end, method, path, token, body) =
                    (next(), next(), next(), next(), next(), next());
                Write {
                    start: start.parse().unwrap(),
                    end: end.parse().unwrap(),
                    method,
                    path,
                    token: token.trim_start_matches("token=").to_owned(),
                    body,
                }
            })
            .collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gate binary, with a configuration file of the test's.
pub(crate) struct Gate {
    child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) metrics: Option<SocketAddr>,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
    config: PathBuf,
    _dir: Arc<tempfile::TempDir>,
}

impl Gate {
    /// A gate in front of `upstream`, with `extra` appended to its TOML.
    pub(crate) fn start(upstream: &str, extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("gate.toml");
        let text = format!("listen = \"127.0.0.1:0\"\nupstream = \"{upstream}\"\n{extra}\n");
        std::fs::write(&config, text).unwrap();
        Self::run(&["--config".as_ref(), config.as_os_str()], config.clone(), Arc::new(dir))
    }

    /// `fencing-gate --listen 127.0.0.1:0 --upstream URL`: no configuration file.
    pub(crate) fn one_line(upstream: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let args = ["--listen", "127.0.0.1:0", "--upstream", upstream].map(std::ffi::OsStr::new);
        Self::run(&args, PathBuf::new(), Arc::new(dir))
    }

    /// The same gate again (after [`kill9`](Self::kill9)), on a new port.
    pub(crate) fn restart(&self) -> Self {
        Self::run(
            &["--config".as_ref(), self.config.as_os_str()],
            self.config.clone(),
            Arc::clone(&self._dir),
        )
    }

    fn run(args: &[&std::ffi::OsStr], config: PathBuf, dir: Arc<tempfile::TempDir>) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencing-gate"))
            .args(args)
            .env("RUST_LOG", "fencing_gate=info,fencing_layer=warn")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (ready, listening) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let kept = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                for (what, marker) in
                    [("gate", "fencing-gate serving listen="), ("metrics", "metrics serving listen=")]
                {
                    if let Some(rest) = line.split(marker).nth(1) {
                        let addr: SocketAddr = rest.split_whitespace().next().unwrap().parse().unwrap();
                        let _ = ready.send((what, addr));
                    }
                }
                kept.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let mut metrics = None;
        loop {
            match listening.recv_timeout(Duration::from_secs(30)) {
                Ok(("metrics", addr)) => metrics = Some(addr),
                Ok((_, addr)) => {
                    return Self { child, addr, metrics, log, reader: Some(reader), config, _dir: dir };
                }
                Err(_) => panic!("the gate did not start:\n{}", log.lock().unwrap()),
            }
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What the gate logged so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub(crate) fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and the exit status within `bound`.
    pub(crate) fn terminate(&mut self, bound: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Everything it logged, up to its last line.
                if let Some(reader) = self.reader.take() {
                    let _ = reader.join();
                }
                return status;
            }
            assert!(started.elapsed() < bound, "the gate did not exit within {bound:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on.
pub(crate) fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A response as it came, status line, headers and body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn problem(&self) -> serde_json::Value {
        assert_eq!(self.headers["content-type"], "application/problem+json", "{self:?}");
        serde_json::from_str(&self.body).unwrap()
    }
}

/// `method path` through the gate, with `Fencing-Token: token` when given.
pub(crate) async fn send(gate: &Gate, method: &str, path: &str, token: Option<u64>, body: &str) -> Reply {
    let client = reqwest::Client::new();
    let mut request = client.request(method.parse().unwrap(), gate.url(path)).body(body.to_owned());
    if let Some(token) = token {
        request = request.header("fencing-token", token);
    }
    let response = request.timeout(Duration::from_secs(20)).send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Reply { status, headers, body: response.text().await.unwrap() }
}

/// Sends `raw` bytes to the gate and reads until it closes the connection (or 5 s pass).
pub(crate) fn raw(gate: &Gate, raw: &[u8]) -> String {
    let mut stream = TcpStream::connect(gate.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(raw).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends `raw` bytes to the gate and reads one response (its head and its
/// `Content-Length` bytes of body), leaving the connection as it is.
pub(crate) fn raw_one(gate: &Gate, raw: &[u8]) -> String {
    let mut stream = TcpStream::connect(gate.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(raw).unwrap();
    let mut reader = BufReader::new(stream);
    let mut answer = String::new();
    while !answer.ends_with("\r\n\r\n") {
        if reader.read_line(&mut answer).unwrap() == 0 {
            return answer;
        }
    }
    let length = answer
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase().strip_prefix("content-length: ").map(|n| n.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    answer + &String::from_utf8_lossy(&body)
}

/// Seconds since the epoch, as the upstream's journal counts them.
pub(crate) fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}
