//! Token authenticity through the real demo-resource app (`serve --verify-key`'s
//! configuration) over real HTTP on 127.0.0.1: forged raises are 403 and change
//! nothing, the honest holder carries on, the verifier is asked only about
//! raises, and a verifier that cannot answer is 503 with nothing admitted.
//! With PostgreSQL (SKIPPED when not reachable, unless `CI=true`), two replicas.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use demo_resource::{Config, Resource, RunningResource, Served, proof_verifier};
use fencing_layer::verify::{ProofSigner, Raise, TokenVerifier, Verification, verify_fn};
use reqwest::{Client, Method};
use test_support::TestDb;

use crate::common::{Answer, client};

async fn call(
    http: &Client,
    method: Method,
    url: String,
    token: Option<&str>,
    proof: Option<&str>,
    body: &str,
) -> Answer {
    let mut request = http.request(method, url);
    if let Some(token) = token {
        request = request.header("Fencing-Token", token);
    }
    if let Some(proof) = proof {
        request = request.header("Fencing-Proof", proof);
    }
    Answer::of(request.body(body.to_owned())).await
}

async fn post(running: &RunningResource, path: &str, token: u64, proof: Option<&str>) -> Answer {
    let url = format!("{}{path}", running.base_url());
    call(&client(), Method::POST, url, Some(&token.to_string()), proof, &format!("write with {token}")).await
}

async fn put(running: &RunningResource, path: &str, token: u64, proof: Option<&str>) -> Answer {
    let url = format!("{}{path}", running.base_url());
    call(&client(), Method::PUT, url, Some(&token.to_string()), proof, &format!("value of {token}")).await
}

fn mark(running: &RunningResource, key: &str) -> Option<u64> {
    running.served().mark_store().unwrap().mark(key)
}

/// A durable resource in `dir` checking proofs by `signer`'s public key.
async fn verified(dir: &std::path::Path, signer: &ProofSigner) -> RunningResource {
    let config = Config::durable(dir).verify_key(signer.public_key());
    let resource = Resource::connect(config).await.unwrap();
    resource.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

#[tokio::test]
async fn forged_raises_are_403_and_the_honest_holder_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let lock_service = ProofSigner::generate().unwrap();
    let stranger = ProofSigner::generate().unwrap();
    let running = verified(dir.path(), &lock_service).await;
    let log = "/logs/billing";

    // The honest holder of token 5 raises the mark from nothing, with its proof.
    let honest = lock_service.sign("billing", 5);
    let answer = post(&running, log, 5, Some(&honest)).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(mark(&running, log), Some(5));

    let garbage_signature = {
        // 64 bytes of a real proof with one bit flipped.
        let mut proof = lock_service.sign("billing", 6).into_bytes();
        proof[10] = if proof[10] == b'A' { b'B' } else { b'A' };
        String::from_utf8(proof).unwrap()
    };
    let forgeries: Vec<(&str, u64, Option<String>)> = vec![
        ("no proof", 6, None),
        ("no proof, the highest token", u64::MAX, None),
        ("not base64", 6, Some("not a proof!".to_owned())),
        ("too short", 6, Some("AAAA".to_owned())),
        ("a bad signature", 6, Some(garbage_signature)),
        ("a proof for another lock", 6, Some(lock_service.sign("payroll", 6))),
        ("a proof for /kv/billing's spelling", 6, Some(lock_service.sign("/logs/billing", 6))),
        ("a lower token's proof with a higher number", 1_000, Some(honest.clone())),
        ("a proof from another key pair", 6, Some(stranger.sign("billing", 6))),
    ];
    for (what, token, proof) in forgeries {
        let answer = post(&running, log, token, proof.as_deref()).await;
        answer.problem(403, "unverified-token");
        assert_eq!(answer.body["presented_token"], token, "{what}: {answer:?}");
        assert_eq!(mark(&running, log), Some(5), "{what}: the mark moved");
    }
    // A proof header given twice is refused too, even if one of them is right.
    let url = format!("{}{log}", running.base_url());
    let response = client()
        .post(&url)
        .header("Fencing-Token", "6")
        .header("Fencing-Proof", lock_service.sign("billing", 6))
        .header("Fencing-Proof", lock_service.sign("billing", 6))
        .body("twice")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(mark(&running, log), Some(5));

    // The honest holder's next write still succeeds (an equal token needs no proof,
    // and fencing-client sends it anyway), and so does the next genuine holder's.
    assert_eq!(post(&running, log, 5, Some(&honest)).await.status, 201);
    assert_eq!(post(&running, log, 5, None).await.status, 201);
    let next = lock_service.sign("billing", 6);
    assert_eq!(post(&running, log, 6, Some(&next)).await.status, 201);
    assert_eq!(mark(&running, log), Some(6));
    // And the old holder is now stale: 409, no proof asked.
    post(&running, log, 5, Some(&honest)).await.problem(409, "stale-token");

    // Only admitted writes reached the log.
    let entries = call(&client(), Method::GET, url, None, None, "").await;
    let tokens: Vec<u64> =
        entries.body["entries"].as_array().unwrap().iter().map(|e| e["token"].as_u64().unwrap()).collect();
    assert_eq!(tokens, [5, 5, 5, 6]);
    running.shutdown().await.unwrap();

    // The marks survived the restart, and so did the check.
    let running = verified(dir.path(), &lock_service).await;
    assert_eq!(mark(&running, log), Some(6));
    post(&running, log, 7, None).await.problem(403, "unverified-token");
    post(&running, log, 7, Some(&lock_service.sign("billing", 7))).await;
    assert_eq!(mark(&running, log), Some(7));
}

