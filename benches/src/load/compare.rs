//! Runs the targets in interleaved rounds (the order flipped every round, so
//! neither always runs first on a machine whose load drifts) and gathers the rows.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::inprocess::{loadavg, threads_cpu_ns};
use super::progress::Progress;
use super::report::{Ratios, RoundRow, TargetRow};
use super::runner::{Plan, round};
use super::schedule::Schedule;
use super::tally::Tally;
use super::target::Target;

/// Everything the rounds saw.
#[derive(Debug)]
pub struct Outcome {
    /// One row per target per round, in the order they ran.
    pub rounds: Vec<RoundRow>,
    /// One row per target, over every round.
    pub rows: Vec<TargetRow>,
    /// With exactly two targets: the second over the first.
    pub ratios: Option<Ratios>,
    /// Each target's counts and latencies over every round (for the plot).
    pub tallies: Vec<Tally>,
}

/// What the run measured, with the load average before and after it.
#[derive(Debug)]
pub struct Measured {
    /// Every round's and every target's rows, ratios and tallies.
    pub outcome: Outcome,
    /// `/proc/loadavg` before the first round.
    pub loadavg_start: String,
    /// `/proc/loadavg` after the last round.
    pub loadavg_end: String,
}

/// Runs `rounds` rounds of every target on `client`. `server_threads`: the
/// in-process servers' thread name, whose CPU time is then measured.
pub fn run(
    client: &tokio::runtime::Runtime,
    targets: &[Target],
    plan: &Arc<Plan>,
    schedules: &[Arc<Schedule>],
    rounds: u32,
    server_threads: Option<&str>,
) -> Outcome {
    let mut tallies: Vec<Tally> = targets.iter().map(|_| Tally::new()).collect();
    let mut measured = vec![Duration::ZERO; targets.len()];
    let mut per_round_rps: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    let mut cpu_ns = vec![0u64; targets.len()];
    let mut round_rows = Vec::new();
    for r in 1..=rounds {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if r % 2 == 0 {
            order.reverse();
        }
        for i in order {
            let target = &targets[i];
            let cpu_before = server_threads.and_then(threads_cpu_ns);
            let done = Arc::new(AtomicU64::new(0));
            let progress =
                Progress::start(format!("{r}/{rounds} {}", target.label), plan.duration, Arc::clone(&done));
            let (tally, seconds) = client.block_on(round(target, &schedules[i], plan, &done));
            drop(progress);
            let cpu =
                cpu_before.zip(server_threads.and_then(threads_cpu_ns)).map(|(before, after)| after - before);
            let row = RoundRow::new(r, &target.label, &tally, seconds.as_secs_f64(), cpu);
            let rps = row.requests_per_s;
            eprintln!("{}", row.line(rounds, &loadavg()));
            round_rows.push(row);
            tallies[i].add(&tally);
            measured[i] += seconds;
            per_round_rps[i].push(rps);
            cpu_ns[i] += cpu.unwrap_or(0);
        }
    }
    let rows: Vec<TargetRow> = targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            let mut row = TargetRow::new(
                target,
                &tallies[i],
                measured[i].as_secs_f64(),
                &mut per_round_rps[i],
                plan.connections,
            );
            row.server_cpu_ns_per_request =
                server_threads.map(|_| cpu_ns[i] as f64 / tallies[i].all_requests as f64);
            row
        })
        .collect();
    let ratios = match rows.as_slice() {
        [base, fenced] => {
            let per_round = (1..=rounds)
                .filter_map(|r| {
                    let rps = |label: &str| {
                        round_rows
                            .iter()
                            .find(|row| row.round == r && row.target == label)
                            .map(|row| row.requests_per_s)
                    };
                    Some(rps(&fenced.target)? / rps(&base.target)?)
                })
                .collect();
            Some(Ratios::new(base, fenced, per_round))
        }
        _ => None,
    };
    Outcome { rounds: round_rows, rows, ratios, tallies }
}
