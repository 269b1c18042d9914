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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::request::RequestSpec;
use super::schedule::{FIRST_TOKEN, MALFORMED_TOKEN, STALE_TOKEN, Schedule, Token};
use super::tally::Tally;
use super::target::Target;

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
    let tasks: Vec<_> = (0..plan.connections)
        .map(|conn| {
            let window = Window { start, record_from, end };
            let (target, schedule, plan, done) =
                (target.clone(), Arc::clone(schedule), Arc::clone(plan), Arc::clone(done));
            tokio::spawn(async move { connection(&target, conn, &schedule, &plan, window, &done).await })
        })
        .collect();
    let mut tally = Tally::new();
    for task in tasks {
        match task.await {
            Ok(t) => tally.add(&t),
            Err(_) => tally.errors += 1,
        }
    }
    (tally, end.saturating_duration_since(record_from.min(end)))
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    record_from: Instant,
    end: Instant,
}

/// One keep-alive connection sending until the end of the round.
async fn connection(
    target: &Target,
    conn: u32,
    schedule: &Schedule,
    plan: &Plan,
    window: Window,
    done: &AtomicU64,
) -> Tally {
    let mut tally = Tally::new();
    let (addr, host) = &target.replicas[conn as usize % target.replicas.len()];
    let Ok(stream) = TcpStream::connect(addr).await else {
        tally.errors += 1;
        return tally;
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, driver)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await else {
        tally.errors += 1;
        return tally;
    };
    let driver = tokio::spawn(driver);
    // Open loop: this connection's slots, `interval` apart, staggered so that
    // the connections do not all send at the same instant.
    let interval = plan.rate.map(|rate| Duration::from_secs_f64(f64::from(plan.connections) / rate));
    let offset =
        interval.map_or(Duration::ZERO, |i| i.mul_f64(f64::from(conn) / f64::from(plan.connections)));
    let mut rng = schedule.rng(conn);
    let first_token = HeaderValue::from(FIRST_TOKEN);
    for seq in 0u64.. {
        let intended = match interval {
            Some(interval) => {
                let slot = window.start + offset + interval.mul_f64(seq as f64);
                if slot >= window.end {
                    break;
                }
                if Instant::now() >= window.end {
                    // Late past the end: the slots left before the end were never sent.
                    let left = window.end.duration_since(slot).as_secs_f64() / interval.as_secs_f64();
                    tally.missed += left.ceil() as u64;
                    break;
                }
                tokio::time::sleep_until(slot.into()).await;
                slot
            }
            None => Instant::now(),
        };
        if intended >= window.end {
            break;
        }
        let token = match schedule.next(conn, seq, &mut rng) {
            Token::Valid(FIRST_TOKEN) => first_token.clone(),
            Token::Valid(token) => HeaderValue::from(token),
            Token::Stale => HeaderValue::from_static(STALE_TOKEN),
            Token::Malformed => HeaderValue::from_static(MALFORMED_TOKEN),
        };
        let mut request = Request::builder()
            .method(plan.request.method.clone())
            .uri(target.template.expand(conn, seq, schedule.key(conn, seq)))
            .header(header::HOST, host.clone());
        for (name, value) in &plan.request.headers {
            request = request.header(name, value.clone());
        }
        let request = request
            .header(&plan.token_header, token)
            .body(Full::new(plan.request.body.clone()))
            .expect("a template checked at start and valid headers");
        let sent = Instant::now();
        let exchange = async {
            sender.ready().await.ok()?;
            let response = sender.send_request(request).await.ok()?;
            let status = response.status();
            response.into_body().collect().await.ok()?;
            Some(status)
        };
        let Ok(Some(status)) = tokio::time::timeout_at((window.end + GRACE).into(), exchange).await else {
            tally.errors += 1;
            break;
        };
        let answered = Instant::now();
        tally.all_requests += 1;
        done.fetch_add(1, Ordering::Relaxed);
        if intended < window.record_from {
            continue;
        }
        tally.sent_latency.saturating_record(nanos(answered - sent));
        if interval.is_some() {
            tally.intended_latency.saturating_record(nanos(answered - intended));
            tally.send_lag.saturating_record(nanos(sent - intended));
        }
        tally.count_status(status.as_u16());
    }
    drop(sender);
    driver.abort();
    tally
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}
