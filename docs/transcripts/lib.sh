# What every transcript script shares (sourced, not run). A script defines `session`, which
# prints `@@ NAME` before each console block and runs each command through `say`, then calls
# `transcribe PAGE "$@"`: the sessions go into PAGE, or with --check are compared with it
# (docs/transcripts/splice.py says what may differ).
set -euo pipefail
script=$(realpath "${BASH_SOURCE[-1]}")
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
script=${script#"$root"/}
bin=${FENCING_BIN:-$root/${CARGO_TARGET_DIR:-target}/debug}
work=$(mktemp -d)
touch "$work/pids"
# Servers started in a session (a pipeline's subshell) leave their pids in a file.
cleanup() {
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$work/pids"
  rm -rf "$work"
}
trap cleanup EXIT

# Runs one shell command as the page shows it, with all it prints and, when not 0, its exit status.
say() {
  printf '$ %s\n' "$1"
  local status=0
  bash -c "$1" 2>&1 || status=$?
  if [[ $status != 0 ]]; then printf 'exit %d\n' "$status"; fi
}

# Starts a server in the background as the page shows it (`$ COMMAND &`), its output in file
# $1, and waits for a line matching $2 (it listens), which the block shows with what precedes it.
serve() {
  local log=$1 ready=$2 shown=$3 command=$4
  printf '$ %s &\n' "$shown"
  bash -c "exec env $command" >"$log" 2>&1 &
  echo $! >>"$work/pids"
  for _ in $(seq 300); do
    if grep -q "$ready" "$log" 2>/dev/null; then
      sed -e 's/\x1b\[[0-9;]*m//g' "$log"
      return 0
    fi
    sleep 0.05
  done
  echo "no '$ready' in $log:" >&2
  cat "$log" >&2
  exit 1
}

# The README's quick start (fencing-layer/examples/quickstart.rs), on 127.0.0.1:3000, not shown.
quickstart() {
  "$bin/examples/quickstart" >quickstart.out 2>&1 &
  echo $! >>"$work/pids"
  for _ in $(seq 200); do grep -q "listening on" quickstart.out 2>/dev/null && return; sleep 0.05; done
  echo "the quick start did not start:" >&2
  cat quickstart.out >&2
  exit 1
}

# $1: page; $2: --check or nothing. Runs `session` in $work, with the binaries on PATH.
transcribe() {
  local page=$1 mode=${2:-}
  if ! (cd "$work" && PATH="$bin:$PATH" session) | sed -e 's/\x1b\[[0-9;]*m//g' | tr -d '\r' >"$work/sessions"; then
    echo "$script: the session stopped before its end (above); $page is left as it was" >&2
    exit 1
  fi
  python3 "$root/docs/transcripts/splice.py" "$page" "$script" "$work/sessions" $mode
}
