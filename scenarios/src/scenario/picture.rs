//! The scenario's three rounds as one timeline: the lock service's grants and
//! expiries, each client's lease and pause, each write with its token and
//! outcome, and the resource's mark, at the times the run recorded.

use std::time::Duration;

use super::Report;
use super::record::{Happening, Holder, Recorded, Round};
use crate::timeline::{BarKind, Lane, Timeline, Tone};

/// The lanes of the picture.
struct Lanes {
    lock: Lane,
    a: Lane,
    b: Lane,
    resource: Lane,
}

impl Lanes {
    fn client(&self, holder: Holder) -> Lane {
        match holder {
            Holder::A => self.a,
            Holder::B => self.b,
        }
    }
}

fn heading(round: Round) -> &'static str {
    match round {
        Round::WithoutFencing => "1 · without fencing: the stale write is stored",
        Round::WithFencing => "2 · with fencing: the stale write gets 409",
        Round::InFlight => "3 · A's write in flight: B waits at the door",
    }
}

/// What is still open while the history is read: started and not yet drawn.
#[derive(Default)]
struct Open {
    round: Option<(Round, Duration)>,
    /// Per holder: when its lease was granted, and the token.
    lease: [Option<(Duration, u64)>; 2],
    /// Per holder: since when it is inside the handler or waiting at the door.
    write: [Option<(Duration, BarKind)>; 2],
    /// The mark seen last, and since when.
    mark: Option<(Duration, Option<u64>)>,
    /// The highest token of a write stored in this round.
    highest_stored: Option<u64>,
}

fn slot(holder: Holder) -> usize {
    match holder {
        Holder::A => 0,
        Holder::B => 1,
    }
}

impl Report {
    /// The three rounds as one timeline picture ([`Timeline::to_svg`] draws it).
    pub fn timeline(&self) -> Timeline {
        let mut timeline =
            Timeline::new("The paused lease holder, three times: fencing tokens at the resource");
        timeline.caption(
            "A takes a lease and is paused past its TTL; B takes the lock and writes; A wakes up and writes with its old token.",
        );
        timeline.caption(
            "Times are the run's own (ms since it started); where events crowd they are spaced evenly, where nothing happens the gap is shortened (≈).",
        );
        let lanes = Lanes {
            lock: timeline.lane("lock service"),
            a: timeline.lane("client A"),
            b: timeline.lane("client B"),
            resource: timeline.lane("resource"),
        };
        let mut open = Open::default();
        for Recorded { at, what } in &self.history {
            draw(&mut timeline, &lanes, &mut open, *at, what);
        }
        timeline
    }
}

fn draw(timeline: &mut Timeline, lanes: &Lanes, open: &mut Open, at: Duration, what: &Happening) {
    match *what {
        Happening::RoundStarted(round) => {
            *open = Open { round: Some((round, at)), ..Open::default() };
        }
        Happening::RoundEnded(round) => {
            if let Some((_, since)) = open.round.take() {
                timeline.section(since, at, heading(round));
            }
            close_mark(timeline, lanes, open, at);
        }
        Happening::Granted { holder, token } => {
            timeline.point(lanes.lock, at, Tone::Lock, format!("grant {holder}: token {token}"));
            open.lease[slot(holder)] = Some((at, token));
            // In the first two rounds A is paused from its grant until its write.
            if holder == Holder::A && !matches!(open.round, Some((Round::InFlight, _))) {
                open.write[slot(holder)] = Some((at, BarKind::Pause));
            }
        }
        Happening::Expired { holder } => {
            timeline.point(lanes.lock, at, Tone::Neutral, format!("{holder}'s lease expired"));
            end_lease(timeline, lanes, open, holder, at);
        }
        Happening::Released { holder } => {
            timeline.point(lanes.lock, at, Tone::Lock, format!("{holder} released"));
            end_lease(timeline, lanes, open, holder, at);
        }
        Happening::WriteSent { holder, .. } => {
            if let Some((since, BarKind::Pause)) = open.write[slot(holder)].take() {
                timeline.bar(lanes.client(holder), since, at, BarKind::Pause, "paused (GC, SIGSTOP…)");
            }
        }
        Happening::WriteInside { holder } => {
            open.write[slot(holder)] = Some((at, BarKind::Inside));
        }
        Happening::WriteAtDoor { holder } => {
            open.write[slot(holder)] = Some((at, BarKind::Waiting));
        }
        Happening::WriteAnswered { holder, token, status } => {
            let lane = lanes.client(holder);
            let mut waited = false;
            if let Some((since, kind)) = open.write[slot(holder)].take() {
                let label = match kind {
                    BarKind::Waiting => "waiting at the door",
                    _ => "inside the handler",
                };
                timeline.bar(lane, since, at, kind, label);
                waited = kind == BarKind::Waiting;
            }
            let stored = (200..300).contains(&status);
            let stale = stored && open.highest_stored.is_some_and(|highest| token < highest);
            let (tone, outcome) = match (stored, stale, waited) {
                (true, true, _) => (Tone::StaleStored, format!("{status} stored after a newer token!")),
                (true, false, true) => (Tone::Waited, format!("{status} stored after waiting")),
                (true, false, false) => (Tone::Stored, format!("{status} stored")),
                (false, ..) if status == 409 => (Tone::Refused, "409 stale: refused".to_owned()),
                (false, ..) => (Tone::Refused, format!("{status} refused")),
            };
            timeline.point(lane, at, tone, format!("write, token {token} → {outcome}"));
            if stored {
                open.highest_stored = open.highest_stored.max(Some(token));
            }
        }
        Happening::Mark(mark) => {
            close_mark(timeline, lanes, open, at);
            open.mark = Some((at, mark));
        }
    }
}

fn end_lease(timeline: &mut Timeline, lanes: &Lanes, open: &mut Open, holder: Holder, at: Duration) {
    if let Some((since, token)) = open.lease[slot(holder)].take() {
        timeline.bar(lanes.client(holder), since, at, BarKind::Lease, format!("lease, token {token}"));
    }
}

fn close_mark(timeline: &mut Timeline, lanes: &Lanes, open: &mut Open, at: Duration) {
    match open.mark.take() {
        Some((since, Some(mark))) => {
            timeline.bar(lanes.resource, since, at, BarKind::Mark, format!("mark {mark}"))
        }
        Some((since, None)) => {
            timeline.bar(lanes.resource, since, at, BarKind::NoMark, "no fencing: no mark")
        }
        None => {}
    }
}
