#!/usr/bin/env bash
# Shows that the replica simulation with shared marks (tests/it/replica_simulation.rs,
# `replicas_with_shared_marks_pass_the_checker_through_lost_sessions`) catches each
# mutant of the claims protocol, and passes without one. The mutants are compiled in
# only with the `mutants` feature (fencing-layer, fencing-postgres, scenarios:
# tests only) and switched on by FENCING_MUTANT, read once per process:
#
#   no-deadline-revoke  fencing-layer/src/claims/keeper.rs and claim.rs: a claim whose
#                       renewals stop is not revoked at its local deadline, by the keeper
#                       nor by its requests' own check (its requests run on)
#   session-claims      fencing-postgres/src/fence.rs: a replica's claims are freed
#                       when its background session ends (a grant deletes the claims
#                       of replicas whose last renewing session is gone)
#
#   scenarios/claims-sim-mutants.sh              # the control run and both mutants
#   scenarios/claims-sim-mutants.sh session      # mutants whose name contains "session"
#   FENCING_REPLICA_SIM_SEEDS=30 scenarios/claims-sim-mutants.sh
#
# 20 seeds by default: the simulation runs in real time, and session-claims shows on only
# some seeds (1 of 6, 0 of 6, 1 of 10, 2 of 10 in four runs on 3 December 2026), so 6 seeds
# missed it about one run in three. The conformance suite catches it on every run
# (test-support's shared_store_suite: the lost connection and the killed replica).
#
# Fails unless the control run passes and every mutant makes the test fail with
# checker violations (not with some other error). Needs PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")"

export FENCING_REPLICA_SIM_SEEDS="${FENCING_REPLICA_SIM_SEEDS:-20}"
test_name=replicas_with_shared_marks_pass_the_checker_through_lost_sessions
run() {
  cargo test -p scenarios --features mutants --test it "replica_simulation::$test_name" -- --nocapture
}

mutants=(no-deadline-revoke session-claims)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== no mutant ($FENCING_REPLICA_SIM_SEEDS seeds): the checker must pass =="
if ! (unset FENCING_MUTANT; run) >"$log" 2>&1; then
  cat "$log" >&2
  echo "the unbroken protocol failed the simulation" >&2
  exit 2
fi
grep -E '^[0-9]+ seeds:' "$log"
if grep -q 'SKIPPED' "$log"; then
  echo "PostgreSQL is not reachable: nothing was shown" >&2
  exit 2
fi

caught=0 missed=()
for mutant in "${mutants[@]}"; do
  [[ -z "${1:-}" || "$mutant" == *"$1"* ]] || continue
  echo "== FENCING_MUTANT=$mutant =="
  if FENCING_MUTANT=$mutant run >"$log" 2>&1; then
    grep -E '^[0-9]+ seeds:' "$log" || true
    echo "mutant $mutant: MISSED"
    missed+=("$mutant")
  elif grep -q 'VIOLATIONS with shared marks' "$log"; then
    grep -E '^seed [0-9]+:|^[0-9]+ seeds:' "$log"
    echo "mutant $mutant: caught"
    caught=$((caught + 1))
  else
    cat "$log" >&2
    echo "mutant $mutant: the test failed without checker violations" >&2
    exit 2
  fi
done

echo "caught $caught mutant(s)${missed:+; missed: ${missed[*]}}"
[[ ${#missed[@]} -eq 0 ]]
