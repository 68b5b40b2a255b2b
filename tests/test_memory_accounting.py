"""The read budget sees what finished results really hold, and shared pools stay deadlock-free."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from beam_pipeline.writer.budget import Budget
from beam_pipeline.writer.readahead import read_then_convert

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent

GROWTH = 20  # a small CMYK JPEG re-encoded as PNG: ~20 times its file


def _wait_for(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


@pytest.mark.e2e
def test_results_waiting_in_the_queue_are_charged_at_their_real_size():
    budget = Budget(1000)
    lock = threading.Lock()
    real: dict[int, int] = {}  # item -> bytes it holds now (input while reading, output once converted)
    taken: set[int] = set()

    def read(i):
        with lock:
            real[i] = 10
        return b"r" * 10

    def convert(i, data):
        out = data * GROWTH
        with lock:
            real[i] = len(out)
        return out

    def converted() -> int:
        with lock:
            return sum(n == 10 * GROWTH for n in real.values())

    def in_flight() -> int:
        with lock:
            return sum(n for i, n in real.items() if i not in taken)

    with ThreadPoolExecutor(4) as io_pool, ThreadPoolExecutor(2) as decode_pool:
        results = read_then_convert(
            range(30), read, convert, io_pool, decode_pool, window=8, budget=budget, cost=lambda i: 10, size=len
        )
        seen = []
        for i, out in results:
            if not seen:
                # Hold the first result until four more are converted and waiting, so the peak below does not
                # depend on how fast this thread is scheduled against the pools.
                assert _wait_for(lambda: converted() >= 5), real
            with lock:
                taken.add(i)
            seen.append((i, len(out)))
            # Whatever else is done by now waits in the queue: the budget must be holding it.
            assert _wait_for(lambda: budget.held >= in_flight()), (budget.held, in_flight())
    assert seen == [(i, 10 * GROWTH) for i in range(30)]
    assert budget.held == 0
    assert budget.peak >= 8 * 10 * GROWTH // 2  # without the adjustment it never passes 8 reads of 10 bytes


def test_outputs_larger_than_the_whole_budget_finish_for_two_writers_sharing_it():
    budget = Budget(100)
    done: dict[str, list] = {}

    def writer(name: str, io_pool: ThreadPoolExecutor, decode_pool: ThreadPoolExecutor) -> None:
        sizes = {i: (250 if i % 5 == 0 else 20) for i in range(25)}  # every 5th input alone is over the budget
        results = read_then_convert(
            range(25),
            lambda i: b"r" * sizes[i],
            lambda i, data: data * 30,  # every output is over the budget
            io_pool,
            decode_pool,
            window=6,
            budget=budget,
            cost=sizes.__getitem__,
            size=len,
        )
        done[name] = [(i, len(out)) for i, out in results]

    # The pools are shared as the process-wide ones are: few decode threads for both writers.
    with ThreadPoolExecutor(4) as io_pool, ThreadPoolExecutor(2) as decode_pool:
        threads = [threading.Thread(target=writer, args=(n, io_pool, decode_pool), daemon=True) for n in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "read_then_convert deadlocked on the shared budget"
    expected = [(i, (250 if i % 5 == 0 else 20) * 30) for i in range(25)]
    assert done == {"a": expected, "b": expected}
    assert budget.held == 0


def test_an_early_stop_gives_back_what_results_finished_later_were_charged():
    budget = Budget(1000)
    release = threading.Event()

    def read(i):
        release.wait(5)
        return b"r" * 10

    with ThreadPoolExecutor(4) as io_pool, ThreadPoolExecutor(2) as decode_pool:
        results = read_then_convert(
            range(10),
            read,
            lambda i, d: d * GROWTH,
            io_pool,
            decode_pool,
            window=6,
            budget=budget,
            cost=lambda i: 10,
            size=len,
        )
        release.set()
        next(results)
        results.close()  # the writer failed: reads still running finish after their bytes went back
    assert _wait_for(lambda: budget.held == 0)
    time.sleep(0.2)
    assert budget.held == 0


def test_writer_instances_of_one_process_share_its_read_and_decode_pools(tmp_path):
    from beam_pipeline import hashing
    from beam_pipeline.examples import parse_example
    from beam_pipeline.formats.registry import TFRECORD
    from beam_pipeline.vocab.refs import Ref
    from beam_pipeline.writer.shard import IO_THREADS, WriteShardFn

    from .imagegen import image_bytes, write

    fns = [WriteShardFn(str(tmp_path / "tmp"), "none", 2) for _ in range(2)]
    for fn in fns:
        fn.setup()
    assert fns[0]._io_pool is fns[1]._io_pool and fns[0]._pool is fns[1]._pool
    assert fns[0]._io_pool._max_workers == IO_THREADS

    def shard(n: int) -> list[Ref]:
        refs = []
        for i in range(8):
            rel = f"cat/{n}-{i}.png"
            path = write(str(tmp_path / "in" / rel), image_bytes("png", seed=10 * n + i))
            refs.append(Ref(path, rel, len(open(path, "rb").read()), "train", "cat", hashing.shuffle_key(rel, 0)))
        return refs

    outputs: dict[int, list] = {}

    def run(n: int) -> None:  # two bundles at once in one process, as on a Dataflow worker
        outputs[n] = list(fns[n].process((("train", n), shard(n)), ["cat"], {}))

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for n in range(2):
        [result] = outputs[n]
        assert result.records == 8 and TFRECORD.count(result.tmp_path) == 8
        from apache_beam.io.tfrecordio import _TFRecordUtil

        with open(result.tmp_path, "rb") as fh:
            names = [
                parse_example(rec)["image/filename"][0].decode()
                for rec in iter(lambda: _TFRecordUtil.read_record(fh), None)
            ]
        assert sorted(names) == sorted(f"cat/{n}-{i}.png" for i in range(8))


def _denied_refs(n: int, bucket: str = "secret-bucket") -> list:
    from beam_pipeline import hashing
    from beam_pipeline.vocab.refs import Ref

    return [
        Ref(f"gs://{bucket}/cat/{i}.jpg", f"cat/{i}.jpg", 1000, "train", "cat", hashing.shuffle_key(f"{i}", 0))
        for i in range(n)
    ]


def _forbid_every_read(monkeypatch) -> None:
    from google.api_core import exceptions as gexc

    from beam_pipeline import storage

    def forbidden(path, *args):
        raise gexc.Forbidden(f"GET {path}: sa@p.iam.gserviceaccount.com does not have storage.objects.get access")

    monkeypatch.setattr(storage.gcs, "read_image", forbidden)


def test_a_shard_whose_every_read_is_forbidden_fails_naming_the_bucket(tmp_path, monkeypatch):
    import pytest

    from beam_pipeline.writer.shard import WriteShardFn

    _forbid_every_read(monkeypatch)
    fn = WriteShardFn(str(tmp_path / "tmp"), "none", 2)
    fn.setup()
    with pytest.raises(PermissionError) as err:
        list(fn.process((("train", 3), _denied_refs(10)), ["cat"], {}))
    message = str(err.value)
    assert "gs://secret-bucket" in message and "permission denied" in message and "train-00003" in message
    assert "roles/storage.objectViewer" in message and "storage.objects.get access" in message
    assert fn._read_budget.held == 0


def test_a_few_forbidden_files_are_still_rejects(tmp_path, monkeypatch):
    from beam_pipeline.sources.rules import REJECTS
    from beam_pipeline.writer.shard import DENIED_SHARD_MIN, WriteShardFn

    _forbid_every_read(monkeypatch)
    fn = WriteShardFn(str(tmp_path / "tmp"), "none", 2)
    fn.setup()
    out = list(fn.process((("train", 0), _denied_refs(DENIED_SHARD_MIN - 1)), ["cat"], {}))
    rejects = [o.value["reason"] for o in out if getattr(o, "tag", None) == REJECTS]
    assert rejects == ["unreadable"] * (DENIED_SHARD_MIN - 1)
    [result] = [o for o in out if not hasattr(o, "tag")]
    assert result.records == 0


def _waiting_for(budget: Budget, nbytes: int) -> tuple[threading.Thread, threading.Event]:
    served = threading.Event()

    def wait() -> None:
        budget.acquire(nbytes)
        served.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert _wait_for(lambda: len(budget._queue) == 1 or served.is_set())
    return waiter, served


def test_read_ahead_may_pass_a_waiting_large_request_by_one_budget_at_most():
    budget = Budget(100)
    assert budget.try_acquire(60)
    waiter, served = _waiting_for(budget, 80)  # a writer with nothing in flight, waiting for a large file
    for _ in range(3):  # other writers keep reading while it waits: 90 bytes past it ...
        assert budget.try_acquire(30)
        budget.release(30)
    assert not budget.try_acquire(30)  # ... then they stop, so its bytes come free
    assert not served.is_set()
    budget.release(60)
    assert served.wait(5) and budget.held == 80
    assert budget.try_acquire(20) and not budget.try_acquire(1)
    waiter.join(5)


def test_a_stream_of_small_reads_never_starves_a_waiting_large_one():
    budget = Budget(100)
    stop = threading.Event()

    def reader() -> None:  # a writer reading small files back to back, never waiting
        while not stop.is_set():
            if budget.try_acquire(10):
                time.sleep(0.001)
                budget.release(10)

    readers = [threading.Thread(target=reader, daemon=True) for _ in range(4)]
    for t in readers:
        t.start()
    try:
        waiter, served = _waiting_for(budget, 95)
        assert served.wait(20), "the large request starved behind small reads"
        budget.release(95)
    finally:
        stop.set()
        for t in readers:
            t.join(5)
    assert budget.held == 0


def test_a_read_threads_gcs_client_follows_the_emulator_endpoint(gcs, monkeypatch):
    """Read threads outlive a pipeline now: a later one with other GCS settings gets a new client."""
    import os

    from beam_pipeline import storage
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    with ThreadPoolExecutor(1) as thread:  # one read thread, as the process pool's live on
        first = thread.submit(storage.gcs.gcsio).result()
        assert thread.submit(storage.gcs.gcsio).result() is first  # built once per thread
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", os.environ["STORAGE_EMULATOR_HOST"].rstrip("/") + "/")
        assert thread.submit(storage.gcs.gcsio).result() is not first


_DECODE_IN_TURN = r"""
import io, sys, threading
import numpy as np
import psutil
from PIL import Image
if sys.argv[1] == "writer":
    from beam_pipeline.writer.budget import budgets
    from beam_pipeline.images.options import ImageOptions
    budgets(ImageOptions())  # what every shard writer's setup does
