"""scripts/benchmark.py profile --timeline: the phases it marks come from a real convert's shards (issue #22)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from beam_pipeline import cli
from beam_pipeline.writer import readahead, shard
from tests.imagegen import image_bytes

pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script() -> ModuleType:
    """scripts/bench/profile.py, imported as scripts/benchmark.py imports it (scripts/ on sys.path)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module("bench.profile")


def test_timeline_marks_every_shard_and_its_phases_cover_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = _script()
    # the hooks patch the writer for the rest of the process: put the originals back after the test
    monkeypatch.setattr(shard.ShardWrite, "write", shard.ShardWrite.write)
    monkeypatch.setattr(shard, "read_then_convert", shard.read_then_convert)
    monkeypatch.setattr(readahead, "_batches", readahead._batches)
    monkeypatch.setattr(profile.Timeline, "_hooked", False)
    for i in range(24):
        path = tmp_path / "in" / ("cats", "dogs")[i % 2] / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes("jpeg", seed=i))
    out = tmp_path / "out"

    timeline = profile.Timeline(period=0.01)
    timeline.hook()
    with timeline:
        argv = ["convert", "--input", str(tmp_path / "in"), "--output", str(out), "--no-transform",
                "--no-tfds-metadata", "--target-shard-mb", "0.01"]  # fmt: skip
        assert cli.main(argv) == 0

    shards = len(list(out.glob("*.tfrecord-*")))  # not idx/*.idx
    marks = [what for _, what in timeline.marks]
    assert shards > 1
    assert marks == ["start", *["shard start", "shard tail", "shard end"] * shards, "end"]
    phases = timeline.phases()
    assert phases[0][2].startswith("before the first shard") and phases[-1][2].startswith("after the last shard")
    assert sum(1 for *_, phase in phases if phase == "between shards") == shards - 1
    assert sum(t1 - t0 for t0, t1, _ in phases) == pytest.approx(timeline.marks[-1][0] - timeline.marks[0][0])
    assert timeline.decode_busy > 0  # the decode pool's tasks were timed
    table = timeline.table(24, 2)
    assert "| shards: steady |" in table and "| **all** |" in table
