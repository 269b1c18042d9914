//! Signed tokens: the lock service signs (lock name, token) with an Ed25519
//! key, the client sends the signature as `Fencing-Proof` beside
//! `Fencing-Token`, and [`Ed25519Verifier`] checks it before any raise.
//!
//! A forged token then cannot raise a mark: without the lock service's secret
//! key nobody can sign a token it did not grant, and a proof names its lock, so
//! a genuine proof for one lock cannot raise another lock's mark.
//!
//! ```
//! use fencing_layer::FencingLayer;
//! use fencing_layer::verify::{Ed25519Verifier, ProofSigner};
//!
//! // The lock service holds the secret key and signs every grant.
//! let signer = ProofSigner::generate().unwrap();
//! let proof = signer.sign("billing", 42);
//!
//! // The resource trusts the public key. Its keys are paths, `/logs/{lock}`.
//! let verifier = Ed25519Verifier::new(signer.public_key())
//!     .lock_for_key(|key| key.strip_prefix("/logs/").map(str::to_owned));
//! assert!(verifier.check("/logs/billing", 42, &proof).is_ok());
//! assert!(verifier.check("/logs/billing", 43, &proof).is_err(), "another token");
//! assert!(verifier.check("/logs/payroll", 42, &proof).is_err(), "another lock");
//!
//! let layer = FencingLayer::new().verifier(verifier);
//! # let _ = layer;
//! ```
//!
//! The signed message is `fencing-proof-v1`, a zero byte, the lock name's
//! length as a big-endian `u64`, the lock name's bytes, and the token as a
//! big-endian `u64`; the proof is the 64-byte signature in URL-safe base64
//! without padding. Key files hold one line: the 32-byte key in the same
//! base64.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use http::HeaderName;

use super::{Raise, TokenVerifier, Verification};
use crate::headers::FENCING_PROOF;

const CONTEXT: &[u8] = b"fencing-proof-v1\0";

/// The bytes a proof signs for `token` of `lock`.
fn message(lock: &str, token: u64) -> Vec<u8> {
    let mut message = Vec::with_capacity(CONTEXT.len() + 16 + lock.len());
    message.extend_from_slice(CONTEXT);
    message.extend_from_slice(&(lock.len() as u64).to_be_bytes());
    message.extend_from_slice(lock.as_bytes());
    message.extend_from_slice(&token.to_be_bytes());
    message
}

/// A key file could not be read, written or parsed.
#[derive(Debug)]
pub struct KeyError(String);

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyError {}

fn decode_key(text: &str, what: &str) -> Result<[u8; 32], KeyError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text.trim())
        .map_err(|error| KeyError(format!("{what} is not URL-safe base64: {error}")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| KeyError(format!("{what} is {} bytes; an Ed25519 key is 32", bytes.len())))
}

fn read_key(path: &Path, what: &str) -> Result<[u8; 32], KeyError> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| KeyError(format!("cannot read the {what} {}: {error}", path.display())))?;
    decode_key(&text, &format!("the {what} {}", path.display()))
}

/// The public half: what a resource trusts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ProofPublicKey(VerifyingKey);

impl ProofPublicKey {
    /// Reads a public key file written by [`ProofSigner::write_key_pair`].
    ///
    /// # Errors
    ///
    /// The file cannot be read or does not hold an Ed25519 public key.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        let path = path.as_ref();
        let bytes = read_key(path, "public key")?;
        VerifyingKey::from_bytes(&bytes)
            .map(Self)
            .map_err(|error| KeyError(format!("{} is not an Ed25519 public key: {error}", path.display())))
    }

    /// The key as written to a file (URL-safe base64).
    #[must_use]
    pub fn to_base64(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0.as_bytes())
    }
}

impl fmt::Debug for ProofPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ProofPublicKey").field(&self.to_base64()).finish()
    }
}

/// The secret half, held by the lock service: signs grants.
#[derive(Clone)]
pub struct ProofSigner(SigningKey);