buf = io.BytesIO()
Image.new("RGB", (6000, 6000)).save(buf, "PNG")  # 108 MB decoded, 100 KB on disk
data, turn = buf.getvalue(), threading.Lock()
before = psutil.Process().memory_info().rss
def decode():
    with turn:  # one at a time, as the decode budget lets them: each on its own thread
        image = Image.open(io.BytesIO(data))
        pixels = np.asarray(image)  # as the check's hash reads them
        del image, pixels
threads = [threading.Thread(target=decode) for _ in range(5)]
[t.start() for t in threads]
[t.join() for t in threads]
print(psutil.Process().memory_info().rss - before)
"""


@pytest.mark.e2e  # two processes, ~10 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_decoded_images_freed_on_other_threads_go_back_to_the_system():
    """The budget lets one 108 MB decode run at a time, on five threads in turn. With glibc's defaults each
    thread's heap kept its freed image (~260 MB more after, measured); a writer's process keeps less than one (~65 MB).
    A process each: the malloc setting is per process and cannot be undone."""

    def growth(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _DECODE_IN_TURN, mode], capture_output=True, text=True, check=True, cwd=REPO
        )
        return int(out.stdout.split()[-1])

    default, writer = growth("default"), growth("writer")
    image = 6000 * 6000 * 3
    assert default > 2 * image, f"glibc kept {default / 1e6:.0f} MB by default: the test shows nothing"
    assert writer < image, f"{writer / 1e6:.0f} MB kept after the decodes ({default / 1e6:.0f} MB by default)"
