"""A shard's refs through piece files (Flink and Spark): the same groups as one GroupByKey, no element large."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_pipeline import hashing
from beam_pipeline.planning import PlanShards
from beam_pipeline.resume import SCRATCH_ONLY, SHARD_REFS
from beam_pipeline.vocab.refs import Ref, RefCoder
from beam_pipeline.writer import pieces

pytestmark = pytest.mark.pipeline

MB = 1024 * 1024


def _refs(n: int, split: str = "train", note: int = 0) -> list[Ref]:
    extras = (("note", "x" * note),) if note else ()
    return [
        Ref(
            f"/in/{i:05d}.jpg",
            f"{i:05d}.jpg",
            2_000,
            split,
            "ab"[i % 2],
            hashing.shuffle_key(f"{i:05d}.jpg", 0),
            extras,
        )
        for i in range(n)
    ]


def _groups(refs: list[Ref], scratch: Path, through_files: bool, target: int) -> dict[str, list[str]]:
    """{"split-shard": [relpaths in the order the writer gets them]} as the pipeline groups them."""
    seen = scratch / "seen"
    seen.mkdir(parents=True)

    def note(kv, folder=str(seen), through_files=through_files):
        (split, shard), group = kv
        if through_files:
            group = pieces.read_refs(group)
        Path(folder, f"{split}-{shard}").write_text(json.dumps([r.relpath for r in group]))

    with beam.Pipeline(runner=FnApiRunner()) as p:
        pc = p | beam.Create(refs)
        plans = pc | PlanShards(target)
        _ = pieces.group_refs_by_shard(pc, plans, str(scratch), through_files) | beam.Map(note)
    return {f.name: json.loads(f.read_text()) for f in seen.iterdir()}


def test_the_pieces_give_each_shard_the_refs_one_groupbykey_gives(tmp_path):
    """3,000 refs with 500-byte columns over two splits: ~1.6 MB of refs, so dozens of 32 KB pieces; the
    groups the writer receives are the same, every piece file is under ~2 pieces' bytes, and the files
    stay in the scratch folder (never published)."""
    refs = _refs(2_500, note=500) + _refs(500, split="test", note=500)
    whole = _groups(refs, tmp_path / "a", False, 2 * MB)
    cut = _groups(refs, tmp_path / "b", True, 2 * MB)
    assert {k: sorted(v) for k, v in cut.items()} == {k: sorted(v) for k, v in whole.items()}
    assert len(whole) >= 2 and sum(map(len, cut.values())) == len(refs)
    files = sorted((tmp_path / "b" / SHARD_REFS).iterdir())
    assert len(files) >= 40
    assert max(f.stat().st_size for f in files) < 2 * pieces.PIECE_REF_BYTES
    assert not (tmp_path / "a" / SHARD_REFS).exists()
    assert SHARD_REFS + "/" in SCRATCH_ONLY


def test_a_piece_file_is_its_refs_in_key_order_whatever_order_they_came_in(tmp_path):
    refs = _refs(50, note=10)
    fn = pieces.WritePieceFn(str(tmp_path))
    [(key, path)] = list(fn.process((("train", 3, 7), refs)))
    first = open(path, "rb").read()
    [(_, again)] = list(fn.process((("train", 3, 7), list(reversed(refs)))))
    assert key == ("train", 3) and again == path and open(path, "rb").read() == first
    assert pieces.read_refs([path, path]) == sorted(refs, key=pieces.sort_key)
    assert len(first) < 2 * sum(len(RefCoder().encode(r)) for r in refs)
