"""The TFT graph's reuse (run/graph_cache.py): a key that moves with every input of the graph, a cache that
hands out a whole entry or none, and a previous dataset's graph taken only under the same key."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from beam_pipeline import metadata
from beam_pipeline.run import graph_cache
from beam_pipeline.vocab.dataset_info import DatasetInfo

pytestmark = pytest.mark.unit

FILES = ["metadata/schema.pbtxt", "transform_fn/assets/label", "transform_fn/saved_model.pb"]
TRANSFORM = {"image_size": 64, "aspect": "resize_with_pad", "outputs": ["image", "label"], "label_vocabulary": "label"}
STATS = {"image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.2, 0.2]}


def key(n: int) -> str:
    """A key as graph_key makes them (32 hex digits)."""
    return f"{n:032x}"


def info(labels: list[str] | None = ("cat", "dog"), multi: bool = False, transform: dict | None = None) -> DatasetInfo:
    label = {"dtype": "int64", "shape": [None] if multi else []}
    return DatasetInfo.from_json(
        {
            "name": "pets",
            "splits": {},
            "examples": 0,
            "bytes": 0,
            "labels": list(labels) if labels is not None else None,
            "num_classes": len(labels) if labels is not None else None,
            "features": {"image/class/label": label},
            "compression": "none",
            "seed": 0,
            **({"transform": transform} if transform else {}),
        }
    )


def graph(folder: Path, marker: str = "g1") -> None:
    """A stand-in for a built graph: its files, each naming the build it came from."""
    for rel in FILES:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(f"{marker}:{rel}")


def test_the_key_moves_with_every_input_of_the_graph(monkeypatch):
    base = graph_cache.graph_key(info(), 64, None)
    assert graph_cache.graph_key(info(), 64, None) == base  # the same inputs, the same key
    different = {
        "labels reordered": graph_cache.graph_key(info(["dog", "cat"]), 64, None),
        "a label more": graph_cache.graph_key(info(["cat", "dog", "eel"]), 64, None),
        "unlabelled": graph_cache.graph_key(info(None), 64, None),
        "no labels, labelled": graph_cache.graph_key(info([]), 64, None),
        "multi-label": graph_cache.graph_key(info(multi=True), 64, None),
        "image size": graph_cache.graph_key(info(), 65, None),
        "statistics": graph_cache.graph_key(info(), 64, STATS),
        "other statistics": graph_cache.graph_key(info(), 64, {**STATS, "image_std": [0.2, 0.2, 0.2000001]}),
    }
    real_version = graph_cache.importlib_metadata.version
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-transform", "tfx-bsl"):
        monkeypatch.setattr(
            graph_cache.importlib_metadata, "version", lambda d, dist=dist: "0.0.1" if d == dist else real_version(d)
        )
        different[dist] = graph_cache.graph_key(info(), 64, None)
    monkeypatch.setattr(graph_cache.importlib_metadata, "version", real_version)
    monkeypatch.setattr(metadata, "code_digest", lambda: "another")
    different["code"] = graph_cache.graph_key(info(), 64, None)
    keys = list(different.values())
    assert base not in keys, [name for name, key in different.items() if key == base]
    assert len(set(keys)) == len(keys)


def test_the_cache_hands_back_what_was_stored_and_only_under_its_key(tmp_path):
    cache, built, staging = tmp_path / "cache", tmp_path / "built", tmp_path / "staging"
    graph(built)
    graph_cache.remember(key(1), str(built), TRANSFORM, FILES, str(cache))
    assert graph_cache.reuse(key(2), str(staging), previous=None, cache=str(cache)) is None
    assert not staging.exists() or not any(staging.rglob("*.pb"))
    transform, source = graph_cache.reuse(key(1), str(staging), previous=None, cache=str(cache))
    assert transform == TRANSFORM and "cache" in source
    assert all((staging / rel).read_text() == f"g1:{rel}" for rel in FILES)


def test_a_second_store_of_a_key_keeps_the_first_and_leaves_no_half_entry(tmp_path):
    cache = tmp_path / "cache"
    for marker in ("g1", "g2"):
        graph(tmp_path / marker, marker)
        graph_cache.remember(key(9), str(tmp_path / marker), TRANSFORM, FILES, str(cache))
    assert sorted(os.listdir(cache)) == [key(9)]
    assert (cache / key(9) / FILES[0]).read_text() == f"g1:{FILES[0]}"


def test_a_damaged_entry_is_a_miss_and_its_partial_copy_is_removed(tmp_path):
    cache, built, staging = tmp_path / "cache", tmp_path / "built", tmp_path / "staging"
    graph(built)
    graph_cache.remember(key(9), str(built), TRANSFORM, FILES, str(cache))
    (cache / key(9) / FILES[-1]).unlink()  # a file gone from the entry
    assert graph_cache.reuse(key(9), str(staging), previous=None, cache=str(cache)) is None
    assert not any(p.is_file() for p in staging.rglob("*"))
    (cache / key(9) / graph_cache.ENTRY).write_text("{not json")
    assert graph_cache.reuse(key(9), str(staging), previous=None, cache=str(cache)) is None


def test_the_cache_keeps_the_most_recently_used_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(graph_cache, "KEEP", 3)
    cache, built = tmp_path / "cache", tmp_path / "built"
    graph(built)
    for n in range(3):
        graph_cache.remember(key(n), str(built), TRANSFORM, FILES, str(cache))
        os.utime(cache / key(n), (1000 + n, 1000 + n))
    assert graph_cache.reuse(key(0), str(tmp_path / "s"), previous=None, cache=str(cache)) is not None  # used now
    graph_cache.remember(key(3), str(built), TRANSFORM, FILES, str(cache))
    assert sorted(os.listdir(cache)) == [key(0), key(2), key(3)]  # k1 was the least recently used


def test_a_cache_that_cannot_be_written_does_not_fail_the_run(tmp_path):
    graph(tmp_path / "built")
    (tmp_path / "file").write_text("not a folder")
    graph_cache.remember(key(9), str(tmp_path / "built"), TRANSFORM, FILES, str(tmp_path / "file" / "cache"))


def test_the_previous_datasets_graph_is_taken_only_under_the_same_key(tmp_path):
    previous, staging = tmp_path / "previous", tmp_path / "staging"
    graph(previous, "night1")
    block = {**TRANSFORM, "graph_key": key(9), "files": FILES}
    (previous / metadata.DATASET_JSON).write_text(json.dumps(info(transform=block).to_json()))
    assert graph_cache.reuse(key(8), str(staging), previous=str(previous), cache=None) is None
    transform, source = graph_cache.reuse(key(9), str(staging), previous=str(previous), cache=None)
    assert transform == TRANSFORM and str(previous) in source
    assert all((staging / rel).read_text() == f"night1:{rel}" for rel in FILES)


def test_a_previous_dataset_missing_a_graph_file_is_a_miss(tmp_path):
    previous, staging = tmp_path / "previous", tmp_path / "staging"
    graph(previous)
    block = {**TRANSFORM, "graph_key": key(9), "files": [*FILES, "transform_fn/variables/variables.index"]}
    (previous / metadata.DATASET_JSON).write_text(json.dumps(info(transform=block).to_json()))
    assert graph_cache.reuse(key(9), str(staging), previous=str(previous), cache=None) is None
    assert not any(p.is_file() for p in staging.rglob("*"))


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(graph_cache.GRAPH_CACHE_ENV, "off")
    assert graph_cache.cache_folder() is None
    monkeypatch.setenv(graph_cache.GRAPH_CACHE_ENV, str(tmp_path / "c"))
    assert graph_cache.cache_folder() == str(tmp_path / "c")
    monkeypatch.delenv(graph_cache.GRAPH_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert graph_cache.cache_folder() == str(tmp_path / "xdg" / "beam_pipeline" / "tft_graphs")


def test_pruning_removes_only_the_caches_own_entries(tmp_path, monkeypatch):
    """A cache pointed at a shared folder (``~/.cache``): what is not an entry, or a store killed half-way,
    stays."""
    monkeypatch.setattr(graph_cache, "KEEP", 1)
    cache, built = tmp_path / "cache", tmp_path / "built"
    graph(built)
    for name in ("pip", ".ssh", ".new-killed", "0" * 32):  # the last: an entry's name without an entry
        (cache / name).mkdir(parents=True)
        os.utime(cache / name, (1000, 1000))
    graph_cache.remember(key(1), str(built), TRANSFORM, FILES, str(cache))
    graph_cache.remember(key(2), str(built), TRANSFORM, FILES, str(cache))
    assert sorted(os.listdir(cache)) == sorted([".ssh", "0" * 32, "pip", key(2)])  # .new-killed: an hour old


def test_a_reuse_leaves_no_file_of_an_earlier_attempt_in_the_staging_folder(tmp_path):
    cache, built, staging = tmp_path / "cache", tmp_path / "built", tmp_path / "staging"
    graph(built)
    graph_cache.remember(key(1), str(built), TRANSFORM, FILES, str(cache))
    (staging / "transform_fn").mkdir(parents=True)
    (staging / "transform_fn" / "left_by_a_failed_attempt.pb").write_text("stale")
    assert graph_cache.reuse(key(1), str(staging), previous=None, cache=str(cache)) is not None
    assert sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()) == sorted(FILES)


def test_an_entry_naming_files_outside_the_graph_is_refused(tmp_path):
    cache, built, staging = tmp_path / "cache", tmp_path / "built", tmp_path / "staging"
    graph(built)
    graph_cache.remember(key(1), str(built), TRANSFORM, FILES, str(cache))
    entry = cache / key(1) / graph_cache.ENTRY
    for files in ([], ["transform_fn/../../escape"], ["elsewhere/file"], ["/etc/passwd"]):
        record = json.loads(entry.read_text())
        entry.write_text(json.dumps({**record, "files": files}))
        assert graph_cache.reuse(key(1), str(staging), previous=None, cache=str(cache)) is None


def test_a_previous_dataset_published_over_during_the_copy_is_a_miss(tmp_path, monkeypatch):
    previous, staging = tmp_path / "previous", tmp_path / "staging"
    graph(previous)
    block = {**TRANSFORM, "graph_key": key(9), "files": FILES}
    (previous / metadata.DATASET_JSON).write_text(json.dumps(info(transform=block).to_json()))
    real_copy = graph_cache.copy_file

    def copy_while_another_run_publishes(src: str, dest: str) -> None:
        real_copy(src, dest)
        other = {**block, "graph_key": key(7)}
        (previous / metadata.DATASET_JSON).write_text(json.dumps(info(["eel"], transform=other).to_json()))

    monkeypatch.setattr(graph_cache, "copy_file", copy_while_another_run_publishes)
    assert graph_cache.reuse(key(9), str(staging), previous=str(previous), cache=None) is None
    assert not any(p.is_file() for p in staging.rglob("*"))
