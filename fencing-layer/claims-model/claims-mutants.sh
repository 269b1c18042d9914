#!/usr/bin/env bash
# Runs the model of the replica-claims protocol (tests/claims_model.rs) under
# each mutant, and fails unless the checker catches every one: finds a state
# that breaks invariant 2, and prints the shortest path to it.
#
#   fencing-layer/claims-model/claims-mutants.sh            # all mutants
#   fencing-layer/claims-model/claims-mutants.sh cancel     # the ones whose name contains "cancel"
set -euo pipefail
cd "$(dirname "$0")"

# name, then the replica counts to run it with.
mutants=(
  # a replica that cannot renew does not stop its requests at its deadline
  "no-cancel two three"
  # the database drops a replica's claims when its session is lost
  "session-frees-claims two three"
  # clocks drift by as much as the margin (the assumption, shown to be needed)
  "drift-at-margin two three"
  # release_if_idle turns Releasing back into Valid when it finds someone counted in (the release race)
  "revert-releasing two"
  # a new claim's deadline is known to the keeper only when it next wakes for something else
  "unarmed-deadline two three"
  # the keeper runs on the application's workers: a blocked handler stalls it
  "keeper-on-workers two three"
  # release_if_idle looks at the count and leaves Valid in two steps: a request admitted between them is orphaned
  "idle-window two"
)
# revert-releasing and idle-window: two replicas only. Their counterexamples
# are the longest (14 and 12 steps); breadth-first search of three replicas
# to 12 steps takes 5 GB and most of a minute and a half (idle-window), and
# each step more multiplies that by two to three. One replica does all the
# work in idle-window's counterexample, and two in revert-releasing's: a third
# adds nothing but states.

cargo build -q -p fencing-claims-model --release --test claims_model

caught=0 missed=()
for entry in "${mutants[@]}"; do
  read -r name replica_counts <<<"$entry"
  [[ -z "${1:-}" || "$name" == *"$1"* ]] || continue
  for replicas in $replica_counts; do
    log=$(mktemp)
    # The test passes only if the mutant is caught (see the module docs).
    if CLAIMS_MUTANT=$name cargo test -q -p fencing-claims-model --release --test claims_model \
      -- --exact "${replicas}_replicas" --nocapture >"$log" 2>&1; then
      found=$(grep -oE 'counterexample of [0-9]+ steps' "$log")
      states=$(grep -oE '[0-9]+ states \([0-9]+ unique\)' "$log")
      seconds=$(grep -oE '[0-9.]+ s$' "$log" | head -n 1)
      echo "mutant $name, $replicas replicas: caught, $found ($states, $seconds)"
      caught=$((caught + 1))
    else
      echo "mutant $name, $replicas replicas: MISSED"
      grep -E 'MISSED|panicked' "$log" || tail -n 20 "$log"
      missed+=("$name/$replicas")
    fi
    rm -f "$log"
  done
done

echo "${caught} caught, ${#missed[@]} missed"
[[ ${#missed[@]} -eq 0 ]]
