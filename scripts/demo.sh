#!/usr/bin/env bash
# Sets everything up, generates sample images and converts them on the local runner.
# Output: samples/photos-tfrecords, with report.html to open in a browser (the sample images are in samples/photos).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
PY=.venv/bin/python
[[ -d samples/photos ]] || "$PY" scripts/make_sample_images.py samples/photos --per-class 60
"$PY" -m beam_pipeline convert --config configs/local.yaml \
  --input samples/photos --output samples/photos-tfrecords \
  --split-ratios train=0.8,validation=0.1,test=0.1 --report --overwrite "$@"
