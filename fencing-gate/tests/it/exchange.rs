//! The guarantee across the proxy: a request is inside until its upstream
//! exchange has ended, whatever its client does, and an exchange whose outcome
//! is unknown keeps its key closed for the quarantine.

use std::io::{Read, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::{Gate, Upstream, closed_port, now, send};

/// A write with `token` to `path` on a raw connection, left open for the caller.
fn start_write(gate: &Gate, path: &str, token: u64, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(gate.addr).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: gate\r\nFencing-Token: {token}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

#[tokio::test]
async fn a_client_that_leaves_does_not_let_a_higher_token_in_before_the_upstream_is_done() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    // A's write takes the upstream 1.5 s; A's client goes away after 0.3 s.
    let a = start_write(&gate, "/files/f?delay_ms=1500", 5, "A");
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(a);
    let b = send(&gate, "POST", "/files/f", Some(6), "B").await;
    assert_eq!(b.status, 200, "{b:?}");
    let writes = upstream.writes();
    assert_eq!(writes.iter().map(|w| w.token.as_str()).collect::<Vec<_>>(), ["5", "6"], "{writes:?}");
    assert!(
        writes[0].end <= writes[1].start,
        "B's write started at {} while A's was still being applied (until {})",
        writes[1].start,
        writes[0].end
    );
}

#[tokio::test]
async fn a_hung_upstream_gets_504_and_its_key_stays_closed_for_the_quarantine() {
    let upstream = Upstream::start();
    let gate = Gate::start(
        &upstream.url(),
        "[timeouts]\nupstream_ms = 400\nquarantine_ms = 1500\n[fencing]\ndrain_timeout_ms = 5000\n\n[metrics]\nlisten = \"127.0.0.1:0\"",
    );
    let started = Instant::now();
    let hung = send(&gate, "POST", "/files/q?delay_ms=4000", Some(5), "A").await;
    assert_eq!(hung.status, 504, "{hung:?}");
    assert_eq!(hung.headers["fencing-problem"], "upstream-timeout");
    assert!(started.elapsed() < Duration::from_millis(1400), "{:?}", started.elapsed());
    let timed_out = now();
    // A higher token waits out the quarantine, then enters with the mark raised.
    let b = send(&gate, "POST", "/files/q", Some(6), "B").await;
    assert_eq!(b.status, 200, "{b:?}");
    let b_write = upstream.writes().into_iter().find(|w| w.token == "6").expect("B's write");
    assert!(
        b_write.start >= timed_out + 1.0,
        "B entered {:.3} s after the timeout",
        b_write.start - timed_out
    );
    assert_eq!(send(&gate, "POST", "/files/q", Some(5), "A again").await.status, 409);
    let metrics = reqwest::get(format!("http://{}/metrics", gate.metrics.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("fencing_gate_quarantines_total 1"), "{metrics}");
    assert!(metrics.contains("fencing_gate_upstream_total{outcome=\"timeout\"} 1"), "{metrics}");
}

#[tokio::test]
async fn an_upstream_that_is_down_gets_502_and_closes_nothing() {
    let gate = Gate::one_line(&format!("http://127.0.0.1:{}", closed_port()));
    let down = send(&gate, "POST", "/files/d", Some(1), "x").await;
    assert_eq!(down.status, 502, "{down:?}");
    assert_eq!(down.headers["fencing-problem"], "upstream-unreachable");
    assert_eq!(down.headers["retry-after"], "1");
    assert!(down.problem()["detail"].as_str().unwrap().contains("refused"), "{down:?}");
    // Nothing was sent: no quarantine, the next holder goes straight on.
    let started = Instant::now();
    assert_eq!(send(&gate, "POST", "/files/d", Some(2), "y").await.status, 502);
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
}

#[tokio::test]
async fn expect_100_continue_is_answered_once_the_upstream_is_reached() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let mut stream = TcpStream::connect(gate.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream
        .write_all(b"PUT /files/e HTTP/1.1\r\nHost: gate\r\nFencing-Token: 3\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        .unwrap();
    let mut interim = [0; 25];
    stream.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"hello").unwrap();
    let mut answer = [0; 15];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200 OK");
    assert_eq!(upstream.writes()[0].body, "hello");

    // With the upstream down, the answer comes before any body was asked for.
    let down = Gate::one_line(&format!("http://127.0.0.1:{}", closed_port()));
    let mut stream = TcpStream::connect(down.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream
        .write_all(b"PUT /files/e HTTP/1.1\r\nHost: gate\r\nFencing-Token: 3\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        .unwrap();
    let mut answer = [0; 12];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 502");
}

#[tokio::test]
async fn shutdown_lets_the_requests_inside_finish() {
    let upstream = Upstream::start();
    let mut gate = Gate::start(&upstream.url(), "[timeouts]\nshutdown_ms = 5000");
    let slow = {
        let url = gate.url("/files/s?delay_ms=800");
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .header("fencing-token", "1")
                .body("slow")
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, log) = tokio::task::spawn_blocking(move || {
        let status = gate.terminate(Duration::from_secs(5));
        assert!(TcpStream::connect(gate.addr).is_err(), "still accepting after SIGTERM");
        (status, gate.log())
    })
    .await
    .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(log.contains("every request inside finished"), "{log}");
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(upstream.writes()[0].body, "slow");
}

#[tokio::test]
async fn a_request_the_upstream_received_is_never_sent_again() {
    let upstream = Upstream::start();
    let gate = Gate::start(&upstream.url(), "[timeouts]\nupstream_ms = 1000\nquarantine_ms = 1000");
    // Pooled connections first, so that a retry on a reused one would be tempting.
    for _ in 0..3 {
        assert_eq!(send(&gate, "POST", "/files/r", Some(1), "warm").await.status, 200);
    }
    let closed = send(&gate, "POST", "/files/r?close=1", Some(1), "once").await;
    assert_eq!(closed.status, 502, "{closed:?}");
    assert_eq!(closed.headers["fencing-problem"], "upstream-failed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let once: Vec<_> = upstream.writes().into_iter().filter(|w| w.body == "once").collect();
    assert_eq!(once.len(), 1, "{once:?}");
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_one_the_upstream_closed_is_not_used() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let a = send(&gate, "POST", "/files/k?conn=1", Some(1), "a").await;
    let b = send(&gate, "POST", "/files/k?conn=1", Some(1), "b").await;
    assert_eq!((a.status, b.status), (200, 200), "{a:?} {b:?}");
    assert_eq!(
        a.headers["x-connection"], b.headers["x-connection"],
        "the second write reused the first's connection"
    );
    // Answered in full, then the upstream closes that connection without saying so.
    let c = send(&gate, "POST", "/files/k?conn=1&hangup=1", Some(1), "c").await;
    assert_eq!(c.status, 200, "{c:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let d = send(&gate, "POST", "/files/k?conn=1", Some(1), "d").await;
    assert_eq!(d.status, 200, "{d:?}");
    assert_ne!(d.headers["x-connection"], c.headers["x-connection"], "a closed connection was not reused");
    let bodies: Vec<_> = upstream.writes().into_iter().map(|w| w.body).collect();
    assert_eq!(bodies, ["a", "b", "c", "d"]);
}

#[tokio::test]
async fn a_client_that_leaves_mid_body_leaves_its_key_quarantined() {
    let upstream = Upstream::start();
    let gate = Gate::start(
        &upstream.url(),
        "[timeouts]\nupstream_ms = 500\nquarantine_ms = 1500\n[fencing]\ndrain_timeout_ms = 5000",
    );
    // Ten bytes announced, three sent: the upstream has the head and part of the body.
    let mut a = TcpStream::connect(gate.addr).unwrap();
    a.write_all(b"POST /files/m HTTP/1.1\r\nHost: gate\r\nFencing-Token: 5\r\nContent-Length: 10\r\n\r\nabc")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(a);
    let left = now();
    let b = send(&gate, "POST", "/files/m", Some(6), "B").await;
    assert_eq!(b.status, 200, "{b:?}");
    let b_write = upstream.writes().into_iter().find(|w| w.token == "6").expect("B's write");
    assert!(b_write.start >= left + 1.0, "B entered {:.3} s after A left mid-body", b_write.start - left);
}

#[tokio::test]
async fn a_client_that_leaves_mid_response_keeps_its_place_until_the_response_ends() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let mut a = start_write(&gate, "/files/body?slow_answer=1", 5, "A");
    // The head and the first chunk arrive, then A's client goes.
    let mut first = [0; 64];
    let read = a.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..read]).starts_with("HTTP/1.1 200"));
    drop(a);
    let b = send(&gate, "POST", "/files/body", Some(6), "B").await;
    assert_eq!(b.status, 200, "{b:?}");
    let writes = upstream.writes();
    let answered = writes.iter().find(|w| w.method == "ANSWERED").expect("A's answer ended");
    let b_write = writes.iter().find(|w| w.token == "6").expect("B's write");
    assert!(
        answered.end <= b_write.start,
        "B's write started at {} before A's response ended at {}",
        b_write.start,
        answered.end
    );
}
