# What every transcript script shares (sourced, not run). A script defines `session`, which
# prints `@@ NAME` before each console block and runs each command through `say`, then calls
# `transcribe PAGE "$@"`: the sessions go into PAGE, or with --check are compared with it
# (docs/transcripts/splice.py says what may differ).
set -euo pipefail
# The pages name fixed ports (7000, 8080, 3000...): one script at a time on this machine.
exec 9>"${TMPDIR:-/tmp}/fencing-transcripts.lock"
flock 9
script=$(realpath "${BASH_SOURCE[-1]}")
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
script=${script#"$root"/}
bin=${FENCING_BIN:-$root/${CARGO_TARGET_DIR:-target}/debug}
work=$(mktemp -d)
touch "$work/pids"
claimed=()
# Servers started in a session (a pipeline's subshell) leave their pids in a file.
cleanup() {
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$work/pids"
  rm -rf "$work" "${claimed[@]}"
}

# Claims a fixed path the page shows (its session starts from nothing there): refuses to run
# if it exists; cleanup removes it.
claim_path() {
  if [[ -e $1 ]]; then
    echo "$1 exists: the page's session starts from nothing there; move it away" >&2
    exit 1
  fi
  claimed+=("$1")
}
trap cleanup EXIT

# Runs one shell command as the page shows it, with all it prints and, when not 0, its exit status.
say() {
  printf '$ %s\n' "$1"
  local status=0
  bash -c "$1" 2>&1 9>&- || status=$?
  if [[ $status != 0 ]]; then printf 'exit %d\n' "$status"; fi
}

# Starts a server in the background as the page shows it (`$ COMMAND &`), its output in file
# $1, and waits for a line matching $2 (it listens), which the block shows with what precedes it.
serve() {
  local log=$1 ready=$2 shown=$3 command=$4
  printf '$ %s &\n' "$shown"
  bash -c "exec env $command" >"$log" 2>&1 9>&- &
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

# Starts $1 in the background as the page shows it (`$ COMMAND &`; the command sends its output
# to a log file of its own), then waits, not shown, until the shell test $2 succeeds: it serves.
# If it never does, says so with the file $3 (the server's log), when given. Redirect the call's
# output to /dev/null for a server the page only names.
background() {
  printf '$ %s &\n' "$1"
  bash -c "exec $1" </dev/null 9>&- &
  echo $! >>"$work/pids"
  for _ in $(seq 600); do
    if bash -c "$2" 2>/dev/null 9>&-; then return 0; fi
    sleep 0.05
  done
  echo "not ready ($2): $1" >&2
  if [[ -n ${3:-} ]]; then cat "$3" >&2; fi
  exit 1
}

# Stops every server started so far and waits (up to 5 s each) until it is gone, for a script
# that then removes their data or whose next user needs their ports: `trap 'stop_servers;
# cleanup; rm -rf DIR' EXIT` (cleanup alone only signals them).
stop_servers() {
  local pid
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$work/pids"
  while read -r pid; do
    for _ in $(seq 100); do
      [[ -e /proc/$pid && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || break
      sleep 0.05
    done
  done <"$work/pids"
}

# The README's quick start (fencing-layer/examples/quickstart.rs), on 127.0.0.1:3000, not shown.
quickstart() {
  "$bin/examples/quickstart" >quickstart.out 2>&1 9>&- &
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
