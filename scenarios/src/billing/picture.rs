//! The billing rounds as one timeline: the Redis lock's grants and expiries,
//! each instance's lease and A's pause, each charge and whether it moved money
//! twice, each refusal by the run's record, and the record's token.

use std::collections::HashMap;
use std::time::Duration;

use super::history::{Event, MarkOutcome, Recorded};
use super::{Protection, Report, Round, Step};
use crate::scenario::Holder;
use crate::timeline::{BarKind, Lane, Scale, Timeline, Tone};

struct Lanes {
    lock: Lane,
    a: Lane,
    b: Lane,
    record: Lane,
    provider: Lane,
}

impl Lanes {
    fn of(&self, holder: Holder) -> Lane {
        match holder {
            Holder::A => self.a,
            Holder::B => self.b,
        }
    }
}

fn slot(holder: Holder) -> usize {
    match holder {
        Holder::A => 0,
        Holder::B => 1,
    }
}

/// What is open while the history is read.
#[derive(Default)]
struct Open {
    round: Option<(usize, Duration)>,
    lease: [Option<(Duration, u64)>; 2],
    pause: Option<Duration>,
    /// The run record's token since when (`None` inside: unfenced, no token).
    record: Option<(Duration, Option<u64>)>,
    /// Real charges per customer in this round.
    charged: HashMap<String, usize>,
}

fn heading(number: usize, round: &Round) -> String {
    let twice = round.charged_twice();
    let outcome = match twice.len() {
        0 => "everyone charged once".to_owned(),
        _ => format!("{} charged twice", twice.join(", ")),
    };
    let guard = match (round.protection, round.pause.step) {
        (Protection::Unfenced, _) => "unfenced",
        (Protection::Record, Step::BeforeMark) => "record, paused before a mark",
        (Protection::Record, _) => "record, paused after the mark",
        (Protection::RecordAndKey, _) => "record + key",
    };
    format!("{number} · {guard}: {outcome}")
}

impl Report {
    /// The rounds as one timeline picture ([`Timeline::to_svg`] draws it).
    pub fn timeline(&self) -> Timeline {
        let mut timeline = Timeline::new(
            "A billing job on a Redis lock, paused past its TTL: who charges whom, and how often",
        );
        timeline.caption(format!(
            "A takes the lock (SET … NX PX {}) and is paused mid-run; B takes the lock and runs the job; A wakes up and carries on.",
            self.ttl_ms
        ));
        timeline.caption(
            "The provider cannot check tokens: only the run's record (compare-and-set on the token) and the idempotency key can stop A.",
        );
        timeline.caption(
            "Times are the run's own (ms since it started); where events crowd they are spaced evenly, where nothing happens the gap is shortened (≈).",
        );
        timeline.scale(Scale { min_gap: 26.0, ..Scale::default() });
        timeline
            .bar_legend(BarKind::Lease, "lock held (by Redis's clock)")
            .bar_legend(BarKind::Mark, "the run's token in its record")
            .bar_legend(BarKind::NoMark, "unfenced: no token")
            .tone_legend(Tone::Stored, "charged")
            .tone_legend(Tone::StaleStored, "charged again")
            .tone_legend(Tone::Refused, "refused by the record")
            .tone_legend(Tone::Waited, "replayed: not charged again")
            .tone_legend(Tone::Lock, "Redis")
            .tone_legend(Tone::Neutral, "expired")
            .flag_legend("a customer charged twice");
        let lanes = Lanes {
            lock: timeline.lane("Redis lock"),
            a: timeline.lane("instance A"),
            b: timeline.lane("instance B"),
            record: timeline.lane("run record"),
            provider: timeline.lane("provider"),
        };
        let mut open = Open::default();
        for Recorded { at, what } in &self.history {
            self.draw(&mut timeline, &lanes, &mut open, *at, what);
        }
        timeline
    }

