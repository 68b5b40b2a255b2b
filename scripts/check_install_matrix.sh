#!/usr/bin/env bash
# Installs each role with the README's command into fresh virtualenvs and checks it keeps the environment.
#
#   converter   fresh venv, `pip install '<checkout>[convert]'` (pip picks TF): converts generated images
#               (several shards, rejects, TFDS metadata), `inspect --verify`
#   reader      venvs holding only TensorFlow $TF_VERSIONS: `pip install '<checkout>'` in one,
#               `pip install '<checkout>[tfds]'` in another; after each: TensorFlow and protobuf unchanged, no
#               installed package changed, no apache-beam, no google-cloud-* client; reader.load reads
#               two epochs in different orders, a seed repeats, shuffle=False is the stored order, images
#               decode to the recorded shapes; `beam-pipeline convert` and reader.load(transformed=True)
#               fail in one line naming the extra; with [tfds]: TFDS as_supervised gives (image, label)
#   pip picks   fresh venv, `pip install '<checkout>[tfds]'` with nothing installed: the same reads
#   combined    fresh venv, `pip install '<checkout>[all]'`: converts with the TFT analysis, then reader.load
#               and TFDS read it; also records that pip refuses '[transform,tfds]' (docs/install.md says why)
#
# <checkout> is a clone of this repository's HEAD (commit first). Downloads TensorFlow (~600 MB a
# version; pip's cache keeps them for the next run) and Beam: not part of CI. Ends with one line per
# venv and role (versions, PASS/FAIL); exits 1 if any failed.
# Usage: scripts/check_install_matrix.sh [WORK_DIR]
#        PYTHON=python3.11 TF_VERSIONS="2.16.2 2.19.1 2.21.0" scripts/check_install_matrix.sh /tmp/matrix
#        ROLES=combined scripts/check_install_matrix.sh    (one part: converter, combined)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TF_VERSIONS="${TF_VERSIONS:-2.16.2 2.19.1 2.21.0}"
ROLES="${ROLES:-converter combined}"  # the reader venvs run after a passing converter (they read its output)
WORK="${1:-$(mktemp -d -t beam_pipeline-matrix-XXXXXX)}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
export TF_CPP_MIN_LOG_LEVEL=3 PIP_DISABLE_PIP_VERSION_CHECK=1 LC_ALL=C  # LC_ALL: one order for sort and comm
RESULTS="$WORK/results.txt"
: > "$RESULTS"

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
# pip's notes about extra index locations that do not exist on this machine are noise here
pip_quiet() { "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" >&2; return "${PIPESTATUS[0]}"; }
versions() { "$1/bin/python" -m pip list --format=freeze 2>/dev/null | sort; }
pick() { grep -i "^$2==" <<<"$1" | cut -d= -f3; }

rm -rf "$WORK/clone"
git clone --quiet "$(pwd)" "$WORK/clone" || exit 1
CHECKOUT="$WORK/clone"
log "checkout $(git -C "$CHECKOUT" rev-parse --short HEAD) in $CHECKOUT; work dir $WORK"

# --- what each reader venv runs (from $WORK, so the installed package is the one imported) ---
cat > "$WORK/check_reader.py" <<'PY'
"""reader.load (and TFDS with --tfds) on the converted dataset; one line of results."""
import json
import subprocess
import sys

import tensorflow as tf

from beam_pipeline import reader

out, with_tfds, with_transform = sys.argv[1], "--tfds" in sys.argv, "--transform" in sys.argv
assert reader.__file__.startswith(sys.prefix), reader.__file__
info = json.load(open(f"{out}/dataset.json"))
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
        feature = tf.train.Example.FromString(raw.numpy()).features.feature
        expected.append(feature["image/filename"].bytes_list.value[0].decode())
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
if with_transform:  # the converter's venv ([all]): the saved graph serves reader.load(transformed=True)
    batch = next(iter(reader.load(out, "train", transformed=True, batch_size=4)))
    assert batch["image"].dtype == tf.float32 and batch["image"].shape[1:] == (224, 224, 3), batch["image"].shape
else:
    assert not any(m.split(".")[0] in ("apache_beam", "tensorflow_transform") for m in sys.modules)
    try:
        reader.load(out, "train", transformed=True)
        raise AssertionError("transformed=True without tensorflow-transform did not fail")
    except ImportError as e:
        assert type(e).__name__ == "MissingExtraError" and "pip install 'beam_pipeline[transform]'" in str(e), e
    cli = subprocess.run(
        [f"{sys.prefix}/bin/beam-pipeline", "convert", "--input", "x", "--output", "y"], capture_output=True, text=True
    )
    assert cli.returncode == 2 and cli.stdout == "", cli
    assert cli.stderr == "error: convert needs the converter: pip install 'beam_pipeline[convert]'\n", cli.stderr
