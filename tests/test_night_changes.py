"""Night over night (run/changes.py): what an --incremental-from run records against the dataset it started from,
and --max-class-drop stopping a publish."""

from __future__ import annotations

import json

import pytest

from beam_pipeline.run import changes as ch
from beam_pipeline.vocab.dataset_info import DatasetInfo

from .conftest import run_cli
from .imagegen import encode, photo_like


def info(labels: dict[str, int], rejects: dict[str, int] | None = None) -> dict:
    rejects = rejects or {}
    return {
        "name": "x",
        "splits": {"train": {"examples": sum(labels.values()), "bytes": 1, "num_shards": 1, "labels": labels}},
        "examples": sum(labels.values()),
        "rejects": {"total": sum(rejects.values()), "by_reason": rejects},
    }


def lines(*pairs: tuple[str, str, str, str]) -> str:
    return "".join(
        json.dumps({"a": a, "b": b, "split_a": sa, "split_b": sb, "distance": 2}) + "\n" for a, b, sa, sb in pairs
    )


@pytest.mark.unit
def test_classes_counts_rejects_and_new_pairs_against_the_previous_night(tmp_path):
    before = tmp_path / "before"
    before.mkdir()
    previous = {**info({"cats": 100, "dogs": 100, "owls": 5}, {"truncated": 2}), "near_duplicates": {"pairs": {}}}
    (before / "dataset.json").write_text(json.dumps(previous))
    (before / "near_duplicates.jsonl").write_text(lines(("a.jpg", "b.jpg", "train", "train")))
    now_near = tmp_path / "now.jsonl"  # one sorted part of tonight's groups; the previous night's file: pairs
    now_near.write_text(
        "".join(
            json.dumps({"group": g, "images": len(g), "splits": s, "confidence": "sure", "ties": []}) + "\n"
            for g, s in (
                (["a.jpg", "b.jpg", "c.jpg"], {"test": 1, "train": 2}),  # a and b were a pair: not new
                (["d.jpg", "e.jpg"], {"test": 2}),
                (["f.jpg", "g.jpg"], {"test": 1, "train": 1}),
            )
        )
    )
    now = DatasetInfo.from_json(info({"cats": 110, "dogs": 60, "bats": 3}, {"truncated": 40}))
    got = ch.night_changes(str(before), now, 0.2, [str(now_near)])
    assert got["classes_added"] == ["bats"] and got["classes_removed"] == ["owls"]
    assert got["classes_moved"] == {"dogs": {"before": 100, "now": 60}}  # cats moved 10 %: under the share
    assert got["rejects_by_reason"] == {"truncated": {"before": 2, "now": 40}}
    assert got["near_duplicates_new"] == {"groups": 2, "across_splits": 1, "images": 4}
    assert got["notes"] == [
        "class bats is new",
        "class owls has no image any more",
        "class dogs: 100 -> 60 images (-40%)",
        "reject rate 1.0% -> 18.8%",
        "2 new near-duplicate groups (4 images), 1 across splits",
    ]
    assert ch.dropped_class(got, None) is None
    assert ch.dropped_class(got, 0.5) == "class owls has no image any more"
    assert ch.dropped_class(got, 1.0) == "class owls has no image any more"  # 1: only a class that vanished
    only_dogs = {**got, "classes_removed": []}
    assert ch.dropped_class(only_dogs, 0.3) == "class dogs went from 100 to 60 images"
    assert ch.dropped_class(only_dogs, 0.5) is None
    # a drop past --max-class-drop under --change-share is still listed
    assert ch.night_changes(str(before), now, 0.9, None, max_drop=0.3)["classes_moved"] == got["classes_moved"]


@pytest.mark.unit
def test_a_gone_or_damaged_previous_dataset_json_gives_no_changes(tmp_path):
    now = DatasetInfo.from_json(info({"cats": 1}))
    assert ch.night_changes(str(tmp_path / "gone"), now, 0.2) is None
    (tmp_path / "dataset.json").write_text("{not json")
    assert ch.night_changes(str(tmp_path), now, 0.2) is None


def two_classes(root, dogs: int) -> None:
    for label, n in (("cats", 12), ("dogs", dogs)):
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / label / f"{i:02d}.jpg").write_bytes(encode(photo_like(hash((label, i)) % 10_000, 96, 72), "JPEG"))


QUICK = ("--no-transform", "--no-tfds-metadata")


@pytest.mark.e2e
def test_a_night_notes_a_class_that_shrank_and_max_class_drop_keeps_the_previous_dataset(tmp_path):
    src = tmp_path / "in"
    two_classes(src, dogs=12)
    first = tmp_path / "first"
    assert run_cli("convert", "--input", str(src), "--output", str(first), *QUICK).returncode == 0
    for i in range(4, 12):
        (src / "dogs" / f"{i:02d}.jpg").unlink()
    second = tmp_path / "second"
    r = run_cli("convert", "--input", str(src), "--output", str(second), *QUICK, "--incremental-from", str(first))
    assert r.returncode == 0, r.stderr
    assert "note         class dogs: 12 -> 4 images (-67%)" in r.stdout
    changes = json.loads((second / "dataset.json").read_text())["changes"]
    assert changes["classes_moved"] == {"dogs": {"before": 12, "now": 4}}

    # the same night, into the previous dataset's own folder, with a limit: nothing is published
    before = (first / "dataset.json").read_bytes()
    r = run_cli(
        "convert", "--input", str(src), "--output", str(first), *QUICK, "--incremental-from", str(first),
        "--overwrite", "--max-class-drop", "0.5",
    )  # fmt: skip
    assert r.returncode == 3
    assert r.stderr.strip().count("\n") == 0
    assert "class dogs went from 12 to 4 images" in r.stderr and "--max-class-drop 0.5" in r.stderr
    assert (first / "dataset.json").read_bytes() == before


@pytest.mark.unit
def test_max_class_drop_needs_a_previous_night(tmp_path):
    r = run_cli("convert", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--max-class-drop", "0.5")
    assert r.returncode == 2 and "--max-class-drop needs --incremental-from" in r.stderr


@pytest.mark.unit
def test_the_median_image_size_moving_is_a_note(tmp_path):
    from beam_pipeline.vocab.records import size_bucket

    assert [size_bucket(s) for s in ((63, 900), (64, 64), (640, 480), (4000, 3000), None)] == [
        "<64",
        "64-127",
        "256-511",
        ">=2048",
        "unknown",
    ]
    before = {**info({"cats": 10}), "image_sizes": {"shorter_side": {"256-511": 10}}}
    (tmp_path / "dataset.json").write_text(json.dumps(before))
    now = DatasetInfo.from_json({**info({"cats": 10}), "image_sizes": {"shorter_side": {"<64": 7, "256-511": 3}}})
    got = ch.night_changes(str(tmp_path), now, 0.2)
    assert got["image_sizes"] == {"before": {"256-511": 10}, "now": {"<64": 7, "256-511": 3}}
    assert "median shorter side 256-511 px -> <64 px" in got["notes"]
    same = DatasetInfo.from_json(before)
    assert "image_sizes" not in ch.night_changes(str(tmp_path), same, 0.2)
