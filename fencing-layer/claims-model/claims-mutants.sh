#!/usr/bin/env bash
# Runs the model of the replica-claims protocol (tests/claims_model.rs) under
# each mutant, and fails unless the checker catches every one: finds a state
# that breaks invariant 2, and prints the shortest path to it.
#
#   fencing-layer/claims-model/claims-mutants.sh            # all mutants
#   fencing-layer/claims-model/claims-mutants.sh cancel     # the ones whose name contains "cancel"
set -euo pipefail
cd "$(dirname "$0")"

mutants=(
  no-cancel            # a replica that cannot renew does not stop its requests at its deadline
  session-frees-claims # the database drops a replica's claims when its session is lost
  drift-at-margin      # clocks drift by as much as the margin (the assumption, shown to be needed)
)

cargo build -q -p fencing-claims-model --release --test claims_model

caught=0 missed=()
for name in "${mutants[@]}"; do
  [[ -z "${1:-}" || "$name" == *"$1"* ]] || continue
  for replicas in two three; do
    log=$(mktemp)
    # The test passes only if the mutant is caught (see the module docs).
    if CLAIMS_MUTANT=$name cargo test -q -p fencing-claims-model --release --test claims_model \
      -- --exact "${replicas}_replicas" --nocapture >"$log" 2>&1; then
      found=$(grep -oE 'counterexample of [0-9]+ steps' "$log")
      states=$(grep -oE '[0-9]+ states \([0-9]+ unique\)' "$log")
      echo "mutant $name, $replicas replicas: caught, $found ($states)"
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
