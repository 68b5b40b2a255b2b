"""Shard plans on bytes: every shard of a split over 100 MB lands in 100-200 MB."""

from __future__ import annotations

import numpy as np
import pytest

from beam_pipeline import hashing
from beam_pipeline.config import MB
from beam_pipeline.planning import cut_buckets, estimated_record_bytes, make_plans, shard_count
from beam_pipeline.vocab.refs import Ref

pytestmark = pytest.mark.unit

TARGET = 150 * MB


@pytest.mark.parametrize("total_mb", [101, 150, 199, 200, 201, 210, 225, 260, 299, 301, 350, 1000, 2049, 10_000])
def test_shard_count_keeps_even_shards_within_bounds(total_mb):
    n = shard_count(total_mb * MB, TARGET)
    assert 100 * MB <= total_mb * MB / n <= 200 * MB


def test_small_split_is_one_shard():
    assert shard_count(5 * MB, TARGET) == 1
    assert shard_count(0, TARGET) == 1


def _refs(sizes, seed=0, split="train"):
    return [
        Ref(f"/x/{i}.jpg", f"{i}.jpg", int(s), split, None, hashing.shuffle_key(f"{i}.jpg", seed))
        for i, s in enumerate(sizes)
    ]


def _plan_sizes(refs):
    pairs = [((r.split, hashing.bucket_of(r.key)), estimated_record_bytes(r)) for r in refs]
    plans = make_plans(pairs, TARGET)
    sizes = {}
    for r in refs:
        shard = plans[r.split].shard_of(hashing.bucket_of(r.key))
        sizes[shard] = sizes.get(shard, 0) + estimated_record_bytes(r)
    return plans, sizes


def test_many_small_jpegs_make_even_shards():
    rng = np.random.default_rng(1)
    refs = _refs(rng.uniform(80_000, 160_000, size=20_000))  # ~2.4 GB of 100-150 KB files
    plans, sizes = _plan_sizes(refs)
    assert plans["train"].num_shards == len(sizes) >= 15
    assert all(100 * MB <= s <= 200 * MB for s in sizes.values()), sorted(sizes.values())
    assert max(sizes.values()) - min(sizes.values()) < 2 * MB


def test_a_few_hundred_multi_mb_photos_make_even_shards():
    rng = np.random.default_rng(2)
    refs = _refs(rng.uniform(3 * MB, 12 * MB, size=300))  # ~2.2 GB of large photos
    plans, sizes = _plan_sizes(refs)
    assert all(100 * MB <= s <= 200 * MB for s in sizes.values()), sorted(sizes.values())


def test_shards_are_contiguous_runs_of_the_global_order():
    refs = _refs(np.full(5000, 100_000))
    plans, _ = _plan_sizes(refs)
    plan = plans["train"]
    shards = [plan.shard_of(hashing.bucket_of(r.key)) for r in sorted(refs, key=lambda r: r.key)]
    assert shards == sorted(shards)
    assert set(shards) == set(range(plan.num_shards))


def test_cut_buckets_with_fewer_buckets_than_shards():
    plan = cut_buckets({5: 10, 9: 10}, 4)
    assert plan.shard_of(5) != plan.shard_of(9)
    assert plan.shard_of(0) == 0


def test_each_split_is_planned_separately():
    pairs = [(("train", b), 10 * MB) for b in range(100)] + [(("test", b), 1 * MB) for b in range(10)]
    plans = make_plans(pairs, TARGET)
    assert plans["train"].num_shards == 7  # 1000 MB
    assert plans["test"].num_shards == 1


def test_a_tiny_target_makes_no_more_shards_than_buckets():
    """A shard holds whole hash buckets, so more shards than buckets stay empty: 4 GB at a 100-byte target asked
    for 40 million (the planner's list of them took GBs), and its loop ran once per shard."""
    assert shard_count(4e9, 100) == hashing.NUM_BUCKETS
    assert shard_count(620e6, 150e6) == 4  # as before at ordinary sizes


