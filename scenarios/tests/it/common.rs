//! What the tests share: the binary run to completion, and the lease scenario
//! run within a bound.

use std::process::Command;
use std::time::Duration;

use scenarios::Failure;
use scenarios::scenario::Report;

/// The report of a run of the lease scenario; fails the test unless the run
/// gets to the end within `bound`.
pub(crate) async fn scenario_within(
    bound: Duration,
    run: impl Future<Output = Result<Report, Failure>>,
) -> Report {
    tokio::time::timeout(bound, run)
        .await
        .unwrap_or_else(|_| panic!("the scenario did not finish within {bound:?}"))
        .expect("the scenario runs")
}

/// Runs `command` (the `scenarios` binary) to completion with `RUST_LOG=warn`;
/// asserts that it succeeded, showing its output if not, and returns its stdout.
pub(crate) fn stdout_of_success(command: &mut Command) -> String {
    let output = command.env("RUST_LOG", "warn").output().expect("scenarios runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}\n{stdout}\n{stderr}", output.status);
    stdout
}
