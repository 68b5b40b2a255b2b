#!/usr/bin/env bash
# Sets everything up, checks lint/format, builds the docs site (a broken link, anchor or a page
# missing from the nav fails it), and runs the test suite. The tests come in layers (pytest markers,
# see docs/development.md): unit, pipeline, e2e, cluster.
# Usage: scripts/test.sh [--fast | --rest] [pytest arguments]
#   (nothing)  set-up, lint/format, docs build, every test
#   --fast     set-up, lint/format, the unit and pipeline layers (-m "unit or pipeline"); no docs build
#   --rest     set-up, docs build, the e2e and cluster layers: what --fast leaves out (.ci/run runs both)
# Extra arguments go to pytest. pytest's exit 5 (no tests collected) fails too.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=all
case "${1:-}" in
  --fast | --rest) mode="${1#--}"; shift ;;
esac
scripts/setup_env.sh
if [[ "$mode" != rest ]]; then
  .venv/bin/ruff check --quiet beam_pipeline tests scripts setup.py
  .venv/bin/ruff format --check --quiet beam_pipeline tests scripts setup.py
fi
if [[ "$mode" != fast ]]; then
  site_dir="$(mktemp -d)"
  trap 'rm -rf "$site_dir"' EXIT
  .venv/bin/mkdocs build --strict --site-dir "$site_dir"
fi
case "$mode" in
  fast) .venv/bin/python -m pytest -m "unit or pipeline" "$@" ;;
  rest) .venv/bin/python -m pytest -m "e2e or cluster" "$@" ;;
  *) .venv/bin/python -m pytest "$@" ;;
esac
