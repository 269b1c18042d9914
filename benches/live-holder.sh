#!/usr/bin/env bash
# A real holder, a load test of the README's kind against the same live service, and the holder writing afterwards.
set -u
cd "$(dirname "$0")/.."
cargo build -q --release -p demo-lock-service -p demo-resource -p fencing-benches --bin demo-lock-service --bin demo-resource --bin fencing-load
d=$(mktemp -d)
target/release/demo-lock-service --listen 127.0.0.1:7301 --data-dir $d/locks >$d/locks.log 2>&1 &
L=$!
target/release/demo-resource serve --listen 127.0.0.1:7302 --data-dir $d/resource >$d/res.log 2>&1 &
R=$!
sleep 1
echo '$ curl -s -X POST http://127.0.0.1:7301/v1/leases -d {"name":"docs-7","holder":"real-holder","ttl_ms":60000}'
grant=$(curl -s -X POST http://127.0.0.1:7301/v1/leases -H 'Content-Type: application/json' -d '{"name":"docs-7","holder":"real-holder","ttl_ms":60000}')
echo "$grant"
token=$(echo "$grant" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
echo "\$ curl -si -X PUT http://127.0.0.1:7302/kv/docs-7 -H 'Fencing-Token: $token' -d before   # the real holder writes"
curl -s -o /dev/null -w '%{http_code}\n' -X PUT http://127.0.0.1:7302/kv/docs-7 -H "Fencing-Token: $token" -d before
echo '$ fencing-load --url http://127.0.0.1:7302/kv/docs-7 -X PUT --body hi --rate 2000 --duration 2 --rounds 1   # no {key}'
target/release/fencing-load --url http://127.0.0.1:7302/kv/docs-7 -X PUT --body hi --rate 2000 --duration 2 --rounds 1 2>&1 | tail -2; echo "exit ${PIPESTATUS[0]}"
echo "\$ fencing-load --url 'http://127.0.0.1:7302/kv/{key}' -X PUT -H 'Content-Type: application/json' --body '{\"text\":\"hi\"}' --new-holder-every 500 --rate 2000 --max-p99 20 --duration 3 --rounds 2 --plot $d/latency.svg"
target/release/fencing-load --url 'http://127.0.0.1:7302/kv/{key}' -X PUT -H 'Content-Type: application/json' --body '{"text":"hi"}' --new-holder-every 500 --rate 2000 --max-p99 20 --duration 3 --rounds 2 --plot $d/latency.svg 2>&1 | tail -12
echo "exit ${PIPESTATUS[0]}"
echo "\$ curl -si -X PUT http://127.0.0.1:7302/kv/docs-7 -H 'Fencing-Token: $token' -d after   # the real holder, after the load test"
curl -s -w '\n%{http_code}\n' -X PUT http://127.0.0.1:7302/kv/docs-7 -H "Fencing-Token: $token" -d after
curl -s -w '\n' http://127.0.0.1:7302/kv/docs-7
echo '$ fencing-load --url http://127.0.0.1:7399 (nobody listens)'
target/release/fencing-load --url 'http://127.0.0.1:7399/kv/{key}' -X PUT --body hi --duration 1 --rounds 1 2>&1 | tail -1; echo "exit ${PIPESTATUS[0]}"
echo '$ fencing-load --url http://127.0.0.1:7302/nope/{key} (a wrong route)'
target/release/fencing-load --url 'http://127.0.0.1:7302/nope/{key}' -X PUT --body hi --duration 1 --rounds 1 2>&1 | tail -1; echo "exit ${PIPESTATUS[0]}"
kill $L $R; wait 2>/dev/null; rm -rf $d