def _plan_through_the_combine(refs):
    """{split: ShardPlan} as the pipeline makes it (PlanShards' CombineFn, in two partials merged), and the
    largest shard's refs in encoded bytes."""
    from beam_pipeline.planning import SumBucketBytes, plans_from_table
    from beam_pipeline.vocab.refs import RefCoder

    fn = SumBucketBytes()
    partials = []
    for part in (refs[::2], refs[1::2]):
        acc = fn.create_accumulator()
        for ref in part:
            acc = fn.add_input(acc, ref)
        partials.append(acc)
    plans = plans_from_table(fn.extract_output(fn.merge_accumulators(partials)), TARGET)
    per_shard: dict[tuple[str, int], int] = {}
    for r in refs:
        shard = (r.split, plans[r.split].shard_of(hashing.bucket_of(r.key)))
        per_shard[shard] = per_shard.get(shard, 0) + len(RefCoder().encode(r))
    return plans, max(per_shard.values())


def test_a_shards_refs_stay_under_the_cap_when_rows_carry_big_columns():
    """150 MB of tiny images whose rows carry a 25 KB column: by bytes one shard, but its refs would be one
    150 MB element (a Flink sort record over its ~16 MB limit failed the job). The cap makes ~19 shards."""
    from beam_pipeline.planning import MAX_REF_BYTES_PER_SHARD

    refs = [
        Ref(r.path, r.relpath, r.size, r.split, r.label, r.key, (("note", "ab" * 12_500),)) for r in _refs([300] * 6000)
    ]
    plans, largest = _plan_through_the_combine(refs)
    assert plans["train"].num_shards >= 18
    assert largest <= 1.25 * MAX_REF_BYTES_PER_SHARD, largest


def test_ordinary_tiles_are_planned_on_bytes_alone():
    """62k tiles of 2.4 KB (one 150 MB shard's worth) carry ~5 MB of refs: under the cap, the same plan as
    bytes give."""
    refs = _refs([2_400] * 62_000)
    pairs = [((r.split, hashing.bucket_of(r.key)), estimated_record_bytes(r)) for r in refs]
    plans, largest = _plan_through_the_combine(refs)
    assert plans["train"].starts == make_plans(pairs, TARGET)["train"].starts == (0,)
    assert largest < 8 * MB


def test_the_refs_size_estimate_is_near_the_encoding():
    from beam_pipeline.vocab.refs import RefCoder

    coder = RefCoder()
    refs = [
        *_refs([2_400] * 3),
        Ref("gs://bucket/a/b/c.jpg", "c.jpg", 10, "validation", ("cat", "dog"), 7),
        Ref("gs://bucket/elsewhere.jpg", "c.jpg", 10, "train", "cat", 7),
        Ref("/x/1.jpg", "1.jpg", 10, "train", None, 7, (("note", "x" * 100),)),
    ]
    for ref in refs:
        assert abs(coder.estimate_size(ref) - len(coder.encode(ref))) <= 4, ref


def test_a_table_past_its_dict_size_plans_the_same_from_one_array():
    """40k photos-sized refs, 32k in train: its table turns into one array of 2**18 counts (2 MB, where a
    dict of that many buckets held ~100 bytes each for the whole run), in a partial and when merged with one
    still a dict; test's 8k stay a dict; the plans equal those of the plain pairs."""
    import pickle

    from beam_pipeline.planning import DENSE_AFTER, SumBucketBytes, plans_from_table

    refs = _refs([150_000 + 7 * i for i in range(40_000)])
    refs = [r if i % 5 else Ref(r.path, r.relpath, r.size, "test", r.label, r.key) for i, r in enumerate(refs)]
    fn = SumBucketBytes()
    partials = []
    for part in (refs[:30_000], refs[30_000:]):  # one partial past DENSE_AFTER per split, one not
        acc = fn.create_accumulator()
        for ref in part:
            acc = fn.add_input(acc, ref)
        partials.append(pickle.loads(pickle.dumps(acc)))  # as an accumulator crosses a shuffle
    assert not isinstance(partials[0]["train"].buckets, dict) and len(partials[1]["train"].buckets) < DENSE_AFTER
    merged = fn.merge_accumulators(partials)
    assert merged["train"].buckets.nbytes == 8 * hashing.NUM_BUCKETS and isinstance(merged["test"].buckets, dict)
    pairs = [((r.split, hashing.bucket_of(r.key)), estimated_record_bytes(r)) for r in refs]
    plans = plans_from_table(fn.extract_output(merged), TARGET)
    assert plans == make_plans(pairs, TARGET, {s: merged[s].ref_bytes for s in ("train", "test")})
    assert plans["train"].num_shards > 20
