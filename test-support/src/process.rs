//! The child-process plumbing the launchers share.

use std::path::PathBuf;
use std::process::Child;

/// `name` in `$env_var` if set, else the first `name` on `PATH`.
pub(crate) fn find_binary(env_var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env_var) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// SIGKILL (no shutdown of any kind) and reap, if running.
pub(crate) fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Whether the child has exited (a server that cannot start exits at once).
pub(crate) fn exited(child: &mut Option<Child>) -> bool {
    matches!(child.as_mut().map(Child::try_wait), Some(Ok(Some(_))))
}

/// The last `lines` lines of the file at `path` (a server's log, for a panic message).
pub(crate) fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let mut tail: Vec<&str> = log.lines().rev().take(lines).collect();
    tail.reverse();
    tail.join("\n")
}
