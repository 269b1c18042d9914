//! A seed's history as a timeline: the servers' crashes, the partitions, and per
//! client its leases, pauses, and writes with their answers; the writes the
//! checker flags are ringed in red (fenced: every one; unfenced: its first
//! violation, which is the point of that run).

use std::time::Duration;

use tokio::time::Instant;

use scenarios::timeline::{BarKind, Scale, Timeline, Tone};

use super::{CLIENT_TIMEOUT, CLIENTS, SeedResult, Violation, stale_write_applied};

/// A request that took longer than this to reach the resource is drawn on the wire.
const HELD: Duration = Duration::from_millis(20);

pub(crate) fn timeline(seed: u64, fenced: bool, result: &SeedResult) -> Timeline {
    let since = |at: Instant| at.saturating_duration_since(result.start);
    let history = &result.history;
    let run = if fenced { "fenced" } else { "unfenced" };
    let mut timeline = Timeline::new(format!(
        "Fault simulation, seed {seed}, {run}: {} grants, {} writes, {} faults",
        history.grants.len(),
        history.writes.len(),
        history.faults.len()
    ));
    // Simulated time has no jitter: a linear axis, gaps kept as they are.
    timeline.scale(Scale { px_per_ms: 0.22, min_gap: 2.0, max_gap: 600.0 });
    let flagged: Vec<&Violation> = if fenced {
        result.violations.iter().collect()
    } else {
        stale_write_applied(result).or(result.violations.first()).into_iter().collect()
    };
    match (result.violations.len(), flagged.first()) {
        (0, _) | (_, None) => timeline.caption("The checker found no violation."),
        (n, Some(first)) if fenced => {
            timeline.caption(format!("The checker found {n} violation(s); the first: {first}"))
        }
        (n, Some(first)) => {
            timeline.caption(format!("Without fencing the checker found {n} violation(s); ringed: {first}"))
        }
    };
    timeline.caption(format!(
        "Writes are labelled key, token, answer (? = no answer within {} ms); times are simulated (tokio's paused clock).",
        CLIENT_TIMEOUT.as_millis()
    ));

    let lock = timeline.lane("lock service");
    let resource = timeline.lane("resource");
    let network = timeline.lane("network");
    let clients: Vec<_> = (0..CLIENTS).map(|c| timeline.lane(format!("c{c}"))).collect();

    for span in &history.faults {
        let (from, to) = (since(span.from), since(span.to));
        match span.client {
            Some(client) => timeline.bar(clients[client], from, to, BarKind::Pause, "paused"),
            None if span.what == "Lock down" => timeline.bar(lock, from, to, BarKind::Fault, "down"),
            None if span.what == "Resource down" => timeline.bar(resource, from, to, BarKind::Fault, "down"),
            None => timeline.bar(network, from, to, BarKind::Fault, span.what.as_str()),
        }
    }
    for grant in &history.grants {
        let (from, to) = (since(grant.completed), since(grant.ended.unwrap_or(grant.completed)));
        let label = format!("k{} t{}", grant.key, grant.token);
        timeline.bar(clients[grant.client], from, to, BarKind::Lease, label);
    }
    // A client's writes in a row under one lease, all answered alike, are labelled once.
    let mut last_label = vec![String::new(); CLIENTS];
    for write in &history.writes {
        let lane = clients[write.client];
        if let Some(arrived) = write.arrived
            && arrived - write.sent > HELD
        {
            timeline.bar(lane, since(write.sent), since(arrived), BarKind::OnTheWire, "held");
        }
        let at = write.answered.or(write.arrived).unwrap_or(write.sent + CLIENT_TIMEOUT);
        let (tone, answer) = match write.status {
            Some(status) if (200..300).contains(&status) => (Tone::Stored, status.to_string()),
            Some(status) => (Tone::Refused, status.to_string()),
            None => (Tone::Unknown, "?".to_owned()),
        };
        let label = format!("k{} t{} {answer}", write.key, write.token);
        let flag = flagged.iter().find_map(|violation| {
            match violation.writes.iter().position(|value| *value == write.value)? {
                0 => Some(format!("✗ {violation}")),
                _ => Some(format!("✗ the newer write {:?}", write.value)),
            }
        });
        let repeated = last_label[write.client] == label && flag.is_none();
        last_label[write.client].clone_from(&label);
        let point = timeline.point(lane, since(at), tone, if repeated { String::new() } else { label });
        if let Some(why) = flag {
            point.flag(why);
        }
    }
    timeline
}
