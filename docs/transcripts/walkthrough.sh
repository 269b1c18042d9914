#!/usr/bin/env bash
# docs/walkthrough.md, run for real: the scenario, then the lock service and the storage
# service on 127.0.0.1:7000 and :8080 with data in /tmp/fencing-demo (as the page shows; the
# script refuses to run if that directory exists), every command of the page in turn,
# Ctrl-C and kill -9 included, and the quick start on 127.0.0.1:3000. Written into the page;
# --check compares. About 15 s (the page's lease lapses and its in-flight write wait).
#
#   docs/transcripts/walkthrough.sh [--check]
#
# The page shows `cargo run -p …` where the binary it builds ran (cargo's own lines left out,
# as the page says). Uses the debug binaries the test step builds, or those in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
demo=/tmp/fencing-demo
claim_path "$demo"
locks=http://127.0.0.1:7000
store=http://127.0.0.1:8080

# Runs $2 and shows it as $1 (a cargo command, whose binary $2 is).
say_as() {
  printf '$ %s\n' "$1"
  local status=0
  bash -c "$2" 2>&1 9>&- || status=$?
  if [[ $status != 0 ]]; then printf 'exit %d\n' "$status"; fi
}

# The storage service: a new process for each start, its log in resource-N.log.
starts=0
resource() { # $1: the flags the page shows after `serve`
  starts=$((starts + 1))
  serve "resource-$starts.log" "resource listening" "cargo run -p demo-resource -- serve $1" \
    "demo-resource serve $1"
  resource_pid=$(tail -n 1 "$work/pids")
}

# The lines server log $1 printed since line $2.
since() { tail -n "+$(($2 + 1))" "$1" | sed -e 's/\x1b\[[0-9;]*m//g'; }

lease() { # $1: holder, $2: ttl_ms
  say "curl -s -w '\n' -X POST $locks/v1/leases -H 'Content-Type: application/json' -d '{\"name\":\"billing\",\"holder\":\"$1\",\"ttl_ms\":$2}'"
}

session() {
  echo "@@ quick"
  say_as "cargo run --release -p scenarios" scenarios

  echo "@@ locks"
  serve locks.log "lock service listening" \
    "cargo run -p demo-lock-service -- --listen 127.0.0.1:7000 --data-dir $demo/locks" \
    "demo-lock-service --listen 127.0.0.1:7000 --data-dir $demo/locks"

  echo "@@ resource"
  resource "--listen 127.0.0.1:8080 --data-dir $demo/resource"

  echo "@@ first-write"
  lease worker-1 5000
  say "curl -si -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 1' -d 'worker-1: invoice run started'"

  echo "@@ lapse"
  say "sleep 6   # worker-1 is paused (GC, SIGSTOP, ...) past its 5 s TTL; it does not renew"
  say "curl -s -w '\n' $locks/v1/locks/billing"
  lease worker-2 30000 | tee lease-2.out
  lease_2=$(grep -o '"lease_id":"[0-9a-f]*"' lease-2.out | cut -d'"' -f4)
  say "curl -si -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 2' -d 'worker-2: invoice run started'"

  echo "@@ stale"
  say "curl -si -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 1' -d 'worker-1: charged customer 42'"
  say "curl -s -w '\n' $store/logs/billing"

  echo "@@ no-token"
  say "curl -si -w '\n' -X POST $store/logs/billing -d 'who am I?'"
  say "curl -si -w '\n' -X PUT $store/kv/owner -H 'Fencing-Token: 2' -d 'worker-2'"
  say "curl -si -w '\n' -X PUT $store/kv/owner -H 'Fencing-Token: 1' -d 'worker-1'"
  say "curl -s -w '\n' $store/kv/owner"

  echo "@@ log text"
  grep -e 'fencing mark raised key="/logs/billing" old=1 new=2' -e 'appended log="billing" index=1 ' \
    -e 'fenced request rejected.*key=Some("/logs/billing") presented=1 highest=2' resource-1.log |
    sed -e 's/\x1b\[[0-9;]*m//g'

  echo "@@ in-flight"
  say "curl -si -X DELETE $locks/v1/leases/$lease_2"
  say "curl -s -w '\n' -X POST '$store/logs/billing?delay_ms=3000' -H 'Fencing-Token: 2' -d 'worker-2: slow write, sent before worker-3 got the lock' &
sleep 0.2
curl -s -w '\n' -X POST $locks/v1/leases -H 'Content-Type: application/json' -d '{\"name\":\"billing\",\"holder\":\"worker-3\",\"ttl_ms\":30000}'
time curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 3' -d 'worker-3: invoice run started'
wait"
  say "curl -s -w '\n' $store/logs/billing"

  echo "@@ delay-cap"
  say "curl -s -w '\n' -X POST '$store/logs/billing?delay_ms=60000' -H 'Fencing-Token: 3' -d x"

  echo "@@ ctrl-c"
  local lines
  lines=$(wc -l <resource-1.log)
  kill -INT "$resource_pid"
  while kill -0 "$resource_pid" 2>/dev/null; do sleep 0.05; done
  printf '^C'
  since resource-1.log "$lines"
  resource "--listen 127.0.0.1:8080 --no-fencing --data-dir $demo/unfenced"

  echo "@@ unfenced"
  say "curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 2' -d 'worker-2: invoice run started'"
  say "curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 1' -d 'worker-1: charged customer 42'"
  say "curl -s -w '\n' $store/logs/billing"

  echo "@@ fenced-again"
  kill -INT "$resource_pid"
  while kill -0 "$resource_pid" 2>/dev/null; do sleep 0.05; done
  resource "--listen 127.0.0.1:8080 --data-dir $demo/resource"

  echo "@@ kill-9"
  say "curl -s -w '\n' -X PUT $store/kv/owner -H 'Fencing-Token: 3' -d 'worker-3'"
  say "kill -9 $resource_pid"
  { wait "$resource_pid"; } 2>/dev/null || true

  echo "@@ restart"
  resource "--listen 127.0.0.1:8080 --data-dir $demo/resource"

  echo "@@ after-restart"
  say "curl -si -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 1' -d 'worker-1: charged customer 42'"
  say "curl -s -w '\n' -X PUT $store/kv/owner -H 'Fencing-Token: 2' -d 'worker-2'"
  say "curl -s -w '\n' $store/logs/billing"
  say "curl -s -w '\n' $store/kv/owner"
  say "curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 3' -d 'worker-3: invoice run finished'"

  echo "@@ unknown-route"
  say "curl -s -w '\n' $store/nope"
  say "curl -s -w '\n' $store/healthz"

  echo "@@ quickstart"
  quickstart
  say "curl -si -X PUT localhost:3000/docs/report -d v1"
  echo
  say "curl -si -X PUT localhost:3000/docs/report -H 'Fencing-Token: abc' -d v1"
  echo
  say "curl -si -X PUT localhost:3000/docs/report -H 'Fencing-Token: 7' -H 'Fencing-Token: 7' -d v1"
  echo
  say "curl -si -X PUT localhost:3000/docs/report -H 'Fencing-Token: 7' -d v1"
  echo
  say "curl -si -X PUT localhost:3000/docs/report -H 'Fencing-Token: 6' -d v0"
}

transcribe docs/walkthrough.md "$@"
