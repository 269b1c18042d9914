#!/usr/bin/env bash
# docs/lock-service.md, run for real: the lock service on 127.0.0.1:7000 (data in this script's
# temporary directory), every curl of the page in turn with $LEASE taken from /tmp/lease.txt as
# the page does (the script refuses to run if that file exists), a Ctrl-C and a restart, then a
# second service started under libfiu (`fiu-run -x -f /tmp/fiu`, fiu-utils) whose fdatasync is
# made to fail and then works again. Written into the page; --check compares. About 1 s.
#
#   docs/transcripts/lock-service.sh [--check]
#
# Uses the debug binaries (`cargo build -p demo-lock-service`), or those in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
lease_file=/tmp/lease.txt
if [[ -e $lease_file ]]; then
  echo "$lease_file exists: the page's session writes it; move it away" >&2
  exit 1
fi
trap 'cleanup; rm -f "$lease_file"' EXIT
locks=http://127.0.0.1:7000

# The lock service, not shown (the page starts it in a ```sh block); $1: its data directory,
# $2: what runs it first (fiu-run). Sets $service_pid.
locks() {
  serve "locks-$(wc -l <"$work/pids").log" "^listening on" "demo-lock-service" \
    "${2:-} demo-lock-service --listen 127.0.0.1:7000 --data-dir $1" >/dev/null
  service_pid=$(tail -n 1 "$work/pids")
}

# Stops the service as Ctrl-C does.
ctrl_c() {
  kill -INT "$service_pid"
  while kill -0 "$service_pid" 2>/dev/null; do sleep 0.05; done
}

grant() { # $1: curl's flags, $2: lock name, $3: holder, $4: ttl_ms
  say "curl $1 -w '\n' -X POST $locks/v1/leases -H 'Content-Type: application/json' -d '{\"name\":\"$2\",\"holder\":\"$3\",\"ttl_ms\":$4}'"
}

session() {
  locks "$work/locks"

  echo "@@ acquire"
  say "curl -si -w '\n' -X POST $locks/v1/leases -H 'Content-Type: application/json' -d '{\"name\":\"billing\",\"holder\":\"worker-1\",\"ttl_ms\":30000}' | tee $lease_file"
  local get_lease='LEASE=$(sed -nE '\''s/.*"lease_id":"([0-9a-f]+)".*/\1/p'\'' /tmp/lease.txt)'
  say "$get_lease"
  eval "$get_lease"
  export LEASE

  echo "@@ conflict"
  grant -si billing worker-2 30000

  echo "@@ status"
  say "curl -si -w '\n' $locks/v1/locks/billing"

  echo "@@ keepalive"
  say "curl -si -w '\n' -X POST \"$locks/v1/leases/\$LEASE/keepalive\""

  echo "@@ release"
  say "curl -si -w '\n' -X DELETE \"$locks/v1/leases/\$LEASE\""
  say "curl -si -w '\n' $locks/v1/locks/billing"
  say "curl -si -w '\n' -X POST \"$locks/v1/leases/\$LEASE/keepalive\""

  echo "@@ next-grant"
  grant -s billing worker-2 60000

  ctrl_c
  locks "$work/locks"
  echo "@@ restart"
  grant -si billing worker-3 30000
  grant -s reports worker-3 30000
  ctrl_c

  # A fresh service whose fdatasync libfiu can make fail, controlled through /tmp/fiu-PID.*.
  locks "$work/fiu-locks" "fiu-run -x -f /tmp/fiu"
  PID=$service_pid
  export PID
  echo "@@ disk"
  grant -s billing worker-1 60000
  say "fiu-ctrl -f /tmp/fiu -c 'enable name=posix/io/sync/fdatasync,failinfo=5' \$PID"
  grant -s reports worker-2 60000
  say "curl -si -w '\n' $locks/readyz"
  say "curl -s $locks/healthz"
  say "fiu-ctrl -f /tmp/fiu -c 'disable name=posix/io/sync/fdatasync' \$PID"
  say "sleep 0.3"
  say "curl -s $locks/readyz"
  grant -s reports worker-2 60000
  ctrl_c

  locks "$work/locks"
  echo "@@ ttl-zero"
  grant -si billing worker-1 0

  echo "@@ no-content-type"
  say "curl -si -w '\n' -X POST $locks/v1/leases -d '{\"name\":\"billing\",\"holder\":\"worker-1\",\"ttl_ms\":1000}'"
}

transcribe docs/lock-service.md "$@"
