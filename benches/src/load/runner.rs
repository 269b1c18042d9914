//! Sends the requests: keep-alive HTTP/1.1 connections, closed or open loop.
//!
//! Closed loop (the default): each connection sends its next request as soon
//! as the previous answer's body has arrived. Open loop (`rate`): each
//! connection has its share of the rate as a fixed schedule of send slots
//! (staggered between connections) and sends each request at its slot, or at
//! once if it is already late, as wrk2 does. A late request's latency is then
//! counted from its slot, not from when it went out: a target that stalls
//! shows the stall in every request that should have been sent meanwhile,
//! which the closed loop (and the "as sent" histogram) leaves out.
//!
//! The slots are kept by a [`Pacer`], a thread of its own that sleeps until
//! [`SPIN`] before each slot, spins the rest of the way and then releases
//! the slot's connection: tokio's timer wakes on millisecond ticks, which made
//! every send about 1 ms late, and the corrected latency of a sub-millisecond
//! service mostly the generator's own. At high rates it spins for at most a
//! tenth of the time between slots, so that it never takes much of a core from
//! the target. How late each request still went out is measured
//! ([`Tally::send_lag`]) and reported beside the latencies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::request::RequestSpec;
use super::schedule::{MALFORMED_TOKEN, STALE_TOKEN, Schedule, Token};
use super::tally::Tally;
use super::target::Target;

/// How long before each open-loop slot the pacer stops sleeping and spins (at most a
/// tenth of the time between slots): above the usual lateness of a Linux sleep (a
/// default timer slack of 50 µs plus the wake-up, about 100 µs here), and short
/// enough that spinning costs little at low rates.
pub const SPIN: Duration = Duration::from_micros(200);

/// How long after the end of a round a request may still take before it counts as an error.
const GRACE: Duration = Duration::from_secs(10);

/// Everything a round needs besides the target.
#[derive(Debug)]
pub struct Plan {
    /// Method, headers and body.
    pub request: RequestSpec,
    /// The header the token goes in.
    pub token_header: HeaderName,
    /// Concurrent connections.
    pub connections: u32,
    /// Open loop: requests per second over all connections; `None`: closed loop.
    pub rate: Option<f64>,
    /// Length of a round, warm-up included.
    pub duration: Duration,
    /// The start of each round left out of the results.
    pub warmup: Duration,
}

impl Plan {
    /// The request to `path` (on the replica whose `Host` is `host`) with `token`.
    ///
    /// # Panics
    ///
    /// On a path that is not a valid URI: templates are checked at start.
    #[must_use]
    pub fn request(
        &self,
        host: &HeaderValue,
        path: String,
        token: HeaderValue,
    ) -> Request<Full<bytes::Bytes>> {
        let mut request = Request::builder()
            .method(self.request.method.clone())
            .uri(path)
            .header(header::HOST, host.clone());
        for (name, value) in &self.request.headers {
            request = request.header(name, value.clone());
        }
        request
            .header(&self.token_header, token)
            .body(Full::new(self.request.body.clone()))
            .expect("a template checked at start and valid headers")
    }
}

/// One round against `target`; `done` counts answers as they come (for the progress display).
/// Returns what it saw and how long it measured.
pub async fn round(
    target: &Target,
    schedule: &Arc<Schedule>,
    plan: &Arc<Plan>,
    done: &Arc<AtomicU64>,
) -> (Tally, Duration) {
    let start = Instant::now();
    let record_from = start + plan.warmup;
    let end = start + plan.duration;
    let window = Window { start, record_from, end };
    let pacer =
        plan.rate.map(|rate| Pacer::start(window, Duration::from_secs_f64(1.0 / rate), plan.connections));
    let tasks: Vec<_> = (0..plan.connections)
        .map(|conn| {
            let gate = pacer.as_ref().map(|p| (p.step, Arc::clone(&p.gates[conn as usize])));
            let (target, schedule, plan, done) =
                (target.clone(), Arc::clone(schedule), Arc::clone(plan), Arc::clone(done));
            tokio::spawn(
                async move { connection(&target, conn, &schedule, &plan, window, gate, &done).await },
            )
        })
        .collect();
    let mut tally = Tally::new();
    for task in tasks {
        match task.await {
            Ok(t) => tally.add(&t),
            Err(_) => tally.errors += 1,
        }
    }
    if let Some(pacer) = pacer {
        // Every connection is done: a pacer still sleeping towards the end stops at once.
        let _ = tokio::task::spawn_blocking(move || pacer.stop()).await;
    }
    (tally, end.saturating_duration_since(record_from.min(end)))
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    record_from: Instant,
    end: Instant,
}

