//! What each round did, what it should have done, and the printed report.

use std::fmt;

use super::history::Recorded;
use super::{PausePoint, Protection, Step};
use crate::payments::Charge;
use crate::scenario::{Holder, Quoted};

/// One charge request an instance made, and the provider's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Whom.
    pub customer: String,
    /// The charge the provider answered with.
    pub charge_id: String,
    /// The answer was a replay of an earlier one (same idempotency key): no money moved.
    pub replayed: bool,
    /// The `Idempotency-Key` it carried, if any.
    pub idempotency_key: Option<String>,
}

/// Why an instance stopped before the end of its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Its fenced mark of `customer` was refused: the run had seen `highest`.
    MarkRefused {
        /// Whom it was about to charge.
        customer: String,
        /// The run's token.
        highest: u64,
    },
    /// Its fenced record of `customer`'s charge was refused (the charge was made).
    RecordRefused {
        /// Whom it had just charged.
        customer: String,
        /// The run's token.
        highest: u64,
    },
}

/// One instance's run of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// A (paused) or B (took over).
    pub holder: Holder,
    /// Its lock grant's token.
    pub token: u64,
    /// Every charge request it made, in order.
    pub charges: Vec<Attempt>,
    /// Why it stopped early, if it did.
    pub stopped: Option<Stopped>,
}

impl Instance {
    fn customers(&self) -> Vec<&str> {
        self.charges.iter().map(|attempt| attempt.customer.as_str()).collect()
    }
}

/// One round: both instances, and what the provider charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// How the job was guarded.
    pub protection: Protection,
    /// Where A was paused.
    pub pause: PausePoint,
    /// The run's name (the record's key and the idempotency keys' run).
    pub run: String,
    /// The customers, in the job's order.
    pub customers: Vec<String>,
    /// The paused instance.
    pub a: Instance,
    /// The one that took over.
    pub b: Instance,
    /// Every charge the provider made in this round, in order.
    pub charges: Vec<Charge>,
}

/// What a round should end with, from its protection and where the pause fell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// Charges per customer, in the job's order.
    pub charges: Vec<usize>,
    /// At which step A is stopped by a refusal (`None`: it runs to the end).
    pub a_stopped_at: Option<Step>,
}

/// The outcome a round must have: the model the scenario and its tests check
/// the real run against.
///
/// * Unfenced: B charges everyone A had not recorded as charged when B read the
///   list, and A, awake, charges the rest of its own list: every customer from
///   the pause on is charged twice; nothing stops A.
/// * The record alone: paused before its mark, A's mark is refused and nobody is
///   charged twice. Paused after the mark (before the call, or after it and before
///   its record of the charge), B finds the customer still "charging" and
///   charges; so does A (or did): that customer is charged twice, and A's
///   record of it is refused.
/// * Record and key: everyone is charged once, wherever the pause fell; A
///   stops at the same refusal as with the record alone.
pub fn predict(protection: Protection, customers: usize, pause: PausePoint) -> Prediction {
    let mut charges = vec![1; customers];
    let at = pause.customer.min(customers);
    let a_stopped_at = match protection {
        Protection::Unfenced => {
            charges[at..].iter_mut().for_each(|n| *n = 2);
            None
        }
        Protection::Record | Protection::RecordAndKey => match pause.step {
            Step::BeforeMark => Some(Step::BeforeMark),
            Step::BeforeCall | Step::BeforeRecord => {
                if protection == Protection::Record
                    && let Some(n) = charges.get_mut(at)
                {
                    *n = 2;
                }
                Some(Step::BeforeRecord)
            }
        },
    };
    Prediction { charges, a_stopped_at }
}

impl Round {
    /// How many charges each customer got, in the job's order.
    pub fn counts(&self) -> Vec<usize> {
        let count = |customer: &String| self.charges.iter().filter(|c| c.customer == *customer).count();
        self.customers.iter().map(count).collect()
    }

    /// The customers charged more than once.
    pub fn charged_twice(&self) -> Vec<&str> {
        let counts = self.counts();
        self.customers.iter().zip(counts).filter(|(_, n)| *n > 1).map(|(c, _)| c.as_str()).collect()
    }

    /// What this round should have ended with.
    pub fn prediction(&self) -> Prediction {
        predict(self.protection, self.customers.len(), self.pause)
    }

