//! Idempotency keys: what a lease holder sends to a resource that cannot check
//! fencing tokens (a payment provider, a third-party API), so that a stale
//! holder's repeat of an operation is deduplicated instead of done twice.
//!
//! A key names one operation of one run, and nothing else: both the paused
//! holder and the one that took over compute the same key for the same
//! operation, so the provider does it once and answers the second caller with
//! the first result. That is why it is *derived* from (run, operation), never
//! random per attempt (the usual advice for retries by one client, which two
//! instances could not share) and never from the fencing token (which differs
//! between the two holders).

use std::fmt;

use http::HeaderValue;
use http::header::HeaderName;
use sha2::{Digest, Sha256};

/// The request header carrying the idempotency key, as Stripe and the IETF draft
/// `draft-ietf-httpapi-idempotency-key-header` spell it.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// [`IDEMPOTENCY_KEY_HEADER`] as a typed header name.
pub fn idempotency_key_header() -> HeaderName {
    HeaderName::from_static("idempotency-key")
}

/// Domain separation: a key of this scheme never equals a digest of the same
/// strings made for another purpose, and a later scheme can change the prefix.
const SCHEME: &[u8] = b"fencing-client idempotency key v1\0";

/// An idempotency key: 64 lowercase hex digits, the SHA-256 of (run, operation).
///
/// # Why a hash, and not a readable `run:op`
///
/// * **Stable everywhere.** SHA-256 is fixed by FIPS 180-4: every process,
///   machine, language and release computes the same key (std's `Hasher`s are
///   not: `RandomState` is seeded per process, `DefaultHasher` may change
///   between Rust releases).
/// * **Unambiguous.** Each part is length-prefixed before hashing, so
///   (`"a:b"`, `"c"`) and (`"a"`, `"b:c"`) get different keys; a joined
///   `run:op` string would give them the same one.
/// * **Fits every provider.** Always 64 ASCII characters, a valid header value
///   under Stripe's 255-character limit, whatever the run and operation names
///   hold (spaces, non-ASCII, any length).
/// * **Says nothing.** Customer ids and run names do not end up in the
///   provider's logs and dashboards.
///
/// The cost is that the key cannot be read back; log the run and the operation
/// beside it when a human must match them.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key of operation `op` (e.g. `charge:cus_42`) of run `run` (e.g.
    /// `billing:2026-12`): the same for every caller, in every process.
    ///
    /// ```
    /// use fencing_client::idempotency::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::for_operation("billing:2026-12", "charge:cus_42");
    /// assert_eq!(key, IdempotencyKey::for_operation("billing:2026-12", "charge:cus_42"));
    /// assert_ne!(key, IdempotencyKey::for_operation("billing:2026-12", "charge:cus_43"));
    /// assert_eq!(key.as_str().len(), 64);
    /// ```
    pub fn for_operation(run: &str, op: &str) -> Self {
        let mut hash = Sha256::new();
        hash.update(SCHEME);
        for part in [run, op] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        let digest = hash.finalize();
        let mut hex = String::with_capacity(2 * digest.len());
        for byte in digest {
            hex.push(char::from(HEX[usize::from(byte >> 4)]));
            hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        Self(hex)
    }

    /// The key as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as a header value.
    pub fn header_value(&self) -> HeaderValue {
        // 64 hex digits: always a valid header value.
        HeaderValue::from_str(&self.0).expect("hex digits are a valid header value")
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({})", self.0)
    }
}

/// Sets the `Idempotency-Key` header of `request` to `key`, replacing any value already there.
pub fn set_idempotency_key<B>(request: &mut http::Request<B>, key: &IdempotencyKey) {
    request.headers_mut().insert(idempotency_key_header(), key.header_value());
}

/// Adds the `Idempotency-Key` header with `key` to a reqwest request.
pub fn idempotent_reqwest(request: reqwest::RequestBuilder, key: &IdempotencyKey) -> reqwest::RequestBuilder {
    request.header(idempotency_key_header(), key.header_value())
}

