"""Splits ignore the seed; the shuffle key does not."""

from __future__ import annotations

import collections

import pytest

from beam_pipeline import hashing

pytestmark = pytest.mark.unit

RATIOS = (("train", 0.8), ("validation", 0.1), ("test", 0.1))


def test_split_is_stable_and_close_to_ratios():
    paths = [f"class_{i % 7}/img_{i:05d}.jpg" for i in range(20000)]
    splits = [hashing.split_for(p, RATIOS) for p in paths]
    assert splits == [hashing.split_for(p, RATIOS) for p in paths]
    counts = collections.Counter(splits)
    assert abs(counts["train"] / len(paths) - 0.8) < 0.02
    assert abs(counts["validation"] / len(paths) - 0.1) < 0.02
    assert abs(counts["test"] / len(paths) - 0.1) < 0.02


def test_adding_files_never_moves_a_file_between_splits():
    before = {f"a/{i}.jpg": hashing.split_for(f"a/{i}.jpg", RATIOS) for i in range(1000)}
    after = {f"a/{i}.jpg": hashing.split_for(f"a/{i}.jpg", RATIOS) for i in range(2000)}
    assert all(after[p] == s for p, s in before.items())


def test_shuffle_key_depends_on_seed_and_path():
    assert hashing.shuffle_key("a/1.jpg", 1) == hashing.shuffle_key("a/1.jpg", 1)
    assert hashing.shuffle_key("a/1.jpg", 1) != hashing.shuffle_key("a/1.jpg", 2)
    assert hashing.shuffle_key("a/1.jpg", 1) != hashing.shuffle_key("a/2.jpg", 1)
    order1 = sorted(range(100), key=lambda i: hashing.shuffle_key(f"{i}.jpg", 1))
    order2 = sorted(range(100), key=lambda i: hashing.shuffle_key(f"{i}.jpg", 2))
    assert order1 != order2


def test_bucket_is_the_top_bits_of_the_key():
    assert hashing.bucket_of(0) == 0
    assert hashing.bucket_of(2**64 - 1) == hashing.NUM_BUCKETS - 1
    keys = sorted(hashing.shuffle_key(f"{i}", 0) for i in range(1000))
    buckets = [hashing.bucket_of(k) for k in keys]
    assert buckets == sorted(buckets)  # bucket order is key order
