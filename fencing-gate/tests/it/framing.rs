//! Requests framed two ways, and oversized heads, over raw sockets: refused,
//! or made unambiguous; never forwarded as they came.

use crate::common::{Gate, Upstream, raw, raw_one};

#[tokio::test]
async fn content_length_with_chunked_is_forwarded_chunked_only_and_what_follows_is_dropped() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    // Read by Content-Length, the body would be "5\r\nh" and the rest a second
    // request with token 1; read as chunked (which wins), it is "hello".
    let answer = raw(
        &gate,
        b"POST /s/1 HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\nPOST /s/1 HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: 3\r\n\r\nbad",
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1").count(), 1, "the bytes after the body were served: {answer}");
    let writes = upstream.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!((writes[0].token.as_str(), writes[0].body.as_str()), ("5", "hello"));
}

#[tokio::test]
async fn differing_content_lengths_obs_fold_and_unknown_codings_are_refused() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let two_lengths =
        raw(&gate, b"POST /s/2 HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nhello");
    assert!(two_lengths.starts_with("HTTP/1.1 400"), "{two_lengths}");
    let folded = raw(&gate, b"POST /s/3 HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nX-A: a\r\n b\r\nContent-Length: 5\r\n\r\nhello");
    assert!(folded.starts_with("HTTP/1.1 400"), "{folded}");
    let gzip = raw(
        &gate,
        b"POST /s/4 HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    assert!(gzip.starts_with("HTTP/1.1 501"), "{gzip}");
    assert!(gzip.contains("unsupported-transfer-coding"), "{gzip}");
    for path in ["/s/../s/5", "/s//5", "/s/%2e%2e/5", "/s%2F5"] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let answer = raw(&gate, request.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("ambiguous-path"), "{path}: {answer}");
    }
    let connect = raw_one(&gate, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n");
    assert!(connect.starts_with("HTTP/1.1 501") && connect.contains("connect-refused"), "{connect}");
    assert!(upstream.writes().is_empty(), "{:?}", upstream.writes());
}

#[tokio::test]
async fn oversized_heads_get_431() {
    let upstream = Upstream::start();
    let gate = Gate::start(&upstream.url(), "[limits]\nmax_header_count = 20");
    let fields = |n: usize| -> String { (0..n).map(|i| format!("X-H{i}: v\r\n")).collect() };
    let head = |fields: String| {
        format!("POST /s HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\n{fields}Connection: close\r\n\r\n")
    };
    let answer = raw(&gate, head(fields(20)).as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431") && answer.contains("headers-too-large"), "{answer}");
    // Past 100 fields hyper's parser refuses the head itself: 431, without a body.
    let answer = raw(&gate, head(fields(101)).as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    let big = "a".repeat(40 * 1024);
    let answer = raw(
        &gate,
        format!(
            "POST /s HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nX-Big: {big}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 431") && answer.contains("headers-too-large"), "{answer}");
    // Past hyper's own bound the parser refuses it: still 431, without a body.
    let huge = "a".repeat(200 * 1024);
    let answer = raw(&gate, format!("POST /s HTTP/1.1\r\nHost: x\r\nX-Huge: {huge}\r\n\r\n").as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(upstream.writes().is_empty());
}

#[tokio::test]
async fn trailers_pass_both_ways() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let answer = raw(
        &gate,
        b"POST /t HTTP/1.1\r\nHost: x\r\nFencing-Token: 2\r\nTE: trailers\r\nTrailer: X-Checksum\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\nX-Checksum: c1\r\n\r\n\
          GET /trailers HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(upstream.writes()[0].body, "hello [trailer x-checksum: c1]");
    let response = answer.split("HTTP/1.1 ").nth(2).expect("two answers");
    assert!(response.to_ascii_lowercase().contains("x-checksum: abc"), "{answer}");
}

#[tokio::test]
async fn upgrades_are_refused_unless_passed_through_unfenced() {
    let upstream = Upstream::start();
    let handshake = b"GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
    let refusing = Gate::one_line(&upstream.url());
    let refused = raw_one(&refusing, handshake);
    assert!(refused.starts_with("HTTP/1.1 501") && refused.contains("upgrade-refused"), "{refused}");

    let passing = Gate::start(&upstream.url(), "[forwarding]\nupgrades = \"pass\"");
    let mut stream = std::net::TcpStream::connect(passing.addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    std::io::Write::write_all(&mut stream, handshake).unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        std::io::BufRead::read_line(&mut reader, &mut head).unwrap();
    }
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.to_ascii_lowercase().contains("upgrade: echo"), "{head}");
    std::io::Write::write_all(&mut stream, b"through the tunnel\n").unwrap();
    let mut echoed = String::new();
    std::io::BufRead::read_line(&mut reader, &mut echoed).unwrap();
    assert_eq!(echoed, "THROUGH THE TUNNEL\n");
}

#[tokio::test]
async fn bodies_stream_through_without_waiting_for_their_end() {
    let upstream = Upstream::start();
    let gate = Gate::one_line(&upstream.url());
    let started = std::time::Instant::now();
    let mut response = reqwest::get(gate.url("/stream")).await.unwrap();
    let first = response.chunk().await.unwrap().unwrap();
    assert_eq!(&first[..], b"first\n");
    assert!(
        started.elapsed() < std::time::Duration::from_millis(800),
        "the first chunk waited for the second"
    );
    let mut rest = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"second\n");
}