/// One operation of a run, done by a lease holder: the fencing token for what
/// can check it (the run's record), the idempotency key for what cannot (the
/// provider). [`Lease::operation`](crate::Lease::operation) makes one from a lease.
///
/// The job's step is then: fence the record with [`token`](Self::token) (a
/// compare-and-set that refuses a token lower than the run's), and only if that
/// succeeds, make the call with both headers ([`reqwest`](Self::reqwest)). The
/// fence stops a stale holder at its next step; the key covers the one step the
/// fence cannot: a holder paused after its fenced write and before its call,
/// whose call then repeats the newer holder's.
///
/// ```
/// use std::collections::HashMap;
/// use fencing_client::idempotency::{FencedOperation, IdempotencyKey};
///
/// /// The per-run record: the highest token each run has seen (a database row, with
/// /// `UPDATE … SET token = $t WHERE run = $r AND token <= $t`, in real life).
/// #[derive(Default)]
/// struct Record(HashMap<String, u64>);
///
/// impl Record {
///     /// Compare-and-set on the token: refuses a lower one, raises to a higher one.
///     fn fence(&mut self, run: &str, token: u64) -> Result<(), u64> {
///         let highest = self.0.entry(run.to_owned()).or_insert(token);
///         if token < *highest {
///             return Err(*highest);
///         }
///         *highest = token;
///         Ok(())
///     }
/// }
///
/// let mut record = Record::default();
/// let http = reqwest::Client::new();
/// let run = "billing:2026-12";
///
/// // Instance A (token 7) fences the record, then builds its charge.
/// let a = FencedOperation::new(7, run, "charge:cus_42");
/// record.fence(run, a.token()).expect("nobody newer yet");
/// let charge = a.reqwest(http.post("http://127.0.0.1:9/v1/charges")).body("amount=1999").build()?;
/// assert_eq!(charge.headers()["fencing-token"], "7");
/// assert_eq!(charge.headers()["idempotency-key"], a.key().as_str());
///
/// // A is paused; B (token 8) takes the lock and does the same operation: same key,
/// // so the provider charges once and answers B with A's charge.
/// let b = FencedOperation::new(8, run, "charge:cus_42");
/// record.fence(run, b.token()).expect("B is the newest");
/// assert_eq!(b.key(), a.key());
/// assert_eq!(b.key(), &IdempotencyKey::for_operation(run, "charge:cus_42"));
///
/// // A wakes up: its next fenced write is refused, so it stops.
/// assert_eq!(record.fence(run, 7), Err(8));
/// # Ok::<(), reqwest::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedOperation {
    token: u64,
    key: IdempotencyKey,
}

impl FencedOperation {
    /// Operation `op` of run `run`, by the holder of `token`.
    pub fn new(token: u64, run: &str, op: &str) -> Self {
        Self { token, key: IdempotencyKey::for_operation(run, op) }
    }

    /// The holder's fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The operation's idempotency key (the same for every holder).
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Sets `Fencing-Token` and `Idempotency-Key` on `request`, replacing any values already there.
    pub fn apply<B>(&self, request: &mut http::Request<B>) {
        crate::header::set_fencing_token(request, self.token);
        set_idempotency_key(request, &self.key);
    }

    /// Adds `Fencing-Token` and `Idempotency-Key` to a reqwest request. The token
    /// costs nothing where it is not checked, and is there for the logs, or for a
    /// resource in front of the provider that does check it.
    pub fn reqwest(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        idempotent_reqwest(crate::header::fence_reqwest(request, self.token), &self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_a_fixed_sha256_of_the_length_prefixed_parts() {
        // Pinned: a change of scheme would silently stop deduplicating the runs in flight.
        let key = IdempotencyKey::for_operation("billing:2026-12", "charge:cus_42");
        let mut expected = Sha256::new();
        expected.update(b"fencing-client idempotency key v1\0");
        expected.update(15u64.to_be_bytes());
        expected.update(b"billing:2026-12");
        expected.update(13u64.to_be_bytes());
        expected.update(b"charge:cus_42");
        let expected: String = expected.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(key.as_str(), expected);
        assert!(key.as_str().bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn the_parts_cannot_be_shifted_into_each_other() {
        let a = IdempotencyKey::for_operation("a:b", "c");
        let b = IdempotencyKey::for_operation("a", "b:c");
        let c = IdempotencyKey::for_operation("a:b:c", "");
        let d = IdempotencyKey::for_operation("", "a:b:c");
        let all = [&a, &b, &c, &d];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn any_names_give_a_valid_header() {
        let long = "x".repeat(10_000);
        for (run, op) in [("", ""), ("run\n1", "op\0"), ("月次請求", "charge:ü"), (long.as_str(), "op")]
        {
            let key = IdempotencyKey::for_operation(run, op);
            assert_eq!(key.as_str().len(), 64);
            assert_eq!(key.header_value(), key.as_str());
        }
    }

    #[test]
    fn sets_token_and_key_together_replacing_old_values() {
        let op = FencedOperation::new(42, "run", "op");
        let mut request = http::Request::builder()
            .uri("/v1/charges")
            .header("idempotency-key", "old")
            .header("Idempotency-Key", "older")
            .header("fencing-token", "1")
            .body(())
            .unwrap();
        op.apply(&mut request);
        let keys: Vec<_> = request.headers().get_all(IDEMPOTENCY_KEY_HEADER).iter().collect();
        assert_eq!(keys, [op.key().as_str()]);
        let tokens: Vec<_> = request.headers().get_all("Fencing-Token").iter().collect();
        assert_eq!(tokens, ["42"]);

        let built = op.reqwest(reqwest::Client::new().post("http://127.0.0.1:9/x")).build().unwrap();
        assert_eq!(built.headers()["idempotency-key"], op.key().as_str());
        assert_eq!(built.headers()["fencing-token"], "42");
    }
}
