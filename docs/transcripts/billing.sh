#!/usr/bin/env bash
# The payment-provider stand-in's session of docs/billing.md, run for real: `scenarios payments
# --listen 127.0.0.1:8090` (what the page's `cargo run -p scenarios -- payments …` runs, not
# shown), then each curl of the page. Written into the page; --check compares. Under 1 s.
# (The page's billing run needs Redis and PostgreSQL and is not made here.)
#
#   docs/transcripts/billing.sh [--check]
#
# Uses the debug binary (`cargo build -p scenarios`), or the one in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"

session() {
  serve payments.log "listening on" "scenarios payments --listen 127.0.0.1:8090" \
    "scenarios payments --listen 127.0.0.1:8090" >/dev/null
  local charges=127.0.0.1:8090/v1/charges json="-H 'Content-Type: application/json'" key="-H 'Idempotency-Key: run-1:cus_1'"
  echo "@@ payments"
  say "curl -si -X POST $charges $json $key -d '{\"customer\":\"cus_1\",\"amount\":1999,\"currency\":\"eur\"}'"
  echo
  say "curl -si -X POST $charges $json $key -H 'Fencing-Token: 1' -d '{\"customer\":\"cus_1\",\"amount\":1999,\"currency\":\"eur\"}'"
  echo
  say "curl -si -X POST $charges $json $key -d '{\"customer\":\"cus_1\",\"amount\":2500,\"currency\":\"eur\"}'"
  echo
  say "curl -s $charges"
}

transcribe docs/billing.md "$@"
