"""Shard planning: how many shards each split gets, and which refs go in which.

Planning is on bytes, not counts: every ref adds its estimated record size to
its fine hash bucket (the top bits of its shuffle key), and each split's
buckets, in key order, are cut into contiguous runs of about equal bytes.
Shards therefore stay within the size bounds even with a few hundred multi-MB
photos, and concatenating a split's shards in order gives one global
permutation (the shuffle-key order). A split whose refs are large or many
for their bytes (rows with big extra columns, images of a few hundred bytes)
gets more shards, so that no shard's refs pass MAX_REF_BYTES_PER_SHARD.

    n = shard_count(total_bytes=620e6, target=150e6)            # 4
    plan = cut_buckets({bucket: bytes, ...}, n)                 # ShardPlan
    plan.shard_of(bucket)                                       # 0 .. n-1
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypedDict

import apache_beam as beam

from . import hashing
from .config import case_twins_problem
from .errors import UsageError
from .sources.rules import label_names
from .vocab.refs import REF_CODER, Ref


class _SplitPlan(TypedDict):
    num_shards: int
    estimated_bytes: int
    shard_bytes: list[int]
    examples: int
    labels: dict[str, int]


class SplitPlanSummary(_SplitPlan, total=False):
    """One split of ``plan``'s output: shards planned on the listed bytes, before any pixel is read."""

    files: list[str]  # the shards' names (run.convert.run_plan adds them)


class _Plan(TypedDict):
    splits: dict[str, SplitPlanSummary]
    rejects: dict[str, int]  # reason → files rejected while listing
    skipped: dict[str, int]


class PlanSummary(_Plan, total=False):
    """What the planning pipeline writes (plan.json) and ``plan`` prints; ``run_plan`` adds the rest."""

    output: str
    name: str
    target_shard_mb: float


# Shards may exceed the target by this factor before another shard is added:
# with the default 150 MB target every shard of a split over 100 MB lands in 100–200 MB.
MAX_OVER_TARGET = 4 / 3

# Bytes a record adds beyond the image: TFRecord framing (16), feature keys and
# numbers (~170), the sha256 hex (64).  Filename and label are added per ref.
RECORD_OVERHEAD = 260


def estimated_record_bytes(ref: Ref) -> int:
    extras = sum(len(str(k)) + len(str(v)) + 8 for k, v in ref.extras)
    if isinstance(ref.label, tuple):  # a multi-label image's names, and an id each
        label = sum(len(name.encode()) + 2 for name in label_names(ref.label))
    else:
        label = len((ref.label or "").encode())
    return ref.size + RECORD_OVERHEAD + len(ref.relpath.encode()) + label + extras


# A shard's refs (their encoded bytes, vocab.refs.RefCoder) stay under this: more shards otherwise. The refs
# of a shard are grouped into one element on every runner, and on Flink into one record of its sort, whose
# limit is ~16 MB at scripts/cluster.sh's TaskManager (a record over it fails the job). 82-byte tile refs
# reach it at ~100k tiles per shard (tiles of ~1.5 KB at 150 MB); rows with kilobytes of extra columns or
# annotations sooner. Below it, and so for every ordinary dataset, the plan is the bytes' alone.
MAX_REF_BYTES_PER_SHARD = 8 * 1024 * 1024


