//! The keeper's log output, handed off without ever blocking the keeper.
//!
//! The application owns the log output: a stalled log shipper or a full
//! container pipe makes every `write(2)` to stderr block. A keeper that logged
//! there itself would stop renewing and revoking while it waits (an attack
//! showed a lower token run 5 s beside a higher one that way). So the keeper's
//! thread gets a subscriber of its own, [`Handoff`]: every event on that thread
//! (the keeper's, the backend's, a driver's bridged through `log`) is formatted
//! there and put in a bounded queue, or dropped and counted when the queue is
//! full. A thread of its own, the journal, takes the lines and logs them with
//! the application's subscriber; it may block as long as the sink likes.
//!
//! What is dropped is counted ([`ClaimStore::revocations`], and a metric), and said in
//! the next line that gets through. The keeper logs once per renewal or
//! revocation with counts, never once per claim, so a burst of ten thousand
//! expiries is one line.
//!
//! [`ClaimStore::revocations`]: super::ClaimStore::revocations

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};

/// The keeper's metrics, when the feature is on (else nothing to carry).
#[cfg(feature = "metrics")]
pub(super) use super::revocations::Metered;
#[cfg(not(feature = "metrics"))]
pub(super) enum Metered {}

/// Lines waiting for the journal at most; past it they are dropped.
const QUEUE: usize = 256;

/// One formatted event on its way to the application's subscriber.
struct Line {
    level: Level,
    from: &'static str,
    text: String,
}

/// The subscriber of the keeper's thread: formats each event the
/// application's subscriber wants, queues it, never waits.
pub(super) struct Handoff {
    lines: SyncSender<Line>,
    dropped: Arc<AtomicU64>,
    #[cfg(feature = "metrics")]
    metered: Option<metrics::Counter>,
    /// The application's subscriber: asked what it wants, never given anything here.
    real: Dispatch,
}

impl Handoff {
    /// A handoff to `real` (the application's subscriber), and the journal
    /// thread that logs what it is handed. Lines dropped are counted in `dropped`.
    pub(super) fn start(real: Dispatch, dropped: Arc<AtomicU64>, metered: Option<Metered>) -> Dispatch {
        let (lines, queue) = std::sync::mpsc::sync_channel(QUEUE);
        let journal = real.clone();
        let counted = Arc::clone(&dropped);
        let thread = std::thread::Builder::new()
            .name("fencing-claims-journal".into())
            .spawn(move || tracing::dispatcher::with_default(&journal, || write_out(&queue, &counted)));
        if let Err(error) = thread {
            // Nothing will read the queue: every line is dropped (and counted), the keeper still runs.
            tracing::error!(%error, "claims: cannot start the keeper's journal thread; its lines are dropped");
        }
        #[cfg(feature = "metrics")]
        let metered = metered.map(|metered| metered.dropped);
        #[cfg(not(feature = "metrics"))]
        let _: Option<Metered> = metered;
        Dispatch::new(Self {
            lines,
            dropped,
            #[cfg(feature = "metrics")]
            metered,
            real,
        })
    }
}

/// The journal thread: logs each line as it comes, and how many were dropped
/// before it, until the keeper's thread ends.
fn write_out(queue: &Receiver<Line>, dropped: &AtomicU64) {
    while let Ok(line) = queue.recv() {
        emit(&line);
        let missed = dropped.swap(0, Ordering::Relaxed);
        if missed > 0 {
            tracing::warn!(
                target: "fencing_layer::claims",
                missed,
                "claims: the log output did not keep up; the keeper dropped lines rather than wait"
            );
        }
    }
}

fn emit(line: &Line) {
    let (from, text) = (line.from, &line.text);
    match line.level {
        Level::ERROR => tracing::error!(target: "fencing_layer::claims", from, "{text}"),
        Level::WARN => tracing::warn!(target: "fencing_layer::claims", from, "{text}"),
        Level::INFO => tracing::info!(target: "fencing_layer::claims", from, "{text}"),
        Level::DEBUG => tracing::debug!(target: "fencing_layer::claims", from, "{text}"),
        _ => tracing::trace!(target: "fencing_layer::claims", from, "{text}"),
    }
}

impl Subscriber for Handoff {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Asked each time: the application's filter may change.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && self.real.enabled(metadata)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Spans are not handed off: the journal logs events alone.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        let mut text = Text::default();
        event.record(&mut text);
        let line = Line { level: *metadata.level(), from: metadata.target(), text: text.0 };
        match self.lines.try_send(line) {
            Ok(()) => {}
            // Full (the sink is slow or stalled) or gone (the journal could not start).
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                self.metered.as_ref().inspect(|dropped| dropped.increment(1));
            }
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// An event's message, then its other fields as `name=value`.
#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let fields = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}{fields}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;

    /// A sink that never returns from a write while `stalled` is held.
    #[derive(Clone)]
    struct Stalled(Arc<Mutex<Vec<u8>>>);

    impl Write for Stalled {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// With the journal's sink stalled, logging on the handoff never waits:
    /// 10,000 lines take far less than a second, those past the queue are
    /// counted as dropped, and once the sink moves the count is logged.
    #[test]
    fn a_stalled_sink_never_blocks_the_keeper_and_drops_are_counted() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = Stalled(Arc::clone(&written));
        let real = Dispatch::new(tracing_subscriber_like::Plain::new(move || sink.clone()));
        let stall = written.lock().unwrap();
        let dropped = Arc::new(AtomicU64::new(0));
        let handoff = Handoff::start(real, Arc::clone(&dropped), None);
        let started = Instant::now();
        tracing::dispatcher::with_default(&handoff, || {
            for n in 0..10_000 {
                tracing::warn!(n, "claims: a line");
            }
        });
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "logging 10,000 lines on a stalled sink took {took:?}");
        // The journal holds one line (stalled in its write) and the queue `QUEUE` more.
        let counted = dropped.load(Ordering::Relaxed);
        assert!(counted >= 10_000 - QUEUE as u64 - 1, "only {counted} lines counted as dropped");
        drop(stall);
        drop(handoff);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = String::from_utf8_lossy(&written.lock().unwrap()).into_owned();
            if text.contains("dropped lines rather than wait") {
                assert!(text.contains("claims: a line n=0"), "{text}");
                break;
            }
            assert!(Instant::now() < deadline, "the drop count was never logged: {text}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The smallest subscriber that writes each event's message and fields as
    /// one line to a writer (the tests have no tracing-subscriber).
    mod tracing_subscriber_like {
        use std::io::Write;
        use std::sync::Mutex;

        use super::super::Text;
        use tracing::span::{Attributes, Id, Record};
        use tracing::{Event, Metadata, Subscriber};

        pub(super) struct Plain<W> {
            writer: Mutex<Box<dyn FnMut() -> W + Send>>,
        }

        impl<W: Write> Plain<W> {
            pub(super) fn new(make: impl FnMut() -> W + Send + 'static) -> Self {
                Self { writer: Mutex::new(Box::new(make)) }
            }
        }

        impl<W: Write + 'static> Subscriber for Plain<W> {
            fn enabled(&self, _: &Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &Attributes<'_>) -> Id {
                Id::from_u64(1)
            }
            fn record(&self, _: &Id, _: &Record<'_>) {}
            fn record_follows_from(&self, _: &Id, _: &Id) {}
            fn event(&self, event: &Event<'_>) {
                let mut text = Text::default();
                event.record(&mut text);
                let mut writer = (self.writer.lock().unwrap())();
                let _ = writeln!(writer, "{}", text.0);
            }
            fn enter(&self, _: &Id) {}
            fn exit(&self, _: &Id) {}
        }
    }
}
