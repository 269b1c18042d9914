//! Marks that outlive the gate (redb, kill -9) and marks several gates share
//! (PostgreSQL claims).

use crate::common::{Gate, Upstream, send};

#[tokio::test]
async fn durable_marks_survive_kill_9() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.redb");
    let mut gate = Gate::start(&upstream.url(), &format!("[marks]\nkind = \"redb\"\npath = {:?}", marks));
    assert_eq!(send(&gate, "POST", "/files/k", Some(9), "nine").await.status, 200);
    gate.kill9();
    let gate = gate.restart();
    let stale = send(&gate, "POST", "/files/k", Some(8), "eight").await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(stale.problem()["highest_token"], 9);
    assert_eq!(send(&gate, "POST", "/files/k", Some(9), "nine again").await.status, 200);
    let tokens: Vec<_> = upstream.writes().into_iter().map(|w| w.token).collect();
    assert_eq!(tokens, ["9", "9"]);
}

#[tokio::test]
async fn two_gates_sharing_postgresql_refuse_a_stale_write_through_either() {
    let Some(db) = test_support::TestDb::create().await else { return };
    two_gates_sharing(&format!("[marks]\nkind = \"postgres\"\nurl = {:?}", db.url())).await;
    drop(db);
}

#[tokio::test]
async fn two_gates_sharing_etcd_refuse_a_stale_write_through_either() {
    let Some(etcd) = test_support::Etcd::start().await else { return };
    two_gates_sharing(&format!("[marks]\nkind = \"etcd\"\nendpoints = [{:?}]", etcd.endpoint)).await;
}

async fn two_gates_sharing(marks: &str) {
    let upstream = Upstream::start();
    let first = Gate::start(&upstream.url(), marks);
    let second = Gate::start(&upstream.url(), marks);
    assert_eq!(send(&first, "POST", "/files/p", Some(5), "five via the first").await.status, 200);
    let stale = send(&second, "POST", "/files/p", Some(4), "four via the second").await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(send(&second, "POST", "/files/p", Some(6), "six via the second").await.status, 200);
    assert_eq!(send(&first, "POST", "/files/p", Some(5), "five again via the first").await.status, 409);
    let tokens: Vec<_> = upstream.writes().into_iter().map(|w| w.token).collect();
    assert_eq!(tokens, ["5", "6"]);
}
