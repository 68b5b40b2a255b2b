#!/usr/bin/env bash
# The newest lane: what `pip install` gives a new user today, tested. A fresh virtualenv on the newest CPython
# the project supports (3.13; the pinned lane, scripts/test.sh, stays on 3.11), `pip install '.[all]'` as
# README's table says (no constraints file: pip picks the newest releases setup.py's ranges admit), then the
# test tools; prints the versions it got; runs the unit and pipeline layers and the e2e tests marked `smoke`
# (a folder with rejects, COCO with object rejects, VOC, masks, a manifest, an incremental night, gs:// on the
# emulator, near-duplicate leaks, the TFT analysis, the reader without Beam), every conversion with Beam's
# runtime type check on (BEAM_PIPELINE_TEST_TYPE_CHECK, tests/conftest.py).
#
# A new upstream release that breaks the tool fails here, the next time anyone submits. When the fix is not
# quick: a cap in setup.py below that release, a line in docs/versions.md saying why (docs/development.md).
# Usage: scripts/test_newest.sh [pytest arguments]      (NEWEST_PYTHON=/path/to/python3.13 to pick one)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${NEWEST_VENV:-.venv-newest}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

newest_python() {  # the newest supported CPython here: on PATH, or installed by pyenv but not its global one
  local v candidate
  for v in 3.13 3.12 3.11 3.10; do
    for candidate in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}/versions/$v"*/bin/"python$v"; do
      if "$candidate" -c "" >/dev/null 2>&1; then
        command -v "$candidate"
        return
      fi
    done
  done
  echo "error: no CPython 3.10-3.13 found for the newest lane" >&2
  return 1
}

PYTHON="${NEWEST_PYTHON:-$(newest_python)}"
started=$SECONDS
# A new resolution each day (and whenever setup.py changes): "newest" is what PyPI serves today.
want="$(cat setup.py | sha256sum | cut -d' ' -f1) $(date -u +%F) $("$PYTHON" -c 'import sys; print(sys.version)')"
if [[ ! -f "$VENV/.installed" || "$(cat "$VENV/.installed")" != "$want" ]]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet ".[all]"  # README's "convert with the analysis and load with TFDS"
  "$VENV/bin/python" -m pip install --quiet ".[test]"  # the same resolution plus pytest, the GCS emulator, ...
  echo "$want" > "$VENV/.installed"
fi
echo "newest lane: CPython $("$VENV/bin/python" -c 'import platform; print(platform.python_version())'), $(
  "$VENV/bin/python" -m pip list --format=freeze 2>/dev/null |
    grep -iE '^(apache-beam|pillow|tensorflow|tensorflow-transform|tensorflow-datasets|numpy|protobuf|pyarrow|google-cloud-storage|imagehash|matplotlib|pycocotools|ijson|scipy)==' |
    tr '\n' ' '
)(set-up $((SECONDS - started)) s)"
# The tests import this checkout (pytest puts it first on sys.path); the installed copy serves the processes they
# start from elsewhere. Both are this commit.
export BEAM_PIPELINE_TEST_TYPE_CHECK=1
"$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-3}" -m "unit or pipeline or (e2e and smoke)" -p no:cacheprovider "$@"
echo "newest lane: $((SECONDS - started)) s"
