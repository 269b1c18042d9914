#!/usr/bin/env bash
# Shows that the in-transaction fence's tests (tests/it/concurrency.rs) catch each mutant of
# the fence, and pass without one. The mutants are compiled in only with the `mutants`
# feature (tests only) and switched on by FENCING_MUTANT, read when a PgFence is built:
#
#   unlocked-fence  src/fence.rs: the plain lock of a remembered token, every write of a
#                   holder but its first, reads the mark without locking its row (a raise
#                   no longer waits for the writer still inside)
#
#   fencing-postgres/fence-mutants.sh
#
# The workspace's features, as the README's test command builds them (`--all-features`),
# so that the run reuses that build. Fails unless the control run passes and every mutant
# makes a test fail. Needs PostgreSQL on 127.0.0.1:5432 (a SKIPPED run shows nothing).
set -euo pipefail
cd "$(dirname "$0")/.."

run() { cargo test -q --workspace --all-features --test it -- concurrency:: --test-threads 1; }
mutants=(unlocked-fence)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== no mutant: the tests must pass =="
if ! (unset FENCING_MUTANT; run) >"$log" 2>&1; then
  cat "$log" >&2
  echo "the unbroken fence failed its tests" >&2
  exit 2
fi
if grep -q 'SKIPPED' "$log"; then
  echo "PostgreSQL is not reachable: nothing was shown" >&2
  exit 2
fi
grep -E '^test result' "$log"

missed=()
for mutant in "${mutants[@]}"; do
  echo "== FENCING_MUTANT=$mutant =="
  if FENCING_MUTANT=$mutant run >"$log" 2>&1; then
    echo "mutant $mutant: MISSED"
    missed+=("$mutant")
  elif grep -qE '^test .* FAILED$|panicked at' "$log"; then
    grep -E "panicked at|^test .* FAILED$|returned while" "$log" | head -n 4
    echo "mutant $mutant: caught"
  else
    cat "$log" >&2
    echo "mutant $mutant: the run failed, but not in a test" >&2
    exit 2
  fi
done
[[ ${#missed[@]} -eq 0 ]]
