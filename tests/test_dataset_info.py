"""dataset.json as a typed record: the file's bytes round-trip, earlier versions' files read."""

from __future__ import annotations

import json

import pytest

from beam_pipeline.vocab.dataset_info import DatasetInfo, InfoShapeError, SplitInfo

pytestmark = pytest.mark.unit

# A detection dataset's dataset.json as this version writes it, incremental, resumed, post-steps and all.
FULL = {
    "format_version": 1,
    "name": "pets",
    "splits": {
        "train": {
            "examples": 3,
            "bytes": 300,
            "num_shards": 1,
            "shards": [{"file": "pets-train.tfrecord-00000-of-00001", "records": 3, "bytes": 300}],
            "labels": {"cat": 2, "dog": 1},
        }
    },
    "examples": 3,
    "bytes": 300,
    "labels": ["cat", "dog"],
    "num_classes": 2,
    "features": {"image/encoded": {"dtype": "string", "shape": []}},
    "compression": "none",
    "seed": 42,
    "sink": "planned",
    "rejects": {"total": 1, "by_reason": {"truncated": 1}},
    "skipped": {"total": 0, "by_reason": {}},
    "config": {"max_reject_fraction": 0.05, "output": "/out"},
    "versions": {"beam_pipeline": "1.0"},
    "categories": [{"id": 1, "name": "cat"}],
    "objects": {
        "kept": 4,
        "rejects": {"total": 0, "by_reason": {}},
        "images_without_annotations": 0,
        "images_with_every_object_rejected": 0,
        "polygons_dropped": 0,
    },
    "converted": {"jpeg": 1},
    "empty_splits": ["test"],
    "idx_files": "idx/{file}.idx",
    "incremental": {
        "from": "/prev",
        "reused": 2,
        "converted": 1,
        "reconverted": 0,
        "rejects_kept": 0,
        "added": 1,
        "changed": 0,
        "unchanged": 2,
        "dropped": 0,
        "unreadable_previous_lines": 3,
    },
    "resumed": {"shards": 1, "records": 3, "from_runs": ["20260101-000000-abc"]},
    "status": "ok",
    "run_id": "20260102-000000-def",
    "transform": {"image_size": 224, "image_mean": [0.5, 0.25, 1e-07], "files": ["transform_fn/saved_model.pb"]},
    "tfds": {"files": ["dataset_info.json", "features.json"]},
}


def _text(data: object) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def test_a_file_of_this_version_round_trips_byte_for_byte():
    info = DatasetInfo.from_json(json.loads(_text(FULL)))
    assert info.to_text() == _text(FULL)
    assert info.splits["train"].shards[0].records == 3 and info.incremental.source == "/prev"
    assert info.categories[0].name == "cat" and info.tfds.files == ("dataset_info.json", "features.json")


def test_keys_written_only_sometimes_stay_out_and_null_labels_stay_null():
    core = {k: v for k, v in FULL.items() if k in list(FULL)[:15]} | {"converted": {}, "status": "ok"}
    core.update(labels=None, num_classes=None, run_id="r")
    core["splits"] = {"train": {**FULL["splits"]["train"], "labels": None}}
    assert DatasetInfo.from_json(core).to_text() == _text(core)
    # an intact previous dataset: no unreadable_previous_lines
    inc = {k: v for k, v in FULL["incremental"].items() if k != "unreadable_previous_lines"}
    assert DatasetInfo.from_json({**core, "incremental": inc}).to_json()["incremental"] == inc


def test_an_earlier_versions_file_is_read_its_unknown_keys_kept_last():
    old = {"name": "pets", "splits": FULL["splits"], "compression": "gzip", "seed": 1, "from_the_future": [1, 2]}
    info = DatasetInfo.from_json(old)
    assert info.status == "ok" and info.sink == "planned" and info.run_id is None and info.rejects.total == 0
    assert info.examples == 3 and info.labels is None
    assert list(info.to_json())[-1] == "from_the_future" and info.to_json()["from_the_future"] == [1, 2]


@pytest.mark.parametrize(
    "damage", [[1, 2], {"splits": []}, {"splits": {"train": {"shards": {}}}}, {"rejects": 3}, {"labels": "cat"}]
)
def test_json_of_another_shape_is_a_value_error(damage):
    with pytest.raises(InfoShapeError):
        DatasetInfo.from_json(damage)


def test_records_are_picklable_and_compare_by_value():
    import pickle

    info = DatasetInfo.from_json(FULL)
    assert pickle.loads(pickle.dumps(info)) == info
    assert info.with_(status="too_many_rejects") != info
    assert isinstance(info.splits["train"], SplitInfo)


def test_the_reader_takes_a_parsed_dataset_json_as_before():
    """reader.read_info returned a dict before the record was typed: a program that passes one on still works."""
    from beam_pipeline import reader

    info = DatasetInfo.from_json(FULL)
    assert reader.feature_spec(FULL) == reader.feature_spec(info)
