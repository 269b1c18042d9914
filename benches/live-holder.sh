#!/usr/bin/env bash
# docs/load-testing.md's "A run beside a real holder", run for real: a real holder takes a lease
# and writes, a load test of the README's kind runs against the same live service, and the holder
# writes again. Each command is printed as it runs (the release binaries on PATH), with all it
# printed and its exit status, and the session is written between the page's markers. About 15 s
# after the builds; not run by CI (a load run's figures differ every time), so rerun it after
# changing what it shows.
#
#   benches/live-holder.sh            # write the session into docs/load-testing.md
#   benches/live-holder.sh --print    # print it only
#
# NO_BUILD=1 uses the release binaries as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ ${NO_BUILD:-} == 1 ]] || cargo build -q --release -p demo-lock-service -p demo-resource -p fencing-benches \
  --bin demo-lock-service --bin demo-resource --bin fencing-load
export PATH="$PWD/${CARGO_TARGET_DIR:-target}/release:$PATH"
page=docs/load-testing.md
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# Runs one command as the session shows it, with its output and, when not 0, its exit status.
say() {
  printf '$ %s\n' "$1"
  local status=0
  bash -c "$1" 2>&1 || status=$?
  if [[ $status != 0 ]]; then printf 'exit %d\n' "$status"; fi
}

wait_port() {
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
  echo "nothing listens on 127.0.0.1:$1" >&2; exit 1
}

demo-lock-service --listen 127.0.0.1:7301 --data-dir "$work/locks" >"$work/locks.log" 2>&1 &
pids+=($!)
demo-resource serve --listen 127.0.0.1:7302 --data-dir "$work/resource" >"$work/resource.log" 2>&1 &
pids+=($!)
wait_port 7301
wait_port 7302

session() {
  cd "$work"
  say "curl -s -X POST http://127.0.0.1:7301/v1/leases -H 'Content-Type: application/json' -d '{\"name\":\"docs-7\",\"holder\":\"real-holder\",\"ttl_ms\":60000}'"
  echo
  say "curl -si -X PUT http://127.0.0.1:7302/kv/docs-7 -H 'Fencing-Token: 1' -d before | head -n 1   # the real holder writes"
  say "fencing-load --url http://127.0.0.1:7302/kv/docs-7 -X PUT --body hi --rate 2000 --duration 2 --rounds 1   # no {key}"
  say "fencing-load --url 'http://127.0.0.1:7302/kv/{key}' -X PUT -H 'Content-Type: application/json' --body '{\"text\":\"hi\"}' --new-holder-every 500 --rate 2000 --max-p99 20 --duration 3 --rounds 2 --plot latency.svg 2>&1 | grep -v '^  [0-9]/[0-9] target: '; exit \${PIPESTATUS[0]}"
  say "curl -si -X PUT http://127.0.0.1:7302/kv/docs-7 -H 'Fencing-Token: 1' -d after | head -n 1   # the real holder, after the load test"
  say "curl -s http://127.0.0.1:7302/kv/docs-7"
  echo
  say "fencing-load --url 'http://127.0.0.1:7399/kv/{key}' -X PUT --body hi --duration 1 --rounds 1   # nobody listens"
  say "fencing-load --url 'http://127.0.0.1:7302/nope/{key}' -X PUT --body hi --duration 1 --rounds 1 2>&1 | tail -n 2; exit \${PIPESTATUS[0]}   # a wrong route"
}

block=$(session)
if [[ ${1:-} == --print ]]; then
  printf '%s\n' "$block"
  exit 0
fi
begin='<!-- transcript: benches/live-holder.sh -->'
end='<!-- end of transcript -->'
BLOCK="$block" awk -v b="$begin" -v e="$end" '
  $0 == b { print; print "```console"; print ENVIRON["BLOCK"]; print "```"; skip = 1; next }
  skip && $0 == e { skip = 0 }
  !skip { print }' "$page" >"$work/page"
grep -qF "$begin" "$page" || { echo "no '$begin' in $page" >&2; exit 1; }
cp "$work/page" "$page"
echo "wrote the session into $page"
