#!/usr/bin/env bash
# fencing-gate next to nginx as a reverse proxy, in one run, with fencing-load at
# the same settings against four targets on 127.0.0.1:
#
#   upstream   the upstream directly
#   nginx      Debian's nginx, proxy_pass to the upstream (keepalive 64, HTTP/1.1)
#   gate       fencing-gate --no-fencing (a plain reverse proxy)
#   fenced     fencing-gate, every POST fenced by its path, marks in memory
#
# Every request is `POST /logs/load-gvn-<n>` with `Fencing-Token: 1` and a 16-byte
# body, key n = one per connection (the same paths for all four targets). Rounds
# are interleaved, in rotated order, each its own fencing-load run with no warm-up
# cut, so that the server CPU read from /proc/PID/stat (utime+stime; for nginx
# master and workers) covers exactly the requests counted. Each target gets one
# unmeasured warm-up run first. Every run gets a freshly started upstream.
#
#   benches/gate-vs-nginx.sh
#   DURATION=3 ROUNDS=1 benches/gate-vs-nginx.sh
#
# Settings (environment): DURATION (s per round, 10, at most 60), ROUNDS (3), CONNECTIONS (32),
# KEYS (= CONNECTIONS), WARMUP_S (2), SERVER_CPUS (1) and CLIENT_CPUS (0) for
# taskset, WORKERS (nginx worker_processes = gate and upstream worker threads; the
# number of SERVER_CPUS, which is what tokio picks under taskset), UPSTREAM
# (`standin`: fencing-load --serve-only, the fenced stand-in, memory bounded; or
# `demo-resource`: serve --in-memory --no-fencing, whose redb log grows with every
# POST and slows down as it does), BASE_PORT (18610: four ports from it, checked
# free), NO_BUILD=1 to use the release binaries as they are.
#
# Needs nginx (installs Debian's package when missing, as root), jq, taskset.
# Builds the release binaries first. Runs its own nginx from a temp dir, never
# the system service.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-32}
KEYS=${KEYS:-$CONNECTIONS}
WARMUP_S=${WARMUP_S:-2}
# This machine has 2 cores: the servers share CPU 1, the load generator has CPU 0.
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
UPSTREAM=${UPSTREAM:-standin}
BASE_PORT=${BASE_PORT:-18610}
RUN_ID=gvn

bin=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release
tick=$(getconf CLK_TCK)
targets=(upstream nginx gate fenced)
declare -A port pids label

