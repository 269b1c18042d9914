#!/usr/bin/env bash
# The README's two sessions, run for real: the scenario's output (what `cargo run --release -p
# scenarios` prints), and curl against the quick start (`cargo run -p fencing-layer --example
# quickstart --features axum`, which listens on 127.0.0.1:3000). Written into README.md;
# --check compares.
#
#   docs/transcripts/readme.sh [--check]
#
# Uses the debug binaries the test step builds (`cargo test --workspace --all-features` builds
# the examples too), or those in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"

session() {
  echo "@@ scenario text"
  scenarios 2>&1
  echo "@@ quickstart"
  quickstart
  say "curl -si -X PUT localhost:3000/docs/report -H 'Fencing-Token: 7' -d v1"
  echo
  say "curl -si -X PUT localhost:3000/docs/report -H 'Fencing-Token: 6' -d v0"
}

transcribe README.md "$@"
