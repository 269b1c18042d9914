//! A server binary of the workspace, run as a child process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A child server process that prints `listening on ADDR` as its first line on
/// stdout once bound (the workspace's binaries do, with `--listen 127.0.0.1:0`);
/// SIGKILLed when dropped, so a failed assertion never leaves it behind.
pub struct ChildServer {
    child: Child,
    addr: String,
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
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        Starting { server: ChildServer { child, addr: String::new() }, first_line: rx }
    }

    /// The address it listens on, `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://ADDR`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL: no shutdown code runs. Waits for the process to be gone.
    pub fn kill_9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
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
        let line = self.first_line.recv_timeout(Duration::from_secs(30)).expect("`listening on` within 30 s");
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
