"""reader.load: a new record order every epoch by default, reproducible with a seed, stored order on request."""

from __future__ import annotations

import pytest

from beam_pipeline import reader
from beam_pipeline.vocab.dataset_info import SplitInfo

from .conftest import convert, load_info, read_records
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader")
    for i in range(40):
        write(str(root / "in" / ["cat", "dog"][i % 2] / f"{i:02d}.png"), image_bytes("png", 8 + i, 8, seed=i))
    out = root / "out"
    convert("--input", str(root / "in"), "--output", str(out))
    assert load_info(out)["splits"]["train"]["num_shards"] == 1
    return out


def _names(ds) -> list[str]:
    return [r["image/filename"].numpy().decode() for r in ds]


def test_two_epochs_of_one_shard_come_in_different_orders(one_shard):
    ds = reader.load(str(one_shard), "train")
    first, second = _names(ds), _names(ds)
    assert sorted(first) == sorted(second) and len(first) == 40
    assert first != second


def test_shuffle_false_reads_the_stored_order(one_shard):
    stored = [r["image/filename"].decode() for r in read_records(one_shard, "train")]
    ds = reader.load(str(one_shard), "train", shuffle=False)
    assert _names(ds) == stored == _names(ds)
    assert _names(reader.load(str(one_shard), "train", shuffle_files=False)) == stored  # the older name


def test_a_seed_makes_the_epochs_reproducible(one_shard):
    a = reader.load(str(one_shard), "train", seed=7)
    b = reader.load(str(one_shard), "train", seed=7)
    a1, a2 = _names(a), _names(a)
    assert a1 == _names(b) and a2 == _names(b)
    assert a1 != a2  # still a new order each epoch
    assert _names(reader.load(str(one_shard), "train", seed=8)) != a1


def test_batches_are_shuffled_too(one_shard):
    ds = reader.load(str(one_shard), "train", batch_size=8, seed=1)
    names = [n.decode() for batch in ds for n in batch["image/filename"].numpy()]
    stored = [r["image/filename"].decode() for r in read_records(one_shard, "train")]
    assert sorted(names) == sorted(stored) and names != stored


@pytest.mark.unit
def test_default_shuffle_buffer_follows_record_size():
    def split(examples: int, size: int) -> SplitInfo:
        return SplitInfo(examples=examples, bytes=size, num_shards=0, shards=(), labels=None)

    assert reader.default_shuffle_buffer(split(100_000, 100_000 * 150_000)) == 1789
    assert reader.default_shuffle_buffer(split(300, 300 * 7_000_000)) == 64
    assert reader.default_shuffle_buffer(split(50, 50 * 1000)) == 50
    assert reader.default_shuffle_buffer(split(10**6, 10**6 * 100)) == 10_000
