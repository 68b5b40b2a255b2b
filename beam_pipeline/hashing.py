"""Deterministic hashes: which split a file goes to, and where it lands in the shuffle.

The split hash ignores the seed, so changing ``--seed`` or adding files never
moves a file between splits.  The shuffle key is salted with the seed, so each
seed gives one global permutation, the same on every run and every retry.

    split_for("cat/001.jpg", (("train", 0.8), ("test", 0.2)))   # 'train'
    shuffle_key("cat/001.jpg", seed=42)                        # 64-bit int
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# 2**18 buckets: fine enough that one bucket of a 10 TB split is far below a shard.
BUCKET_BITS = 18
NUM_BUCKETS = 1 << BUCKET_BITS


def _u64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def unit_interval(relpath: str) -> float:
    """A stable number in [0, 1) for a relative path, independent of any seed."""
    return _u64("split\0" + relpath) / 2.0**64


def split_for(relpath: str, ratios: Sequence[tuple[str, float]]) -> str:
    """Picks a split by cumulative ratio; ratios sum to 1."""
    point = unit_interval(relpath)
    total = 0.0
    for name, ratio in ratios:
        total += ratio
        if point < total:
            return name
    return ratios[-1][0]


def shuffle_key(relpath: str, seed: int) -> int:
    """The record's position in the global order (salted with the seed)."""
    return _u64(f"shuffle\0{seed}\0{relpath}")


def bucket_of(key: int) -> int:
    """The fine hash bucket (top bits of the shuffle key) used for shard planning."""
    return key >> (64 - BUCKET_BITS)


def part_of(path: str, parts: int) -> int:
    """Which of ``parts`` part files a line about ``path`` goes to: a hash of the path, the same on every
    attempt and worker (rejects.jsonl's parts, near_duplicates.jsonl's)."""
    return int.from_bytes(hashlib.sha256(path.encode("utf-8", "surrogatepass")).digest()[:4], "big") % parts
