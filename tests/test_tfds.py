"""tfds.builder_from_directory loads the output: counts, features, pixels."""

from __future__ import annotations

import numpy as np
from PIL import Image

from .conftest import convert, load_info
from .imagegen import image_bytes, write


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
    assert builder.info.features["image"]["class"]["label"].names == ["cat", "dog"]
    seen = 0
    for split in info["splits"]:
        for ex in builder.as_dataset(split=split):
            image = ex["image"]
            rel = image["filename"].numpy().decode()
            assert image["class"]["text"].numpy().decode() == rel.split("/")[1]
            assert int(image["class"]["label"]) == ["cat", "dog"].index(rel.split("/")[1])
            if rel.endswith(".png"):
                expected = np.asarray(Image.open(io.BytesIO(sources[rel])).convert("RGB"))
                np.testing.assert_array_equal(image["encoded"].numpy(), expected)
            seen += 1
    assert seen == 12


def test_gzip_output_says_why_there_is_no_tfds_metadata(tmp_path):
    write(str(tmp_path / "in" / "cat" / "a.png"), image_bytes("png"))
    out = tmp_path / "out"
    result = convert("--input", str(tmp_path / "in"), "--output", str(out), "--compression", "gzip", tfds=True)
    assert load_info(out)["tfds"] == {"skipped": "TFDS cannot read gzip shards"}
    assert not (out / "dataset_info.json").exists() and (out / "_SUCCESS").exists()
    assert "TFDS" in result.stdout
