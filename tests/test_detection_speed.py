"""Per-image costs of annotated images that scripts/detection_speed.py measured, kept cut (issue #21)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from beam_pipeline import index, resume
from beam_pipeline.annotations import objects
from beam_pipeline.annotations.objects import Annotations, Obj
from beam_pipeline.images import ImageOptions
from beam_pipeline.listing import Ref

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
    text = json.dumps(dataclasses.asdict(value), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_annotation_digest_is_the_one_earlier_runs_wrote(kind: str) -> None:
    value = annotations(VARIANTS[kind])
    assert objects.digest(value) == asdict_digest(value)
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
