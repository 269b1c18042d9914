//! The provider's state, without HTTP: the charges made, and the idempotency
//! table (key → the first request's parameters and, once done, its answer).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What a charge request asks for. Two requests with one idempotency key must
/// ask for the same thing, field by field.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeParams {
    /// Who pays.
    pub customer: String,
    /// How much, in the currency's smallest unit (cents).
    pub amount: u64,
    /// ISO 4217 code, lowercase (`eur`).
    pub currency: String,
    /// Free text shown on the charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A charge the provider made: money moved.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Charge {
    /// `ch_000001`, `ch_000002`… in the order they were made.
    pub id: String,
    /// Who paid.
    pub customer: String,
    /// How much, in the currency's smallest unit.
    pub amount: u64,
    /// The currency.
    pub currency: String,
    /// The request's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A saved answer: status and body, replayed as they were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Saved {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// Where a request with an idempotency key stands.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The key is new: this request runs; the guard gives it back if it does not finish.
    Run(KeyGuard),
    /// Done before: its answer.
    Replay(Saved),
    /// The same key is running now.
    InProgress,
    /// The key was used with other parameters.
    Mismatch,
    /// The table is full of keys younger than the retention.
    Full,
}

#[derive(Debug)]
enum Slot {
    Running(ChargeParams),
    Done(ChargeParams, Saved),
}

#[derive(Debug, Default)]
struct Inner {
    charges: Vec<Charge>,
    keys: HashMap<String, Slot>,
    /// Keys in the order they were first used, for expiry.
    ages: VecDeque<(Instant, String)>,
}

/// The charges and the idempotency table, shared by every request.
#[derive(Debug, Clone)]
pub(crate) struct Ledger {
    inner: Arc<Mutex<Inner>>,
    retention: Duration,
    max_keys: usize,
}

impl Ledger {
    pub(crate) fn new(retention: Duration, max_keys: usize) -> Self {
        Self { inner: Arc::default(), retention, max_keys }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock; a poisoned one still holds consistent data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every charge, in the order made.
    pub(crate) fn charges(&self) -> Vec<Charge> {
        self.lock().charges.clone()
    }

    /// How many requests with a key are running now (claimed, not yet charged).
    pub(crate) fn running(&self) -> usize {
        self.lock().keys.values().filter(|slot| matches!(slot, Slot::Running(_))).count()
    }

    /// Makes a charge (no idempotency key): money moves every time.
    pub(crate) fn charge(&self, params: &ChargeParams) -> Charge {
        make(&mut self.lock(), params)
    }

    /// Claims `key` for a request asking for `params`.
    pub(crate) fn claim(&self, key: &str, params: &ChargeParams) -> Claim {
        let mut inner = self.lock();
        let now = Instant::now();
        expire(&mut inner, now, self.retention);
        match inner.keys.get(key) {
            Some(Slot::Running(first) | Slot::Done(first, _)) if first != params => return Claim::Mismatch,
            Some(Slot::Running(_)) => return Claim::InProgress,
            Some(Slot::Done(_, saved)) => return Claim::Replay(saved.clone()),
            None => {}
        }
        if inner.keys.len() >= self.max_keys {
            return Claim::Full;
        }
        inner.keys.insert(key.to_owned(), Slot::Running(params.clone()));
        inner.ages.push_back((now, key.to_owned()));
        Claim::Run(KeyGuard { ledger: self.clone(), key: Some(key.to_owned()) })
    }
}

/// A running request's hold on its key. [`KeyGuard::charge`] makes the charge
/// and saves the answer in one step; dropped before that (the client went away
/// while the request waited), the key is free again and nothing was charged.
#[derive(Debug)]
pub(crate) struct KeyGuard {
    ledger: Ledger,
    key: Option<String>,
}

impl KeyGuard {
    /// Makes the charge and saves `answer(charge)` as the key's answer, atomically.
    pub(crate) fn charge(mut self, params: &ChargeParams, answer: impl FnOnce(&Charge) -> Saved) -> Saved {
        let key = self.key.take().expect("a guard charges once");
        let mut inner = self.ledger.lock();
        let charge = make(&mut inner, params);
        let saved = answer(&charge);
        inner.keys.insert(key, Slot::Done(params.clone(), saved.clone()));
        saved
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut inner = self.ledger.lock();
            if matches!(inner.keys.get(&key), Some(Slot::Running(_))) {
                inner.keys.remove(&key);
            }
        }
    }
}

