//! A payment-provider stand-in: charges customers, counts the charges, and
//! deduplicates requests by their `Idempotency-Key` the way Stripe documents
//! it. Like a real provider it cannot check fencing tokens: a `Fencing-Token`
//! header is ignored. `cargo run -p scenarios -- payments` serves it; the billing scenario
//! (`billing`, feature `billing`) runs it in-process.
//!
//! | route | success | errors |
//! |---|---|---|
//! | `POST /v1/charges`, JSON `{"customer","amount","currency"[,"description"]}`, optional `Idempotency-Key` | 201 the charge `{"id","customer","amount","currency"[,"description"]}`; with a key already done: its first answer again, `Idempotent-Replayed: true`, nothing charged | 400 bad JSON, fields or key; 415 not JSON; 413 over 16 KiB; 422 the key was first used with other parameters; 409 + `Retry-After` a request with the key is still running; 503 + `Retry-After` the key table is full |
//! | `GET /v1/charges[?customer=C]` | 200 `{"data":[charge…]}`, oldest first | 400 another query parameter |
//! | `GET /v1/charges/{id}` | 200 the charge | 404 |
//! | `GET /healthz` | 200 `ok` | |
//!
//! `amount` is in the currency's smallest unit (1 to 99,999,999), `currency` a
//! lowercase ISO 4217 code. A key is 1 to 255 visible ASCII characters.
//! `?delay_ms=N` (0 to 10,000) makes the charge wait before it is made: a slow
//! provider, with the key held meanwhile (a duplicate gets 409).
//!
//! # The idempotency rules (Stripe's)
//!
//! * The first request with a key that *begins executing* (it passed
//!   validation) has its status and body saved; every later request with the
//!   key gets them back, and nothing is charged again. The charge and the saved
//!   answer are made in one step: there is no moment where one exists without
//!   the other.
//! * A request that fails validation saves nothing: it may be retried with the
//!   same key.
//! * The same key with other parameters is refused, not replayed (Stripe's
//!   `idempotency_error`; 422 as the IETF draft
//!   `draft-ietf-httpapi-idempotency-key-header` says), so a bug that reuses
//!   keys cannot silently hide a different charge.
//! * While a request with a key is running, another with the same key gets 409
//!   (the IETF draft's status; Stripe's `idempotency_key_in_use`). If the first
//!   one's client goes away before the charge is made, the key is free again.
//! * Keys are forgotten after [`ProviderConfig::retention`] (Stripe: 24 hours);
//!   after that the same key charges again.
//!
//! Keys are global here (Stripe scopes them per account). Charges live in
//! memory: a restart forgets them.

mod ledger;
mod routes;

use std::time::Duration;

use demo_resource::{Running, Served};

pub use ledger::{Charge, ChargeParams};

/// The answer of a replayed request carries this header, `true` (as Stripe's do).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Largest accepted `amount`.
pub const MAX_AMOUNT: u64 = 99_999_999;
/// Largest accepted body of `POST /v1/charges`, in bytes.
pub const MAX_CHARGE_BODY_BYTES: usize = 16 * 1024;
/// Longest accepted `Idempotency-Key`, in characters (Stripe's limit).
pub const MAX_KEY_CHARS: usize = 255;

/// How long keys are kept, and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderConfig {
    /// How long a key's answer is kept after its first use (default 24 hours).
    pub retention: Duration,
    /// Most keys kept at once; a new key beyond is 503 (default 1,000,000).
    pub max_keys: usize,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self { retention: Duration::from_secs(24 * 3600), max_keys: 1_000_000 }
    }
}

/// The payment provider: its charges and its idempotency table.
#[derive(Debug, Clone)]
pub struct Provider {
    ledger: ledger::Ledger,
}

impl Default for Provider {
    fn default() -> Self {
        Self::new(ProviderConfig::default())
    }
}

impl Provider {
    /// A provider with no charges yet.
    pub fn new(config: ProviderConfig) -> Self {
        Self { ledger: ledger::Ledger::new(config.retention, config.max_keys) }
    }

    /// Every charge made, in order.
    pub fn charges(&self) -> Vec<Charge> {
        self.ledger.charges()
    }

    /// How many requests with an `Idempotency-Key` are running now: their key is
    /// held (a duplicate gets 409) and nothing is charged yet.
    pub fn keys_in_progress(&self) -> usize {
        self.ledger.running()
    }

    /// The routes in the table above.
    pub fn router(&self) -> axum::Router {
        routes::router(self.ledger.clone())
    }
}

/// A provider started by [`Served::spawn`]; dropping it stops the server.
pub type RunningProvider = Running<Provider>;

/// Its [`router`](Provider::router), in the foreground ([`Served::serve`]) or in
/// a background task ([`Served::spawn`]); nothing more to do once its server
/// has stopped.
impl Served for Provider {
    fn router(&self) -> axum::Router {
        Provider::router(self)
    }
}