    /// Every way this round differs from its prediction.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let predicted = self.prediction();
        let name = self.title();
        if self.counts() != predicted.charges {
            problems.push(format!(
                "{name}: charges per customer {:?} (got {:?})",
                predicted.charges,
                self.counts()
            ));
        }
        let stopped_at = self.a.stopped.as_ref().map(|stopped| match stopped {
            Stopped::MarkRefused { .. } => Step::BeforeMark,
            Stopped::RecordRefused { .. } => Step::BeforeRecord,
        });
        if stopped_at != predicted.a_stopped_at {
            problems.push(format!(
                "{name}: A stopped by a refusal at {:?} (got {stopped_at:?})",
                predicted.a_stopped_at
            ));
        }
        if self.b.stopped.is_some() {
            problems.push(format!("{name}: B runs to the end (got {:?})", self.b.stopped));
        }
        if self.protection != Protection::Unfenced
            && let Some(Stopped::MarkRefused { highest, .. } | Stopped::RecordRefused { highest, .. }) =
                &self.a.stopped
            && *highest != self.b.token
        {
            problems.push(format!("{name}: A is refused for B's token {} (got {highest})", self.b.token));
        }
        if self.protection == Protection::RecordAndKey {
            // Whoever asked, a customer's every request carried one key, and every answer names one charge.
            let mut keys = Vec::new();
            for customer in &self.customers {
                let attempts: Vec<&Attempt> = [&self.a, &self.b]
                    .iter()
                    .flat_map(|i| &i.charges)
                    .filter(|attempt| attempt.customer == *customer)
                    .collect();
                let ids: Vec<&str> = attempts.iter().map(|attempt| attempt.charge_id.as_str()).collect();
                if ids.windows(2).any(|pair| pair[0] != pair[1]) {
                    problems
                        .push(format!("{name}: every answer for {customer} names one charge (got {ids:?})"));
                }
                let customer_keys: Vec<Option<&str>> =
                    attempts.iter().map(|attempt| attempt.idempotency_key.as_deref()).collect();
                if customer_keys.iter().any(Option::is_none) || customer_keys.windows(2).any(|p| p[0] != p[1])
                {
                    problems.push(format!(
                        "{name}: both instances send {customer}'s charge with one key (got {customer_keys:?})"
                    ));
                }
                keys.extend(customer_keys.first().copied().flatten());
            }
            let distinct: std::collections::BTreeSet<&str> = keys.iter().copied().collect();
            if distinct.len() != keys.len() {
                problems.push(format!("{name}: each customer's charge has a key of its own (got {keys:?})"));
            }
        }
        problems
    }

    /// The round's one-line name, as printed.
    pub fn title(&self) -> String {
        let customer = self.customers.get(self.pause.customer).map_or("?", String::as_str);
        let guard = match self.protection {
            Protection::Unfenced => "unfenced",
            Protection::Record => "fenced record",
            Protection::RecordAndKey => "fenced record + idempotency key",
        };
        let pause = match (self.protection, self.pause.step) {
            (Protection::Unfenced, Step::BeforeMark | Step::BeforeCall) => {
                format!("before charging {customer}")
            }
            (_, Step::BeforeMark) => format!("before marking {customer}"),
            (_, Step::BeforeCall) => format!("between marking {customer} and charging it"),
            (_, Step::BeforeRecord) => format!("between charging {customer} and recording it"),
        };
        format!("{guard}, A paused {pause}")
    }
}

/// The whole scenario's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Where the lock lived (`redis://…`), and whether the scenario started that Redis itself.
    pub redis: String,
    /// The lock key (`SET key value NX PX ttl`).
    pub lock_key: String,
    /// A's lock TTL, in milliseconds.
    pub ttl_ms: u64,
    /// The rounds, in order.
    pub rounds: Vec<Round>,
    /// What happened when.
    pub history: Vec<Recorded>,
}

impl Report {
    /// Every way the outcomes differ from the predicted ones (empty when all is well).
    pub fn problems(&self) -> Vec<String> {
        self.rounds.iter().flat_map(Round::problems).collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let customers = self.rounds.first().map_or(0, |round| round.customers.len());
        writeln!(
            f,
            "billing job for {customers} customers; lock: SET {} <id> NX PX {} on {}",
            self.lock_key, self.ttl_ms, self.redis
        )?;
        for round in &self.rounds {
            write_round(f, round)?;
        }
        Ok(())
    }
}

fn write_round(f: &mut fmt::Formatter<'_>, round: &Round) -> fmt::Result {
    let counts: Vec<String> =
        round.customers.iter().zip(round.counts()).map(|(customer, n)| format!("{customer}:{n}")).collect();
    writeln!(
        f,
        "{}: {} charges [{}]; charged twice: {}",
        round.title(),
        round.charges.len(),
        counts.join(" "),
        Quoted(&round.charged_twice())
    )?;
    let (a, b) = (&round.a, &round.b);
    writeln!(
        f,
        "  A (token {}) charged {}; B (token {}) charged {}",
        a.token,
        Quoted(&a.customers()),
        b.token,
        Quoted(&b.customers())
    )?;
    match &a.stopped {
        None if round.protection == Protection::Unfenced => {
            writeln!(f, "  A woke up and went on charging its list: nothing refused it")
        }
        None => writeln!(f, "  A was never refused"),
        Some(Stopped::MarkRefused { customer, highest }) => writeln!(
            f,
            "  A woke up; its mark of {customer} was refused (token {} < the run's {highest}), so it stopped",
            a.token
        ),
        Some(Stopped::RecordRefused { customer, highest }) => {
            let attempt = a.charges.iter().rev().find(|attempt| attempt.customer == *customer);
            let call = match attempt {
                Some(Attempt { charge_id, replayed: true, idempotency_key, .. }) => {
                    let key = idempotency_key.as_deref().unwrap_or_default();
                    let key = key.get(..12).unwrap_or(key);
                    format!(
                        "its charge of {customer} (Idempotency-Key {key}…, as B's) was answered with {charge_id}, a replay: no money moved"
                    )
                }
                Some(Attempt { charge_id, .. }) => {
                    format!(
                        "its charge of {customer} went through as {charge_id} (the provider cannot check tokens)"
                    )
                }
                None => format!("it never charged {customer}"),
            };
            writeln!(
                f,
                "  A woke up: {call}; then its record of it was refused (token {} < the run's {highest}), so it stopped",
                a.token
            )
        }
    }
}
