#!/usr/bin/env bash
# User-space instructions per proxied request, by callgrind: fencing-gate (fenced and
# --no-fencing) and nginx, each alone under valgrind in front of the fencing-load stand-in,
# loaded by fencing-load (32 connections, POST /logs/load-gic-{0..31}, Fencing-Token: 1,
# 16-byte body). Instrumentation is switched on only for a 4 s run after a 2 s warm-up, so
# start-up is left out: the count is (instructions in that run) / (requests in it). The
# load is slow under valgrind (a few thousand requests a second), and the per-request
# figure moves by about ±1 % from run to run with how requests batch; the kernel's share
# (the same syscalls per request for all three: benches/gate-vs-nginx.sh's notes) is not
# counted. Load-insensitive, unlike wall time.
#
#   benches/gate-instructions.sh                 # fenced gate-unfenced nginx
#   benches/gate-instructions.sh fenced          # one of them
#
# Needs valgrind, nginx (Debian's), jq. Builds the release binaries first (NO_BUILD=1 to
# skip). Ports BASE_PORT (18640) and BASE_PORT + 1.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_PORT=${BASE_PORT:-18640}
targets=("${@:-fenced gate-unfenced nginx}")
read -r -a targets <<<"${targets[*]}"
for tool in valgrind callgrind_control nginx jq; do
  command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
if [[ ${NO_BUILD:-} != 1 ]]; then
  cargo build --quiet --release -p fencing-gate --bin fencing-gate
  cargo build --quiet --release -p fencing-benches --bin fencing-load
fi
bin=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release
up=127.0.0.1:$BASE_PORT front=127.0.0.1:$((BASE_PORT + 1))
tmp=$(mktemp -d /tmp/gate-instructions.XXXXXX)
chmod 755 "$tmp" # nginx's workers, as root, run as nobody
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT

load() { # $1: seconds
  "$bin/fencing-load" --url "http://$front/logs/{key}" -X POST --run-id gic --first-token 1 --keys 32 \
    --connections 32 --duration "$1" --rounds 1 --warmup-ms 0 --json "$tmp/load.json" >"$tmp/load.log" 2>&1 ||
    { echo "fencing-load failed:" >&2; tail -n 3 "$tmp/load.log" >&2; exit 1; }
}

wait_port() {
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null && return; sleep 0.1; done
  echo "nothing listens on $1" >&2; exit 1
}

nginx_conf() {
  cat >"$tmp/nginx.conf" <<EOF
worker_processes 1; master_process off; daemon off; pid $tmp/nginx.pid; error_log $tmp/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off; client_body_temp_path $tmp/b; proxy_temp_path $tmp/p; fastcgi_temp_path $tmp/f;
  uwsgi_temp_path $tmp/u; scgi_temp_path $tmp/s; keepalive_requests 1000000;
  upstream backend { server $up; keepalive 64; keepalive_requests 1000000; }
  server {
    listen $front;
    location / {
      proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header Forwarded "for=\$remote_addr;proto=\$scheme";
    }
  }
}
EOF
}

printf '%-14s %9s %14s %12s\n' target requests instructions "per request"
for target in "${targets[@]}"; do
  "$bin/fencing-load" --serve-only "$up" --duration 100 --server-threads 1 >"$tmp/upstream.log" 2>&1 &
  upstream=$!
  pids=("$upstream")
  wait_port "$up"
  vg=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$tmp/callgrind.out")
  case $target in
    fenced) TOKIO_WORKER_THREADS=1 "${vg[@]}" "$bin/fencing-gate" --listen "$front" --upstream "http://$up" \
      >"$tmp/front.log" 2>&1 & ;;
    gate-unfenced) TOKIO_WORKER_THREADS=1 "${vg[@]}" "$bin/fencing-gate" --listen "$front" --upstream "http://$up" \
      --no-fencing >"$tmp/front.log" 2>&1 & ;;
    nginx) nginx_conf; "${vg[@]}" nginx -c "$tmp/nginx.conf" >"$tmp/front.log" 2>&1 & ;;
    *) echo "unknown target $target (fenced, gate-unfenced, nginx)" >&2; exit 2 ;;
  esac
  front_pid=$!
  pids+=("$front_pid")
  wait_port "$front"
  load 2
  callgrind_control -i on "$front_pid" >/dev/null 2>&1
  load 4
  callgrind_control -i off "$front_pid" >/dev/null 2>&1
  requests=$(jq '.targets[0].requests' "$tmp/load.json")
  kill "$front_pid"
  wait "$front_pid" 2>/dev/null || true
  kill "$upstream"
  wait "$upstream" 2>/dev/null || true
  total=$(awk '/Collected/ { gsub(",", "", $4); print $4 }' "$tmp/front.log" | tail -n 1)
  printf '%-14s %9d %14d %12d\n' "$target" "$requests" "$total" $((total / requests))
done
