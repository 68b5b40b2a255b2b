"""The shard writer and finalize steps, driven directly and through TestPipeline."""

from __future__ import annotations

import hashlib
import json

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline import hashing
from beam_pipeline.examples import parse_example
from beam_pipeline.formats.registry import TFRECORD
from beam_pipeline.planning import PlanShards
from beam_pipeline.run.finalize import choose_results, final_layout, rename_idempotent
from beam_pipeline.sources.rules import REJECTS
from beam_pipeline.vocab.records import ShardResult
from beam_pipeline.vocab.refs import Ref
from beam_pipeline.writer import records
from beam_pipeline.writer.budget import Budget
from beam_pipeline.writer.readahead import read_then_convert
from beam_pipeline.writer.records import convert_one
from beam_pipeline.writer.shard import WriteShardFn

from .conftest import local_pipeline
from .imagegen import broken_bytes, image_bytes, write

pytestmark = pytest.mark.unit


def _ref(path: str, relpath: str, label: str | None = "cat", seed: int = 0) -> Ref:
    import os

    return Ref(path, relpath, os.path.getsize(path), "train", label, hashing.shuffle_key(relpath, seed))


@pytest.mark.e2e
def test_read_then_convert_keeps_order_within_its_window_and_byte_budget():
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    budget = Budget(100)
    lock = threading.Lock()
    in_flight, most = [0], [0]

    def read(i):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.001 * (5 - i % 5))
        return i

    def convert(i, data):
        with lock:
            in_flight[0] -= 1
        return data * data

    sizes = {i: (30 if i % 7 else 250) for i in range(60)}  # every 7th is larger than the whole budget
    with ThreadPoolExecutor(8) as io_pool, ThreadPoolExecutor(2) as decode_pool:
        out = list(
            read_then_convert(
                range(60), read, convert, io_pool, decode_pool, window=6, budget=budget, cost=sizes.__getitem__
            )
        )
    assert out == [(i, i * i) for i in range(60)]
    assert budget.held == 0 and budget.peak <= 100 and most[0] <= 6


def test_read_then_convert_gives_its_bytes_back_when_a_read_fails():
    from concurrent.futures import ThreadPoolExecutor

    budget = Budget(100)

    def read(i):
        if i == 3:
            raise ConnectionResetError("reset by peer")
        return i

    with ThreadPoolExecutor(4) as io_pool, ThreadPoolExecutor(2) as decode_pool:
        results = read_then_convert(
            range(10), read, lambda i, d: d, io_pool, decode_pool, window=4, budget=budget, cost=lambda i: 20
        )
        with pytest.raises(ConnectionResetError):
            list(results)
    assert budget.held == 0


def test_budget_is_first_come_first_served_and_an_oversized_request_runs_alone():
    import threading
    import time

    budget = Budget(10)
    order, running, most = [], [0], [0]
    lock = threading.Lock()

    def work(name, nbytes, hold_for):
        with budget.hold(nbytes):
            with lock:
                running[0] += nbytes
                most[0] = max(most[0], running[0])
                order.append(name)
            time.sleep(hold_for)
            with lock:
                running[0] -= nbytes

    first = threading.Thread(target=work, args=("a", 6, 0.2))
    first.start()
    time.sleep(0.05)
    threads = [threading.Thread(target=work, args=(name, n, 0.01)) for name, n in (("big", 50), ("b", 3))]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in [first, *threads]:
        t.join()
    # "b" would fit beside "a" but queued after "big": it waits its turn; "big" ran with nothing else.
    assert order == ["a", "big", "b"]
    assert budget.held == 0 and most[0] == 50


@pytest.mark.pipeline
def test_write_shard_fn_writes_sorted_records_and_routes_rejects(tmp_path):
    refs = []
    for i in range(6):
        path = write(str(tmp_path / "in" / "cat" / f"{i}.jpg"), image_bytes("jpeg", seed=i))
        refs.append(_ref(path, f"cat/{i}.jpg"))
    bad = write(str(tmp_path / "in" / "cat" / "bad.jpg"), broken_bytes("truncated"))
    refs.append(_ref(bad, "cat/bad.jpg"))
    tmp_dir = str(tmp_path / "out" / ".tmp")
    with local_pipeline() as p:
        out = (
            p
            | beam.Create([(("train", 0), refs)])
            | beam.ParDo(WriteShardFn(tmp_dir, "none", 2), ["cat"], {}).with_outputs(REJECTS, main="results")
        )
        assert_that(
            out.results | beam.Map(lambda r: (r.split, r.shard, r.records, r.labels)),
            equal_to([("train", 0, 6, {"cat": 6})]),
            label="Results",
        )
        assert_that(
            out[REJECTS] | beam.Map(lambda r: (r["path"], r["reason"])), equal_to([(bad, "truncated")]), label="Rej"
        )

    [shard] = [f for f in (tmp_path / "out" / ".tmp").iterdir() if f.is_file()]
    assert TFRECORD.count(str(shard)) == 6
    # the shard's index part (finalize makes index.jsonl of them): same stem, one line per record, in order
    [part] = list((tmp_path / "out" / ".tmp" / "_index").glob("*.jsonl"))
    [idx] = list((tmp_path / "out" / ".tmp" / "_index").glob("*.idx"))
    assert idx.stem == shard.stem
    assert part.stem == shard.stem
    entries = [json.loads(line) for line in part.read_text().splitlines()]
    assert [e["record"] for e in entries] == list(range(6))
    from apache_beam.io.tfrecordio import _TFRecordUtil

    names = []
    with open(shard, "rb") as fh:
        while (rec := _TFRecordUtil.read_record(fh)) is not None:
            ex = parse_example(rec)
            names.append(ex["image/filename"][0].decode())
            source = (tmp_path / "in" / names[-1]).read_bytes()
            assert ex["image/encoded"][0] == source
            assert ex["image/key/sha256"][0].decode() == hashlib.sha256(source).hexdigest()
            assert ex["image/class/label"] == [0]
    good = [r for r in refs if r.path != bad]
    assert names == [r.relpath for r in sorted(good, key=lambda r: r.key)]
    assert [e["path"] for e in entries] == names