#[tokio::test]
async fn the_lock_of_a_kv_key_is_the_decoded_key() {
    let dir = tempfile::tempdir().unwrap();
    let lock_service = ProofSigner::generate().unwrap();
    let running = verified(dir.path(), &lock_service).await;

    // `/kv/a%20b` is the key `a b`: its lock is `a b`, not `a%20b`.
    put(&running, "/kv/a%20b", 3, Some(&lock_service.sign("a%20b", 3)))
        .await
        .problem(403, "unverified-token");
    // The refused raise left the key at no mark (a key the layer met is listed at 0).
    assert!(mark(&running, "/kv/a b").is_none_or(|mark| mark == 0));
    let answer = put(&running, "/kv/a%20b", 3, Some(&lock_service.sign("a b", 3))).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(mark(&running, "/kv/a b"), Some(3));
    // The same name's log has a mark of its own; the lock's proof raises it as well.
    let answer = post(&running, "/logs/a%20b", 3, Some(&lock_service.sign("a b", 3))).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    // DELETE is fenced and checked the same way.
    let url = format!("{}/kv/a%20b", running.base_url());
    let forged = call(&client(), Method::DELETE, url.clone(), Some("4"), None, "").await;
    forged.problem(403, "unverified-token");
    let deleted =
        call(&client(), Method::DELETE, url, Some("4"), Some(&lock_service.sign("a b", 4)), "").await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    running.shutdown().await.unwrap();
}

/// Counts the calls of the verifier it wraps.
struct Counting<V> {
    inner: V,
    calls: Arc<AtomicUsize>,
}

impl<V: TokenVerifier> TokenVerifier for Counting<V> {
    fn verify(&self, raise: &Raise<'_>) -> Verification {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.verify(raise)
    }
}

