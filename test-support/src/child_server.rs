//! A server binary of the workspace, run as a child process.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a child may take to print a line the test waits for.
const LINE_WITHIN: Duration = Duration::from_secs(30);

/// A child server process that prints `listening on ADDR` as its first line on
/// stdout once bound (the workspace's binaries do, with `--listen 127.0.0.1:0`);
/// SIGKILLed when dropped, so a failed assertion never leaves it behind.
///
/// Its stdout is read to the end (a pipe nobody reads would stop the child);
/// the lines after the first are kept ([`next_line`](Self::next_line),
/// [`stdout_lines`](Self::stdout_lines)). Its stderr is the command's: set
/// `Stdio::piped()` on it to keep it ([`stderr`](Self::stderr)).
pub struct ChildServer {
    child: Child,
    addr: String,
    /// Every stdout line after `listening on`, in order.
    lines: Arc<Mutex<Vec<String>>>,
    /// The same lines, as they come, for [`next_line`](Self::next_line).
    incoming: mpsc::Receiver<String>,
    /// All of stderr, when the command piped it.
    stderr: Arc<Mutex<String>>,
    /// The threads copying stdout and stderr; each ends with its pipe.
    readers: Vec<JoinHandle<()>>,
}

impl ChildServer {
    /// Spawns `command` with stdout piped and waits (at most 30 s) for its
    /// `listening on ADDR` line. Panics if it does not come.
    pub fn start(command: &mut Command) -> ChildServer {
        Self::spawn(command).ready()
    }

    /// Spawns `command` with stdout piped, without waiting: start several at
    /// once (their startups race, as replicas' do), then wait for each.
    pub fn spawn(command: &mut Command) -> Starting {
        let mut child = command.stdout(Stdio::piped()).spawn().expect("the server starts");
        let stdout = child.stdout.take().unwrap();
        // Read off this thread, so a silent child cannot hang the test past the bound.
        let (first_tx, first_line) = mpsc::channel();
        let (tx, incoming) = mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&lines);
        let mut readers = vec![std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout).lines();
            let first = stdout.next().and_then(Result::ok).unwrap_or_default();
            let _ = first_tx.send(first);
            for line in stdout {
                let Ok(line) = line else { break };
                kept.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        })];
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let text = Arc::clone(&stderr);
            readers.push(std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                    text.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            }));
        }
        let server = ChildServer { child, addr: String::new(), lines, incoming, stderr, readers };
        Starting { server, first_line }
    }

    /// The address it listens on, `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://ADDR`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line not yet taken here (waits at most 30 s; panics if none comes).
    pub fn next_line(&self) -> String {
        self.incoming.recv_timeout(LINE_WITHIN).expect("a line on stdout within 30 s")
    }

    /// Every stdout line after `listening on` so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// All of stderr so far (empty unless the command piped it).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGKILL: no shutdown code runs. Waits for the process to be gone.
    pub fn kill_9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits (at most 20 s; panics past it) for the exit, and for
    /// the last of its stdout and stderr to be read.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed");
        let start = Instant::now();
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "the server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        exit
    }
}

/// A [`ChildServer`] spawned but not yet known to listen.
pub struct Starting {
    server: ChildServer,
    first_line: mpsc::Receiver<String>,
}

impl Starting {
    /// Waits (at most 30 s) for the `listening on ADDR` line. Panics if it does not come.
    pub fn ready(mut self) -> ChildServer {
        let line = self.first_line.recv_timeout(LINE_WITHIN).expect("`listening on` within 30 s");
        let addr =
            line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {line:?}"));
        self.server.addr = addr.to_owned();
        self.server
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
