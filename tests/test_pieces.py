"""A shard's refs through piece files (Flink and Spark: grouped pieces; the local runner: packed per bundle): the
same groups as one GroupByKey, no element large."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_pipeline import hashing
from beam_pipeline.planning import PlanShards, ShardPlan
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


def _groups(refs: list[Ref], scratch: Path, how: str, target: int) -> dict[str, list[str]]:
    """{"split-shard": [relpaths in the order the writer gets them]} as the pipeline groups them."""
    seen = scratch / "seen"
    seen.mkdir(parents=True)

    def note(kv, folder=str(seen), how=how):
        (split, shard), group = kv
        if how != pieces.GROUP:
            group = pieces.read_refs(group)
        Path(folder, f"{split}-{shard}").write_text(json.dumps([r.relpath for r in group]))

    with beam.Pipeline(runner=FnApiRunner()) as p:
        pc = p | beam.Create(refs)
        plans = pc | PlanShards(target)
        _ = pieces.group_refs_by_shard(pc, plans, str(scratch), how) | beam.Map(note)
    return {f.name: json.loads(f.read_text()) for f in seen.iterdir()}


def test_the_pieces_give_each_shard_the_refs_one_groupbykey_gives(tmp_path):
    """3,000 refs with 500-byte columns over two splits: ~1.6 MB of refs, so dozens of 32 KB pieces; the
    groups the writer receives are the same, every piece file is under ~2 pieces' bytes, and the files
    stay in the scratch folder (never published)."""
    refs = _refs(2_500, note=500) + _refs(500, split="test", note=500)
    whole = _groups(refs, tmp_path / "a", pieces.GROUP, 2 * MB)
    cut = _groups(refs, tmp_path / "b", pieces.PIECES, 2 * MB)
    packed = _groups(refs, tmp_path / "c", pieces.PACK, 2 * MB)
    assert {k: sorted(v) for k, v in cut.items()} == {k: sorted(v) for k, v in whole.items()}
    assert {k: sorted(v) for k, v in packed.items()} == {k: sorted(v) for k, v in whole.items()}
    assert len(whole) >= 2 and sum(map(len, cut.values())) == len(refs)
    files = sorted((tmp_path / "b" / SHARD_REFS).iterdir())
    assert len(files) >= 40
    assert max(f.stat().st_size for f in files) < 2 * pieces.PIECE_REF_BYTES
    assert 1 <= len(list((tmp_path / "c" / SHARD_REFS).iterdir())) <= 2 * len(whole)
    assert not (tmp_path / "a" / SHARD_REFS).exists()
    assert SHARD_REFS + "/" in SCRATCH_ONLY


def test_packing_writes_a_full_shard_piece_and_never_holds_more_than_its_cap(tmp_path, monkeypatch):
    """PackPiecesFn (the local runner's path): a shard's refs are written once they reach PACK_PIECE_BYTES,
    every shard's once the bundle holds PACK_BUFFER_BYTES, the rest when the bundle ends; each ref is in
    exactly one file, a file is named by its bytes (a repeated bundle writes the same file), and the
    bundle never holds more than the cap."""
    monkeypatch.setattr(pieces, "PACK_PIECE_BYTES", 6_000)
    monkeypatch.setattr(pieces, "PACK_BUFFER_BYTES", 20_000)
    refs = _refs(2_000, note=10)
    plans = {
        "train": ShardPlan(
            starts=tuple(range(0, hashing.NUM_BUCKETS, hashing.NUM_BUCKETS // 8)), estimated_bytes=(1,) * 8
        )
    }

    def bundle() -> tuple[list[tuple[tuple[str, int], str]], int]:
        fn = pieces.PackPiecesFn(str(tmp_path))
        fn.start_bundle()
        out, most = [], 0
        for ref in refs:
            out.extend(fn.process(ref, plans))
            most = max(most, fn._total)  # noqa: SLF001
        out.extend(wv.value for wv in fn.finish_bundle())
        return out, most

    first, most = bundle()
    again, _ = bundle()
    assert first == again and most < 20_000
    by_shard: dict[tuple[str, int], list[str]] = {}
    for key, path in first:
        by_shard.setdefault(key, []).append(path)
    assert len(by_shard) == 8 and len(first) > 16  # pieces written before the bundle ended
    for (split, shard), paths in by_shard.items():
        want = sorted(
            (r for r in refs if plans[split].shard_of(hashing.bucket_of(r.key)) == shard), key=pieces.sort_key
        )
        assert pieces.read_refs(paths) == want
    assert all(Path(p).stat().st_size <= 6_000 + 200 for _, p in first)
    assert len(list((tmp_path / SHARD_REFS).iterdir())) == len(set(p for _, p in first))


def test_a_piece_file_is_its_refs_in_key_order_whatever_order_they_came_in(tmp_path):
    refs = _refs(50, note=10)
    fn = pieces.WritePieceFn(str(tmp_path))
    [(key, path)] = list(fn.process((("train", 3, 7), refs)))
    first = open(path, "rb").read()
    [(_, again)] = list(fn.process((("train", 3, 7), list(reversed(refs)))))
    assert key == ("train", 3) and again == path and open(path, "rb").read() == first
    assert pieces.read_refs([path, path]) == sorted(refs, key=pieces.sort_key)
    assert len(first) < 2 * sum(len(RefCoder().encode(r)) for r in refs)
