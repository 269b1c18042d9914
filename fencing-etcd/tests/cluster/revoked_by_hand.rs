//! A replica's claims taken away by hand while a request is inside: its lease
//! revoked (`etcdctl lease revoke`), or its claim's key deleted. etcd's watch
//! turns the deleted claim into a release hint; the keeper renews a claim it
//! holds on a key it hears released at once, the renewal finds the claim gone,
//! and the request is stopped (503 claim-lost) well before the next scheduled
//! renewal would have found it.

use std::sync::Arc;
use std::time::Duration;

use crate::faults::recorder::Recorder;
use crate::faults::replicas::{self, Answer, Replica};
use crate::faults::{BOUND, serial};
use etcd_client::{Client, GetOptions};
use fencing_etcd::{ClaimTiming, DEFAULT_TERM};
use test_support::Etcd;
use tokio::time::{Instant, timeout};

/// Each way of taking a claim away is tried this many times (on fresh keys).
const ROUNDS: u64 = 3;

/// How soon after the claim was taken away the request inside must be
/// stopped. Measured 3–9 ms (the watch, then one renewal of that claim);
/// without the hint, 1.57–1.70 s: a renewal finds it on schedule, up to two
/// periods later (800 ms each with the default term).
const STOPPED_WITHIN: Duration = Duration::from_millis(300);

/// What is taken away by hand.
#[derive(Debug, Clone, Copy)]
enum ByHand {
    /// The replica's lease, with every claim on it.
    RevokeLease,
    /// The one claim's key.
    DeleteClaim,
}

/// A replica with the default timing, on a one-member etcd.
async fn replica(etcd: &Etcd, recorder: &Recorder, prefix: &str) -> Replica {
    let timing = ClaimTiming::for_term(DEFAULT_TERM);
    let store = replicas::store(std::slice::from_ref(&etcd.endpoint), prefix, timing).await;
    Replica::serve(recorder, 0, store, BOUND).await
}

/// The claim keys under `prefix` and the lease each is on.
async fn claims(admin: &mut Client, prefix: &str) -> Vec<(Vec<u8>, i64)> {
    let found = admin.get(format!("{prefix}c/"), Some(GetOptions::new().with_prefix())).await.unwrap();
    found.kvs().iter().map(|kv| (kv.key().to_vec(), kv.lease())).collect()
}

/// Holds a request on `key` inside, takes its claim away `how`, and says how
/// long after that the request was answered, and the answer.
async fn take_away(
    replica: &Arc<Replica>,
    recorder: &Recorder,
    admin: &mut Client,
    prefix: &str,
    key: u64,
    how: ByHand,
) -> (Duration, Answer) {
    let token = key;
    recorder.hold(token);
    let inside = {
        let replica = Arc::clone(replica);
        tokio::spawn(async move { replica.post(key, token).await })
    };
    recorder.wait_inside(key, token).await;
    let found = claims(admin, prefix).await;
    let [(claim, lease)] = found.as_slice() else { panic!("one claim in etcd: {found:?}") };
    let (claim, lease) = (claim.clone(), *lease);
    let taken = Instant::now();
    match how {
        ByHand::RevokeLease => drop(admin.lease_revoke(lease).await.unwrap()),
        ByHand::DeleteClaim => drop(admin.delete(claim, None).await.unwrap()),
    }
    let answer = timeout(BOUND, inside).await.expect("the request answered").unwrap();
    recorder.let_go(token);
    ((answer.started + answer.took).saturating_duration_since(taken), answer)
}

async fn stopped_in_time(how: ByHand, prefix: &str) {
    let _one = serial().await;
    let Some(etcd) = Etcd::start().await else { return };
    let mut admin = Client::connect([etcd.endpoint.as_str()], None).await.unwrap();
    let recorder = Recorder::default();
    let replica = Arc::new(replica(&etcd, &recorder, prefix).await);
    let mut stopped = Vec::new();
    for key in 1..=ROUNDS {
        let (after, answer) = take_away(&replica, &recorder, &mut admin, prefix, key, how).await;
        assert_eq!(answer.status, 503, "{how:?}: {answer:?}");
        assert!(answer.body.contains("claim-lost"), "{how:?}: {answer:?}");
        stopped.push(after);
        // The next round's claim is the only one in etcd.
        replica.until_admitted(key, key, BOUND).await;
        timeout(BOUND, async {
            while !claims(&mut admin, prefix).await.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("idle claims released");
    }
    let revoked = replica.store.claims().revocations();
    eprintln!("[{how:?}] requests stopped {stopped:?} after their claim was taken away; {revoked:?}");
    // At least: the claims the replica released itself are heard of and renewed too (and found gone).
    assert!(revoked.found_gone >= ROUNDS, "each stopped by a renewal that found its claim gone: {revoked:?}");
    assert_eq!(revoked.at_deadline, 0, "none stopped at its deadline: {revoked:?}");
    let slowest = stopped.iter().max().copied().unwrap_or_default();
    assert!(
        slowest <= STOPPED_WITHIN,
        "{how:?}: a request stopped {slowest:?} after (bound {STOPPED_WITHIN:?})"
    );
    recorder.assert_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_revoked_by_hand_stops_the_request_inside_at_once() {
    stopped_in_time(ByHand::RevokeLease, "revoke/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_by_hand_stops_the_request_inside_at_once() {
    stopped_in_time(ByHand::DeleteClaim, "delete/").await;
}
