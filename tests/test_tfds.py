"""tfds.builder_from_directory loads the output: counts, features, pixels."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from .conftest import REPO, convert, load_info
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e


@pytest.mark.smoke
def test_tfds_loads_every_split_with_counts_and_pixels(tmp_path):
    import io

    import tensorflow_datasets as tfds

    root = tmp_path / "in"
    sources = {}
    for i in range(12):
        label = ["cat", "dog"][i % 2]
        kind = ["png", "png_gray", "jpeg"][i % 3]
        data = image_bytes(kind, 20 + i, 30, seed=i)
        rel = f"{['train', 'test'][i % 4 == 0]}/{label}/{i}.{'jpg' if kind == 'jpeg' else 'png'}"
        sources[rel] = data
        write(str(root / rel), data)
    out = tmp_path / "out"
    convert("--input", str(root), "--output", str(out), tfds=True)
    info = load_info(out)
    assert info["tfds"]["files"] and (out / "dataset_info.json").exists() and (out / "_SUCCESS").exists()

    builder = tfds.builder_from_directory(str(out))
    for split, s in info["splits"].items():
        assert builder.info.splits[split].num_examples == s["examples"]
    assert builder.info.features["image/class/label"].names == ["cat", "dog"]
    assert builder.info.homepage == str(out)  # not an invented tensorflow.org catalog page
    seen = 0
    for split in info["splits"]:
        for ex in builder.as_dataset(split=split):
            rel = ex["image/filename"].numpy().decode()
            assert ex["image/class/text"].numpy().decode() == rel.split("/")[1]
            assert int(ex["image/class/label"]) == ["cat", "dog"].index(rel.split("/")[1])
            assert ex["image/key/sha256"].numpy().decode() == hashlib.sha256(sources[rel]).hexdigest()
            if rel.endswith(".png"):
                expected = np.asarray(Image.open(io.BytesIO(sources[rel])).convert("RGB"))
                np.testing.assert_array_equal(ex["image/encoded"].numpy(), expected)
            seen += 1
    assert seen == 12

    # as_supervised: (uint8 image, int64 label id) pairs, the same images as the dicts above
    by_label = sorted(
        (int(label), image.numpy().tobytes()) for image, label in builder.as_dataset(split="train", as_supervised=True)
    )
    expected = sorted(
        (int(ex["image/class/label"]), ex["image/encoded"].numpy().tobytes())
        for ex in builder.as_dataset(split="train")
    )
    assert by_label == expected and len(expected) == info["splits"]["train"]["examples"]
    batch_images, batch_labels = next(iter(builder.as_dataset(split="test", as_supervised=True, batch_size=2)))
    assert batch_images.dtype.name == "uint8" and batch_images.shape[-1] == 3 and batch_labels.dtype.name == "int64"


def test_unlabelled_tfds_output_has_no_supervised_keys(tmp_path):
    import tensorflow_datasets as tfds

    write(str(tmp_path / "in" / "a.png"), image_bytes("png"))
    out = tmp_path / "out"
    convert("--input", str(tmp_path / "in"), "--output", str(out), "--labels-from", "none", tfds=True)
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.supervised_keys is None
    assert "image/class/label" not in builder.info.features
    [ex] = list(builder.as_dataset(split="train"))
    assert ex["image/filename"].numpy() == b"a.png"


def test_writing_tfds_metadata_imports_no_tensorflow(tmp_path):
    """A --no-transform run with TFDS metadata stays TensorFlow-free (and so quiet and fast)."""
    write(str(tmp_path / "in" / "cat" / "a.png"), image_bytes("png"))
    out = tmp_path / "out"
    code = (
        "import sys; from beam_pipeline.cli import main; "
        f"rc = main(['convert', '--input', {str(tmp_path / 'in')!r}, '--output', {str(out)!r}, '--no-transform']); "
        "print('TF' if 'tensorflow' in sys.modules else 'noTF'); sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("noTF") and (out / "dataset_info.json").exists()
    assert result.stderr == ""  # no TensorFlow/absl start-up lines


def test_gzip_output_says_why_there_is_no_tfds_metadata(tmp_path):
    write(str(tmp_path / "in" / "cat" / "a.png"), image_bytes("png"))
    out = tmp_path / "out"
    result = convert("--input", str(tmp_path / "in"), "--output", str(out), "--compression", "gzip", tfds=True)
    assert load_info(out)["tfds"] == {"skipped": "TFDS cannot read gzip shards"}
    assert not (out / "dataset_info.json").exists() and (out / "_SUCCESS").exists()
    assert "TFDS" in result.stdout