done = f"{len(stored)} records in {train['num_shards']} shards, 2 epochs differ"
if with_tfds:
    import tensorflow_datasets as tfds

    pairs = list(tfds.builder_from_directory(out).as_dataset(split="train", as_supervised=True))
    assert len(pairs) == len(stored), (len(pairs), len(stored))
    image, label = pairs[0]
    assert image.dtype == tf.uint8 and image.shape[-1] == 3 and label.dtype == tf.int64
    done += f"; TFDS {tfds.__version__} as_supervised {len(pairs)} (image, label)"
print(done)
PY

# --- the converter: pip picks everything ---
CONVERTER_OK=0
converter() {
  local venv="$WORK/converter"
  rm -rf "$venv" "$WORK/photos" "$WORK/data"
  "$PYTHON" -m venv "$venv" && pip_quiet "$venv/bin/python" -m pip install --quiet --upgrade pip || return 1
  log "converter: pip install '<checkout>[convert]'"
  pip_quiet "$venv/bin/python" -m pip install --quiet "$CHECKOUT[convert]" || return 1
  local after
  after="$(versions "$venv")"
  [[ -n "$(pick "$after" apache-beam)" && -z "$(pick "$after" tensorflow-transform)" ]] || return 1
  (cd "$WORK" && "$venv/bin/python" "$CHECKOUT/scripts/make_sample_images.py" photos --per-class 20 >/dev/null) || return 1
  (cd "$WORK" && "$venv/bin/beam-pipeline" convert --input photos --output data --target-shard-mb 0.5 \
    --split-ratios train=0.8,validation=0.1,test=0.1 --max-reject-fraction 0.2) > "$WORK/convert.txt" || return 1
  cat "$WORK/convert.txt" >&2
  grep -q "transform    skipped: tensorflow-transform is not installed" "$WORK/convert.txt" || return 1
  grep -q "TFDS         tfds.builder_from_directory() can load this folder" "$WORK/convert.txt" || return 1
  (cd "$WORK" && "$venv/bin/beam-pipeline" inspect data --verify | tail -1) >&2 || return 1
  echo "converter  pip picks  [convert]  tensorflow $(pick "$after" tensorflow)  protobuf $(pick "$after" protobuf)  apache-beam $(pick "$after" apache-beam)  PASS: converted $(head -1 "$WORK/convert.txt" | cut -d: -f2 | cut -d, -f1 | xargs), inspect --verify" >> "$RESULTS"
}
wanted() { [[ " $ROLES " == *" $1 "* ]]; }
if ! wanted converter; then :; elif converter; then CONVERTER_OK=1; else
  echo "converter  pip picks  [convert]  FAIL (see the log above)" >> "$RESULTS"
fi

# --- converting with TFT and loading with TFDS in one venv: [all]; pip refuses [transform,tfds] ---
combined() {
  local venv="$WORK/combined" after
  rm -rf "$venv" "$WORK/photos-all" "$WORK/data-all"
  "$PYTHON" -m venv "$venv" && pip_quiet "$venv/bin/python" -m pip install --quiet --upgrade pip || return 1
  log "combined: pip install --dry-run '<checkout>[transform,tfds]' (expected to be refused: docs/install.md)"
  if "$venv/bin/python" -m pip install --quiet --dry-run "$CHECKOUT[transform,tfds]" > "$WORK/pair.txt" 2>&1; then
    echo "combined  [transform,tfds]  resolves now: docs/install.md and the README say it cannot" >> "$RESULTS"
  elif grep -q "ResolutionImpossible" "$WORK/pair.txt"; then
    echo "combined  [transform,tfds]  refused by pip (ResolutionImpossible), as documented: use [all]" >> "$RESULTS"
  fi
  log "combined: pip install '<checkout>[all]'"
  pip_quiet "$venv/bin/python" -m pip install --quiet "$CHECKOUT[all]" || return 1
  after="$(versions "$venv")"
  [[ -n "$(pick "$after" tensorflow-transform)" && -n "$(pick "$after" tensorflow-datasets)" ]] || return 1
  (cd "$WORK" && "$venv/bin/python" "$CHECKOUT/scripts/make_sample_images.py" photos-all --per-class 20 >/dev/null) || return 1
  (cd "$WORK" && "$venv/bin/beam-pipeline" convert --input photos-all --output data-all --target-shard-mb 0.5 \
    --split-ratios train=0.8,validation=0.1,test=0.1) > "$WORK/convert-all.txt" || return 1
  grep -q "transform    tensorflow-transform graph" "$WORK/convert-all.txt" || return 1
  local read
  read="$(cd "$WORK" && "$venv/bin/python" check_reader.py data-all --tfds --transform)" || return 1
  echo "combined  [all]  tensorflow $(pick "$after" tensorflow)  tensorflow-transform $(pick "$after" tensorflow-transform)  tensorflow-metadata $(pick "$after" tensorflow-metadata)  PASS: converted with TFT; $read" >> "$RESULTS"
}
if wanted combined; then combined || echo "combined  [all]  FAIL (see the log above)" >> "$RESULTS"; fi

