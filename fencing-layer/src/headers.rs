//! The header names of the fencing contract, defined once: what the layer reads
//! (`Fencing-Token`, `Fencing-Proof`) and what its refusals carry
//! (`Fencing-Problem`, `Fencing-Highest-Token`).

use http::HeaderName;

/// The header that carries the token unless configured otherwise: `Fencing-Token`.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");

/// The header that carries a token's proof: `Fencing-Proof`, the lock
/// service's signature over (lock name, token), which a verifier such as
/// `verify::Ed25519Verifier` (feature `ed25519`) checks before a raise.
pub const FENCING_PROOF: HeaderName = HeaderName::from_static("fencing-proof");

/// The header on every rejection that names its problem type, e.g.
/// `Fencing-Problem: stale-token` (the last segment of the problem+json `type`):
/// a client tells the layer's 409 from its application's own by this header alone,
/// without reading the body.
pub const FENCING_PROBLEM: HeaderName = HeaderName::from_static("fencing-problem");

/// The header on a stale-token rejection that gives the highest token the
/// resource has seen for the key: proof that a newer holder exists.
pub const FENCING_HIGHEST_TOKEN: HeaderName = HeaderName::from_static("fencing-highest-token");
