#!/usr/bin/env bash
# Where the fence's cost goes at the database, statement by statement (BENCHMARKS.md §13,
# issue 39). Starts a PostgreSQL of its own (initdb in a temporary directory, an ephemeral
# loopback port, pg_stat_statements preloaded), runs one pgbench client through each script
# (BEGIN, the statement, the demo's append, COMMIT), rounds interleaved, and prints per
# script and round:
#   - WAL bytes and transaction ids per transaction (pg_current_wal_lsn, txid_current);
#   - the statement's executor time per call and its WAL records and bytes (pg_stat_statements);
#   - the append's executor time, for scale;
# then EXPLAIN (ANALYZE, BUFFERS, WAL) of the plain lock and of the full statement.
# Scripts: none (the append alone), select1 (SELECT of the parameters), read (the mark read
# without a lock: a probe, not a fence), lock (the equal-token fence), statement (the fence
# that creates or raises the row; here it finds the mark equal and only locks).
# Run as root (the instance runs as postgres):
#   benches/pgbench/split.sh [rounds] [transactions per script and round]
set -euo pipefail
cd "$(dirname "$0")"
rounds=${1:-3}; per_round=${2:-4000}
bin=$(pg_config --bindir)
dir=$(mktemp -d); chown postgres "$dir"
as_pg() { runuser -u postgres -- "$@"; }
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = top
autovacuum = off
CONF
as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
trap 'as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null; rm -rf "$dir"' EXIT
conn="host=127.0.0.1 port=$port user=postgres dbname=postgres"
q() { psql "$conn" -XAtq -v ON_ERROR_STOP=1 "$@"; }
q -c 'CREATE EXTENSION pg_stat_statements'
PGOPTIONS='-c client_min_messages=warning' q -f setup.sql

printf '%-5s %-9s %9s %9s %10s %14s %12s %11s\n' round script "WAL B/tx" "xids/tx" "stmt µs" "stmt WAL rec" "stmt WAL B" "append µs"
for round in $(seq "$rounds"); do
  for script in none select1 read lock statement; do
    q -c 'CHECKPOINT' -c 'SELECT pg_stat_statements_reset()' >/dev/null
    read -r lsn xid < <(q -F ' ' -c 'SELECT pg_current_wal_lsn(), txid_current()')
    "$bin/pgbench" "$conn" -n -M prepared -c 1 -t "$per_round" -f "$script.sql" >/dev/null
    # The statement is the script's second; the append is the one that inserts into demo_logs.
    q -F ' ' -c "
      WITH s AS (SELECT query, calls, total_exec_time, wal_records, wal_bytes FROM pg_stat_statements
                 WHERE calls = $per_round AND query !~* '^(BEGIN|COMMIT)'),
           stmt AS (SELECT * FROM s WHERE query !~ 'demo_logs'),
           app AS (SELECT * FROM s WHERE query ~ 'INSERT INTO demo_logs')
      SELECT $round, '$script',
             round(pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn') / $per_round),
             round((txid_current() - $xid - 1)::numeric / $per_round, 3),
             coalesce((SELECT round((total_exec_time * 1000 / calls)::numeric, 1)::text FROM stmt), '-'),
             coalesce((SELECT round(wal_records::numeric / calls, 2)::text FROM stmt), '-'),
             coalesce((SELECT round(wal_bytes::numeric / calls, 1)::text FROM stmt), '-'),
             (SELECT round((total_exec_time * 1000 / calls)::numeric, 1) FROM app)" |
      awk '{ printf "%-5s %-9s %9s %9s %10s %14s %12s %11s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
  done
done

# The plans, in a transaction rolled back: the lock of an existing mark row, and the full
# statement finding the mark equal (its `up` branch inserts nothing).
echo
echo "== EXPLAIN (ANALYZE, BUFFERS, WAL): the plain lock =="
q -c 'BEGIN' -c "EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) SELECT (mark - 9223372036854775808)::int8, way FROM marks WHERE key = 'load-1' FOR NO KEY UPDATE" -c 'ROLLBACK'
echo "== EXPLAIN (ANALYZE, BUFFERS, WAL): the full statement, the mark equal =="
sed -n 's/^WITH cur/WITH cur/p' statement.sql | sed "s/:client_id/1/g; s/:t/-9223372036854775803/g; s/;\$//" |
  { read -r sql; q -c 'BEGIN' -c "EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) $sql" -c 'ROLLBACK'; }
