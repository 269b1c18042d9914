#!/usr/bin/env bash
# docs/replicas.md, run for real: `demo-resource serve --postgres` replicas on 127.0.0.1:8081 and
# :8082 against databases of their own on the machine's PostgreSQL (127.0.0.1:5432, user
# postgres; fencing_demo, fencing_demo_local, fencing_demo_claims, fencing_demo_etcd and
# fencing_demo_bouncer: the script refuses to run if one exists, and drops them at the end),
# fenced in the write's transaction, with --local-marks, and with --shared-marks (a raise waiting
# for a slow write on the other replica, then for a replica killed with a write inside); the same
# through an etcd with its data in /tmp/etcd-demo (refused if it exists, removed at the end); an
# etcd serving TLS on 127.0.0.1:23790, not shown, with certificates made as docs/token-sources.md
# makes them, in a directory of this script's own where the page's reader is in /tmp/tlsdemo (so
# the session names them relatively); and a PgBouncer in transaction mode on 127.0.0.1:6432 (a stock configuration in a
# temporary directory, run as user postgres when this runs as root: PgBouncer refuses root).
# Written into the page; --check compares. About 25 s (the slow writes, the claims' expiry).
#
#   docs/transcripts/replicas.sh [--check]
#
# Uses the debug binaries the test step builds (`cargo build -p demo-resource --features
# postgres,etcd`), or those in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
pg="-h 127.0.0.1 -U postgres"
databases=(fencing_demo fencing_demo_local fencing_demo_claims fencing_demo_etcd fencing_demo_bouncer)
etcd_data=/tmp/etcd-demo
# shellcheck disable=SC2086
existing=$(psql $pg -Atc "SELECT string_agg(datname, ' ') FROM pg_database WHERE datname = ANY ('{$(IFS=,; echo "${databases[*]}")}'::text[])" postgres)
if [[ -n $existing ]]; then
  echo "database(s) $existing exist: the page's session creates them; drop them (dropdb $pg NAME)" >&2
  exit 1
fi
if [[ -e $etcd_data ]]; then
  echo "$etcd_data exists: the page's etcd starts from nothing there; move it away" >&2
  exit 1
fi
bouncer_dir=$(mktemp -d)
finish() {
  cleanup
  rm -rf "$etcd_data" "$bouncer_dir"
  # Only the databases this run created (createdb_ below records each), at once: each DROP
  # DATABASE waits for a checkpoint.
  while read -r db; do
    # shellcheck disable=SC2086
    dropdb $pg --force --if-exists "$db" &
  done <"${created:-/dev/null}"
  wait
}
created=$(mktemp)
trap 'finish; rm -f "$created"' EXIT

# The background processes a session starts and the page does not show, or shows with its own
# redirections: $1 a name for its log, $2 what runs it, $3 a command that succeeds once it serves.
start() {
  bash -c "exec $2" >"$work/$1.log" 2>&1 9>&- &
  echo $! >>"$work/pids"
  for _ in $(seq 200); do
    if bash -c "$3" >/dev/null 2>&1 9>&-; then return 0; fi
    sleep 0.05
  done
  echo "$1 did not start:" >&2
  cat "$work/$1.log" >&2
  exit 1
}

createdb_() { # $1: the database, made as the page shows; recorded for finish to drop once made
  local out
  out=$(say "createdb $pg $1")
  printf '%s\n' "$out"
  if [[ $out != *$'\n'exit\ * ]]; then echo "$1" >>"$created"; fi
}

# A replica on 127.0.0.1:$1 with flags $2, shown as the page shows it; its pid in $replica_pid.
replica() {
  serve "replica-$1-$(wc -l <"$work/pids").log" "^listening on" "demo-resource serve $2 --listen 127.0.0.1:$1" \
    "demo-resource serve $2 --listen 127.0.0.1:$1"
  replica_pid=$(tail -n 1 "$work/pids")
}

# Stops what the sessions started since the last call (SIGTERM: a graceful stop), not shown.
stop_replicas() {
  while read -r pid; do
    kill "$pid" 2>/dev/null || true
    { wait "$pid"; } 2>/dev/null || true
  done < <(grep -vxF -f "$work/kept" "$work/pids")
  cat "$work/pids" >>"$work/kept"
}

# The seed's four requests: A's first write on 8081, B's on 8082, A's late one on 8081, the log.
four_requests() {
  say "curl -s -w '\n' -X POST localhost:8081/logs/billing -H 'Fencing-Token: 1' -d 'A: first write'"
  say "curl -s -w '\n' -X POST localhost:8082/logs/billing -H 'Fencing-Token: 2' -d 'B: write under valid lease'"
  say "curl -si -w '\n' -X POST localhost:8081/logs/billing -H 'Fencing-Token: 1' -d 'A: write from expired lease'"
  say "curl -s -w '\n' localhost:8081/logs/billing"
}

