#!/usr/bin/env bash
# Checks that reader.load works with a TensorFlow other than the converter's pin.
#
# Converts a small generated dataset with this checkout's environment, then
# makes a throwaway virtualenv with only TensorFlow $TF_VERSION (what
# `pip install 'beam_pipeline[reader]'` needs) plus this package installed
# with --no-deps (no Apache Beam, no tensorflow-transform), and reads the
# dataset back there: counts, labels, decoded shapes, epochs in a new order,
# a seed reproducible, shuffle=False in stored order.
#
# Usage: scripts/check_reader_compat.sh [TF_VERSION]     (default 2.19.1; downloads TF, ~600 MB)
#        PY=.venv/bin/python PYTHON=python3.11 WORK=/tmp/x scripts/check_reader_compat.sh 2.16.2
# Not part of CI (the download takes minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
TF_VERSION="${1:-2.19.1}"
PY="${PY:-.venv/bin/python}"          # the converter's environment
PYTHON="${PYTHON:-python3}"           # the interpreter for the reader's venv
WORK="${WORK:-$(mktemp -d -t beam_pipeline-reader-compat-XXXXXX)}"
REPO="$(pwd)"

echo "converting a sample dataset with $("$PY" -c 'import tensorflow_transform as t, tensorflow as tf; print("TF", tf.__version__, "TFT", t.__version__)' 2>/dev/null || echo "$PY")" >&2
"$PY" scripts/make_sample_images.py "$WORK/photos" --per-class 20 >/dev/null
"$PY" -m beam_pipeline convert --input "$WORK/photos" --output "$WORK/data" \
  --split-ratios train=0.8,validation=0.1,test=0.1 --target-shard-mb 0.5 --max-reject-fraction 1 \
  --no-transform --no-tfds-metadata >/dev/null

echo "creating $WORK/venv with tensorflow==$TF_VERSION" >&2
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet "tensorflow==$TF_VERSION"
"$WORK/venv/bin/python" -m pip install --quiet --no-deps "$REPO"

cd "$WORK"  # not the checkout: the installed package must be the one imported
TF_CPP_MIN_LOG_LEVEL=3 "$WORK/venv/bin/python" - "$WORK/data" <<'PY'
import json
import sys

import tensorflow as tf

from beam_pipeline import reader

out = sys.argv[1]
info = json.load(open(f"{out}/dataset.json"))
assert reader.__file__.startswith(sys.prefix), reader.__file__
train = info["splits"]["train"]
assert train["num_shards"] > 1, "the check wants several shards"

def names(ds):
    return [r["image/filename"].numpy().decode() for r in ds]

stored = names(reader.load(out, "train", shuffle=False))
epochs = reader.load(out, "train")
first, second = names(epochs), names(epochs)
assert len(stored) == train["examples"] and sorted(first) == sorted(second) == sorted(stored)
assert first != second, "two epochs in the same order"
assert names(reader.load(out, "train", seed=3)) == names(reader.load(out, "train", seed=3))
expected = []
for shard in train["shards"]:
    for raw in tf.data.TFRecordDataset(f"{out}/{shard['file']}"):
        expected.append(tf.train.Example.FromString(raw.numpy()).features.feature["image/filename"].bytes_list.value[0].decode())
assert stored == expected, "shuffle=False is not the stored order"
labels = info["labels"]
for batch in reader.load(out, "train", batch_size=8):
    for encoded, h, w, c, label, text in zip(
        batch["image/encoded"], batch["image/height"], batch["image/width"], batch["image/channels"],
        batch["image/class/label"], batch["image/class/text"],
    ):
        image = tf.io.decode_image(encoded, expand_animations=False)
        assert tuple(image.shape) == (int(h), int(w), int(c))
        assert labels[int(label)] == text.numpy().decode()
assert "apache_beam" not in sys.modules and "tensorflow_transform" not in sys.modules
print(f"reader OK with tensorflow {tf.__version__} (Python {sys.version.split()[0]}): "
      f"{len(stored)} train records in {train['num_shards']} shards, epochs differ, seed reproducible")
PY
