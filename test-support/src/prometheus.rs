//! Debian's `prometheus` package's tools (`promtool`, `prometheus`): finding
//! them, and running `promtool` on some input.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `name` (`promtool`, `prometheus`) on the `PATH`, or `None` after the loud skip.
pub fn prometheus_tool(name: &str) -> Option<PathBuf> {
    crate::process::on_path(name)
        .or_else(|| crate::skip(&format!("`{name}` not installed (Debian: apt-get install prometheus)")))
}

/// Runs `promtool args…` with `stdin` on its standard input; panics with its
/// output (and the input, when there was one) unless it succeeds.
pub fn promtool(promtool: &Path, args: &[&str], stdin: &str) {
    let mut child = Command::new(promtool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let input = if stdin.is_empty() { String::new() } else { format!("\non:\n{stdin}") };
    assert!(
        output.status.success(),
        "promtool {args:?}: {}\n{}{}{input}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
