//! A load of raises, equal and stale tokens, routed at random across
//! replicas, and what it measured: how long admitted raises waited.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::recorder::Recorder;
use super::replicas::{Answer, Replica};

/// A small xorshift generator; the seed is printed so that a run can be replayed (`FENCING_SEED`).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn from_clock() -> Self {
        let seed = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
        let seed = std::env::var("FENCING_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(seed);
        eprintln!("FENCING_SEED={seed}");
        Rng(seed)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Load running in the background until [`finish`](Self::finish).
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<Answer>>>,
}

impl Load {
    /// `workers` clients posting to `keys` keys: each worker's token creeps up
    /// every eight requests, plus 0 or 1 at random, plus 1 on odd workers, so
    /// that raises, equal and stale tokens all come, on every replica.
    pub(crate) fn start(replicas: &Arc<Vec<Replica>>, workers: u64, keys: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut rng = Rng::from_clock();
        let handles = (0..workers)
            .map(|worker| {
                let (replicas, stop) = (Arc::clone(replicas), Arc::clone(&stop));
                let mut rng = Rng(rng.below(u64::MAX) | 1);
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    let mut round = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let token = 1 + round / 8 + rng.below(2) + worker % 2;
                        let replica = &replicas[rng.below(replicas.len() as u64) as usize];
                        answers.push(replica.post(rng.below(keys), token).await);
                        round += 1;
                    }
                    answers
                })
            })
            .collect();
        Self { stop, workers: handles }
    }

    /// Stops the load; every answer it got.
    pub(crate) async fn finish(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        let mut answers = Vec::new();
        for worker in self.workers {
            answers.extend(worker.await.unwrap());
        }
        answers
    }
}

/// Every answer is 200, 409 or 503, and every 503 says why; at least one
/// request was admitted after `after`.
pub(crate) fn assert_answers(answers: &[Answer], after: Instant) {
    for answer in answers {
        assert!([200, 409, 503].contains(&answer.status), "{answer:?}");
    }
    let late = answers.iter().filter(|a| a.status == 200 && a.started > after).count();
    assert!(late > 0, "nothing admitted once the faults were over");
}

/// The admitted raises: for each key, every request the recorder saw enter
/// with a token above every token admitted before it. Their answers.
pub(crate) fn raises(recorder: &Recorder, answers: &[Answer]) -> Vec<Answer> {
    let by_request: HashMap<u64, &Answer> = answers.iter().map(|a| (a.request, a)).collect();
    let mut highest: HashMap<u64, u64> = HashMap::new();
    let mut raises = Vec::new();
    for event in recorder.events().iter().filter(|e| e.entered) {
        let last = highest.entry(event.key).or_default();
        if event.token > *last {
            *last = event.token;
            let answer = by_request.get(&event.request).expect("every admitted request was sent by the load");
            assert_eq!((answer.key, answer.token), (event.key, event.token), "{answer:?} is not {event:?}");
            raises.push((*answer).clone());
        }
    }
    raises
}

/// How long admitted raises sent within `from..to` waited: `(count, median, max)`.
pub(crate) fn waits(raises: &[Answer], from: Instant, to: Instant) -> (usize, Duration, Duration) {
    let mut took: Vec<Duration> =
        raises.iter().filter(|a| a.started >= from && a.started <= to).map(|a| a.took).collect();
    took.sort_unstable();
    let median = took.get(took.len() / 2).copied().unwrap_or_default();
    (took.len(), median, took.last().copied().unwrap_or_default())
}

/// Prints the raise waits of one window, and the statuses sent in it.
pub(crate) fn report(what: &str, raises: &[Answer], answers: &[Answer], from: Instant, to: Instant) {
    let (count, median, max) = waits(raises, from, to);
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for answer in answers.iter().filter(|a| a.started >= from && a.started <= to) {
        *statuses.entry(answer.status).or_default() += 1;
    }
    let mut statuses: Vec<_> = statuses.into_iter().collect();
    statuses.sort_unstable();
    eprintln!(
        "[{what}] {:.1} s window: {count} admitted raises, wait median {median:?}, max {max:?}; statuses {statuses:?}",
        (to - from).as_secs_f64()
    );
}

/// Prints the answers by the half second their request started in, from
/// `began`: `(200s, 409s, 503s, others, longest wait)`.
pub(crate) fn timeline(answers: &[Answer], began: Instant) {
    let mut buckets: Vec<(usize, usize, usize, usize, Duration)> = Vec::new();
    for answer in answers {
        let at = (answer.started.saturating_duration_since(began).as_millis() / 500) as usize;
        if buckets.len() <= at {
            buckets.resize(at + 1, Default::default());
        }
        let bucket = &mut buckets[at];
        match answer.status {
            200 => bucket.0 += 1,
            409 => bucket.1 += 1,
            503 => bucket.2 += 1,
            _ => bucket.3 += 1,
        }
        bucket.4 = bucket.4.max(answer.took);
    }
    for (n, bucket) in buckets.iter().enumerate() {
        eprintln!("  t={:>4.1}s {bucket:?}", n as f64 / 2.0);
    }
}
