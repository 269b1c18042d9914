#!/usr/bin/env bash
# The fence's cost at the database: pgbench transactions of the demo's append
# alone, with the plain lock, and with the full statement, interleaved, and
# PostgreSQL's CPU per transaction (every postgres process in /proc, reaped
# backends included). Run as root on the machine of the server, e.g.
#   benches/pgbench/run.sh "host=127.0.0.1 user=postgres" fencing_pgbench 3
set -euo pipefail
cd "$(dirname "$0")"
conn=$1; db=$2; rounds=${3:-3}; per_client=500; clients=16
pgbench=$(pg_config --bindir)/pgbench
psql "$conn dbname=postgres" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
psql "$conn dbname=$db" -q -f setup.sql
ticks() {
  local total=0 fields
  for pid in $(pgrep -u postgres postgres); do
    fields=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
    set -- $fields
    total=$((total + ${12} + ${13} + ${14} + ${15}))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)
for round in $(seq "$rounds"); do
  for script in none lock statement; do
    before=$(ticks)
    tps=$("$pgbench" "$conn dbname=$db" -n -M prepared -c $clients -j 2 -t $per_client -f $script.sql 2>/dev/null |
      awk '/^tps/ { printf "%.0f", $3 }')
    after=$(ticks)
    printf 'round %s %-9s %6s tps %5s us CPU/transaction\n' "$round" "$script" "$tps" \
      $(((after - before) * 1000000 / hz / (clients * per_client)))
  done
done
psql "$conn dbname=postgres" -qc "DROP DATABASE $db"
