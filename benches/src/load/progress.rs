//! What a round is doing while it runs: a live bar on a terminal, plain lines otherwise.
//!
//! On a terminal (stderr), an [`indicatif`] bar shows the round's elapsed time,
//! requests answered and their rate. Off a terminal (CI logs, pipes) it prints
//! one plain line a second instead, which a log keeps readably.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// A round's display; stops when dropped.
#[derive(Debug)]
pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts showing `label`'s round, `duration` long; `done` counts the answers.
    #[must_use]
    pub fn start(label: String, duration: Duration, done: Arc<AtomicU64>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || show(&label, duration, &done, &stop, tty))
        };
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn show(label: &str, duration: Duration, done: &AtomicU64, stop: &AtomicBool, tty: bool) {
    let start = Instant::now();
    let total_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let bar = tty.then(|| {
        let bar = ProgressBar::new(total_ms);
        let style = ProgressStyle::with_template("{prefix:>14} [{bar:30}] {elapsed:>3} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(label.to_owned());
        bar
    });
    let tick = if tty { Duration::from_millis(100) } else { Duration::from_secs(1) };
    let mut next = start + tick;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        if now < next {
            continue;
        }
        next += tick;
        let elapsed = now - start;
        let answered = done.load(Ordering::Relaxed);
        let rate = answered as f64 / elapsed.as_secs_f64();
        match &bar {
            Some(bar) => {
                bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX).min(total_ms));
                bar.set_message(format!("{answered} requests, {rate:.0} req/s"));
            }
            None => {
                eprintln!("  {label}: {:.1} s, {answered} requests, {rate:.0} req/s", elapsed.as_secs_f64())
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}
