"""Reading and looking at a --coco dataset: TFDS, reader.load(objects=True), inspect --contact-sheet and --verify.

One generated COCO set (tests/test_coco.py's make_coco) converted once with default flags (TFT analysis and
TFDS metadata included); every test compares what it reads with what the JSON says.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from beam_pipeline import tfds_metadata

from .conftest import convert, load_info
from .test_coco import expected_objects, make_coco, mask_of


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    """(output folder, COCO dict): a conversion with default flags, rejects allowed (the set has every kind)."""
    base = tmp_path_factory.mktemp("coco-read")
    root = base / "images"
    doc = make_coco(root)
    path = base / "instances.json"
    path.write_text(json.dumps(doc))
    out = base / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out), "--max-reject-fraction", "1",
            transform=True, tfds=True)  # fmt: skip
    return out, doc


def _close(got: Any, want: Any) -> bool:
    return len(got) == len(want) and all(math.isclose(g, w, abs_tol=1e-6) for g, w in zip(got, want, strict=True))


def test_tfds_loads_the_objects_as_a_sequence(detection):
    """builder_from_directory: image/object is a Sequence whose boxes, class ids (a ClassLabel over labels.txt),
    crowd flags, areas and masks are the JSON's; a negative has empty lists."""
    import tensorflow_datasets as tfds

    out, doc = detection
    builder = tfds.builder_from_directory(str(out))
    assert "image/object" in builder.info.features
    assert tfds_metadata.OBJECT_LABEL_NAMES in load_info(out)["tfds"]["files"]
    label = builder.info.features["image/object"]["class"]["label"]
    lines = (out / "labels.txt").read_text().splitlines()
    assert label.names == lines and label.names[90] == "toothbrush"
    seen = set()
    for ex in builder.as_dataset(split="train"):
        name = ex["image/filename"].numpy().decode()
        want = expected_objects(doc, name)
        obj = ex["image/object"]
        image = next(i for i in doc["images"] if i["file_name"] == name)
        assert ex["image/source_id"].numpy().decode() == str(image["id"])
        for k, coord in enumerate(("xmin", "ymin", "xmax", "ymax")):
            assert _close(obj["bbox"][coord].numpy(), [w["box"][k] for w in want]), (name, coord)
        assert list(obj["class"]["label"].numpy()) == [w["label"] for w in want]
        assert [label.int2str(i) for i in obj["class"]["label"].numpy()] == [w["text"] for w in want]
        assert [t.decode() for t in obj["class"]["text"].numpy()] == [w["text"] for w in want]
        assert list(obj["is_crowd"].numpy()) == [w["crowd"] for w in want]
        assert _close(obj["area"].numpy(), [w["area"] for w in want])
        masks = obj["mask"].numpy()
        assert masks.shape[0] == len(want) and (not want or masks.shape[1:] == (image["height"], image["width"], 1))
        if name == "c.jpg":
            assert (masks[0, :, :, 0] == mask_of(60, 80)).all()  # the compressed RLE
        seen.add(name)
    assert seen == {"a.jpg", "c.jpg", "d.jpg", "sub/b.png"}


def test_tfds_metadata_is_skipped_for_a_category_name_tfds_would_change():
    info = {"compression": "none", "labels": None, "categories": [{"id": 1, "name": " cat"}]}
    assert "leading or trailing spaces" in tfds_metadata.skip_reason(info)
    assert tfds_metadata.skip_reason({**info, "categories": [{"id": 1, "name": "cat"}]}) is None
