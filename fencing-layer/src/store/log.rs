//! Durable marks: the [`MarkLog`] trait and the thread that writes to it.
//!
//! Raises are handed to one writer thread, which takes every raise queued
//! since its last write and records them in one call (one fsync for many
//! raises under load). Each raising request waits for its own write before it
//! is admitted; requests with a token already recorded never touch the log.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::StoreError;
use super::admission::RecordDuty;

/// Where durable marks live: any storage that can make a batch of raises
/// durable before returning.
///
/// The store calls [`load`](Self::load) once when it opens, then
/// [`record`](Self::record) from one writer thread (and from
/// [`MarkStore::seed`](super::MarkStore::seed) callers).
pub trait MarkLog: Send + Sync + 'static {
    /// Every key and its mark.
    ///
    /// # Errors
    ///
    /// The marks could not be read; the store does not open.
    fn load(&self) -> Result<Vec<(String, u64)>, StoreError>;

    /// Makes every `(key, token)` durable (on disk, fsync'd) before returning.
    /// A key's stored mark must become the larger of its old value and the
    /// token, never smaller: writes for one key may arrive out of order.
    ///
    /// # Errors
    ///
    /// Nothing of the batch can be relied on; the raising requests get 503.
    fn record(&self, raises: &[(&str, u64)]) -> Result<(), StoreError>;

    /// Makes `to` the mark of `key`, lower or higher, durably: an operator's
    /// repair ([`MarkStore::reset`](super::MarkStore::reset)). The store calls
    /// it only while no raise of `key` is being recorded.
    ///
    /// # Errors
    ///
    /// The mark could not be written; the default refuses, for logs that
    /// cannot overwrite.
    fn reset(&self, key: &str, to: u64) -> Result<(), StoreError> {
        let _ = (key, to);
        Err(StoreError::log(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this mark log cannot reset a mark",
        )))
    }

    /// Whether the log can record now: what a readiness route answers. A log
    /// that recovers from failures by itself (reopening a file, reconnecting)
    /// may use this call to try. The default is always ready.
    ///
    /// # Errors
    ///
    /// Why raises would fail now.
    fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// At most this many raises go into one write.
const MAX_BATCH: usize = 1024;

// A job dropped unwritten (the writer gone, or dying mid-batch) hands its duty
// back and closes its reply: the request sees `Closed`, the next one retries.
struct Job {
    key: Box<str>,
    duty: RecordDuty,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

/// The writer thread; dropping it finishes the queued writes and joins it, so
/// the log is closed when the last store handle goes away.
pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(super) fn spawn(log: Arc<dyn MarkLog>) -> Result<Self, StoreError> {
        let (jobs, queue) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("fencing-mark-writer".into())
            .spawn(move || run(&*log, &queue))
            .map_err(StoreError::log)?;
        Ok(Self { jobs: Some(jobs), thread: Some(thread) })
    }

    /// Queues the duty's raise for `key`; the receiver answers once it is durable.
    pub(super) fn submit(&self, key: &str, duty: RecordDuty) -> oneshot::Receiver<Result<(), StoreError>> {
        let (reply, answer) = oneshot::channel();
        let job = Job { key: key.into(), duty, reply };
        if let Some(jobs) = &self.jobs {
            // On failure the job comes back and is dropped: duty handed back, reply closed.
            let _ = jobs.send(job);
        }
        answer
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        // A log that holds its own store could drop it from the writer thread: never self-join.
        if let Some(thread) = self.thread.take().filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = thread.join();
        }
    }
}

fn run(log: &dyn MarkLog, queue: &mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let raises: Vec<(&str, u64)> = batch.iter().map(|job| (&*job.key, job.duty.token())).collect();
        // A panicking log must not strand the batch: its requests would wait forever.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log.record(&raises)))
            .unwrap_or_else(|_| Err(StoreError::log(std::io::Error::other("the mark log panicked"))));
        if let Err(error) = &result {
            tracing::error!(%error, raises = raises.len(), "recording fencing marks failed");
        }
        drop(raises);
        for mut job in batch {
            if result.is_ok() {
                job.duty.succeeded();
            }
            // Discharge the duty before answering, so the request finds it done.
            drop(job.duty);
            // The request may have gone away (client disconnect); the mark is recorded anyway.
            let _ = job.reply.send(result.clone());
        }
    }
}