def test_an_unforeseen_error_on_one_image_is_a_reject_not_a_crash(tmp_path, monkeypatch):
    path = tmp_path / "odd.png"
    write(str(path), image_bytes("png"))
    ref = Ref(path=str(path), relpath="odd.png", size=1, split="train", label=None, key=1)
    assert not isinstance(convert_one(ref, {}, {}), Exception)  # a good file converts

    def plugin_bug(data, options=None, reserve=None):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(records, "prepare_image", plugin_bug)
    result = convert_one(ref, {}, {})
    assert result.reason == "decode_error" and "IndexError: tuple index out of range" in result.detail


@pytest.mark.pipeline
def test_plan_shards_transform():
    refs = [Ref(f"/x/{i}", f"{i}.jpg", 1_000_000, "train", None, hashing.shuffle_key(f"{i}", 0)) for i in range(450)]
    refs += [Ref(f"/y/{i}", f"y{i}.jpg", 1_000_000, "test", None, hashing.shuffle_key(f"y{i}", 0)) for i in range(20)]
    with local_pipeline() as p:
        plans = p | beam.Create(refs) | PlanShards(150_000_000)
        assert_that(
            plans | beam.Map(lambda d: {k: v.num_shards for k, v in d.items()}),
            equal_to([{"train": 3, "test": 1}]),
        )


def test_finalize_picks_one_result_per_shard_and_drops_empty_ones():
    results = [
        ShardResult(split="train", shard=0, tmp_path="/t/b", records=3, bytes=30),
        ShardResult(split="train", shard=0, tmp_path="/t/a", records=3, bytes=30),  # a retried writer
        ShardResult(split="train", shard=1, tmp_path="/t/c", records=0, bytes=0),
        ShardResult(split="train", shard=2, tmp_path="/t/d", records=2, bytes=20),
    ]
    chosen = choose_results(results)
    assert chosen[("train", 0)].tmp_path == "/t/a"
    assert chosen == choose_results(list(reversed(results)))
    layout = final_layout(chosen, "ds", "none")
    assert [name for name, _ in layout["train"]] == [
        "ds-train.tfrecord-00000-of-00002",
        "ds-train.tfrecord-00001-of-00002",
    ]
    assert [r.tmp_path for _, r in layout["train"]] == ["/t/a", "/t/d"]


def test_rename_is_idempotent(tmp_path):
    src, dst = tmp_path / "tmp", tmp_path / "final"
    src.write_bytes(b"x")
    rename_idempotent(str(src), str(dst))
    rename_idempotent(str(src), str(dst))  # a retried finalize
    assert dst.read_bytes() == b"x" and not src.exists()


def test_a_shard_written_twice_ends_as_one_final_shard(tmp_path):
    """What a retried bundle does on Dataflow: the writer runs twice for one shard."""
    from beam_pipeline.config import ConvertConfig, Layout
    from beam_pipeline.run.finalize import FinalizeFn, FinalizeSettings

    refs = []
    for i in range(5):
        path = write(str(tmp_path / "in" / "cat" / f"{i}.png"), image_bytes("png", seed=i))
        refs.append(_ref(path, f"cat/{i}.png"))
    out = tmp_path / "out"
    staging = str(out / ".beam_pipeline-tmp-test")
    writer = WriteShardFn(staging, "none", 2)
    writer.setup()
    first = [r for r in writer.process((("train", 0), refs), ["cat"], {}) if isinstance(r, ShardResult)]
    second = [r for r in writer.process((("train", 0), refs[::-1]), ["cat"], {}) if isinstance(r, ShardResult)]
    writer.teardown()
    assert first[0].tmp_path != second[0].tmp_path

    cfg = ConvertConfig(output=str(out), name="ds", input=str(tmp_path / "in"), transform=False, tfds_metadata=False)
    layout = Layout(
        root=str(tmp_path / "in"), pattern=None, manifest=None, manifest_format=None, tmp_dir=staging, run_id="r1"
    )
    finalize = FinalizeFn(FinalizeSettings.of(cfg), layout)
    [info] = list(finalize.process(None, first + second, [], [], [], ["cat"], {}, {}))
    assert info.examples == 5
    shards = sorted(p.name for p in out.iterdir() if ".tfrecord-" in p.name)
    assert shards == ["ds-train.tfrecord-00000-of-00001"]
    assert TFRECORD.count(str(out / shards[0])) == 5
    assert (out / "_SUCCESS").exists() and not (out / ".beam_pipeline-tmp-test").exists()
    # A retried finalize (same side inputs) finds the run published and leaves it as it is.
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    [again] = list(
        FinalizeFn(FinalizeSettings.of(cfg), layout).process(None, first + second, [], [], [], ["cat"], {}, {})
    )
    assert again.examples == 5
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_live_progress_line_on_a_terminal():
    import io
    import time

    from beam_pipeline.run.local import LiveProgress
    from beam_pipeline.writer.shard import PROGRESS

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    with LiveProgress(screen, interval=0.02):
        PROGRESS.add(images=5, rejected=1, shards=2)
        time.sleep(0.2)
    assert "converting: 5 images" in screen.getvalue() and "1 rejected, 2 shards written" in screen.getvalue()
    quiet = io.StringIO()  # not a terminal: no progress line in logs or pipes
    with LiveProgress(quiet, interval=0.02):
        time.sleep(0.05)
    assert quiet.getvalue() == ""
