//! A replica whose log pipe nobody reads: the keeper must still revoke.
//!
//! `demo-resource serve --postgres URL --shared-marks` as a child process whose
//! stderr is a pipe the test filled and never reads (a stalled log shipper, a
//! full container log pipe): every `write(2)` to it blocks. Its claim on the
//! key cannot be renewed (the test's own session holds the claim's row, so
//! renewals skip it as busy). The keeper must stop the request inside at the
//! claim's deadline although the log line that says so cannot be written.
//!
//! The child runs with `FENCING_MUTANT=no-request-deadline` (the workspace's
//! tests build fencing-layer with its `mutants` feature): the request's own
//! deadline timer, the second stop, is off, so this test sees the keeper's
//! stop alone. (An attack found the keeper logging one line per claim before
//! revoking it: blocked in `write(2)`, it let a higher token in on the other
//! replica at 7.0 s while the lower token's request ran on to 12.0 s.)

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use test_support::{BOUND, ChildServer, TestDb};

use crate::common::client;

/// demo-resource's claim term (fencing-layer's default).
const TERM: Duration = Duration::from_secs(5);

/// A pipe whose write end the test filled and whose read end nobody reads.
struct FullPipe {
    /// Kept open, never read: dropping it lets the filler end (EPIPE).
    _reader: std::io::PipeReader,
    /// What the child writes to.
    child_end: Option<std::io::PipeWriter>,
    filled: Arc<AtomicUsize>,
}

impl FullPipe {
    fn new() -> Self {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        let child_end = Some(writer.try_clone().expect("the pipe's write end, twice"));
        Self { _reader: reader, child_end, filled: Arc::new(AtomicUsize::new(0)) }
    }

    /// The write end, for the child's stderr.
    fn child_end(&mut self) -> Stdio {
        Stdio::from(self.child_end.take().expect("one child"))
    }

    /// Fills the pipe from a thread of its own until a write blocks (its
    /// count stops rising), and returns how many bytes it took.
    fn fill(&self, mut writer: std::io::PipeWriter) -> usize {
        let filled = Arc::clone(&self.filled);
        std::thread::spawn(move || {
            let chunk = [b'#'; 1024];
            while writer.write_all(&chunk).is_ok() {
                filled.fetch_add(chunk.len(), Ordering::SeqCst);
            }
        });
        let mut last = usize::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = self.filled.load(Ordering::SeqCst);
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

/// Appends `body` to `path` on `replica` with `token`: status and body.
async fn append(replica: &ChildServer, path: &str, token: u64, body: &str) -> (u16, Value) {
    let url = format!("{}{path}", replica.base());
    let response = client().post(url).header("Fencing-Token", token).body(body.to_owned()).send().await;
    let response = response.expect("the replica answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_log_pipe_is_never_read_still_stops_its_request_at_the_deadline() {
    let Some(db) = TestDb::create().await else { return };
    let mut pipe = FullPipe::new();
    let filler_end = pipe.child_end.as_ref().unwrap().try_clone().unwrap();
    let serve = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_demo-resource"));
        command.args(["serve", "--listen", "127.0.0.1:0", "--postgres", &db.url(), "--shared-marks"]);
        command
    };
    let mut stalled = serve();
    stalled.env("RUST_LOG", "warn").env("FENCING_MUTANT", "no-request-deadline").stderr(pipe.child_end());
    let mut other = serve();
    other.env("RUST_LOG", "error").stderr(Stdio::inherit());
    let (stalled, other) = (ChildServer::spawn(&mut stalled), ChildServer::spawn(&mut other));
    let (stalled, other) = (stalled.ready(), other.ready());
    let bytes = pipe.fill(filler_end);
    eprintln!("the stalled replica's stderr pipe is full ({bytes} bytes, never read)");

    // Token 1's write on the stalled replica, inside for 9 s (its transaction open).
    let path = "/logs/pipe";
    let slow = tokio::spawn({
        let url = stalled.base();
        async move {
            let response = client()
                .post(format!("{url}{path}?delay_ms=9000"))
                .header("Fencing-Token", 1)
                .body("stale")
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .expect("the stalled replica answers");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null), Instant::now())
        }
    });
    let admin = db.connect().await;
    let claim = "SELECT grant_id FROM fencing_marks_claims WHERE key = $1 FOR UPDATE";
    let inside = tokio::time::timeout(BOUND, async {
        loop {
            if admin
                .query_opt("SELECT 1 FROM fencing_marks_claims WHERE key = $1", &[&path])
                .await
                .unwrap()
                .is_some()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    inside.await.expect("token 1's claim was never written");
    // Its row held by this session: the replica's renewals skip it (busy), so
    // the claim reaches its deadline within a term of now.
    admin.batch_execute("BEGIN").await.unwrap();
    assert!(admin.query_opt(claim, &[&path]).await.unwrap().is_some(), "the claim went before it was held");
    let held = Instant::now();
    // Past the row's expiry (its last renewal was sent before `held`), then let go.
    tokio::time::sleep(TERM + Duration::from_millis(500)).await;
    admin.batch_execute("COMMIT").await.unwrap();

    let (status, body) = append(&other, path, 2, "fresh").await;
    let raised = Instant::now();
    assert_eq!(status, 201, "token 2 on the other replica: {body}");
    let (status, problem, answered) = slow.await.unwrap();
    let stopped = answered.duration_since(held);
    eprintln!("token 1's request answered {status} {:.2} s after its row was held", stopped.as_secs_f64());
    assert_eq!(status, 503, "token 1's request ran on past its claim: {problem}");
    assert_eq!(problem["type"], "urn:fencing:problem:claim-lost", "{problem}");
    assert!(answered < raised, "token 1's request answered only after token 2 was admitted");
    assert!(
        stopped <= TERM,
        "token 1's request was stopped {stopped:?} after its row was held: past the row's expiry"
    );
    let log = client().get(format!("{}{path}", other.base())).send().await.unwrap();
    let log: Value = log.json().await.unwrap();
    let tokens: Vec<u64> =
        log["entries"].as_array().unwrap().iter().map(|e| e["token"].as_u64().unwrap()).collect();
    assert_eq!(tokens, [2], "the log holds a write of the revoked token: {log}");
}
