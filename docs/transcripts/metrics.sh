#!/usr/bin/env bash
# The demo services' session of docs/metrics.md, run for real: the lock service and the storage
# service on 127.0.0.1:7000 and :8080 with data in /tmp/fencing-metrics (as the page shows; the
# script refuses to run if that directory exists), a lease that lapses, a write under the next
# one, a stale write, then a scrape of each service's /metrics. Written into the page; --check
# compares. About 4 s (the page's `sleep 3`, A's 2 s lease lapsing).
#
#   docs/transcripts/metrics.sh [--check]
#
# The page shows `target/debug/…`; the script runs the debug binaries the test step builds
# (`cargo build -p demo-lock-service -p demo-resource`), or those in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
demo=/tmp/fencing-metrics
claim_path "$demo"

session() {
  echo "@@ start"
  serve locks.log "^listening on" \
    "RUST_LOG=off target/debug/demo-lock-service --listen 127.0.0.1:7000 --data-dir $demo/locks" \
    "RUST_LOG=off $bin/demo-lock-service --listen 127.0.0.1:7000 --data-dir $demo/locks"
  serve resource.log "^listening on" \
    "RUST_LOG=off target/debug/demo-resource serve --listen 127.0.0.1:8080 --data-dir $demo/resource" \
    "RUST_LOG=off $bin/demo-resource serve --listen 127.0.0.1:8080 --data-dir $demo/resource"

  echo "@@ stale"
  say "curl -s -w '\n' -X POST localhost:7000/v1/leases -H 'content-type: application/json' -d '{\"name\":\"billing\",\"holder\":\"A\",\"ttl_ms\":2000}'"
  say "sleep 3   # A is paused past its TTL"
  say "curl -s -w '\n' -X POST localhost:7000/v1/leases -H 'content-type: application/json' -d '{\"name\":\"billing\",\"holder\":\"B\",\"ttl_ms\":30000}'"
  say "curl -s -w '\n' -X POST localhost:8080/logs/billing -H 'Fencing-Token: 2' -d 'B: write under valid lease'"
  say "curl -s -w '\n' -X POST localhost:8080/logs/billing -H 'Fencing-Token: 1' -d 'A: write from expired lease'"
  say "curl -s localhost:8080/metrics | grep -v '^\$' | LC_ALL=C sort"
  say "curl -s localhost:7000/metrics | grep -v '^\$' | LC_ALL=C sort"
}

transcribe docs/metrics.md "$@"
