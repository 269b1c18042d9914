//! The seed's second failure, end to end: a billing job on a Redis lock charges
//! customers twice, and what fixes it when the payment provider cannot check
//! fencing tokens.
//!
//! Two instances, A and B, run the same billing job for the same customers.
//! Each takes the lock with `SET lock value NX PX ttl` on Redis (with
//! [`fencing_client::RedisLockClient`], whose grant also `INCR`s a token). A is
//! paused mid-run, past its lock's TTL; B takes the lock and runs the job; A
//! wakes up and carries on. The provider is [`crate::payments`]: it deduplicates
//! by `Idempotency-Key` and ignores fencing tokens, as a real one does. The
//! per-run record is in PostgreSQL (a database of the scenario's own, dropped at
//! the end). The rounds ([`default_rounds`]):
//!
//! 1. **Unfenced**: the job reads which customers are not charged yet, charges
//!    them and notes each. B charges what A had not noted; A, awake, charges
//!    the rest of its list again. Customers charged twice.
//! 2. **The record fenced with the token**: before each charge, a
//!    compare-and-set on the run's record marks the customer under the holder's
//!    token; a lower token than the run's is refused. Paused before a mark, A is
//!    refused at its next one and stops: nobody charged twice. Paused between
//!    the mark and the call, A's call still goes out after B's: that customer is
//!    charged twice, and only A's record of it is refused.
//! 3. **Record and idempotency key**: the same, and each charge carries the key
//!    [`fencing_client::idempotency::IdempotencyKey::for_operation`]`(run, "charge:{customer}")`,
//!    the same in both instances: the provider charges once and answers A's
//!    late call with B's charge.
//!
//! [`predict`] is what each round must end with; [`Report::problems`] lists
//! every difference, and `scenarios billing` exits non-zero on any.
//!
//! ```no_run
//! # async fn demo() -> Result<(), scenarios::Failure> {
//! let report = scenarios::billing::run(&scenarios::billing::Options::default()).await?;
//! print!("{report}");
//! assert!(report.problems().is_empty());
//! # Ok(()) }
//! ```

mod history;
mod job;
mod picture;
mod record;
mod redis;
mod report;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencing_client::{LockBackend, LockBackendExt};

use history::Recorder;
pub use history::{Event, MarkOutcome, Recorded};
use job::{Job, Pause};
use record::{Record, TempDb};
pub use report::{Attempt, Instance, Prediction, Report, Round, Stopped, predict};

use crate::failure::{Failure, STEP_BOUND, bounded, fail};
use crate::payments::Provider;
use crate::scenario::Holder;
use demo_resource::Served;

/// The lock's name: its key is `{prefix}lock:{billing}`.
const LOCK: &str = "billing";
/// B's lease, kept alive in the background while B runs the job.
const B_TTL: Duration = Duration::from_secs(3);
const LOOPBACK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// How a round guards the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// The lock alone: no token, no key.
    Unfenced,
    /// A fenced mark in the run's record before each charge.
    Record,
    /// The fenced mark, and an idempotency key on each charge.
    RecordAndKey,
}

/// A step of one customer's part of the job, where a pause can fall before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// Before the fenced mark (unfenced: before the charge, as there is no mark).
    BeforeMark,
    /// After the mark, before the call to the provider.
    BeforeCall,
    /// After the call, before the record of the charge.
    BeforeRecord,
}

/// Where A is paused: before `step` of the customer at index `customer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PausePoint {
    /// The customer's index in the job's order (0-based).
    pub customer: usize,
    /// Before which step.
    pub step: Step,
}

/// What the scenario runs against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The Redis holding the lock; when nothing answers there, a private
    /// `redis-server` is started on an ephemeral loopback port.
    pub redis_url: String,
    /// A PostgreSQL database to connect to first; the run's record goes into a
    /// new database of its own there, dropped at the end.
    pub postgres_url: String,
    /// How many customers the job charges (at least 2).
    pub customers: usize,
    /// A's lock TTL (`PX`); A is paused past it.
    pub ttl: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            redis_url: "redis://127.0.0.1:6379".into(),
            postgres_url: "postgres://postgres@127.0.0.1:5432/postgres?connect_timeout=3".into(),
            customers: 5,
            ttl: Duration::from_millis(300),
        }
    }
}

