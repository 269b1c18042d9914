#!/usr/bin/env bash
# The curl session of docs/gate.md, run for real: a Python service behind fencing-gate on
# loopback, then each command of the session, written into the page (--check: compared).
#
#   docs/transcripts/gate.sh [--check]
#
# Uses the debug binaries (`cargo build -p fencing-gate`), or those in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
upstream_port=${UPSTREAM_PORT:-8000}
gate_port=${GATE_PORT:-8080}

session() {
  cp "$root/fencing-gate/tests/upstream.py" .
  echo "@@ -"
  serve upstream.out "listening on" "python3 upstream.py journal $upstream_port" \
    "python3 upstream.py journal $upstream_port"
  serve gate.out "serving" "fencing-gate --listen 127.0.0.1:$gate_port --upstream http://127.0.0.1:$upstream_port" \
    "RUST_LOG=fencing_gate=info,fencing_layer=warn fencing-gate --listen 127.0.0.1:$gate_port --upstream http://127.0.0.1:$upstream_port"
  printf '\n'
  local url="http://127.0.0.1:$gate_port/files/report"
  say "curl -si -X PUT -H 'Fencing-Token: 34' --data 'B: write under valid lease' $url"
  echo
  say "curl -si -X PUT -H 'Fencing-Token: 33' --data 'A: write from expired lease' $url"
  echo
  say "curl -si -X PUT --data 'no token' $url"
  echo
  say "curl -s $url"
  echo
}

transcribe docs/gate.md "$@"