/// Open loop: slot `j` of the round, counted over all connections (connection
/// `j % connections`, its request `j / connections`), is at `start + j × step`.
fn slot(start: Instant, step: Duration, j: u64) -> Instant {
    start + step.mul_f64(j as f64)
}

/// The open loop's clock: a thread that releases each slot to its connection on time.
///
/// Each connection has a gate (a semaphore): the pacer adds one permit at each
/// of the connection's slots, and the connection takes one before each request.
/// A connection still busy with an earlier answer finds its permit waiting and
/// sends at once, late, which its send lag records.
#[derive(Debug)]
pub struct Pacer {
    step: Duration,
    gates: Vec<Arc<Semaphore>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pacer {
    fn start(window: Window, step: Duration, connections: u32) -> Self {
        let gates: Vec<_> = (0..connections).map(|_| Arc::new(Semaphore::new(0))).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (gates, stop) = (gates.clone(), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("pacer".into())
                .spawn(move || pace(window, step, &gates, &stop))
                .expect("a thread for the open loop's pacer")
        };
        Self { step, gates, stop, thread: Some(thread) }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The pacer's loop: every slot before the end of the round, released on time.
fn pace(window: Window, step: Duration, gates: &[Arc<Semaphore>], stop: &AtomicBool) {
    // Should this thread die, the connections waiting at their gates stop too.
    struct CloseOnUnwind<'a>(&'a [Arc<Semaphore>]);
    impl Drop for CloseOnUnwind<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.iter().for_each(|gate| gate.close());
            }
        }
    }
    let _guard = CloseOnUnwind(gates);
    let n = gates.len() as u64;
    let spin = SPIN.min(step / 10);
    for j in 0u64.. {
        let at = slot(window.start, step, j);
        if at >= window.end || !wait_until(at, spin, stop) {
            break;
        }
        gates[(j % n) as usize].add_permits(1);
    }
}

