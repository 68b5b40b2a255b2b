"""Typed records that cross stages: what one written shard is (``ShardResult``).

A shard writer yields one ``ShardResult`` per shard it closes; finalize names
the shards and sums them into ``dataset.json``; the resume marker keeps it as
JSON (``to_json`` / ``from_json``) so a later run can take the shard over.

    result = ShardResult(split="train", shard=0, tmp_path="/out/.tmp/train-0.tfrecord", records=12, bytes=4096)
    ShardResult.from_json(result.to_json()) == result
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ShardResult:
    """One closed shard file, as its writer (or the WriteToTFRecord sink's describe step) saw it."""

    split: str
    shard: int  # the planned shard number within the split (final names renumber without the empty ones)
    tmp_path: str  # the shard file in the run's scratch folder
    records: int
    bytes: int
    index_path: str | None = None  # its index.jsonl part (the planned sink only)
    rejects_path: str | None = None  # its rejects, kept for a run that takes the shard over (None: no rejects)
    idx_path: str | None = None  # its .idx file (uncompressed shards of the planned sink)
    labels: Mapping[str, int] = field(default_factory=dict)  # records per label
    converted: Mapping[str, int] = field(default_factory=dict)  # images converted, per source format
    sizes: Mapping[str, int] = field(default_factory=dict)  # records per shorter-side bucket (size_bucket)
    objects: Mapping[str, int] = field(default_factory=dict)  # object counts of its records
    reused: int = 0  # records copied from the --incremental-from dataset
    reconverted: int = 0  # unchanged files whose previous record could not be reused
    rejects_kept: int = 0  # rejects of the previous run kept as they were
    resumed_from: str | None = None  # the scratch folder of the run it was taken from (resume.py)

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the set fields (paths left None are left out)."""
        out = asdict(self)
        for key in ("index_path", "idx_path", "resumed_from"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardResult:
        """The record a JSON object (``to_json``, or a resume marker of an earlier run) describes."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def choose_results(results: Iterable[ShardResult]) -> dict[tuple[str, int], ShardResult]:
    """One result per (split, shard); a duplicate (a retried writer) is resolved the same way every time."""
    chosen: dict[tuple[str, int], ShardResult] = {}
    for result in sorted(results, key=lambda r: (r.split, r.shard, r.tmp_path)):
        chosen.setdefault((result.split, result.shard), result)
    return chosen


# The stored images' shorter side, in buckets (dataset.json's image_sizes): powers of two from 64 to 2048.
SIZE_BUCKETS = ("<64", "64-127", "128-255", "256-511", "512-1023", "1024-2047", ">=2048")
UNKNOWN_SIZE = "unknown"  # a record reused from an index without sizes (an older version)


def size_bucket(size: tuple[int, int] | None) -> str:
    """The SIZE_BUCKETS name of an image's shorter side (``size``: width, height), or UNKNOWN_SIZE."""
    if not size:
        return UNKNOWN_SIZE
    side = min(size)
    for i, name in enumerate(SIZE_BUCKETS[:-1]):
        if side < 64 << i:
            return name
    return SIZE_BUCKETS[-1]