    fn draw(&self, timeline: &mut Timeline, lanes: &Lanes, open: &mut Open, at: Duration, what: &Event) {
        match what {
            Event::RoundStarted(index) => {
                *open = Open { round: Some((*index, at)), ..Open::default() };
                let unfenced = self.rounds.get(*index).is_some_and(|r| r.protection == Protection::Unfenced);
                if unfenced {
                    open.record = Some((at, None));
                }
            }
            Event::RoundEnded(index) => {
                if let (Some((_, since)), Some(round)) = (open.round.take(), self.rounds.get(*index)) {
                    timeline.section(since, at, heading(index + 1, round));
                }
                close_record(timeline, lanes, open, at);
            }
            Event::Granted { holder, token } => {
                timeline.point(lanes.lock, at, Tone::Lock, format!("grant {holder}: token {token}"));
                open.lease[slot(*holder)] = Some((at, *token));
            }
            Event::Expired { holder } => {
                timeline.point(lanes.lock, at, Tone::Neutral, format!("{holder}'s lock expired"));
                end_lease(timeline, lanes, open, *holder, at);
            }
            Event::Released { holder } => {
                timeline.point(lanes.lock, at, Tone::Lock, format!("{holder} released"));
                end_lease(timeline, lanes, open, *holder, at);
            }
            Event::Paused { .. } => open.pause = Some(at),
            Event::Resumed { holder } => {
                if let Some(since) = open.pause.take() {
                    timeline.bar(lanes.of(*holder), since, at, BarKind::Pause, "paused (GC, SIGSTOP…)");
                }
            }
            Event::Marked { holder, customer, token, outcome } => match outcome {
                MarkOutcome::Refused(highest) => {
                    timeline.point(
                        lanes.of(*holder),
                        at,
                        Tone::Refused,
                        format!("mark {customer} → refused ({highest})"),
                    );
                }
                MarkOutcome::Marked | MarkOutcome::Skipped => {
                    let current = open.record.and_then(|(_, token)| token);
                    if current.is_none_or(|current| *token > current) {
                        close_record(timeline, lanes, open, at);
                        open.record = Some((at, Some(*token)));
                    }
                }
            },
            Event::Charged { holder, customer, charge_id, replayed } => {
                let lane = lanes.of(*holder);
                if *replayed {
                    let label = format!("{customer}: replay of {charge_id}");
                    timeline.point(lane, at, Tone::Waited, label);
                    return;
                }
                let count = open.charged.entry(customer.clone()).or_default();
                *count += 1;
                if *count == 1 {
                    timeline.point(lane, at, Tone::Stored, format!("charge {customer}"));
                } else {
                    timeline.point(lane, at, Tone::StaleStored, format!("charge {customer} again!"));
                    timeline
                        .point(
                            lanes.provider,
                            at,
                            Tone::StaleStored,
                            format!("{charge_id}: {customer} ×{count}"),
                        )
                        .flag("charged twice");
                }
            }
            Event::Completed { holder, customer, refused: Some(highest) } => {
                let label = format!("record {customer} → refused ({highest})");
                timeline.point(lanes.of(*holder), at, Tone::Refused, label);
            }
            Event::Completed { refused: None, .. } => {}
        }
    }
}

fn end_lease(timeline: &mut Timeline, lanes: &Lanes, open: &mut Open, holder: Holder, at: Duration) {
    if let Some((since, token)) = open.lease[slot(holder)].take() {
        timeline.bar(lanes.of(holder), since, at, BarKind::Lease, format!("lock, token {token}"));
    }
}

fn close_record(timeline: &mut Timeline, lanes: &Lanes, open: &mut Open, at: Duration) {
    match open.record.take() {
        Some((since, Some(token))) => {
            timeline.bar(lanes.record, since, at, BarKind::Mark, format!("run's token {token}"))
        }
        Some((since, None)) => timeline.bar(lanes.record, since, at, BarKind::NoMark, "no token: unfenced"),
        None => {}
    }
}
