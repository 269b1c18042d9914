#!/usr/bin/env bash
# Breaks the admission rule (src/store/admission.rs) in each way the loom model
# must catch, runs the model against each broken copy, and fails unless every
# mutant is caught. The file is restored afterwards, whatever happens.
#
#   fencing-layer/loom-mutants.sh            # all mutants
#   fencing-layer/loom-mutants.sh relaxed    # the ones whose name contains "relaxed"
set -euo pipefail
cd "$(dirname "$0")"

file=src/store/admission.rs
backup=$(mktemp)
cp "$file" "$backup"
trap 'cp "$backup" "$file"; rm -f "$backup"' EXIT

export RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../target/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"

# name | perl substitution (quotemeta'd literal text; applied to the whole file)
mutants=(
  'no-waiters-handshake|s/\Qlet gate = self.gate.fetch_or(WAITERS, Ordering::AcqRel);\E/let gate = self.gate.load(Ordering::Acquire);/'
  'no-wake-in-leave|s/\Qself.gate.fetch_and(!WAITERS, Ordering::AcqRel);\E\s*\Qm.wake_waiters();\E/self.gate.fetch_and(!WAITERS, Ordering::AcqRel);/'
  'check-then-count|s/\Qlet gate = self.gate.fetch_add(1, Ordering::AcqRel);\E/let gate = self.gate.load(Ordering::Acquire); if gate \& OPEN != 0 { self.gate.fetch_add(1, Ordering::AcqRel); return Some(InsideGuard(Arc::clone(self))); }/'
  'raise-keeps-open|s/\Qself.gate.fetch_and(!OPEN, Ordering::AcqRel);\E//'
  'relaxed-fast-path|s/(fn try_enter.*?\n    \}\n)/$1 =~ s{Ordering::(Acquire|AcqRel)}{Ordering::Relaxed}gr/se'
  'failed-write-keeps-recording|s/\Qm.recording = m.recorded;\E//'
  'dropped-duty-not-handed-back|s/\Qself.state.recorded(self.token, self.ok);\E/if self.ok { self.state.recorded(self.token, true); }/'
  'no-wake-on-raise|s/(fn decide.*?)\Qm.wake_waiters();\E/$1/s'
  'seed-wakes-nobody|s/(fn seed.*?)\Qm.wake_waiters();\E/$1/s'
)

echo "== the unbroken rule passes =="
cargo test -q -p fencing-layer --lib --profile loom -- loom_model 2>&1 | grep -E '^test result'

caught=0 missed=()
for mutant in "${mutants[@]}"; do
  name=${mutant%%|*} edit=${mutant#*|}
  [[ -z "${1:-}" || "$name" == *"$1"* ]] || continue
  cp "$backup" "$file"
  perl -0pi -e "$edit" "$file"
  if cmp -s "$backup" "$file"; then
    echo "mutant $name: the edit matched nothing" >&2
    exit 2
  fi
  log=$(mktemp)
  if cargo test -q -p fencing-layer --lib --profile loom -- loom_model >"$log" 2>&1; then
    echo "mutant $name: MISSED"
    missed+=("$name")
  else
    # Failed tests by name; a model that aborts (a panic while unwinding) names its thread instead.
    failed=$(grep -oE "^    store::loom_model::\w+|thread 'store::loom_model::\w+" "$log" |
      sed 's/.*:://' | sort -u | tr '\n' ' ' || true)
    if grep -qE 'could not compile' "$log"; then
      echo "mutant $name: does not compile" >&2
      cat "$log" >&2
      exit 2
    fi
    echo "mutant $name: caught by $failed"
    caught=$((caught + 1))
  fi
  rm -f "$log"
done

echo "${caught} caught, ${#missed[@]} missed"
[[ ${#missed[@]} -eq 0 ]]