# The number of CPUs in a taskset list such as "1", "2-3" or "1,3-5".
count_cpus() {
  local n=0 part
  for part in ${1//,/ }; do
    if [[ $part == *-* ]]; then n=$((n + ${part#*-} - ${part%-*} + 1)); else n=$((n + 1)); fi
  done
  echo "$n"
}
WORKERS=${WORKERS:-$(count_cpus "$SERVER_CPUS")}
# The stand-in upstream serves DURATION + 60 s, and fencing-load caps --duration at 120.
((DURATION >= 1 && DURATION <= 60 && WARMUP_S >= 1 && WARMUP_S <= 60)) ||
  { echo "DURATION and WARMUP_S: 1 to 60 seconds" >&2; exit 2; }

# --- setup ------------------------------------------------------------------

need_nginx() {
  command -v nginx >/dev/null && return
  [[ $(id -u) == 0 ]] || { echo "nginx is missing; install it (apt-get install nginx)" >&2; exit 1; }
  echo "installing nginx (Debian's package) ..." >&2
  apt-get update -qq >/dev/null
  # policy-rc.d or no systemd may keep the service from starting; we never use it either way.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
}

build() {
  [[ ${NO_BUILD:-} == 1 ]] && return
  cargo build --quiet --release -p fencing-gate --bin fencing-gate
  cargo build --quiet --release -p fencing-benches --bin fencing-load
  if [[ $UPSTREAM == demo-resource ]]; then cargo build --quiet --release -p demo-resource --bin demo-resource; fi
}

# Fixed high ports, so the nginx config can name them; refuse to run on a busy one.
pick_ports() {
  local i=0 t
  for t in "${targets[@]}"; do
    port[$t]=$((BASE_PORT + i)); i=$((i + 1))
    if [[ -n $(ss -Hltn "sport = :${port[$t]}") ]]; then
      echo "port ${port[$t]} is in use; set BASE_PORT" >&2; exit 1
    fi
  done
}

cleanup() {
  local t
  for t in "${!pids[@]}"; do
    kill -TERM "${pids[$t]}" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}

# Wait until something accepts on 127.0.0.1:$1 (or give up after 10 s).
wait_port() {
  local i
  for i in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1 after 10 s" >&2; return 1
}

# Wait for the gate's "fencing-gate serving" line in its log $1.
wait_gate() {
  local i
  for i in $(seq 100); do
    grep -q "fencing-gate serving" "$1" && return
    sleep 0.1
  done
  echo "fencing-gate did not start; its log:" >&2; cat "$1" >&2; return 1
}

# --- the servers, all pinned to SERVER_CPUS ---------------------------------

# A new upstream process before every fencing-load run: the stand-in serves at most
# 120 s (fencing-load's --duration cap), and demo-resource's log would grow over the
# run and slow it. Each run thus starts from the same upstream, and every proxy
# opens its upstream connections anew (their idle ones see the old process close).
fresh_upstream() {
  local addr=127.0.0.1:${port[upstream]}
  if [[ -n ${pids[upstream]:-} ]]; then
    kill -TERM "${pids[upstream]}" 2>/dev/null || true
    wait "${pids[upstream]}" 2>/dev/null || true
    cat "$tmp/upstream.log" >>"$tmp/upstream-all.log"
  fi
  if [[ $UPSTREAM == standin ]]; then
    label[upstream]="upstream (fencing-load stand-in, fenced)"
    taskset -c "$SERVER_CPUS" "$bin/fencing-load" --serve-only "$addr" --duration $((DURATION + 60)) \
      --server-threads "$WORKERS" >"$tmp/upstream.log" 2>&1 &
  else
    label[upstream]="upstream (demo-resource --no-fencing)"
    (cd "$tmp" && RUST_LOG=warn TOKIO_WORKER_THREADS=$WORKERS exec taskset -c "$SERVER_CPUS" \
      "$bin/demo-resource" serve --in-memory --no-fencing --listen "$addr") >"$tmp/upstream.log" 2>&1 &
  fi
  pids[upstream]=$!
  wait_port "${port[upstream]}"
}

write_nginx_conf() {
  cat >"$tmp/nginx.conf" <<EOF
worker_processes $WORKERS;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/nginx-body;
  proxy_temp_path $tmp/nginx-proxy;
  fastcgi_temp_path $tmp/nginx-fastcgi;
  uwsgi_temp_path $tmp/nginx-uwsgi;
  scgi_temp_path $tmp/nginx-scgi;
  # A connection nginx closes costs fencing-load a reconnect (counted apart): none here.
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  upstream backend {
    server 127.0.0.1:${port[upstream]};
    keepalive 64;
    # Default 1000 would reopen upstream connections; hyper's pool never does.
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:${port[nginx]};
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # What the gate sends too (docs/gate.md), so that both proxies do the
      # same work and the upstream parses the same request from either.
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header Forwarded "for=\$remote_addr;proto=\$scheme";
    }
  }
}
EOF
}

start_nginx() {
  write_nginx_conf
  # As root the workers run as nobody: let them into the temp dir.
  chmod 755 "$tmp"
  label[nginx]="nginx $(nginx -v 2>&1 | sed 's|.*nginx/||')"
  taskset -c "$SERVER_CPUS" nginx -c "$tmp/nginx.conf" -g 'daemon off;' >"$tmp/nginx.log" 2>&1 &
  pids[nginx]=$!
  wait_port "${port[nginx]}"
}

# $1: target name; the rest: extra gate flags.
start_gate() {
  local t=$1; shift
  TOKIO_WORKER_THREADS=$WORKERS taskset -c "$SERVER_CPUS" "$bin/fencing-gate" \
    --listen "127.0.0.1:${port[$t]}" --upstream "http://127.0.0.1:${port[upstream]}" "$@" \
    >"$tmp/$t.log" 2>&1 &
  pids[$t]=$!
  wait_gate "$tmp/$t.log"
}

# --- measuring --------------------------------------------------------------

# The processes whose CPU counts for target $1: nginx's master and its workers.
server_pids() {
  local pid=${pids[$1]}
  if [[ $1 == nginx ]]; then echo "$pid $(pgrep -P "$pid" | tr '\n' ' ')"; else echo "$pid"; fi
}

# utime + stime, in clock ticks, summed over the pids given.
cpu_ticks() {
  local sum=0 pid stat rest
  for pid in "$@"; do
    stat=$(<"/proc/$pid/stat")
    rest=${stat##*) }          # past "pid (comm) ", comm may hold spaces
    read -r -a f <<<"$rest"    # f[0] is field 3 (state): utime is field 14, stime 15
    sum=$((sum + f[11] + f[12]))
  done
  echo "$sum"
}

# One fencing-load run against target $1 for $2 s; JSON to $3. Never fails the script.
load() {
  local t=$1 secs=$2 json=$3 rc=0
  taskset -c "$CLIENT_CPUS" "$bin/fencing-load" --url "http://127.0.0.1:${port[$t]}/logs/{key}" \
    -X POST --run-id "$RUN_ID" --first-token 1 --keys "$KEYS" --connections "$CONNECTIONS" \
    --duration "$secs" --rounds 1 --warmup-ms 0 --json "$json" >"$json.log" 2>&1 || rc=$?
  if [[ $rc != 0 ]]; then
    echo "  fencing-load against $t exited $rc:" >&2
    tail -n 3 "$json.log" | sed 's/^/    /' >&2
  fi
}

# Round $2 of target $1: load it, read CPU before and after, append a row to results.tsv.
measure() {
  local t=$1 r=$2 json="$tmp/$1-$2.json"
  local srv0 srv1 up0 up1
  fresh_upstream
  read -r -a spids <<<"$(server_pids "$t")"
  srv0=$(cpu_ticks "${spids[@]}"); up0=$(cpu_ticks "${pids[upstream]}")
  load "$t" "$DURATION" "$json"
  srv1=$(cpu_ticks "${spids[@]}"); up1=$(cpu_ticks "${pids[upstream]}")
  if [[ ! -s $json ]]; then
    printf '%s\t%s\tfailed\n' "$t" "$r" >>"$tmp/results.tsv"; return
  fi
  # target round requests measured_s p50 p99 errors non2xx server_ticks upstream_ticks
  jq -r --arg t "$t" --arg r "$r" --argjson s $((srv1 - srv0)) --argjson u $((up1 - up0)) \
    '.targets[0] | [$t, $r, .requests, .measured_s, .p50_us, .p99_us, .errors + .connect_errors,
      .status_409 + .status_400 + .status_other, $s, $u] | @tsv' "$json" >>"$tmp/results.tsv"
  tail -n 1 "$tmp/results.tsv" | awk -F'\t' -v tick="$tick" -v rounds="$ROUNDS" '{
    printf "round %s/%s  %-8s %9.0f req/s  p50 %8.1f us  p99 %8.1f us  errors %d  non-2xx %d  server %6.2f us/req  upstream %6.2f us/req\n",
      $2, rounds, $1, $3 / $4, $5, $6, $7, $8, $9 * 1e6 / tick / $3, $10 * 1e6 / tick / $3 }'
}

# Rounds interleaved, each round starting one target later, so drift hits all alike.
run_rounds() {
  local r i n=${#targets[@]}
  for t in "${targets[@]}"; do fresh_upstream; load "$t" "$WARMUP_S" "$tmp/warmup-$t.json"; done
  for r in $(seq "$ROUNDS"); do
    for i in $(seq 0 $((n - 1))); do
      measure "${targets[$(((i + r - 1) % n))]}" "$r"
    done
  done
}

# --- the report ---------------------------------------------------------------

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# One target's figures over its rounds: req/s (all requests / all seconds), the median
# round's p50 and p99, error and non-2xx sums, CPU per request over all rounds.
summarize() {
  local t=$1 rows p50 p99
  rows=$(awk -F'\t' -v t="$t" '$1 == t && $3 != "failed"' "$tmp/results.tsv")
  [[ -n $rows ]] || { echo "$t failed"; return; }
  p50=$(cut -f5 <<<"$rows" | median)
  p99=$(cut -f6 <<<"$rows" | median)
  awk -F'\t' -v t="$t" -v p50="$p50" -v p99="$p99" -v tick="$tick" '
    { n += $3; s += $4; e += $7; o += $8; sv += $9; up += $10 }
    END { printf "%s %.1f %.1f %.1f %d %d %.2f %.2f\n", t, n / s, p50, p99, e, o,
      sv * 1e6 / tick / n, up * 1e6 / tick / n }' <<<"$rows"
}

# A table row: target $1's req/s and p99 over target $2's, from report's RPS and P99.
ratio_row() {
  [[ -n ${RPS[$1]:-} && -n ${RPS[$2]:-} ]] || return 0
  awk -v a="${RPS[$1]}" -v b="${RPS[$2]}" -v c="${P99[$1]}" -v d="${P99[$2]}" -v l="$3" \
    'BEGIN { printf "| **%s** | **%.3f** | | **%.3f** | | | | |\n", l, a / b, c / d }'
}

report() {
  local t rps p50 p99 err non cpu up failed=""
  declare -A RPS P99
  echo
  echo "| target | req/s | p50 µs | p99 µs | errors | non-2xx | server CPU µs/req | upstream CPU µs/req |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  for t in "${targets[@]}"; do
    read -r _ rps p50 p99 err non cpu up <<<"$(summarize "$t")"
    if [[ $rps == failed ]]; then failed+=" $t"; echo "| ${label[$t]} | failed | | | | | | |"; continue; fi
    RPS[$t]=$rps; P99[$t]=$p99
    [[ $t == upstream ]] && up="(same)"
    printf '| %s | %.0f | %.1f | %.1f | %d | %d | %.2f | %s |\n' "${label[$t]}" "$rps" "$p50" "$p99" "$err" "$non" "$cpu" "$up"
  done
  ratio_row fenced nginx "gate fenced / nginx"
  ratio_row gate nginx "gate --no-fencing / nginx"
  ratio_row fenced gate "gate fenced / gate --no-fencing"
  echo
  echo "req/s: all requests over all measured seconds; p50, p99: the median round's (rounds: $ROUNDS);"
  echo "errors: no answer or connection failed; non-2xx: 409, 400 and other statuses;"
  echo "server CPU: utime+stime of the target's process(es) (nginx: master and workers), of the"
  echo "upstream for the direct target; upstream CPU: the upstream's during the same rounds."
  [[ -z $failed ]] || echo "FAILED targets:$failed (their fencing-load logs were printed above)"
}

# Anything the servers said beyond their start-up lines.
server_notes() {
  local f
  for f in "$tmp/nginx-error.log" "$tmp/nginx.log" "$tmp/gate.log" "$tmp/fenced.log" "$tmp/upstream-all.log"; do
    [[ -f $f ]] || continue
    grep -v -e "fencing-gate serving" -e "mark raised: the key's first" -e "serving the fenced stand-in" \
      -e "^listening on" -e "^fencing-load: serving" "$f" | head -n 5 | sed "s|^|$(basename "$f"): |" || true
  done
}

# --- main -------------------------------------------------------------------

need_nginx
command -v jq >/dev/null || { echo "jq is missing" >&2; exit 1; }
build
pick_ports
tmp=$(mktemp -d /tmp/gate-vs-nginx.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT TERM

fresh_upstream
start_nginx
start_gate gate --no-fencing
label[gate]="fencing-gate --no-fencing"
start_gate fenced
label[fenced]="fencing-gate, fenced"

dirty=$(git status --porcelain -- fencing-gate fencing-layer)
echo "$(date -u '+%F %T UTC'), $(git rev-parse --short HEAD)${dirty:+ (fencing-gate/fencing-layer with uncommitted changes)}"
echo "servers on CPU $SERVER_CPUS (nginx worker_processes $WORKERS, TOKIO_WORKER_THREADS=$WORKERS for the gates,"
echo "  upstream threads $WORKERS), fencing-load on CPU $CLIENT_CPUS (1 client thread); $(nproc --all) CPUs"
# With one thread the gate runs a current-thread runtime (no worker threads: the main
# thread serves); with more, tokio's workers.
workers=$(cat /proc/"${pids[fenced]}"/task/*/comm | grep -cE '^tokio-(rt-worker|runtime-w)' || true)
echo "gate serving threads: $([[ $workers == 0 ]] && echo "1 (current-thread runtime)" || echo "$workers"),"\
  "nginx workers: $(pgrep -c -P "${pids[nginx]}")"
echo "POST /logs/load-$RUN_ID-{0..$((KEYS - 1))}, Fencing-Token: 1, 16-byte body; $CONNECTIONS connections,"
echo "  closed loop, $ROUNDS rounds x $DURATION s per target, interleaved, after a ${WARMUP_S} s warm-up each"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
run_rounds
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
server_notes
report