/// The scenario's rounds for `customers` customers: A is paused at the middle one,
/// before it is charged (1), before its mark and between its mark and the call
/// (2), and between the mark and the call (3).
pub fn default_rounds(customers: usize) -> Vec<(Protection, PausePoint)> {
    let middle = customers / 2;
    let at = |step| PausePoint { customer: middle, step };
    vec![
        (Protection::Unfenced, at(Step::BeforeCall)),
        (Protection::Record, at(Step::BeforeMark)),
        (Protection::Record, at(Step::BeforeCall)),
        (Protection::RecordAndKey, at(Step::BeforeCall)),
    ]
}

/// Runs [`default_rounds`] and reports their outcomes.
///
/// # Errors
///
/// Redis or PostgreSQL cannot be reached (and no private `redis-server` could be
/// started), or a step failed or took longer than 10 s. An unexpected outcome is
/// not an error: see [`Report::problems`].
pub async fn run(options: &Options) -> Result<Report, Failure> {
    let mut scenario = Scenario::connect(options).await?;
    let mut rounds = Vec::new();
    let mut failed = None;
    for (protection, pause) in default_rounds(options.customers) {
        match scenario.round(protection, pause).await {
            Ok(round) => rounds.push(round),
            Err(error) => {
                failed = Some(error);
                break;
            }
        }
    }
    let report = scenario.finish(rounds).await;
    match failed {
        Some(error) => Err(error),
        None => report,
    }
}

/// The servers of a scenario, for running rounds one by one ([`run`] runs the
/// default ones); [`finish`](Self::finish) drops its database and Redis keys.
pub struct Scenario {
    locks: redis::Locks,
    db: Option<TempDb>,
    http: reqwest::Client,
    history: Recorder,
    options: Options,
    next: usize,
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scenario").field("redis", &self.locks.url).field("rounds", &self.next).finish()
    }
}

impl Scenario {
    /// Connects to Redis (or starts a private one) and creates the record's database.
    ///
    /// # Errors
    ///
    /// As [`run`]; also fewer than 2 customers.
    pub async fn connect(options: &Options) -> Result<Self, Failure> {
        if options.customers < 2 {
            return Err(Failure("the job needs at least 2 customers".into()));
        }
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let unique = format!("{}_{nanos}", std::process::id());
        let locks = redis::connect(&options.redis_url, &format!("fencing-billing-{unique}:")).await?;
        let db = TempDb::create(&options.postgres_url, &format!("fencing_billing_{unique}")).await?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(STEP_BOUND)
            .build()
            .map_err(|e| fail("http client", e))?;
        Ok(Self { locks, db: Some(db), http, history: Recorder::new(), options: options.clone(), next: 0 })
    }