fn make(inner: &mut Inner, params: &ChargeParams) -> Charge {
    let charge = Charge {
        id: format!("ch_{:06}", inner.charges.len() + 1),
        customer: params.customer.clone(),
        amount: params.amount,
        currency: params.currency.clone(),
        description: params.description.clone(),
    };
    inner.charges.push(charge.clone());
    charge
}

/// Forgets finished keys first used longer than `retention` ago (a running one stays).
fn expire(inner: &mut Inner, now: Instant, retention: Duration) {
    while let Some((since, _)) = inner.ages.front() {
        if now.saturating_duration_since(*since) < retention {
            break;
        }
        let (_, key) = inner.ages.pop_front().expect("just looked");
        match inner.keys.get(&key) {
            Some(Slot::Running(_)) => {
                // Still running: its answer is kept a full retention from now.
                inner.ages.push_back((now, key));
                break;
            }
            _ => {
                inner.keys.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(customer: &str, amount: u64) -> ChargeParams {
        ChargeParams { customer: customer.into(), amount, currency: "eur".into(), description: None }
    }

    fn saved(charge: &Charge) -> Saved {
        Saved { status: 201, body: charge.id.clone() }
    }

    #[test]
    fn a_key_charges_once_and_replays_its_answer() {
        let ledger = Ledger::new(Duration::from_secs(60), 10);
        let Claim::Run(guard) = ledger.claim("k", &params("c1", 100)) else { panic!("new key") };
        assert!(matches!(ledger.claim("k", &params("c1", 100)), Claim::InProgress));
        assert!(matches!(ledger.claim("k", &params("c1", 101)), Claim::Mismatch));
        let first = guard.charge(&params("c1", 100), saved);
        assert_eq!(first.body, "ch_000001");
        let Claim::Replay(again) = ledger.claim("k", &params("c1", 100)) else { panic!("replay") };
        assert_eq!(again, first);
        assert!(matches!(ledger.claim("k", &params("c2", 100)), Claim::Mismatch));
        assert_eq!(ledger.charges().len(), 1);
    }

    #[test]
    fn a_dropped_request_frees_its_key_without_charging() {
        let ledger = Ledger::new(Duration::from_secs(60), 10);
        let Claim::Run(guard) = ledger.claim("k", &params("c1", 100)) else { panic!() };
        drop(guard);
        assert!(ledger.charges().is_empty());
        assert!(matches!(ledger.claim("k", &params("c1", 999)), Claim::Run(_)));
    }

    #[test]
    fn keys_expire_after_the_retention_and_the_table_is_bounded() {
        let ledger = Ledger::new(Duration::ZERO, 1);
        let Claim::Run(guard) = ledger.claim("k", &params("c1", 100)) else { panic!() };
        guard.charge(&params("c1", 100), saved);
        // Expired at once: the same key charges again, as after a real provider's 24 hours.
        let Claim::Run(guard) = ledger.claim("k", &params("c1", 100)) else { panic!("expired") };
        guard.charge(&params("c1", 100), saved);
        assert_eq!(ledger.charges().len(), 2);

        let full = Ledger::new(Duration::from_secs(60), 1);
        let Claim::Run(_held) = full.claim("a", &params("c1", 1)) else { panic!() };
        assert!(matches!(full.claim("b", &params("c1", 1)), Claim::Full));
    }

    #[test]
    fn without_a_key_every_request_charges() {
        let ledger = Ledger::new(Duration::from_secs(60), 10);
        ledger.charge(&params("c1", 100));
        ledger.charge(&params("c1", 100));
        let ids: Vec<_> = ledger.charges().into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["ch_000001", "ch_000002"]);
    }
}
