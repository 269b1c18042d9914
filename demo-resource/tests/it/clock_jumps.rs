//! Clock jumps, made with libfaketime in a real `demo-resource serve --data-dir`
//! process: the clock stepped back and forward an hour, run 10× fast and 10×
//! slow, while a writer raises its token; first the wall clock only
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`), then both clocks. Fencing compares
//! tokens, never times: after every move stale tokens are refused (409), and
//! after a restart with the clock an hour back the marks are where they were.
//!
//! When the *monotonic* clock steps back (only libfaketime can do that; Linux's
//! `CLOCK_MONOTONIC` never does), tokio's timer wheel fires every deadline up to
//! the highest time it has seen at once. The layer's wait for a raise's durable
//! write (5 s) used to end at once then, and raises answered 503 until the clock
//! was an hour further; the layer now believes a timer only when the clock agrees
//! (`fencing-layer/src/future/deadline.rs`), and this test requires every raise
//! to be admitted on its first try.

use std::time::Duration;

use crate::fault_tools::{FAKETIME_SEEN_WITHIN, FakeClock, Service};

const BIN: &str = env!("CARGO_BIN_EXE_demo-resource");
const MOVES: [&str; 5] = ["+1h", "-1h", "+0 x10", "+0 x0.1", "+0"];

async fn append(http: &reqwest::Client, url: &str, token: u64) -> u16 {
    let request =
        http.post(format!("{url}/logs/clock")).header("Fencing-Token", token).body(format!("t{token}"));
    request.send().await.unwrap().status().as_u16()
}

/// Runs the moves against a resource on `clock`; returns the highest token admitted.
async fn moves(http: &reqwest::Client, url: &str, clock: &FakeClock, wall_only: bool, mut token: u64) -> u64 {
    for spec in MOVES {
        clock.set(spec);
        tokio::time::sleep(FAKETIME_SEEN_WITHIN).await;
        let what = format!("{} {spec}", if wall_only { "wall clock" } else { "both clocks" });
        assert_eq!(append(http, url, token).await, 201, "{what}: the holder's own token");
        assert_eq!(append(http, url, token - 1).await, 409, "{what}: a stale token");
        // A raise waits for its durable write under a 5 s bound: a clock stepped back must
        // not cut that bound short (it did: 503 `store-unavailable` at once).
        assert_eq!(append(http, url, token + 1).await, 201, "{what}: a raise, on its first try");
        token += 1;
        assert_eq!(append(http, url, token - 1).await, 409, "{what}: the token just raised past");
        let delayed = http
            .post(format!("{url}/logs/clock?delay_ms=50"))
            .header("Fencing-Token", token)
            .body("delayed")
            .timeout(Duration::from_secs(10));
        assert_eq!(delayed.send().await.unwrap().status(), 201, "{what}: a delayed write");
    }
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_ignores_clock_jumps_and_speeds_in_the_resource() {
    let dir = tempfile::tempdir().unwrap();
    let Some(clock) = FakeClock::new(dir.path()) else { return };
    let http = reqwest::Client::new();
    let mut token = 1;
    for wall_only in [true, false] {
        let data = dir.path().join(format!("data-{wall_only}"));
        let args = ["serve", "--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap()];
        clock.set("+0");
        let env = clock.env(wall_only);
        let service = Service::start(BIN, &args, None, &env, None);
        assert_eq!(append(&http, &service.url, token).await, 201);
        let highest = moves(&http, &service.url, &clock, wall_only, token).await;
        assert_eq!(highest, token + MOVES.len() as u64, "every raise admitted");
        token = highest;

        // kill -9 and a restart with the clock an hour back: the mark is still the last token.
        service.kill9();
        clock.set("-1h");
        let service = Service::start(BIN, &args, None, &env, None);
        assert_eq!(append(&http, &service.url, token - 1).await, 409, "stale after the restart");
        assert_eq!(append(&http, &service.url, token).await, 201, "the holder after the restart");
        token += 1;
        assert_eq!(append(&http, &service.url, token).await, 201, "a raise after the restart");
        service.kill9();
    }
    eprintln!(
        "resource: {} clock moves, wall clock only then both clocks, each followed by kill -9 and a restart an \
         hour back; raises up to token {token} admitted on their first try, every stale token refused (409)",
        2 * MOVES.len()
    );
}
