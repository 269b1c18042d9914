#!/usr/bin/env bash
# CI's transcript check: every console block of README.md and docs/*.md is either made by a
# script here or still listed as hand-written (coverage.py), and each script's sessions, run
# again against the binaries the test step built, match their pages (dates, ids and timings aside).
#
#   docs/transcripts/check.sh
set -euo pipefail
cd "$(dirname "$0")"
python3 coverage.py
for script in *.sh; do
  case $script in lib.sh | check.sh) continue ;; esac
  "./$script" --check
done
