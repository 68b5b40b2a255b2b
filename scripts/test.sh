#!/usr/bin/env bash
# Sets everything up, checks lint/format, builds the docs site (a broken link, anchor or a page
# missing from the nav fails it), and runs the test suite. The tests come in layers (pytest markers,
# see docs/development.md): unit, pipeline, e2e, cluster.
# Usage: scripts/test.sh [--fast | --rest] [pytest arguments]
#   (nothing)  set-up, lint/format, docs build, every test
#   --fast     set-up, lint/format, the unit and pipeline layers (-m "unit or pipeline"); no docs build
#   --rest     set-up, docs build, the e2e and cluster layers: what --fast leaves out (.ci/run runs both)
# Extra arguments go to pytest (each run). pytest's exit 5 (no tests collected) fails too.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=all
case "${1:-}" in
  --fast | --rest) mode="${1#--}"; shift ;;
esac
scripts/setup_env.sh
# The e2e and cluster layers write a few GB at once (datasets, the clusters' spill and staged jars); a CI run
# once failed on "No space left on device" with a Flink job half-way. Said up front, not found in a trace.
free_gb=$(( $(df -Pk . | awk 'NR==2 {print $4}') / 1048576 ))
if [[ "$mode" != fast && $free_gb -lt 8 ]]; then
  echo "note: ${free_gb} GB free on this disk; the e2e and cluster layers need ~8 GB and may fail for space" >&2
fi
if [[ "$mode" != rest ]]; then
  .venv/bin/ruff check --quiet beam_pipeline tests scripts setup.py
  .venv/bin/ruff format --check --quiet beam_pipeline tests scripts setup.py
fi
# The report's browser test (tests/test_report.py) loads the page in Debian's Chromium, headless: installed here
# when it is missing and this runs as root with apt (CI); otherwise a note, and that test says how to get it.
if [[ "$mode" != fast ]] && ! command -v chromium >/dev/null 2>&1; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; } ||
      echo "note: apt-get could not install chromium: tests/test_report.py's browser test will fail" >&2
  else
    echo "note: chromium is not installed (apt-get install chromium): tests/test_report.py's browser test will fail" >&2
  fi
fi
if [[ "$mode" != fast ]]; then
  site_dir="$(mktemp -d)"
  trap 'rm -rf "$site_dir"' EXIT
  .venv/bin/mkdocs build --strict --site-dir "$site_dir"
fi
# The unit, pipeline and e2e layers run on TEST_WORKERS pytest-xdist workers (default 3: the e2e tests wait on
# their processes as much as they compute, so a third worker still gains on 2 cores), tests dealt one by one;
# tests that build the package from the checkout take a lock (tests/conftest.py). The cluster layer runs after them on its own: one cluster at a time, on a quiet machine
# (a Flink job server under the load of three other workers timed out in a trial).
workers=(-n "${TEST_WORKERS:-3}")
ran=0
step() {  # pytest "$@"; with the user's filters a step may select nothing (exit 5), as long as one selects some
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  if [[ $rc == 0 ]]; then ran=1; elif [[ $rc != 5 ]]; then exit "$rc"; fi
}
case "$mode" in
  fast) step "${workers[@]}" -m "unit or pipeline" "$@" ;;
  rest) step "${workers[@]}" -m e2e "$@"; step -m cluster "$@" ;;
  *) step "${workers[@]}" -m "not cluster" "$@"; step -m cluster "$@" ;;
esac
if [[ $ran == 0 ]]; then
  echo "error: no test was selected" >&2
  exit 5
fi
