#!/usr/bin/env bash
# A local Flink or Spark cluster on 127.0.0.1 for Beam's portable runners: see scripts/cluster.py.
#   scripts/cluster.sh flink|spark fetch|start|stop|status
# start's stdout is one line: the Beam options to append to convert.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="$repo/.venv/bin/python"
[ -x "$python" ] || python="$(command -v python3)"
exec "$python" "$repo/scripts/cluster.py" "$@"