# --- one role in a reader venv: install, compare versions, read ---
reader_role() {  # venv label extra(""|"[tfds]") keep(1: TF/protobuf must not change)
  local venv="$1" label="$2" extra="$3" keep="$4" before after changed message
  before="$(versions "$venv")"
  log "$label: pip install '<checkout>$extra'"
  if ! pip_quiet "$venv/bin/python" -m pip install --quiet "$CHECKOUT$extra"; then
    echo "$label  ${extra:-base}  FAIL: pip install" >> "$RESULTS"; return 1
  fi
  after="$(versions "$venv")"
  local tf pb added
  tf="$(pick "$after" tensorflow)" pb="$(pick "$after" protobuf)"
  added="$(comm -13 <(cut -d= -f1 <<<"$before" | sort) <(cut -d= -f1 <<<"$after" | sort) | wc -l)"
  message=""
  if [[ "$keep" == 1 ]]; then
    [[ "$tf" == "$(pick "$before" tensorflow)" ]] || message+="tensorflow $(pick "$before" tensorflow) -> $tf; "
    [[ "$pb" == "$(pick "$before" protobuf)" ]] || message+="protobuf $(pick "$before" protobuf) -> $pb; "
    changed="$(comm -23 <(echo "$before") <(echo "$after") | tr '\n' ' ')"
    [[ -z "$changed" ]] || message+="changed: $changed; "
  fi
  grep -qi "^apache-beam==" <<<"$after" && message+="apache-beam installed; "
  grep -qi "^google-cloud-" <<<"$after" && message+="GCP clients: $(grep -i '^google-cloud-' <<<"$after" | tr '\n' ' '); "
  local read
  if [[ -z "$message" ]]; then
    if read="$(cd "$WORK" && "$venv/bin/python" "$WORK/check_reader.py" "$WORK/data" ${extra:+--tfds} 2>"$WORK/err.txt")"; then
      :
    else
      message+="read: $(grep -v '^\s*$' "$WORK/err.txt" | tail -1)"
    fi
  fi
  local what="$label  ${extra:-base}  tensorflow $tf  protobuf $pb"
  [[ -n "$extra" ]] && what+="  tensorflow-datasets $(pick "$after" tensorflow-datasets)  tensorflow-metadata $(pick "$after" tensorflow-metadata)"
  if [[ -n "$message" ]]; then
    echo "$what  FAIL: $message" >> "$RESULTS"; return 1
  fi
  echo "$what  PASS: +$added packages, no Beam/GCP clients${keep:+, TF and protobuf kept}; $read" >> "$RESULTS"
}

fresh_venv() {  # path [tensorflow version]
  rm -rf "$1"
  "$PYTHON" -m venv "$1" && pip_quiet "$1/bin/python" -m pip install --quiet --upgrade pip || return 1
  [[ -z "${2:-}" ]] && return 0
  log "$(basename "$1"): pip install tensorflow==$2"
  pip_quiet "$1/bin/python" -m pip install --quiet "tensorflow==$2"
}

if [[ "$CONVERTER_OK" == 1 ]]; then
  for tf in $TF_VERSIONS; do
    # each role straight into a venv holding only TensorFlow: the base install, then [tfds] on its own
    for extra in "" "[tfds]"; do
      venv="$WORK/tf-$tf${extra:+-tfds}"
      if fresh_venv "$venv" "$tf"; then
        reader_role "$venv" "TF $tf installed" "$extra" 1
      else
        echo "TF $tf  FAIL: pip install tensorflow==$tf" >> "$RESULTS"
      fi
    done
  done
  fresh_venv "$WORK/pip-picks" && reader_role "$WORK/pip-picks" "nothing installed" "[tfds]" ""
fi

echo
echo "install matrix, $(date -u +%Y-%m-%d), Python $("$PYTHON" -c 'import platform; print(platform.python_version())'), checkout $(git -C "$CHECKOUT" rev-parse --short HEAD):"
cat "$RESULTS"
! grep -q "FAIL" "$RESULTS"