    /// One round: a fresh provider, A paused at `pause`, B taking over.
    ///
    /// # Errors
    ///
    /// A step failed or took longer than 10 s; `pause` is past the last customer.
    pub async fn round(&mut self, protection: Protection, pause: PausePoint) -> Result<Round, Failure> {
        if pause.customer >= self.options.customers {
            return Err(Failure(format!("no customer {} to pause at", pause.customer)));
        }
        let index = self.next;
        self.next += 1;
        let db = self.db.as_ref().ok_or_else(|| Failure("finished".into()))?;
        let provider = Provider::default().spawn(LOOPBACK).await.map_err(|e| fail("provider", e))?;
        let customers: Arc<[String]> = (1..=self.options.customers).map(|n| format!("cus_{n}")).collect();
        let job = Job {
            run: format!("billing-run-{}", index + 1),
            customers: Arc::clone(&customers),
            protection,
            provider: provider.base_url(),
            amount: 1999,
            http: self.http.clone(),
            history: self.history.clone(),
        };
        let history = &self.history;
        history.note(Event::RoundStarted(index));
        let client = &self.locks.client;
        let (a_record, b_record) = (Record::connect(&db.config).await?, Record::connect(&db.config).await?);

        // A takes the lock and starts; nothing keeps its lease alive (it is about to be paused).
        let a = client.acquire(LOCK, "A", self.options.ttl).await.map_err(|e| fail("A takes the lock", e))?;
        history.note(Event::Granted { holder: Holder::A, token: a.token });
        let (a_pause, control) = Pause::new(pause);
        // Aborted if this round fails early: a paused A must not wake up into the next round.
        let mut a_job =
            AbortOnDrop(tokio::spawn(job::run(job.clone(), a_record, Holder::A, a.token, Some(a_pause))));
        if bounded("A reaches its pause", control.reached).await?.is_err() {
            // A ended without pausing: its own error says why.
            let ended = bounded("A ends", &mut a_job.0).await?.map_err(|e| fail("A's job", e))?;
            return Err(Failure(format!("A never reached its pause point: {:?}", ended.err())));
        }

        // A's lease runs out while A is paused; B takes the lock and runs the whole job.
        bounded("A's lock expires", async {
            loop {
                match client.lock_status(LOCK).await.map_err(|e| fail("lock status", e))? {
                    None => return Ok(()),
                    Some(status) => tokio::time::sleep(status.expires_in.max(Duration::from_millis(1))).await,
                }
            }
        })
        .await??;
        history.note(Event::Expired { holder: Holder::A });
        let b_lease = client.lease(LOCK, "B", B_TTL).await.map_err(|e| fail("B takes the lock", e))?;
        history.note(Event::Granted { holder: Holder::B, token: b_lease.token() });
        let b_job = job::run(job.clone(), b_record, Holder::B, b_lease.token(), None);
        let b = bounded("B's job", b_lease.run(b_job)).await?.map_err(|e| fail("B lost its lease", e))??;
        b_lease.release().await.map_err(|e| fail("B releases", e))?;
        history.note(Event::Released { holder: Holder::B });

        // A wakes up, still believing it holds the lock, and carries on.
        let _ = control.resume.send(());
        let a = bounded("A's job", &mut a_job.0).await?.map_err(|e| fail("A's job", e))??;
        history.note(Event::RoundEnded(index));
        let charges = provider.served().charges();
        provider.shutdown().await.map_err(|e| fail("provider shutdown", e))?;
        Ok(Round { protection, pause, run: job.run, customers: customers.to_vec(), a, b, charges })
    }

    /// Drops the database and this scenario's Redis keys (and stops a private
    /// Redis); reports `rounds` with the history.
    ///
    /// # Errors
    ///
    /// The database could not be dropped.
    pub async fn finish(mut self, rounds: Vec<Round>) -> Result<Report, Failure> {
        let client = &self.locks.client;
        let mut connection = client.connection().clone();
        let keys = [client.lock_key(LOCK), client.counter_key(LOCK)];
        let deleted: Result<(), _> =
            fencing_client::drivers::redis::cmd("DEL").arg(&keys).query_async(&mut connection).await;
        if let Err(error) = deleted {
            tracing::warn!(%error, ?keys, "could not delete the scenario's Redis keys");
        }
        if let Some(db) = self.db.take() {
            db.drop_now().await?;
        }
        let redis = if self.locks.private {
            format!(
                "{} (a private redis-server: none answered at {})",
                self.locks.url, self.options.redis_url
            )
        } else {
            self.locks.url.clone()
        };
        Ok(Report {
            redis,
            lock_key: client.lock_key(LOCK),
            ttl_ms: u64::try_from(self.options.ttl.as_millis()).unwrap_or(u64::MAX),
            rounds,
            history: self.history.take(),
        })
    }
}

/// A task aborted when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