#[tokio::test]
async fn the_verifier_is_asked_only_about_raises() {
    let lock_service = ProofSigner::generate().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counting = Counting { inner: proof_verifier(lock_service.public_key()), calls: Arc::clone(&calls) };
    let resource = Resource::connect(Config::in_memory()).await.unwrap().with_verifier(counting);
    let running = resource.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let calls = || calls.load(Ordering::SeqCst);
    let log = "/logs/orders";

    assert_eq!(post(&running, log, 10, Some(&lock_service.sign("orders", 10))).await.status, 201);
    assert_eq!(calls(), 1, "the first raise is verified");
    // Equal tokens, with and without the proof: never verified.
    for i in 0..20 {
        let proof = (i % 2 == 0).then(|| lock_service.sign("orders", 10));
        assert_eq!(post(&running, log, 10, proof.as_deref()).await.status, 201);
    }
    assert_eq!(calls(), 1, "equal tokens reached the verifier");
    // Stale tokens, even with a valid proof of their own: 409, never verified.
    for token in [0, 1, 9] {
        let proof = lock_service.sign("orders", token);
        post(&running, log, token, Some(&proof)).await.problem(409, "stale-token");
    }
    assert_eq!(calls(), 1, "stale tokens reached the verifier");
    // Every raise is, refused or not.
    post(&running, log, 11, None).await.problem(403, "unverified-token");
    assert_eq!(calls(), 2);
    assert_eq!(post(&running, log, 11, Some(&lock_service.sign("orders", 11))).await.status, 201);
    assert_eq!(calls(), 3);
    assert_eq!(post(&running, log, 11, None).await.status, 201);
    assert_eq!(calls(), 3);
    // A write to another key is that key's first raise.
    assert_eq!(put(&running, "/kv/k", 1, Some(&lock_service.sign("k", 1))).await.status, 201);
    assert_eq!(calls(), 4);
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_verifier_that_cannot_answer_is_503_and_nothing_is_admitted() {
    let resource = Resource::connect(Config::in_memory()).await.unwrap();
    let store = resource.mark_store().unwrap().clone();
    store.seed("/logs/audit", 3).unwrap();
    let down = verify_fn(|_: &Raise<'_>| Verification::unavailable("the lock service is down"));
    let running = resource.with_verifier(down).spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();

    for (path, token) in [("/logs/audit", 4), ("/logs/audit", u64::MAX), ("/logs/fresh", 1)] {
        let answer = post(&running, path, token, None).await;
        answer.problem(503, "verifier-unavailable");
        assert!(answer.retry_after.is_some(), "{answer:?}");
    }
    assert_eq!(store.mark("/logs/audit"), Some(3));
    assert!(store.mark("/logs/fresh").is_none_or(|mark| mark == 0), "{:?}", store.mark("/logs/fresh"));
    // Nothing was written: the log is still unknown. Equal and stale tokens need no answer.
    let url = format!("{}/logs/audit", running.base_url());
    let read = call(&client(), Method::GET, url.clone(), None, None, "").await;
    read.problem(404, "unknown-log");
    assert_eq!(post(&running, "/logs/audit", 3, None).await.status, 201);
    post(&running, "/logs/audit", 2, None).await.problem(409, "stale-token");
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_verify_key_needs_fencing() {
    let key = ProofSigner::generate().unwrap().public_key();
    let error = Resource::connect(Config::in_memory().without_fencing().verify_key(key)).await.unwrap_err();
    assert!(error.to_string().contains("needs fencing"), "{error}");
}

/// With `--postgres` the layer checks the proof before the database's fence: a
/// forged raise on one replica does not brick the key on the others.
#[tokio::test]
async fn postgres_replicas_refuse_forged_raises() {
    let Some(db) = TestDb::create().await else { return };
    let lock_service = ProofSigner::generate().unwrap();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let config = Config::postgres(db.url()).verify_key(lock_service.public_key());
        let resource = Resource::connect(config).await.unwrap();
        replicas.push(resource.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    let (one, two) = (&replicas[0], &replicas[1]);
    let log = "/logs/ledger";
    let proof5 = lock_service.sign("ledger", 5);
    assert_eq!(post(one, log, 5, Some(&proof5)).await.status, 201);
    // Forged raises on the replica that never saw token 5.
    post(two, log, u64::MAX, None).await.problem(403, "unverified-token");
    post(two, log, 1_000, Some(&proof5)).await.problem(403, "unverified-token");
    // Had they reached the database, token 5 would be stale on both replicas now.
    assert_eq!(post(two, log, 5, Some(&proof5)).await.status, 201);
    assert_eq!(post(one, log, 5, None).await.status, 201);
    let database_mark: Option<u64> = {
        let client = db.connect().await;
        let rows =
            client.query("SELECT mark::text FROM fencing_marks WHERE key = $1", &[&log]).await.unwrap();
        rows.first().map(|row| row.get::<_, String>(0).parse().unwrap())
    };
    assert_eq!(database_mark, Some(5));
    // A genuine raise on either replica fences the other's stale holder.
    assert_eq!(post(two, log, 6, Some(&lock_service.sign("ledger", 6))).await.status, 201);
    post(one, log, 5, Some(&proof5)).await.problem(409, "stale-token");
    for replica in replicas {
        replica.shutdown().await.unwrap();
    }
}
