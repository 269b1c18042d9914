#!/usr/bin/env bash
# Instructions per request of `hot_loop` services, by callgrind: (total at 2N
# requests − total at N) / N, so the setup (building the router, seeding keys)
# cancels out. Deterministic for the layer; tower_governor reads the clock, so
# its count moves by a few hundred from run to run.
#
#   benches/instructions.sh [--keys K] [--requests N] SERVICE...
#   benches/instructions.sh noop fenced fenced_lean governor
#   benches/instructions.sh --keys 999999 noop fenced fenced_lean
#
# Needs valgrind; builds the example in release first. FEATURES=metrics adds
# the metrics services (fenced_metrics, fenced_prometheus).
set -euo pipefail
cd "$(dirname "$0")/.."
keys=0
requests=100000
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keys) keys=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { sed -n '2,12p' "$0"; exit 2; }
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
done
