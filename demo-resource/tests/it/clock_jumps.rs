//! Clock jumps, made with libfaketime in a real `demo-resource serve --data-dir`
//! process: the clock stepped back and forward an hour, run 10× fast and 10×
//! slow, while a writer raises its token; first the wall clock only
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`), then both clocks. Fencing compares
//! tokens, never times: after every move stale tokens are refused (409), and
//! after a restart with the clock an hour back the marks are where they were.
//!
//! One finding, kept visible here: when the *monotonic* clock steps back (only
//! libfaketime can do that; Linux's `CLOCK_MONOTONIC` never does), tokio's
//! timer wheel has already passed every new deadline up to the highest time it
//! saw, so the layer's wait for the durable raise (5 s) ends at once and
//! raises get 503 `store-unavailable` until the clock is past that point again
//! (an hour, after `-1h`). That fails closed (nothing stale is admitted), and
//! the writer still records the raise, so the same token gets in on a retry;
//! the test counts these 503s and requires the retry to succeed.

use std::time::Duration;

use crate::fault_tools::{FAKETIME_SEEN_WITHIN, FakeClock, Service};

const BIN: &str = env!("CARGO_BIN_EXE_demo-resource");
const MOVES: [&str; 5] = ["+1h", "-1h", "+0 x10", "+0 x0.1", "+0"];

async fn append(http: &reqwest::Client, url: &str, token: u64) -> u16 {
    let request =
        http.post(format!("{url}/logs/clock")).header("Fencing-Token", token).body(format!("t{token}"));
    request.send().await.unwrap().status().as_u16()
}

/// Runs the moves against a resource on `clock`; returns the highest token
/// admitted and how many raises got 503 first because tokio saw their deadline
/// as passed.
async fn moves(
    http: &reqwest::Client,
    url: &str,
    clock: &FakeClock,
    wall_only: bool,
    mut token: u64,
) -> (u64, u32) {
    let mut unavailable = 0;
    for spec in MOVES {
        clock.set(spec);
        tokio::time::sleep(FAKETIME_SEEN_WITHIN).await;
        let what = format!("{} {spec}", if wall_only { "wall clock" } else { "both clocks" });
        assert_eq!(append(http, url, token).await, 201, "{what}: the holder's own token");
        assert_eq!(append(http, url, token - 1).await, 409, "{what}: a stale token");
        // Only a monotonic clock below the highest it has shown may refuse a raise (503, never
        // admitted): `-1h` after `+1h`, and then everything until the clock passes that hour.
        let stepped_back = !wall_only;
        let mut raised = append(http, url, token + 1).await;
        if raised == 503 && stepped_back {
            // The writer recorded the raise after the request stopped waiting: the same
            // token gets in on a retry, without a new raise (hence without a timer).
            // Retried for up to 5 s, so a slow fsync on a busy machine is waited for.
            unavailable += 1;
            for _ in 0..50 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                raised = append(http, url, token + 1).await;
                if raised != 503 {
                    break;
                }
            }
        }
        assert_eq!(raised, 201, "{what}: a raise");
        token += 1;
        assert_eq!(append(http, url, token - 1).await, 409, "{what}: the token just raised past");
        let delayed = http
            .post(format!("{url}/logs/clock?delay_ms=50"))
            .header("Fencing-Token", token)
            .body("delayed")
            .timeout(Duration::from_secs(10));
        assert_eq!(delayed.send().await.unwrap().status(), 201, "{what}: a delayed write");
    }
    (token, unavailable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_ignores_clock_jumps_and_speeds_in_the_resource() {
    let dir = tempfile::tempdir().unwrap();
    let Some(clock) = FakeClock::new(dir.path()) else { return };
    let http = reqwest::Client::new();
    let mut token = 1;
    let mut unavailable = 0;
    for wall_only in [true, false] {
        let data = dir.path().join(format!("data-{wall_only}"));
        let args = ["serve", "--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap()];
        clock.set("+0");
        let env = clock.env(wall_only);
        let service = Service::start(BIN, &args, None, &env, None);
        assert_eq!(append(&http, &service.url, token).await, 201);
        let (highest, refused) = moves(&http, &service.url, &clock, wall_only, token).await;
        assert_eq!(highest, token + MOVES.len() as u64, "every raise admitted");
        token = highest;
        unavailable += refused;

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
         hour back; raises up to token {token} admitted, every stale token refused (409); raises answered 503 \
         first (then admitted on a retry) after the monotonic clock stepped back: {unavailable}",
        2 * MOVES.len()
    );
}
