"""Type hints are behaviour: Beam (2.78 on) resolves every annotation, ``from __future__ import annotations``
included, and derives coders and runtime checks from it. A hint that lies broke every run with a reject
(``dict[str, str]`` on reject rows holding integers: a text coder met an int).

Here: Beam's runtime type check catches a lying hint at all (a positive control, so the checked runs below
cannot pass by checking nothing); the reject rows pass it through the real steps; and normal runs print no
warning line. With ``BEAM_PIPELINE_TEST_TYPE_CHECK`` set (.ci/run's newest lane) every conversion of the
tests marked ``smoke`` runs under ``--runtime_type_check`` too (tests/conftest.py).

Beam before 2.78 reads a string annotation as ``Any``: ``resolved`` gives the functions under test the hints
that Beam 2.78 resolves, so these tests check the same on the pinned Beam as on the newest.
"""

import json
import typing
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline.config import Layout
from beam_pipeline.pipeline import RejectParts
from beam_pipeline.run import finalize
from beam_pipeline.sources import rules
from beam_pipeline.vocab.refs import RejectRow

from .conftest import convert, load_info, local_pipeline
from .imagegen import image_bytes, write
from .test_coco import CATEGORIES

pytestmark = [pytest.mark.pipeline, pytest.mark.smoke]


def resolved(monkeypatch: pytest.MonkeyPatch, *functions: Any) -> None:
    """Each function's annotations as objects, not strings (what Beam 2.78 does for itself)."""
    for fn in functions:
        monkeypatch.setattr(fn, "__annotations__", typing.get_type_hints(fn))


def checked_pipeline() -> beam.Pipeline:
    return local_pipeline(options=PipelineOptions(["--runtime_type_check"]))


def _says_text(row: dict[str, Any]) -> dict[str, str]:
    return {"path": row["path"], "size": row["size"]}


def test_the_runtime_check_fails_a_map_whose_hint_says_text_and_gets_an_integer():
    assert typing.get_type_hints(_says_text)["return"] == dict[str, str]  # objects: checked on any Beam
    with pytest.raises(Exception, match="violated") as failed:
        with checked_pipeline() as p:
            _ = p | beam.Create([{"path": "a.jpg", "size": 6}]) | beam.Map(_says_text)
    assert "All values should be of type <class 'str'>" in str(failed.value), failed.value


# Every field a reject row may hold, with the kind of value each holds.
FULL_REJECT: RejectRow = {
    "path": "/in/cat/a.jpg",
    "reason": "truncated",
    "detail": "the data ends early",
    "size": 6,
    "mtime": 1.5,
    "extras": "ab12",
    "annotation_id": 7,
    "object": 2,
    "polygon": 1,
}


def test_reject_rows_of_every_field_pass_the_checked_reject_steps(monkeypatch, tmp_path):
    """RejectParts (relative paths, counts by reason, part files) with the runtime check on: a reject's hint
    that says its values are text fails here (it failed every run with a reject on Beam 2.78)."""
    resolved(monkeypatch, rules.with_relative_path, finalize.WriteRejectPartFn.process, finalize.reject_bucket)
    layout = Layout(root="/in", pattern=None, manifest=None, manifest_format=None, tmp_dir=str(tmp_path))
    second = {"path": "/elsewhere/b.png", "reason": "empty", "detail": "zero bytes"}
    with checked_pipeline() as p:
        listing = p | "Listing" >> beam.Create([second])
        writing = p | "Writing" >> beam.Create([FULL_REJECT])
        out = (listing, writing) | RejectParts(layout)
        assert_that(out["counts"], equal_to([("truncated", 1), ("empty", 1)]), label="Counts")
    lines = [json.loads(line) for part in sorted(tmp_path.rglob("part-*.jsonl")) for line in part.open()]
    assert sorted(lines, key=lambda r: r["path"]) == [
        {**second, "source": "/elsewhere/b.png"},
        {**FULL_REJECT, "path": "cat/a.jpg", "source": "/in/cat/a.jpg"},
    ]


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "WARNING" in line or "Warning:" in line]


@pytest.mark.e2e
def test_runs_with_rejects_coco_and_a_night_print_no_warning(tmp_path):
    """Beam's logging as Beam leaves it: a folder with a cut-short JPEG and a text file named .jpg, an
    incremental night over it, and a COCO set with object rejects convert with exit 0 and no warning line
    (Beam 2.78 printed ~30 about the hints of transforms with several outputs)."""
    photos = tmp_path / "photos"
    for i in range(8):
        write(str(photos / ("cat", "dog")[i % 2] / f"{i}.jpg"), image_bytes("jpeg", 24, 20, seed=i))
    (photos / "cat" / "cut.jpg").write_bytes(image_bytes("jpeg", 24, 20, seed=9)[:200])
    (photos / "dog" / "text.jpg").write_text("not a picture")
    first = convert("--input", str(photos), "--output", str(tmp_path / "day1"), "--max-reject-fraction", "0.5")
    assert load_info(tmp_path / "day1")["rejects"]["total"] == 2
    write(str(photos / "cat" / "new.jpg"), image_bytes("jpeg", 24, 20, seed=20))
    night = convert(
        "--input", str(photos), "--output", str(tmp_path / "day2"), "--incremental-from", str(tmp_path / "day1"),
        "--max-reject-fraction", "0.5",
    )  # fmt: skip
    assert load_info(tmp_path / "day2")["examples"] == 9
    images = tmp_path / "coco"
    write(str(images / "a.jpg"), image_bytes("jpeg", 40, 30, seed=1))
    write(str(images / "b.jpg"), image_bytes("jpeg", 40, 30, seed=2))
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 30, "height": 40}, {"id": 2, "file_name": "b.jpg"}],
        "annotations": [
            {"id": 11, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25.0, "iscrowd": 0},
            {"id": 12, "image_id": 1, "category_id": 1, "bbox": [1, 1, -5, 5], "area": 1.0, "iscrowd": 0},
        ],
        "categories": CATEGORIES,
    }
    coco_file = tmp_path / "instances.json"
    coco_file.write_text(json.dumps(doc))
    coco = convert(
        "--input", str(images), "--coco", str(coco_file), "--output", str(tmp_path / "coco_out"),
        "--max-reject-fraction", "0.5",
    )  # fmt: skip
    assert load_info(tmp_path / "coco_out")["objects"]["rejects"]["total"] == 1
    assert load_info(tmp_path / "coco_out")["rejects"]["total"] == 1  # b.jpg's entry has no size
    for result in (first, night, coco):
        assert _warnings(result.stderr) == [], result.stderr
