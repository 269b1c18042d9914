//! The billing job one instance runs: charge every customer of the run, in
//! order, guarded as the round says. It never asks whether it still holds the
//! lock: that check could not help (the pause can fall right after it).

use std::sync::Arc;

use fencing_client::{header::fence_reqwest, idempotency::FencedOperation};
use serde_json::json;
use tokio::sync::oneshot;

use super::history::{Event, MarkOutcome, Recorder};
use super::record::{MarkReply, Record};
use super::{Attempt, Instance, PausePoint, Protection, Step, Stopped};
use crate::failure::Failure;
use crate::payments::{Charge, REPLAYED_HEADER};
use crate::scenario::Holder;

/// What every instance of one round's job shares.
#[derive(Clone)]
pub(super) struct Job {
    pub(super) run: String,
    pub(super) customers: Arc<[String]>,
    pub(super) protection: Protection,
    pub(super) provider: String,
    pub(super) amount: u64,
    pub(super) http: reqwest::Client,
    pub(super) history: Recorder,
}

/// Stops an instance dead at one point of its job until the scenario resumes it.
pub(super) struct Pause {
    at: PausePoint,
    reached: Option<oneshot::Sender<()>>,
    resume: Option<oneshot::Receiver<()>>,
}

/// The scenario's side of a [`Pause`].
pub(super) struct PauseControl {
    /// Fires when the instance has stopped at its pause point.
    pub(super) reached: oneshot::Receiver<()>,
    /// Send to let it run on.
    pub(super) resume: oneshot::Sender<()>,
}

impl Pause {
    pub(super) fn new(at: PausePoint) -> (Self, PauseControl) {
        let (reached_tx, reached) = oneshot::channel();
        let (resume, resume_rx) = oneshot::channel();
        (Self { at, reached: Some(reached_tx), resume: Some(resume_rx) }, PauseControl { reached, resume })
    }

    /// Stops here if this is the pause point (once).
    async fn check(&mut self, here: PausePoint, job: &Job, holder: Holder) {
        if here != self.at {
            return;
        }
        let (Some(reached), Some(resume)) = (self.reached.take(), self.resume.take()) else { return };
        job.history.note(Event::Paused { holder, at: here });
        let _ = reached.send(());
        // A dropped control lets it run on too: the scenario is ending anyway.
        let _ = resume.await;
        job.history.note(Event::Resumed { holder });
    }

    async fn steps(&mut self, customer: usize, steps: &[Step], job: &Job, holder: Holder) {
        for &step in steps {
            self.check(PausePoint { customer, step }, job, holder).await;
        }
    }
}

/// Runs the job as `holder`, whose lock grant carries `token`, on its own
/// connection to the record; pauses at `pause`'s point if given.
pub(super) async fn run(
    job: Job,
    mut record: Record,
    holder: Holder,
    token: u64,
    mut pause: Option<Pause>,
) -> Result<Instance, Failure> {
    let mut instance = Instance { holder, token, charges: Vec::new(), stopped: None };
    let mut pause_at = async |customer: usize, steps: &[Step]| {
        if let Some(pause) = pause.as_mut() {
            pause.steps(customer, steps, &job, holder).await;
        }
    };
    if job.protection == Protection::Unfenced {
        // The naive job: what is not charged yet, read once at the start; no token anywhere.
        let pending = record.uncharged(&job.run, &job.customers).await?;
        for customer in pending {
            let index = job.customers.iter().position(|c| *c == customer).unwrap_or_default();
            pause_at(index, &[Step::BeforeMark, Step::BeforeCall]).await;
            let charge = charge(&job, holder, None, &customer).await?;
            instance.charges.push(charge.clone());
            pause_at(index, &[Step::BeforeRecord]).await;
            record.note_charged(&job.run, &customer, &charge.charge_id).await?;
        }
        return Ok(instance);
    }
    for (index, customer) in job.customers.iter().enumerate() {
        pause_at(index, &[Step::BeforeMark]).await;
        let marked = record.mark(&job.run, customer, token).await?;
        let outcome = match marked {
            MarkReply::Marked => MarkOutcome::Marked,
            MarkReply::AlreadyCharged => MarkOutcome::Skipped,
            MarkReply::Refused { highest } => MarkOutcome::Refused(highest),
        };
        job.history.note(Event::Marked { holder, customer: customer.clone(), token, outcome });
        match marked {
            MarkReply::Marked => {}
            MarkReply::AlreadyCharged => continue,
            MarkReply::Refused { highest } => {
                instance.stopped = Some(Stopped::MarkRefused { customer: customer.clone(), highest });
                return Ok(instance);
            }
        }
        pause_at(index, &[Step::BeforeCall]).await;
        let operation = FencedOperation::new(token, &job.run, &format!("charge:{customer}"));
        let with_key = job.protection == Protection::RecordAndKey;
        let charge = charge(&job, holder, Some((&operation, with_key)), customer).await?;
        instance.charges.push(charge.clone());
        pause_at(index, &[Step::BeforeRecord]).await;
        let refused = record.complete(&job.run, customer, token, &charge.charge_id).await?;
        job.history.note(Event::Completed { holder, customer: customer.clone(), refused });
        if let Some(highest) = refused {
            instance.stopped = Some(Stopped::RecordRefused { customer: customer.clone(), highest });
            return Ok(instance);
        }
    }
    Ok(instance)
}

/// `POST /v1/charges` for `customer`: with the token (and, if asked, the
/// operation's idempotency key) when fenced, bare when not.
async fn charge(
    job: &Job,
    holder: Holder,
    fenced: Option<(&FencedOperation, bool)>,
    customer: &str,
) -> Result<Attempt, Failure> {
    let fail = |e: &dyn std::fmt::Display| Failure(format!("{holder} charges {customer}: {e}"));
    let body = json!({
        "customer": customer,
        "amount": job.amount,
        "currency": "eur",
        "description": format!("billing run {}", job.run),
    });
    let request = job.http.post(format!("{}/v1/charges", job.provider)).json(&body);
    let request = match fenced {
        None => request,
        Some((operation, true)) => operation.reqwest(request),
        // The token only: the provider ignores it, as a real one would.
        Some((operation, false)) => fence_reqwest(request, operation.token()),
    };
    let response = request.send().await.map_err(|e| fail(&e))?;
    let status = response.status();
    let replayed = response.headers().get(REPLAYED_HEADER).is_some_and(|v| v == "true");
    let text = response.text().await.map_err(|e| fail(&e))?;
    if !status.is_success() {
        return Err(fail(&format!("{status}: {text}")));
    }
    let charge: Charge = serde_json::from_str(&text).map_err(|e| fail(&e))?;
    job.history.note(Event::Charged {
        holder,
        customer: customer.to_owned(),
        charge_id: charge.id.clone(),
        replayed,
    });
    let idempotency_key = match fenced {
        Some((operation, true)) => Some(operation.key().to_string()),
        _ => None,
    };
    Ok(Attempt { customer: customer.to_owned(), charge_id: charge.id, replayed, idempotency_key })
}