# A's slow write inside 8081 while B's higher token reaches 8082; then 8081 killed with a write inside.
raise_waits() {
  say "curl -s -w '\n' -X POST localhost:8081/logs/jobs -H 'Fencing-Token: 1' -d 'A: first write'"
  say "curl -s -w '\n' -X POST 'localhost:8081/logs/jobs?delay_ms=3000' -H 'Fencing-Token: 1' -d 'A: slow write' &"
  say "sleep 0.5"
  say "curl -s -o /dev/null -w '%{http_code} after %{time_total}s\n' -X POST localhost:8082/logs/jobs -H 'Fencing-Token: 2' -d 'B: write under valid lease'"
  say "curl -si -w '\n' -X POST localhost:8081/logs/jobs -H 'Fencing-Token: 1' -d 'A: write from expired lease'"
  say "curl -s -w '\n' localhost:8081/logs/jobs"
}
crash() { # $1: replica 8081's pid
  say "curl -s -X POST 'localhost:8081/logs/jobs?delay_ms=10000' -H 'Fencing-Token: 3' -d 'A: slow write, then killed' &"
  say "sleep 0.5; kill -9 $1"
  { wait "$1"; } 2>/dev/null || true
  say "curl -s -o /dev/null -w '%{http_code} after %{time_total}s\n' -X POST localhost:8082/logs/jobs -H 'Fencing-Token: 4' -d 'B: after the crash'"
  say "curl -s -w '\n' localhost:8082/logs/jobs"
}

session() {
  touch "$work/kept"
  echo "@@ in-transaction"
  createdb_ fencing_demo
  replica 8081 "--postgres postgres://postgres@127.0.0.1/fencing_demo"
  replica 8082 "--postgres postgres://postgres@127.0.0.1/fencing_demo"
  four_requests
  stop_replicas

  echo "@@ local-marks"
  createdb_ fencing_demo_local
  replica 8081 "--postgres postgres://postgres@127.0.0.1/fencing_demo_local --local-marks"
  replica 8082 "--postgres postgres://postgres@127.0.0.1/fencing_demo_local --local-marks"
  four_requests
  stop_replicas

  echo "@@ shared-marks"
  createdb_ fencing_demo_claims
  replica 8081 "--postgres postgres://postgres@127.0.0.1/fencing_demo_claims --shared-marks"
  local a=$replica_pid
  replica 8082 "--postgres postgres://postgres@127.0.0.1/fencing_demo_claims --shared-marks"
  raise_waits
  echo "@@ crash"
  crash "$a"
  stop_replicas

  echo "@@ etcd"
  printf '$ %s\n' "etcd --data-dir $etcd_data 2>etcd.log &   # client URL http://127.0.0.1:2379"
  start etcd "etcd --data-dir $etcd_data 2>etcd.log" "curl -sf http://127.0.0.1:2379/health"
  createdb_ fencing_demo_etcd
  replica 8081 "--postgres postgres://postgres@127.0.0.1/fencing_demo_etcd --etcd http://127.0.0.1:2379"
  a=$replica_pid
  replica 8082 "--postgres postgres://postgres@127.0.0.1/fencing_demo_etcd --etcd http://127.0.0.1:2379"
  raise_waits
  crash "$a"
  say "etcdctl get --prefix fencing/ | cat -v   # the mark, and replica B's claim (on B's lease); A's went with its lease"
  stop_replicas

  # The etcd of docs/token-sources.md, "TLS", with certificates made as that page makes them.
  mkdir "$work/tlsdemo"
  cd "$work/tlsdemo"
  {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=fencing-demo-ca -keyout ca.key -out ca.pem
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 -extfile san.ext -out server.pem
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=another-ca -keyout other-ca.key -out other-ca.pem
  } >/dev/null 2>&1
  start etcd-tls "etcd --name demo --data-dir $work/tlsdemo/etcd-data --listen-client-urls https://127.0.0.1:23790 --advertise-client-urls https://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster demo=http://127.0.0.1:23800 --cert-file server.pem --key-file server.key" \
    "curl -sf --cacert ca.pem https://127.0.0.1:23790/health"
  echo "@@ etcd-tls"
  serve "$work/tls-replica.log" "^listening on" "demo-resource serve --in-memory --listen 127.0.0.1:18080 --etcd https://127.0.0.1:23790 --etcd-ca ca.pem" \
    "demo-resource serve --in-memory --listen 127.0.0.1:18080 --etcd https://127.0.0.1:23790 --etcd-ca ca.pem"
  say "curl -s -w '\n' -X POST 127.0.0.1:18080/logs/billing -H 'Fencing-Token: 2' -d 'B: write under valid lease'"
  say "curl -s -w '\n' -X POST 127.0.0.1:18080/logs/billing -H 'Fencing-Token: 1' -d 'A: write from expired lease'"
  say "RUST_LOG=off demo-resource serve --in-memory --listen 127.0.0.1:18080 --etcd https://127.0.0.1:23790 --etcd-ca other-ca.pem"
  say "demo-resource serve --in-memory --listen 127.0.0.1:18080 --etcd https://127.0.0.1:23790 --etcd-ca missing.pem"
  cd "$work"
  stop_replicas

  # A stock PgBouncer in transaction mode on 6432, every database forwarded to 127.0.0.1:5432.
  cat >"$bouncer_dir/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
unix_socket_dir =
auth_type = trust
auth_file = $bouncer_dir/userlist.txt
pool_mode = transaction
logfile = $bouncer_dir/pgbouncer.log
EOF
  echo '"postgres" ""' >"$bouncer_dir/userlist.txt"
  local as=""
  if [[ $(id -u) == 0 ]]; then
    chown -R postgres:postgres "$bouncer_dir"
    as="setpriv --reuid=postgres --regid=postgres --init-groups"
  fi
  start pgbouncer "$as pgbouncer $bouncer_dir/pgbouncer.ini" "psql 'host=127.0.0.1 port=6432 user=postgres dbname=postgres' -Atc 'SELECT 1'"
  echo "@@ pgbouncer"
  createdb_ fencing_demo_bouncer
  say "demo-resource serve --listen 127.0.0.1:0 --postgres \"host=127.0.0.1 port=6432 user=postgres dbname=fencing_demo_bouncer\""
}

transcribe docs/replicas.md "$@"
