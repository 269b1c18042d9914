//! The child-process plumbing the launchers share.

use std::future::Future;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep, timeout};

/// `name` in `$env_var` if set, else the first `name` on `PATH`.
pub(crate) fn find_binary(env_var: &str, name: &str) -> Option<PathBuf> {
    match std::env::var_os(env_var) {
        Some(p) => Some(PathBuf::from(p)),
        None => on_path(name),
    }
}

/// The first `name` on `PATH`.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// [`find_binary`], or `None` after the loud skip saying `missing`.
pub(crate) fn binary_or_skip(env_var: &str, name: &str, missing: &str) -> Option<PathBuf> {
    find_binary(env_var, name).or_else(|| crate::skip(missing))
}

/// Asks `probe` every `pause` (each answer bounded by `per_try`) until it says yes: true then;
/// false once the child has exited (a server that cannot start exits at once) or after `within`.
pub(crate) async fn wait_until_serving<F, P>(
    child: &mut Option<Child>,
    within: Duration,
    per_try: Duration,
    pause: Duration,
    mut probe: F,
) -> bool
where
    F: FnMut() -> P,
    P: Future<Output = std::io::Result<bool>>,
{
    let started = Instant::now();
    while started.elapsed() < within {
        if exited(child) {
            return false;
        }
        if let Ok(Ok(true)) = timeout(per_try, probe()).await {
            return true;
        }
        sleep(pause).await;
    }
    false
}

/// Sends `request` to 127.0.0.1:`port` and reads the answer: `len` bytes, or up to the
/// server's close when `None`.
pub(crate) async fn ask(port: u16, request: &[u8], len: Option<usize>) -> std::io::Result<Vec<u8>> {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    conn.write_all(request).await?;
    let mut answer = vec![0; len.unwrap_or(0)];
    match len {
        Some(_) => conn.read_exact(&mut answer).await.map(drop)?,
        None => conn.read_to_end(&mut answer).await.map(drop)?,
    }
    Ok(answer)
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
