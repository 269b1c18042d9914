#!/usr/bin/env bash
# docs/operating-marks.md, run for real: demo-resource as docs/authenticity.md leaves it (on
# 127.0.0.1:18481, admin routes on :18491, trusting lock.pub; its session replayed, not shown:
# /logs/billing's mark at 6), the admin routes' session and the service's reset lines, then
# `demo-resource marks` while it runs and once it is stopped (Ctrl-C); then a fresh service on
# 127.0.0.1:8080 under libfiu (`fiu-run -x -f /tmp/fiu`, fiu-utils) whose pwrite is made to fail
# with ENOSPC and then works again. The key pair is docs/authenticity.md's (fixed seeds,
# docs/transcripts/proof.py). Written into the page; --check compares. About 1 s.
#
#   docs/transcripts/operating-marks.sh [--check]
#
# Uses the debug binaries (`cargo build -p demo-resource`), or those in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
proof() { python3 "$root/docs/transcripts/proof.py" "$@"; }

# Stops the last server started as Ctrl-C does.
ctrl_c() {
  local pid
  pid=$(tail -n 1 "$work/pids")
  kill -INT "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

session() {
  proof keypair "docs/authenticity.md lock.key" lock.key lock.pub
  local logs=localhost:18481/logs/billing admin=localhost:18491
  serve resource.log "^admin listening on" "demo-resource" \
    "demo-resource serve --data-dir ./data --listen 127.0.0.1:18481 --verify-key lock.pub --admin-listen 127.0.0.1:18491" >/dev/null
  # docs/authenticity.md's admitted writes: tokens 5, 5 and 6.
  curl -sf -X POST $logs -H 'Fencing-Token: 5' -H "Fencing-Proof: $(proof sign lock.key billing 5)" -d 'A: first write' >/dev/null
  curl -sf -X POST $logs -H 'Fencing-Token: 5' -d 'A: second write' >/dev/null
  curl -sf -X POST $logs -H 'Fencing-Token: 6' -H "Fencing-Proof: $(proof sign lock.key billing 6)" -d 'B: first write' >/dev/null

  echo "@@ admin"
  say "curl -s -w '\n' $admin/marks"
  say "curl -s -w '\n' -G $admin/marks --data-urlencode key=/logs/billing"
  say "curl -s -w '\n' localhost:18481/marks"
  say "curl -s -w '\n' -X POST $admin/marks/reset -d '{\"key\": \"/logs/billing\", \"to\": 0}'"
  say "curl -s -w '\n' -X POST $admin/marks/reset -H 'Content-Type: application/json' -d '{\"key\": \"/logs/biling\", \"to\": 0}'"
  say "curl -s -w '\n' -X POST $admin/marks/reset -H 'Content-Type: application/json' -d '{\"key\": \"/logs/billing\", \"to\": -1}'"
  say "curl -s -w '\n' -X POST $admin/marks/reset -H 'Content-Type: application/json' -d '{\"key\": \"/logs/billing\", \"to\": 0}'"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 1' -H 'Fencing-Proof: $(proof sign lock.key billing 1)' -d 'C: first write under the new lock service'"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 0' -d 'too old'"

  echo "@@ log text"
  grep -E ' WARN .*reset' resource.log | sed -E -e 's/\x1b\[[0-9;]*m//g' -e 's/^[0-9T:.-]+Z +//'

  echo "@@ running"
  say "demo-resource marks list --data-dir ./data"
  ctrl_c

  echo "@@ stopped"
  say "demo-resource marks list --data-dir ./data"
  say "demo-resource marks list --data-dir ./data --json"
  say "demo-resource marks get /logs/billing --data-dir ./data"
  say "demo-resource marks reset /logs/billing --to 41 --data-dir ./data"
  say "demo-resource marks get /logs/nope --data-dir ./data"
  say "demo-resource marks list --data-dir ./dta"

  # A fresh service whose pwrite libfiu can make fail, controlled through /tmp/fiu-PID.*.
  serve fiu.log "^listening on" "demo-resource" \
    "fiu-run -x -f /tmp/fiu demo-resource serve --listen 127.0.0.1:8080 --data-dir $PWD/fiu-data" >/dev/null
  PID=$(tail -n 1 "$work/pids")
  export PID
  local store=http://127.0.0.1:8080
  echo "@@ disk"
  say "curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 7' -d 'invoice 1'"
  say "fiu-ctrl -f /tmp/fiu -c 'enable name=posix/io/rw/pwrite,failinfo=28' \$PID"
  say "curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 8' -d 'invoice 2'"
  say "curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 7' -d 'invoice 2'"
  say "curl -si -w '\n' $store/readyz"
  say "curl -s -w '\n' $store/healthz"
  say "fiu-ctrl -f /tmp/fiu -c 'disable name=posix/io/rw/pwrite' \$PID"
  say "sleep 0.3"
  say "curl -s -w '\n' $store/readyz"
  say "curl -s -w '\n' -X POST $store/logs/billing -H 'Fencing-Token: 8' -d 'invoice 2'"
  ctrl_c
}

transcribe docs/operating-marks.md "$@"
