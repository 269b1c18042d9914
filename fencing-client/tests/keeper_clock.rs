//! The lease keeper in a process of its own under libfaketime: this test binary
//! runs itself again as the holder (`KEEPER_CLOCK_URL` set), with its clock
//! moved while it keeps a 1.5 s lease on an in-process lock service.
//!
//! * Wall clock only: stepped −1 h, +1 h, run ×10: the keeper keeps renewing and
//!   never loses the lease (it counts on the monotonic clock).
//! * Both clocks +1 h: the local deadline passes at once and the keeper cancels
//!   the holder (early, the safe side), while the service still holds the lease.
//! * Both clocks ×0.25: renewals come every 2 s of real time, after the 1.5 s
//!   lease ended at the service; the first renewal after that gets 404 and the
//!   keeper cancels the holder. Until then the holder trusted a lease the service
//!   had ended: how long is measured. That is the window fencing tokens cover.

#[path = "../../demo-lock-service/tests/fault_tools/mod.rs"]
mod fault_tools;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use demo_lock_service::{Config, LockService};
use fault_tools::FakeClock;
use fencing_client::{DemoLockClient, LockBackendExt};

const TTL: Duration = Duration::from_millis(1500);
const CHILD: &str = "KEEPER_CLOCK_URL";
/// How long the holder keeps the lease when nothing ends it (by its own clock).
const HOLD: Duration = Duration::from_secs(4);

/// The holder: keeps the lease and prints `renewed` at each renewal and `lost
/// REASON` when the keeper gives up (or `held` after [`HOLD`]).
async fn holder(url: &str) {
    let client = DemoLockClient::new(url).unwrap();
    let lease = client.lease("keeper", "child", TTL).await.unwrap();
    println!("token {}", lease.token());
    let mut deadline = lease.deadline();
    let start = std::time::Instant::now(); // Real time is what the parent moves; this is the child's.
    loop {
        if !lease.is_valid() {
            // The reason, once the keeper has recorded it; a deadline seen here first is the same loss.
            let reason = lease
                .loss_reason()
                .map_or_else(|| "the lease's local deadline passed".into(), |r| r.to_string());
            println!("lost {reason}");
            return;
        }
        if start.elapsed() >= HOLD {
            println!("held");
            return;
        }
        if lease.deadline() != deadline {
            deadline = lease.deadline();
            println!("renewed");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the holder under `clock` and moves it to `spec` once the lease is held;
/// returns each line it printed with the real time since the move.
fn run_holder(url: &str, clock: &FakeClock, wall_only: bool, spec: &str) -> Vec<(Duration, String)> {
    clock.set("+0");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "the_keeper_under_a_moved_clock", "--nocapture", "--test-threads", "1"])
        .env(CHILD, url)
        .envs(clock.env(wall_only))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines, received) = mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // The test harness speaks first (`test NAME ... `, then the token on the same line).
    while !received.recv_timeout(Duration::from_secs(20)).expect("the holder's token").contains("token ") {}
    std::thread::sleep(Duration::from_millis(300));
    clock.set(spec);
    let moved = Instant::now();
    let mut out = Vec::new();
    while let Ok(line) = received.recv_timeout(Duration::from_secs(10)) {
        if line.is_empty() || line.starts_with("running") || line.starts_with("test ") {
            continue;
        }
        let done = line.starts_with("lost") || line == "held";
        out.push((moved.elapsed(), line));
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_under_a_moved_clock() {
    if let Ok(url) = std::env::var(CHILD) {
        return holder(&url).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(clock) = FakeClock::new(dir.path()) else { return };
    let service = LockService::open(Config::new(dir.path().join("locks"))).unwrap();
    let running = service.clone().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let url = running.base_url();

    for spec in ["-1h", "+1h", "+0 x10"] {
        let (url, clock_spec) = (url.clone(), spec);
        let lines = tokio::task::block_in_place(|| run_holder(&url, &clock, true, clock_spec));
        let renewals = lines.iter().filter(|(_, l)| l == "renewed").count();
        let end = &lines.last().unwrap().1;
        assert_eq!(end, "held", "wall clock {spec}: the keeper lost the lease: {lines:?}");
        assert!(renewals >= 4, "wall clock {spec}: {renewals} renewals in {HOLD:?}");
        eprintln!("keeper, wall clock {spec}: held for {HOLD:?}, {renewals} renewals");
    }

    let lines = tokio::task::block_in_place(|| run_holder(&url, &clock, false, "+1h"));
    let (after, end) = lines.last().unwrap();
    assert!(end.starts_with("lost") && end.contains("deadline"), "both clocks +1h: {lines:?}");
    assert!(*after < Duration::from_millis(500), "both clocks +1h: cancelled only after {after:?}");
    eprintln!("keeper, both clocks +1h: holder cancelled {after:?} after the move ({end})");

    let lines = tokio::task::block_in_place(|| run_holder(&url, &clock, false, "+0 x0.25"));
    let (after, end) = lines.last().unwrap();
    assert!(end.starts_with("lost") && end.contains("renewal"), "both clocks x0.25: {lines:?}");
    // The last renewal before the move was at most TTL/3 of real time before it, so the service
    // ended the lease between 2/3 TTL and TTL after the move: the holder trusted a dead lease
    // for the rest of the time until it was cancelled.
    let trusted_dead = (after.saturating_sub(TTL), after.saturating_sub(TTL * 2 / 3));
    assert!(*after < 4 * TTL, "both clocks x0.25: cancelled only after {after:?}");
    eprintln!(
        "keeper, both clocks x0.25: holder cancelled {after:?} after the move ({end}); it trusted a lease the \
         service had ended for {:?} to {:?}",
        trusted_dead.0, trusted_dead.1
    );
    running.shutdown().await.unwrap();
}
