#!/usr/bin/env bash
# The curl session of docs/gate.md, run for real: a Python service behind fencing-gate on
# loopback, then each command of the session. Writes the session between the markers in
# docs/gate.md; with --check, compares instead (dates, timestamps and durations may differ)
# and fails on any other difference, so that the page cannot drift from the program.
#
#   docs/transcripts/gate.sh [--check]
#
# Uses target/debug/fencing-gate (`cargo build -p fencing-gate`), or $FENCING_GATE.
set -euo pipefail
cd "$(dirname "$0")/../.."
gate=${FENCING_GATE:-target/debug/fencing-gate}
page=docs/gate.md
upstream_port=${UPSTREAM_PORT:-8000}
gate_port=${GATE_PORT:-8080}

work=$(mktemp -d)
# The session runs in a subshell (a pipeline): its servers' pids go through a file.
cleanup() {
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$work/pids"
  rm -rf "$work"
}
touch "$work/pids"
trap cleanup EXIT

# Runs one shell command as the session shows it, with its output.
say() {
  printf '$ %s\n' "$1"
  bash -c "$1" 2>&1
  printf '\n'
}

# Waits until file $1 has a line matching $2 (a server saying it listens), then prints the file.
ready() {
  for _ in $(seq 200); do
    if grep -q "$2" "$1" 2>/dev/null; then
      cat "$1"
      return 0
    fi
    sleep 0.05
  done
  echo "no '$2' in $1:" >&2
  cat "$1" >&2
  exit 1
}

session() {
  cd "$work"
  cp "$OLDPWD/fencing-gate/tests/upstream.py" .
  printf '$ python3 upstream.py journal %s &\n' "$upstream_port"
  # Output through files: a background process holding this function's stdout
  # would keep the $(...) below waiting for ever.
  python3 upstream.py journal "$upstream_port" >upstream.out 2>&1 &
  echo $! >>pids
  ready upstream.out "listening on"
  printf '$ fencing-gate --listen 127.0.0.1:%s --upstream http://127.0.0.1:%s &\n' "$gate_port" "$upstream_port"
  RUST_LOG=fencing_gate=info,fencing_layer=warn "$OLDPWD/$gate" --listen "127.0.0.1:$gate_port" \
    --upstream "http://127.0.0.1:$upstream_port" >gate.out 2>&1 &
  echo $! >>pids
  ready gate.out "serving"
  printf '\n'
  local url="http://127.0.0.1:$gate_port/files/report"
  say "curl -si -X PUT -H 'Fencing-Token: 34' --data 'B: write under valid lease' $url"
  say "curl -si -X PUT -H 'Fencing-Token: 33' --data 'A: write from expired lease' $url"
  say "curl -si -X PUT --data 'no token' $url"
  say "curl -s $url"
}

# Dates, timestamps and durations differ from run to run; nothing else may.
normalize() {
  sed -E -e 's/^(date: ).*/\1DATE/I' \
    -e 's/[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z/TIME/g' \
    -e 's/^[0-9]+\.[0-9]+ [0-9]+\.[0-9]+ /START END /'
}

# curl prints HTTP heads with CRLF; the page keeps plain line ends.
transcript=$(session | sed -e 's/\x1b\[[0-9;]*m//g' | tr -d '\r')
block=$(printf '```console\n%s\n```' "$transcript")
begin='<!-- transcript: docs/transcripts/gate.sh -->'
end='<!-- end of transcript -->'
current=$(awk -v b="$begin" -v e="$end" '$0==e{p=0} p{print} $0==b{p=1}' "$page")
if [[ ${1:-} == --check ]]; then
  if ! diff <(printf '%s\n' "$current" | normalize) <(printf '%s\n' "$block" | normalize); then
    echo "$page: the session differs from what the program does now (above); run $0" >&2
    exit 1
  fi
  echo "ok: $page's session is what ran"
else
  BLOCK="$block" awk -v b="$begin" -v e="$end" '
    $0==b {print; print ENVIRON["BLOCK"]; skip=1; next}
    $0==e {skip=0}
    !skip {print}' "$page" >"$page.new"
  mv "$page.new" "$page"
  echo "wrote the session into $page"
fi