/// Sleeps until `spin` before `at`, then spins until `at`. False if told to stop meanwhile.
fn wait_until(at: Instant, spin: Duration, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= at {
            return true;
        }
        let left = at - now;
        if left > spin {
            // In slices, so that a stop is seen within 50 ms even at a low rate.
            std::thread::sleep((left - spin).min(Duration::from_millis(50)));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The sending half of a keep-alive HTTP/1.1 connection.
pub type Sender = hyper::client::conn::http1::SendRequest<Full<bytes::Bytes>>;

/// The half of a connection that does its I/O: a future that runs until the connection closes.
pub type Driver = hyper::client::conn::http1::Connection<TokioIo<TcpStream>, Full<bytes::Bytes>>;

/// A keep-alive HTTP/1.1 connection to `addr`, with its driver to poll beside each exchange.
///
/// # Errors
///
/// The connection or the handshake failed.
pub async fn connect(addr: std::net::SocketAddr) -> std::io::Result<(Sender, Driver)> {
    let stream = TcpStream::connect(addr).await?;
    let _ = stream.set_nodelay(true);
    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(std::io::Error::other)
}

/// A keep-alive HTTP/1.1 connection to `addr`, its driver running on a task of its own.
///
/// # Errors
///
/// The connection or the handshake failed.
pub async fn open(addr: std::net::SocketAddr) -> std::io::Result<(Sender, tokio::task::JoinHandle<()>)> {
    let (sender, driver) = connect(addr).await?;
    let driver = tokio::spawn(async move {
        let _ = driver.await;
    });
    Ok((sender, driver))
}

/// One keep-alive connection sending until the end of the round; `gate`: the open loop's
/// step between slots and this connection's gate from the [`Pacer`].
async fn connection(
    target: &Target,
    conn: u32,
    schedule: &Schedule,
    plan: &Plan,
    window: Window,
    gate: Option<(Duration, Arc<Semaphore>)>,
    done: &AtomicU64,
) -> Tally {
    let mut tally = Tally::new();
    let (addr, host) = &target.replicas[conn as usize % target.replicas.len()];
    // The driver is polled in this task, beside each exchange, not on a task of its own:
    // a request then goes out, and its answer comes back, without a hand-over between
    // tasks (and threads), which cost the open loop's as-sent latency tens of µs at low
    // rates, where every worker sleeps between requests.
    let Ok((mut sender, driver)) = connect(*addr).await else {
        tally.errors += 1;
        tally.connect_errors += 1;
        return tally;
    };
    // Boxed, so that a reconnect can put a new one in its place.
    let mut driver = Box::pin(driver);
    let mut live = true;
    let connections = u64::from(plan.connections);
    let mut rng = schedule.rng(conn);
    // The first token of the key this connection wrote last, as a header (most requests carry it).
    let mut cached: Option<(u64, HeaderValue)> = None;
    for seq in 0u64.. {
        let intended = match &gate {
            Some((step, gate)) => {
                let slot = slot(window.start, *step, seq * connections + u64::from(conn));
                if slot >= window.end {
                    break;
                }
                if Instant::now() >= window.end {
                    // Late past the end: the slots left before the end were never sent.
                    let interval = step.as_secs_f64() * connections as f64;
                    let left = window.end.duration_since(slot).as_secs_f64() / interval;
                    tally.missed += left.ceil() as u64;
                    break;
                }
                match gate.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => {
                        tally.errors += 1;
                        break;
                    }
                }
                slot
            }
            None => Instant::now(),
        };
        if intended >= window.end {
            break;
        }
        let token = match schedule.next(conn, seq, &mut rng) {
            Token::Valid(token) => match &cached {
                Some((t, value)) if *t == token => value.clone(),
                _ => {
                    let value = HeaderValue::from(token);
                    cached = Some((token, value.clone()));
                    value
                }
            },
            Token::Stale => HeaderValue::from_static(STALE_TOKEN),
            Token::Malformed => HeaderValue::from_static(MALFORMED_TOKEN),
        };
        // A connection the target closed since the last answer is replaced, as wrk does:
        // nothing was sent on it, so nothing is lost but the handshake. (A driver that
        // has finished is never polled again.)
        if live {
            live = tokio::select! {
                // The driver first: a `Connection: close` answer ends it only once it is polled,
                // and until then the sender still says ready.
                biased;
                _ = driver.as_mut() => false,
                ready = sender.ready() => ready.is_ok(),
            };
        }
        if !live {
            let Ok((new_sender, new_driver)) = connect(*addr).await else {
                tally.errors += 1;
                tally.connect_errors += 1;
                break;
            };
            (sender, driver) = (new_sender, Box::pin(new_driver));
            tally.reconnects += 1;
        }
        let request = plan.request(host, target.template.expand(conn, seq, schedule.key(conn, seq)), token);
        let sent = Instant::now();
        let exchange = async {
            sender.ready().await.ok()?;
            let response = sender.send_request(request).await.ok()?;
            let status = response.status();
            response.into_body().collect().await.ok()?;
            Some(status)
        };
        let driven = async {
            let mut exchange = std::pin::pin!(exchange);
            tokio::select! {
                biased;
                status = &mut exchange => (status, true),
                // The connection ended (a `Connection: close` answer, or a failure): what it
                // delivered first is still read; an answer cut short is an error.
                _ = driver.as_mut() => (exchange.await, false),
            }
        };
        let status = match tokio::time::timeout_at((window.end + GRACE).into(), driven).await {
            Ok((status, still_live)) => {
                live = still_live;
                match status {
                    Some(status) => status,
                    // Broken mid-exchange: an error; the next request reconnects.
                    None => {
                        tally.errors += 1;
                        live = false;
                        continue;
                    }
                }
            }
            Err(_) => {
                tally.errors += 1;
                break;
            }
        };
        let answered = Instant::now();
        tally.all_requests += 1;
        done.fetch_add(1, Ordering::Relaxed);
        if intended < window.record_from {
            continue;
        }
        tally.sent_latency.saturating_record(nanos(answered - sent));
        if gate.is_some() {
            tally.intended_latency.saturating_record(nanos(answered - intended));
            tally.send_lag.saturating_record(nanos(sent - intended));
        }
        tally.count_status(status.as_u16());
    }
    tally
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}