def shard_count(total_bytes: float, target: float, ref_bytes: int = 0) -> int:
    """Shards for a split: nearest to ``target`` each, never above MAX_OVER_TARGET × target, nor above
    MAX_REF_BYTES_PER_SHARD of refs each (``ref_bytes``: the split's)."""
    if total_bytes <= 0:
        return 1
    n = max(1, round(total_bytes / target), math.ceil(ref_bytes / MAX_REF_BYTES_PER_SHARD))
    while total_bytes / n > target * MAX_OVER_TARGET and n < hashing.NUM_BUCKETS:
        n += 1
    # a shard holds whole buckets: more shards than buckets would stay empty (a tiny target made millions)
    return min(n, hashing.NUM_BUCKETS)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Shard i holds the buckets in [starts[i], starts[i+1]); estimated bytes per shard; the split's refs'
    encoded bytes (writer/pieces.py cuts a shard's refs by them)."""

    starts: tuple[int, ...]
    estimated_bytes: tuple[int, ...]
    ref_bytes: int = 0

    @property
    def num_shards(self) -> int:
        return len(self.starts)

    def shard_of(self, bucket: int) -> int:
        return max(0, bisect.bisect_right(self.starts, bucket) - 1)


def cut_buckets(bucket_bytes: Mapping[int, int], num_shards: int) -> ShardPlan:
    """Cuts buckets (in bucket order) into ``num_shards`` runs of about equal bytes.

    A bucket goes to the shard its byte midpoint falls in, so each cut is off by
    at most half a bucket.  With fewer non-empty buckets than shards, the extra
    shards stay empty (finalize drops empty shards).
    """
    items = sorted((b, s) for b, s in bucket_bytes.items() if s > 0)
    total = sum(s for _, s in items)
    if not items or num_shards <= 1:
        return ShardPlan((0,), (total,))
    per_shard = total / num_shards
    starts = [0]
    sizes = [0]
    cumulative = 0
    for bucket, size in items:
        midpoint = cumulative + size / 2
        shard = min(num_shards - 1, math.floor(midpoint / per_shard))
        while shard > len(starts) - 1:
            starts.append(bucket)
            sizes.append(0)
        sizes[-1] += size
        cumulative += size
    return ShardPlan(tuple(starts), tuple(sizes))


def make_plans(
    split_bucket_bytes: Iterable[tuple[tuple[str, int], int]], target: int, ref_bytes: Mapping[str, int] | None = None
) -> dict[str, ShardPlan]:
    """((split, bucket), bytes) pairs → {split: ShardPlan}; ``ref_bytes``: {split: its refs' encoded bytes}.

    UsageError for splits whose names differ only in case: only a manifest's split column can give them (the
    flags are checked at the start, split folders have fixed names), and the plan is the first point that
    sees every row's split; nothing is written before it.
    """
    by_split: dict[str, dict[int, int]] = {}
    for (split, bucket), size in split_bucket_bytes:
        buckets = by_split.setdefault(split, {})
        buckets[bucket] = buckets.get(bucket, 0) + size
    twins = case_twins_problem(by_split)
    if twins:
        raise UsageError(f"--manifest split column: {twins}")
    plans = {}
    for split, buckets in sorted(by_split.items()):
        refs = (ref_bytes or {}).get(split, 0)
        plan = cut_buckets(buckets, shard_count(sum(buckets.values()), target, refs))
        plans[split] = dataclasses.replace(plan, ref_bytes=refs)
    return plans


# A split's table turns from a dict into one array of NUM_BUCKETS counts (2 MB) past this many buckets:
# a dict entry costs ~100 bytes, and a run of many small images fills up to all 2**18 buckets, which the
# local runner's side-input cache then keeps for the whole run (~0.1 KB per image up to 26 MB per split).
DENSE_AFTER = 1 << 14


class SplitTable:
    """One split's part of the planner's table: estimated record bytes per bucket (a dict, or an array of
    NUM_BUCKETS once more than DENSE_AFTER buckets are used), and its refs' bytes."""

    __slots__ = ("buckets", "ref_bytes")

    def __init__(self, buckets: dict[int, int] | None = None, ref_bytes: int = 0) -> None:
        self.buckets: dict[int, int] | Any = buckets if buckets is not None else {}
        self.ref_bytes = ref_bytes

    def add(self, bucket: int, size: int) -> None:
        buckets = self.buckets
        if isinstance(buckets, dict):
            buckets[bucket] = buckets.get(bucket, 0) + size
            if len(buckets) > DENSE_AFTER:
                self._make_dense()
        else:
            buckets[bucket] += size

    def merge(self, other: SplitTable) -> None:
        self.ref_bytes += other.ref_bytes
        if isinstance(other.buckets, dict):
            for bucket, size in other.buckets.items():
                self.add(bucket, size)
            return
        if isinstance(self.buckets, dict):
            self._make_dense()
        self.buckets += other.buckets

    def items(self) -> Iterator[tuple[int, int]]:
        """(bucket, bytes) of the buckets in use."""
        buckets = self.buckets
        if isinstance(buckets, dict):
            return iter(buckets.items())
        import numpy as np

        used = np.flatnonzero(buckets)
        return zip(used.tolist(), buckets[used].tolist(), strict=True)

    def _make_dense(self) -> None:
        import numpy as np

        dense = np.zeros(hashing.NUM_BUCKETS, dtype=np.int64)
        for bucket, size in self.buckets.items():
            dense[bucket] = size
        self.buckets = dense


class SumBucketBytes(beam.CombineFn):
    """refs → {split: SplitTable}: the planner's table, as one dict.

    One accumulator instead of a CombinePerKey over (split, bucket): the
    local runner would otherwise hold every one of the up to 2**18 keys per
    split several times over (partials, grouped table, list), ~900 B each;
    a plain dict costs ~100 B per bucket. On Dataflow each bundle's partial
    holds only the buckets its refs fell in.
    """

    def create_accumulator(self) -> dict[str, SplitTable]:
        return {}

    def add_input(self, acc: dict[str, SplitTable], ref: Ref) -> dict[str, SplitTable]:
        table = acc.get(ref.split)
        if table is None:
            table = acc[ref.split] = SplitTable()
        table.add(hashing.bucket_of(ref.key), estimated_record_bytes(ref))
        table.ref_bytes += REF_CODER.estimate_size(ref)
        return acc

    def merge_accumulators(self, accs: Iterable[dict[str, SplitTable]]) -> dict[str, SplitTable]:
        merged: dict[str, SplitTable] = {}
        for acc in accs:
            for split, table in acc.items():
                into = merged.get(split)
                if into is None:
                    into = merged[split] = SplitTable()
                into.merge(table)
        return merged

    def extract_output(self, acc: dict[str, SplitTable]) -> dict[str, SplitTable]:
        return acc


def plans_from_table(table: Mapping[str, SplitTable], target: int) -> dict[str, ShardPlan]:
    """{split: SplitTable} → {split: ShardPlan}."""
    return make_plans(
        (((split, bucket), size) for split, t in table.items() for bucket, size in t.items()),
        target,
        {split: t.ref_bytes for split, t in table.items()},
    )


class PlanShards(beam.PTransform):
    """refs → one element: {split: ShardPlan} (use as a singleton side input)."""

    def __init__(self, target_bytes: int) -> None:
        super().__init__()
        self._target = target_bytes

    def expand(self, refs: beam.PCollection) -> beam.PCollection:
        return (
            refs
            # {split: SplitTable}: at most 2**18 buckets per split, small enough for one worker
            | "SumBucketBytes" >> beam.CombineGlobally(SumBucketBytes())
            | "CutShards" >> beam.Map(plans_from_table, self._target)
        )


def assign_shard(ref: Ref, plans: Mapping[str, ShardPlan]) -> tuple[tuple[str, int], Ref]:
    """((split, shard), ref): the key refs are grouped by before writing."""
    return (ref.split, plans[ref.split].shard_of(hashing.bucket_of(ref.key))), ref