impl ProofSigner {
    /// A new key pair from the operating system's random number generator.
    ///
    /// # Errors
    ///
    /// The OS has no randomness to give.
    pub fn generate() -> Result<Self, KeyError> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|error| KeyError(format!("no randomness: {error}")))?;
        Ok(Self(SigningKey::from_bytes(&secret)))
    }

    /// Reads a secret key file written by [`write_key_pair`](Self::write_key_pair).
    ///
    /// # Errors
    ///
    /// The file cannot be read or does not hold a 32-byte key.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        read_key(path.as_ref(), "secret key").map(|bytes| Self(SigningKey::from_bytes(&bytes)))
    }

    /// Writes the secret key to `secret` (readable by its owner only, on Unix)
    /// and the public key to `public`. Refuses to overwrite either file: a lost
    /// secret key cannot be recovered, and a replaced one invalidates every
    /// resource's trust.
    ///
    /// # Errors
    ///
    /// Either file exists already or cannot be written.
    pub fn write_key_pair(&self, secret: impl AsRef<Path>, public: impl AsRef<Path>) -> Result<(), KeyError> {
        let (secret, public) = (secret.as_ref(), public.as_ref());
        write_new(secret, &URL_SAFE_NO_PAD.encode(self.0.to_bytes()), true)?;
        write_new(public, &self.public_key().to_base64(), false)
    }

    /// The public key to give the resources.
    #[must_use]
    pub fn public_key(&self) -> ProofPublicKey {
        ProofPublicKey(self.0.verifying_key())
    }

    /// The proof of `token` for `lock`: the value of `Fencing-Proof`.
    #[must_use]
    pub fn sign(&self, lock: &str, token: u64) -> String {
        URL_SAFE_NO_PAD.encode(self.0.sign(&message(lock, token)).to_bytes())
    }
}

impl fmt::Debug for ProofSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProofSigner").field("public_key", &self.public_key()).finish_non_exhaustive()
    }
}

fn write_new(path: &Path, text: &str, secret: bool) -> Result<(), KeyError> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file =
        options.open(path).map_err(|error| KeyError(format!("cannot create {}: {error}", path.display())))?;
    writeln!(file, "{text}")
        .and_then(|()| file.sync_all())
        .map_err(|error| KeyError(format!("cannot write {}: {error}", path.display())))
}

type LockForKey = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A [`TokenVerifier`] that admits a raise only with a valid `Fencing-Proof`:
/// the lock service's signature over the token and the lock that the
/// request's key belongs to.
#[derive(Clone)]
pub struct Ed25519Verifier {
    key: ProofPublicKey,
    header: HeaderName,
    lock_for_key: LockForKey,
}

impl Ed25519Verifier {
    /// Trusts proofs signed by `key`. The lock of a request is its resource key
    /// unless [`lock_for_key`](Self::lock_for_key) says otherwise.
    #[must_use]
    pub fn new(key: ProofPublicKey) -> Self {
        Self { key, header: FENCING_PROOF, lock_for_key: Arc::new(|key| Some(key.to_owned())) }
    }

    /// Maps a resource key to the name of the lock whose holder may write it;
    /// `None` (no lock guards this key) refuses every raise of it.
    #[must_use]
    pub fn lock_for_key(
        mut self,
        lock_for_key: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.lock_for_key = Arc::new(lock_for_key);
        self
    }

    /// Reads the proof from `header` instead of `Fencing-Proof`.
    #[must_use]
    pub fn header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }

    /// Whether `proof` proves `token` for the lock of `key`; the reason if not.
    ///
    /// # Errors
    ///
    /// No lock maps to `key`, or the proof is malformed or is not the trusted
    /// key's signature over this token and this lock.
    pub fn check(&self, key: &str, token: u64, proof: &str) -> Result<(), String> {
        let Some(lock) = (self.lock_for_key)(key) else {
            return Err(format!("no lock guards {key}"));
        };
        let bytes =
            URL_SAFE_NO_PAD.decode(proof).map_err(|_| "the proof is not URL-safe base64".to_owned())?;
        let signature = Signature::from_slice(&bytes)
            .map_err(|_| format!("the proof is {} bytes; a signature is 64", bytes.len()))?;
        self.key.0.verify(&message(&lock, token), &signature).map_err(|_| {
            format!("the proof is not the lock service's signature of token {token} for lock {lock:?}")
        })
    }
}

impl fmt::Debug for Ed25519Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ed25519Verifier")
            .field("key", &self.key)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl TokenVerifier for Ed25519Verifier {
    fn verify(&self, raise: &Raise<'_>) -> Verification {
        let mut proofs = raise.headers().get_all(&self.header).iter();
        let proof = match (proofs.next(), proofs.next()) {
            (Some(proof), None) => proof,
            (None, _) => return Verification::refused(format!("a raise needs a {} header", self.header)),
            (Some(_), Some(_)) => return Verification::refused(format!("{} is repeated", self.header)),
        };
        let Ok(proof) = proof.to_str() else {
            return Verification::refused("the proof is not URL-safe base64");
        };
        self.check(raise.key(), raise.token(), proof)
            .map_or_else(Verification::refused, |()| Verification::valid())
    }
}
