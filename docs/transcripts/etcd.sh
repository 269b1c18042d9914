#!/usr/bin/env bash
# docs/etcd.md, run for real: an etcd on 127.0.0.1:2379 (peer :2380) with its data in
# /tmp/fencing-etcd and its log in /tmp/fencing-etcd.log (as the page shows; the script refuses
# to run if either exists, and removes both at the end), its health, the scenario with etcd
# issuing the tokens, the scenario against a port nothing listens on, the etcd_lock example,
# and the list of the etcd tests. Written into the page; --check compares. About 10 s (etcd
# raises A's 200 ms lease to 2 s).
#
#   docs/transcripts/etcd.sh [--check]
#
# The page shows `target/debug/scenarios` and `target/debug/examples/etcd_lock` after the
# `cargo build` with the feature that it names: the script runs the debug binaries of CI's
# `cargo build --workspace --all-features` (which has the feature), or those in $FENCING_BIN,
# from a directory whose target/debug holds them. The etcd tests are listed (`cargo test … --list`
# in the checkout: after CI's `cargo test --workspace --all-features` it builds nothing), not
# run: CI's test step has just run them.
source "$(dirname "$0")/lib.sh"
data=/tmp/fencing-etcd
log=/tmp/fencing-etcd.log
for path in "$data" "$log"; do
  if [[ -e $path ]]; then
    echo "$path exists: the page's session starts from nothing there; move it away" >&2
    exit 1
  fi
done

# The servers, stopped (and gone) before their data goes.
trap 'stop_servers; cleanup; rm -rf "$data" "$log"' EXIT

session() {
  mkdir target
  ln -s "$bin" target/debug

  echo "@@ start"
  background "etcd --name fencing-demo --data-dir $data \\
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \\
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \\
    --initial-cluster fencing-demo=http://127.0.0.1:2380 >$log 2>&1" \
    "grep -q 'serving insecure client requests on 127.0.0.1:2379' $log" "$log"

  echo "@@ health"
  say "grep -o 'serving insecure client requests on 127.0.0.1:2379' $log"
  say "curl -s http://127.0.0.1:2379/health; echo"
  say "curl -s http://127.0.0.1:2379/version; echo"

  echo "@@ scenario"
  say "target/debug/scenarios --lock-backend etcd --etcd-endpoints http://127.0.0.1:2379"

  echo "@@ unreachable"
  say "target/debug/scenarios --lock-backend etcd --etcd-endpoints http://127.0.0.1:2999"

  echo "@@ example"
  say "target/debug/examples/etcd_lock http://127.0.0.1:2379"

  # In the checkout, where cargo finds the workspace; with CI's build, nothing is built.
  echo "@@ tests"
  (cd "$root" && say "cargo test -q --workspace --all-features --test it -- etcd:: etcd_scenario:: --list")
}

transcribe docs/etcd.md "$@"
