"""Memory and threads per process: the byte budgets and thread pools every shard writer in a process shares.

File bytes read ahead and decoded pixels in flight each have a per-process
budget (``Budget``; ``ImageOptions.memory_budget_bytes`` per machine, split
between the SDK processes of a worker VM), so memory is bounded per machine,
not by thread counts.

    reads, decodes = budgets(image_options)
    pool = process_pool("decode", decode_threads(0))
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from ..images.options import ImageOptions
from ..malloc import give_back_large_frees
from ..storage import HEADER_BYTES

# Share of the memory budget for file bytes read ahead; the rest is for decoded pixels.
READ_SHARE = 0.25


class Budget:
    """Bytes in flight in one process: taken before work, given back after.

    Waiting requests (``acquire``) are served first come, first served; one
    larger than the whole budget waits until nothing else is held and then
    runs alone. A holder never waits for another budget while holding this
    one, so it cannot deadlock.

    ``try_acquire`` (a writer's read-ahead, which never waits) may pass the
    first waiter, but only by one capacity's worth of bytes in all while that
    waiter waits: enough that one writer waiting for a large file does not
    stall every other writer's reads at once, and bounded, so the stream of
    small reads dries up and the waiter's bytes do come free (no starvation).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.held = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._passed = 0  # bytes try_acquire let past the first waiter since it became first

    def _take(self, nbytes: int) -> int:
        return min(max(0, nbytes), self.capacity)

    def clamp(self, nbytes: int) -> int:
        """What ``acquire(nbytes)`` actually takes: a request over the capacity takes all of it."""
        return self._take(nbytes)

    def adjust(self, delta: int) -> None:
        """Charges ``delta`` more bytes (or gives ``-delta`` back) at once, without waiting.

        For memory that already exists: a finished result larger than what its
        read was charged. The held total may go over the capacity; then nobody
        new is let in until enough is given back.
        """
        with self._cond:
            self.held = max(0, self.held + delta)
            self.peak = max(self.peak, self.held)
            if delta < 0:
                self._cond.notify_all()

    def try_acquire(self, nbytes: int) -> bool:
        """Takes ``nbytes`` if it fits now and no waiter has been passed by a capacity's worth already."""
        take = self._take(nbytes)
        with self._cond:
            if self.held + take > self.capacity:
                return False
            if self._queue:
                if self._passed + take > self.capacity:
                    return False
                self._passed += take
            self.held += take
            self.peak = max(self.peak, self.held)
            return True

    def acquire(self, nbytes: int) -> None:
        take = self._take(nbytes)
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or self.held + take > self.capacity:
                self._cond.wait()
            self._queue.popleft()
            self._passed = 0  # the next waiter's allowance starts now
            self.held += take
            self.peak = max(self.peak, self.held)
            self._cond.notify_all()

    def release(self, nbytes: int) -> None:
        with self._cond:
            self.held -= self._take(nbytes)
            self._cond.notify_all()

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        self.acquire(nbytes)
        try:
            yield
        finally:
            self.release(nbytes)


_BUDGETS: dict[tuple[str, int], Budget] = {}
_BUDGETS_LOCK = threading.Lock()


def process_budget(kind: str, capacity: int) -> Budget:
    """The one Budget of this kind and size in this process, shared by every writer in it."""
    with _BUDGETS_LOCK:
        budget = _BUDGETS.get((kind, capacity))
        if budget is None:
            budget = _BUDGETS[(kind, capacity)] = Budget(capacity)
        return budget


_POOLS: dict[tuple[str, int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def process_pool(kind: str, threads: int) -> ThreadPoolExecutor:
    """The one thread pool of this kind and size in this process, shared by every writer in it.

    On Dataflow one SDK process may run a dozen writer instances at once (one
    per bundle thread): a pool per instance would mean hundreds of threads and
    GCS clients (one per read thread) per process. Never shut down: it lives
    as long as the process, like its threads' clients. Keyed by process id
    too: a forked child has none of its parent's threads.
    """
    key = (kind, threads, os.getpid())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix=f"beam-pipeline-{kind}")
        return pool


def sdk_processes_per_machine() -> int:
    """How many processes of this job share this machine's memory budget.

    In the launching process (the local default up to 4 cores): 1. In a
    worker process of a local ``multi_processing`` run: the number the
    launcher started (``runner.LOCAL_PROCESSES_ENV``). In another SDK worker
    process (Dataflow starts one per vCPU): ``os.cpu_count()``.
    """
    if _in_sdk_worker_process():
        return _local_processes() or os.cpu_count() or 1
    return 1


def _in_sdk_worker_process() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name in (
        "apache_beam.runners.worker.sdk_worker_main",
        "beam_pipeline.run.sdk_worker",
    )


def _local_processes() -> int | None:
    """In a worker process of a local multi_processing run: how many the launcher started (runner.py)."""
    from ..runner import LOCAL_PROCESSES_ENV

    try:
        return max(1, int(os.environ.get(LOCAL_PROCESSES_ENV, "")))
    except ValueError:
        return None


def budgets(options: ImageOptions) -> tuple[Budget, Budget]:
    """(file bytes read ahead, decoded pixels) budgets of this process for ``options``; glibc told to give
    large decode buffers back when freed (``give_back_large_frees``)."""
    give_back_large_frees()
    share = options.memory_budget_bytes // sdk_processes_per_machine()
    reads = max(HEADER_BYTES, int(share * READ_SHARE))
    return process_budget("read", reads), process_budget("decode", max(1, share - reads))


def decode_threads(requested: int) -> int:
    """``--decode-threads``, or one per core; in a worker process of a local multi_processing run, the cores
    shared among the processes (each process's threads on its share)."""
    if requested > 0:
        return requested
    processes = _local_processes() if _in_sdk_worker_process() else None
    if not processes:
        return os.cpu_count() or 1
    from ..runner import usable_cores

    return max(1, -(-usable_cores() // processes))
