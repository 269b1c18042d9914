#!/usr/bin/env bash
# The check of docs/architecture.md, run for real: `python3 docs/architecture/graph.py --check`
# in the workspace (its figures: fencing-layer's modules, edges, cycles, forbidden edges and
# long functions as the code has them now). Written into the page; --check compares. Under 1 s.
#
#   docs/transcripts/architecture.sh [--check]
source "$(dirname "$0")/lib.sh"

session() {
  echo "@@ check"
  (cd "$root" && say "python3 docs/architecture/graph.py --check")
}

transcribe docs/architecture.md "$@"
