#!/usr/bin/env bash
# docs/authenticity.md, run for real: `demo-lock-service keygen` and a lock service signing its
# grants on 127.0.0.1:17000 (the signed grant, then the online check's answers), and in a
# directory of its own demo-resource on 127.0.0.1:18481 (admin routes on :18491) trusting
# lock.pub, sent the page's raises with and without proofs. The resource's key pairs are made
# from fixed seeds (docs/transcripts/proof.py, which also signs its proofs with openssl), so its
# session is the same on every run; keygen's key, and so its grant's proof, is new each time.
# Written into the page; --check compares. About 1 s.
#
#   docs/transcripts/authenticity.sh [--check]
#
# Uses the debug binaries (`cargo build -p demo-lock-service -p demo-resource`), or those in
# $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
proof() { python3 "$root/docs/transcripts/proof.py" "$@"; }

session() {
  mkdir locks resource
  cd locks
  echo "@@ keygen"
  say "demo-lock-service keygen --secret lock.key --public lock.pub"
  say "demo-lock-service keygen --secret lock.key --public other.pub"
  serve locks.log "^listening on" \
    "demo-lock-service --listen 127.0.0.1:17000 --data-dir ./data --signing-key lock.key --max-leases 2" \
    "demo-lock-service --listen 127.0.0.1:17000 --data-dir ./data --signing-key lock.key --max-leases 2"
  say "curl -s -w '\n' -X POST localhost:17000/v1/leases -H 'content-type: application/json' \\
    -d '{\"name\":\"billing\",\"holder\":\"worker-1\",\"ttl_ms\":30000}'"

  echo "@@ check"
  for lock_token in billing/tokens/1 billing/tokens/2 payroll/tokens/1 billing/tokens/007; do
    say "curl -s -w '\n' localhost:17000/v1/locks/$lock_token"
  done

  echo "@@ full"
  say "curl -s -w '\n' -X POST localhost:17000/v1/leases -H 'content-type: application/json' \\
    -d '{\"name\":\"payroll\",\"holder\":\"worker-2\",\"ttl_ms\":30000}'"
  say "curl -si -w '\n' -X POST localhost:17000/v1/leases -H 'content-type: application/json' \\
    -d '{\"name\":\"reports\",\"holder\":\"worker-3\",\"ttl_ms\":30000}'"

  cd ../resource
  proof keypair "docs/authenticity.md lock.key" lock.key lock.pub
  proof keypair "docs/authenticity.md other.key" other.key other.pub
  local five six payroll stranger
  five=$(proof sign lock.key billing 5)
  six=$(proof sign lock.key billing 6)
  payroll=$(proof sign lock.key payroll 6)
  stranger=$(proof sign other.key billing 6)
  local logs=localhost:18481/logs/billing
  echo "@@ resource"
  serve resource.log "^admin listening on" \
    "demo-resource serve --data-dir ./data --listen 127.0.0.1:18481 --verify-key lock.pub --admin-listen 127.0.0.1:18491" \
    "demo-resource serve --data-dir ./data --listen 127.0.0.1:18481 --verify-key lock.pub --admin-listen 127.0.0.1:18491"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 5' -H 'Fencing-Proof: $five' -d 'A: first write'"
  say "curl -si -w '\n' -X POST $logs -H 'Fencing-Token: 18446744073709551615' -d 'forged'"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 1000' -H 'Fencing-Proof: $five' -d 'forged'"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 6' -H 'Fencing-Proof: $payroll' -d 'forged'"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 6' -H 'Fencing-Proof: $stranger' -d 'forged'"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 5' -d 'A: second write'"
  say "curl -s -w '\n' -X POST $logs -H 'Fencing-Token: 6' -H 'Fencing-Proof: $six' -d 'B: first write'"
  say "curl -s -w '\n' $logs"
}

transcribe docs/authenticity.md "$@"
