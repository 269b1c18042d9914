#!/usr/bin/env bash
# Instructions per request of `hot_loop` services, by callgrind: (total at 2N
# requests − total at N) / N, so the setup (building the router, seeding keys)
# cancels out. Deterministic for the layer; tower_governor reads the clock, so
# its count moves by a few hundred from run to run.
#
#   benches/instructions.sh [--keys K] [--requests N] [--at-most SERVICE=M]... SERVICE...
#   benches/instructions.sh noop fenced fenced_extension governor
#   benches/instructions.sh --keys 999999 noop fenced fenced_extension
#   benches/instructions.sh --at-most fenced=700 noop fenced    # CI's bound
#
# Needs valgrind; builds the example in release first. FEATURES=metrics adds
# the metrics services (fenced_metrics, fenced_prometheus). --at-most fails
# (exit 1) when SERVICE costs more than M instructions over noop.
set -euo pipefail
cd "$(dirname "$0")/.."
keys=0
requests=100000
declare -A at_most=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keys) keys=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --at-most) at_most[${2%%=*}]=${2#*=}; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { sed -n '2,15p' "$0"; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
cargo build --quiet --release -p fencing-benches --example hot_loop ${FEATURES:+--features "$FEATURES"}
bin=${CARGO_TARGET_DIR:-target}/release/examples/hot_loop
total() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" "$keys" 2>&1 |
    awk '/Collected/ { print $4 }'
}
noop=""
printf '%-18s %14s %10s\n' service instructions "over noop"
for service in "$@"; do
  once=$(total "$service" "$requests")
  twice=$(total "$service" $((requests * 2)))
  per=$(((twice - once) / requests))
  [[ $service == noop ]] && noop=$per
  printf '%-18s %14d %10s\n' "$service" "$per" "${noop:+$((per - noop))}"
  if [[ -n ${at_most[$service]:-} ]]; then
    [[ -n $noop ]] || { echo "--at-most $service needs noop measured before it" >&2; exit 2; }
    if ((per - noop > at_most[$service])); then
      echo "$service: +$((per - noop)) instructions over noop, over its bound of +${at_most[$service]}" >&2
      failed=1
    fi
  fi
done
exit "${failed:-0}"
