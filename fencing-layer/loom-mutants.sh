#!/usr/bin/env bash
# Breaks the rules the loom models check, in each way they must catch: the
# admission rule (src/store/admission.rs, store/loom_model.rs) and a claim's
# atomics (src/claims/cell.rs, claims/loom_model.rs). Runs the models of the
# broken file against each broken copy, and fails unless every mutant is
# caught. Every file is restored afterwards, whatever happens.
#
#   fencing-layer/loom-mutants.sh            # all mutants
#   fencing-layer/loom-mutants.sh relaxed    # the ones whose name contains "relaxed"
set -euo pipefail
# A relative CARGO_TARGET_DIR is the caller's, as for cargo run there.
if [[ -n "${CARGO_TARGET_DIR:-}" && "$CARGO_TARGET_DIR" != /* ]]; then
  CARGO_TARGET_DIR="$PWD/$CARGO_TARGET_DIR"
fi
cd "$(dirname "$0")"

# The files mutated (under src/), and the models that check each.
declare -A models=(
  [store/admission.rs]=store::loom_model::
  [claims/cell.rs]=claims::loom_model::
)

# While a mutant runs: its file, the file as it was before, and the mutant.
work=$(mktemp -d)
file='' original="$work/original" mutated="$work/mutated" log="$work/log"
restore() {
  [[ -n "$file" ]] || return 0
  if cmp -s "src/$file" "$mutated"; then
    cat "$original" >"src/$file"
  elif ! cmp -s "src/$file" "$original"; then
    # Someone else saved the file meanwhile: theirs, not ours to overwrite.
    echo "src/$file changed while mutant $name was in it: left as it is (as it was before: $original)" >&2
    work=''
  fi
  file=''
}
trap 'restore; [[ -z "$work" ]] || rm -rf "$work"' EXIT
trap 'exit 130' INT TERM HUP

export RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../target/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"

# name | file (under src/) | perl substitution (quotemeta'd literal text; applied to the whole file)
mutants=(
  'no-waiters-handshake|store/admission.rs|s/\Qlet gate = self.gate.fetch_or(WAITERS, Ordering::AcqRel);\E/let gate = self.gate.load(Ordering::Acquire);/'
  'no-wake-in-leave|store/admission.rs|s/\Qself.gate.fetch_and(!WAITERS, Ordering::AcqRel);\E\s*\Qm.wake_waiters();\E/self.gate.fetch_and(!WAITERS, Ordering::AcqRel);/'
  'check-then-count|store/admission.rs|s/\Qlet gate = self.gate.fetch_add(1, Ordering::AcqRel);\E/let gate = self.gate.load(Ordering::Acquire); if gate \& OPEN != 0 { self.gate.fetch_add(1, Ordering::AcqRel); return Some(InsideGuard(Arc::clone(self))); }/'
  'raise-keeps-open|store/admission.rs|s/\Qself.gate.fetch_and(!OPEN, Ordering::AcqRel);\E//'
  'relaxed-fast-path|store/admission.rs|s/(fn try_enter.*?\n    \}\n)/$1 =~ s{Ordering::(Acquire|AcqRel)}{Ordering::Relaxed}gr/se'
  'failed-write-keeps-recording|store/admission.rs|s/\Qm.recording = m.recorded;\E//'
  'dropped-duty-not-handed-back|store/admission.rs|s/\Qself.state.recorded(self.token, self.ok);\E/if self.ok { self.state.recorded(self.token, true); }/'
  'no-wake-on-raise|store/admission.rs|s/(fn decide.*?)\Qm.wake_waiters();\E/$1/s'
  'seed-wakes-nobody|store/admission.rs|s/(fn seed.*?)\Qm.wake_waiters();\E/$1/s'
  # The earlier idle releases: the count looked at apart from the move to Releasing, then
  # (the old bug) a count found by a second look turning Releasing back into Valid,
  'revert-releasing|claims/cell.rs|s/\Qlet idle = self.word.compare_exchange(VALID << SHIFT, RELEASING << SHIFT, SeqCst, SeqCst);\E\s*\QThen::release_if(idle.is_ok() && self.start_release())\E/if count_of(self.word.load(SeqCst)) > 0 { return Then::Nothing; } let idle = self.word.fetch_update(SeqCst, SeqCst, |w| (state_of(w) == VALID).then_some(count_of(w) | RELEASING << SHIFT)); if idle.is_err() { return Then::Nothing; } if count_of(self.word.load(SeqCst)) > 0 { let _ = self.word.fetch_update(SeqCst, SeqCst, |w| (state_of(w) == RELEASING).then_some(count_of(w))); return Then::Nothing; } Then::release_if(self.start_release())/'
  # or leaving Releasing with someone counted in,
  'idle-look-then-move|claims/cell.rs|s/\Qlet idle = self.word.compare_exchange(VALID << SHIFT, RELEASING << SHIFT, SeqCst, SeqCst);\E\s*\QThen::release_if(idle.is_ok() && self.start_release())\E/if count_of(self.word.load(SeqCst)) > 0 { return Then::Nothing; } let idle = self.word.fetch_update(SeqCst, SeqCst, |w| (state_of(w) == VALID).then_some(count_of(w) | RELEASING << SHIFT)); Then::release_if(idle.is_ok() && count_of(self.word.load(SeqCst)) == 0 && self.start_release())/'
  # or releasing without a second look.
  'idle-without-recheck|claims/cell.rs|s/\Qlet idle = self.word.compare_exchange(VALID << SHIFT, RELEASING << SHIFT, SeqCst, SeqCst);\E\s*\QThen::release_if(idle.is_ok() && self.start_release())\E/if count_of(self.word.load(SeqCst)) > 0 { return Then::Nothing; } let idle = self.word.fetch_update(SeqCst, SeqCst, |w| (state_of(w) == VALID).then_some(count_of(w) | RELEASING << SHIFT)); Then::release_if(idle.is_ok() && self.start_release())/'
  'look-then-count|claims/cell.rs|s/\Qlet word = self.word.fetch_add(1, SeqCst);\E/let word = self.word.load(SeqCst); self.word.fetch_add(1, SeqCst);/'
  'leave-reads-state-after|claims/cell.rs|s/\QThen::release_if(count_of(word) == 1 && state_of(word) != VALID && self.start_release())\E/Then::release_if(count_of(word) == 1 && state_of(self.word.load(SeqCst)) != VALID && self.start_release())/'
  'leave-releases-while-valid|claims/cell.rs|s/\Qcount_of(word) == 1 && state_of(word) != VALID && self.start_release()\E/count_of(word) == 1 && self.start_release()/'
  'extend-forgets-release|claims/cell.rs|s/\QThen::release_if(state_of(self.word.load(SeqCst)) != VALID && self.releasing.load(SeqCst))\E/Then::Nothing/'
  'extend-keeps-old-grant|claims/cell.rs|s/\Qself.grant.store(grant, SeqCst);\E/let _ = grant;/'
  'revoke-releases-with-inside|claims/cell.rs|s/\QThen::release_if(count_of(word) == 0 && self.start_release()))\E/Then::release_if(self.start_release()))/'
  'overtake-ignores-count|claims/cell.rs|s/\Qmoved.is_ok_and(|word| count_of(word) == 0) && self.start_release()\E/moved.is_ok() && self.start_release()/'
  'release-not-once|claims/cell.rs|s/\Q!self.releasing.swap(true, SeqCst)\E/{ self.releasing.store(true, SeqCst); true }/'
)

# LOOM_MUTANTS_CONTROL_DONE=1: the caller has just run the unbroken models (at least as
# many preemptions), as .ci/run does in the step before this script.
if [[ "${LOOM_MUTANTS_CONTROL_DONE:-}" != 1 ]]; then
  echo "== the unbroken rules pass =="
  if ! cargo test -q -p fencing-layer --lib --profile loom -- loom_model >"$log" 2>&1; then
    cat "$log" >&2
    echo "the models fail on the unbroken code: no mutant can be judged" >&2
    exit 2
  fi
  grep -E '^test result' "$log"
fi

caught=0 missed=()
for mutant in "${mutants[@]}"; do
  name=${mutant%%|*} rest=${mutant#*|}
  mutant_file=${rest%%|*} edit=${rest#*|}
  [[ -z "${1:-}" || "$name" == *"$1"* ]] || continue
  filter=${models[$mutant_file]}
  # The file as it is now (someone may have saved it since the last mutant).
  cp "src/$mutant_file" "$original"
  cp "$original" "$mutated"
  perl -0pi -e "$edit" "$mutated"
  if cmp -s "$original" "$mutated"; then
    echo "mutant $name ($mutant_file): the edit matched nothing" >&2
    exit 2
  fi
  file=$mutant_file
  cat "$mutated" >"src/$file"
  if cargo test -q -p fencing-layer --lib --profile loom -- "$filter" >"$log" 2>&1; then
    echo "mutant $name ($file): MISSED"
    missed+=("$name")
  else
    if grep -qE 'could not compile' "$log"; then
      echo "mutant $name ($file): does not compile" >&2
      cat "$log" >&2
      exit 2
    fi
    # Failed tests by name; a model that aborts (a panic while unwinding) names its thread instead.
    failed=$(grep -oE "^    (store|claims)::loom_model::\w+|thread '(store|claims)::loom_model::\w+" "$log" |
      sed -E "s/^thread '//; s/^ +//" | sort -u | tr '\n' ' ' || true)
    if [[ -z "$failed" ]]; then
      echo "mutant $name ($file): the models failed, but no model is named:" >&2
      cat "$log" >&2
      exit 2
    fi
    echo "mutant $name ($file): caught by $failed"
    caught=$((caught + 1))
  fi
  restore
done

echo "${caught} caught, ${#missed[@]} missed"
[[ ${#missed[@]} -eq 0 ]]
