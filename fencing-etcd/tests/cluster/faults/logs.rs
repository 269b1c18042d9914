//! The stores' warnings, captured: how a test knows that the replica's watch
//! was cancelled by etcd, and why. One global subscriber for the test binary
//! (the keeper logs from a thread of its own).

use std::io::Write;
use std::sync::{Mutex, OnceLock};

static CAPTURED: Mutex<String> = Mutex::new(String::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        CAPTURED.lock().unwrap().push_str(&String::from_utf8_lossy(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts capturing warnings (once per binary).
pub(crate) fn capture() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(|| Capture)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    });
}

/// The captured lines containing `text`.
pub(crate) fn lines_with(text: &str) -> Vec<String> {
    CAPTURED.lock().unwrap().lines().filter(|line| line.contains(text)).map(str::to_owned).collect()
}
