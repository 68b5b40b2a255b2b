#!/usr/bin/env bash
# Builds the beam_pipeline wheel into dist/ (for `pip install dist/beam_pipeline-*.whl[...]`,
# a private index, or a training image). Uses `python -m build` when it is installed,
# otherwise pip's own builder; neither needs anything beyond setuptools.
# Usage: scripts/build_wheel.sh            (PY=python3.12 scripts/build_wheel.sh to pick one)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
rm -rf build ./*.egg-info
mkdir -p dist
if "$PY" -m build --version >/dev/null 2>&1; then
  "$PY" -m build --wheel --outdir dist .
else
  "$PY" -m pip wheel --quiet --no-deps --wheel-dir dist .
fi
rm -rf build ./*.egg-info
ls -1 dist/beam_pipeline-*.whl
