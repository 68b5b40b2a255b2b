"""Per-image costs of annotated images that scripts/benchmark.py detection measured, kept cut (issue #21)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from beam_pipeline import index, resume
from beam_pipeline.annotations import objects
from beam_pipeline.annotations.objects import Annotations, Obj
from beam_pipeline.images.options import ImageOptions
from beam_pipeline.vocab.refs import Ref

pytestmark = pytest.mark.unit

VARIANTS = {
    "boxes": (),
    "polygons": ([[1.0, 2.0, 30.5, 2.0, 30.5, 40.25]], [[0, 0, 5, 0, 5, 5], [7, 7, 9, 7, 9, 9]]),
    "rle": ({"counts": [0, 100, 3000], "size": [48, 64]},),
    "compressed rle": ({"counts": "PPYo0", "size": [48, 64]},),
}


def annotations(segmentations: tuple[Any, ...]) -> Annotations:
    objs = [Obj(bbox=(1.0, 2.5, 30.0, 40.0), label=3, text="voiture é", area=12.5, is_crowd=True)]
    more = [Obj(bbox=(0.0, 0.0, 9.0, 9.0), label=-1, text="dog", difficult=True, segmentation=s) for s in segmentations]
    objs += more
    return Annotations("42", 64, 48, tuple(objs))


def asdict_digest(value: Annotations) -> str:
    """The digest as the first --coco runs wrote it to index.jsonl (dataclasses.asdict): kept, so an
    incremental run from such an output reuses its records."""
    fields = dataclasses.asdict(value)
    fields.pop("given")  # a later field (the source's object count), kept out of the digest
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_annotation_digest_is_the_one_earlier_runs_wrote(kind: str) -> None:
    value = annotations(VARIANTS[kind])
    assert objects.digest(value) == asdict_digest(value)
    assert objects.digest(dataclasses.replace(value, given=7)) == objects.digest(value)
    assert objects.digest(None) == ""
    changed = dataclasses.replace(value, objects=value.objects[:1] + (dataclasses.replace(value.objects[0], area=1.0),))
    assert objects.digest(changed) != objects.digest(value)


class _CountingJson:
    """objects.json with its dumps calls counted."""

    def __init__(self) -> None:
        self.calls = 0

    def dumps(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        return json.dumps(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


def test_the_writer_encodes_an_images_annotations_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard's resume digest and the image's index line both need the annotation digest; with polygons
    its JSON encoding cost more than the object keys: it is encoded once per image, not per use."""
    counting = _CountingJson()
    monkeypatch.setattr(objects, "json", counting)
    value = annotations(VARIANTS["polygons"])
    ref = Ref("/in/a.jpg", "a.jpg", 10, "train", None, 1, annotations=value)
    first = resume.shard_digest("train", 0, [ref], ["background"], {}, ImageOptions(), "none")
    line = json.loads(index.part_line(ref, 0, 0, 10, "ab", None))
    assert resume.shard_digest("train", 0, [ref], ["background"], {}, ImageOptions(), "none") == first
    assert line["extras"] == index.extras_digest(ref) != ""
    assert counting.calls == 1
    # a copy of the ref (dataclasses.replace) shares the Annotations, and so its digest
    index.extras_digest(dataclasses.replace(ref, key=2))
    assert counting.calls == 1


def test_masks_are_0_1_pngs_at_image_size_deflated_as_runs() -> None:
    """Each mask PNG decodes (TensorFlow, as Model Garden's decoder does) to the 0/1 instance at the recorded
    size, and is deflated with zlib's run-length strategy: a third less CPU per mask than Pillow's default
    (the mask encoding is what a --coco run with masks spends most on), and no bigger."""
    import io
    import zlib

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from beam_pipeline.images.options import Geometry

    outline = [10.0, 10.0, 200.0, 12.0, 180.0, 150.0, 15.0, 140.0]
    objs = [Obj(bbox=(10.0, 10.0, 200.0, 150.0), label=1, text="a", segmentation=[outline])]
    geometry = Geometry(stored_width=256, stored_height=192, width=256, height=192)
    (png,) = objects.mask_pngs(objs, geometry)
    expected = objects._mask(objs[0], 256, 192)  # noqa: SLF001 - the rasterized instance
    decoded = tf.io.decode_png(png, channels=1).numpy()[:, :, 0]
    assert decoded.dtype == np.uint8 and decoded.shape == (192, 256)
    assert set(np.unique(decoded)) == {0, 1}
    assert (decoded == expected).all()
    default, runs = io.BytesIO(), io.BytesIO()
    Image.fromarray(expected).save(default, format="PNG")
    Image.fromarray(expected).save(runs, format="PNG", compress_type=zlib.Z_RLE)
    assert png == runs.getvalue()
    assert len(png) <= len(default.getvalue())


def test_the_parts_the_benchmark_times_run_the_real_reader_join_and_writer_code(tmp_path) -> None:
    """scripts/benchmark.py detection --parts times the tool's own COCO reader, join, object keys and digest on a
    generated set (the floor a boxes run cannot go below): each part is timed on every image of it."""
    import importlib
    import math
    import sys
    from pathlib import Path

    from tests.imagegen import image_bytes

    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    if scripts not in sys.path:  # as scripts/benchmark.py imports its measurements
        sys.path.insert(0, scripts)
    speed = importlib.import_module("bench.detection")
    folder = tmp_path / "images"
    files = []
    for i in range(30):
        path = folder / ("cats", "dogs")[i % 2] / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes("jpeg", 48, 64, seed=i))
        files.append(path)
    coco_path = tmp_path / "instances.json"
    coco_path.write_text(json.dumps(speed.make_coco(folder, files, 64, 48, masks=False)))
    parts = speed.time_parts(folder, coco_path)
    assert len(parts) == 6 and all(math.isfinite(ms) for ms in parts.values()), parts
    assert parts["the join by image id and the checks"] > 0  # timed directly (the others are differences)
