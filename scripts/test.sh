#!/usr/bin/env bash
# Sets everything up and runs the test suite (pytest's exit code: 5 = no tests = failure).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m pytest "$@"
