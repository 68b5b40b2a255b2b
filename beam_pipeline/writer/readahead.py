"""Reading ahead in input order: reads on one pool, conversions on another, within a byte budget.

for item, result in read_then_convert(items, read, convert, io_pool, decode_pool, window=..., budget=..., cost=...):
    ...
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..images.options import Rejected
from .budget import Budget


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class _InFlight:
    """One batch of read_then_convert: what the budget holds for it until its results are taken."""

    __slots__ = ("items", "charged", "future", "closed")

    def __init__(self, items: list[Any], charged: int) -> None:
        self.items = items
        self.charged = charged
        self.future: Future | None = None
        self.closed = False


class _Raised:
    """An item's read or conversion raised: re-raised when the caller reaches that item."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


# A batch holds at most this many items (one future per batch, not per item).
MAX_BATCH = 64


def _batches(items: Iterable[Any], cost: Callable[[Any], int], batch_bytes: int) -> Iterator[tuple[list[Any], int]]:
    """Consecutive items, grouped until their cost reaches ``batch_bytes`` (0: one item per batch)."""
    group: list[Any] = []
    total = 0
    for item in items:
        group.append(item)
        total += cost(item)
        if total >= batch_bytes or len(group) >= MAX_BATCH:
            yield group, total
            group, total = [], 0
    if group:
        yield group, total


def read_then_convert(
    items: Iterable[Any],
    read: Callable[[Any], Any],
    convert: Callable[[Any, Any], Any],
    io_pool: ThreadPoolExecutor,
    decode_pool: ThreadPoolExecutor,
    *,
    window: int,
    budget: Budget,
    cost: Callable[[Any], int],
    size: Callable[[Any], int] | None = None,
    batch_bytes: int = 0,
    read_inline: bool = False,
) -> Iterator[tuple[Any, Any]]:
    """(item, convert(item, read(item))) in input order; ``read`` may return a Rejected, which is passed through.

    Items go in batches of consecutive items up to ``batch_bytes`` of cost
    (0: one item per batch; on local disk a batch of a few images costs one future,
    one budget charge and one hand-off between threads instead of one each; on GCS
    one read per task keeps enough reads in flight). Each batch is read on
    ``io_pool`` and then converted on ``decode_pool``, so reads run ahead of
    decodes. A batch is in flight from the start of its reads until its
    results are taken: at most ``window`` batches and ``budget`` bytes at a
    time. A batch is charged the ``cost(item)`` of its items (e.g. their
    listed sizes) before it starts; when its results are ready the charge
    becomes their ``size(result)``, the bytes they really hold while they wait
    to be taken (a re-encoded image can be 20 times its file), so later reads,
    of this writer and every other one in the process, wait for them. That
    adjustment never waits (the bytes already exist), so no pool thread
    blocks on the budget; the results may take the budget over its capacity,
    and then nothing new starts until taken results give bytes back.

    ``read_inline`` (local files): a batch is read and converted by one task on
    ``decode_pool``, with no hand-off to ``io_pool`` in between. On small images
    one more thread contending for the GIL made every read and check dearer (80k
    tiles, one process: 59.6 → 47.4 s; docs/benchmarks.md, "Small images against
    the tutorial loop").
    The task times both halves; once a batch's reads take longer than its
    conversions (a cold disk, a network filesystem mounted locally), the later
    batches are read ahead on ``io_pool`` again.

    When the budget is short the caller's earlier results are taken first
    (they give bytes back); only with nothing of its own in flight does it
    wait for other writers of the process, so it never waits on itself. An
    exception (a transient read error, a MemoryError) is raised from the
    result it belongs to, after the items before it and after every byte this
    call held is given back.
    """
    pending: collections.deque[_InFlight] = collections.deque()
    lock = threading.Lock()
    inline = [read_inline]  # turned off for good by the first batch whose reads outlast its conversions

    def settle(entry: _InFlight, results: list[Any]) -> list[Any]:
        if size is not None:
            real = sum(max(0, size(r)) for r in results if not isinstance(r, _Raised))
            with lock:
                if not entry.closed:  # not given back already (the caller stopped early)
                    budget.adjust(real - entry.charged)
                    entry.charged = real
        return results

    def give_back(entry: _InFlight) -> None:
        with lock:
            if not entry.closed:
                entry.closed = True
                budget.adjust(-entry.charged)

    def convert_all(entry: _InFlight, data: list[Any]) -> list[Any]:
        results = []
        for item, got in zip(entry.items, data, strict=True):
            if isinstance(got, (Rejected, _Raised)):
                results.append(got)
                continue
            try:
                results.append(convert(item, got))
            except Exception as e:  # noqa: BLE001 - raised where the caller reaches this item
                results.append(_Raised(e))
                break  # the caller stops there: the rest is never taken
        results += [results[-1]] * (len(entry.items) - len(results))
        return settle(entry, results)

    def read_all(entry: _InFlight) -> list[Any]:
        data: list[Any] = []
        for item in entry.items:
            try:
                data.append(read(item))
            except Exception as e:  # noqa: BLE001 - raised where the caller reaches this item
                data += [_Raised(e)] * (len(entry.items) - len(data))  # the rest is never taken
                break
        return data

    def start(entry: _InFlight) -> Future:
        def run() -> Any:
            data = read_all(entry)
            if all(isinstance(d, (Rejected, _Raised)) for d in data):
                return _done(settle(entry, data))
            return decode_pool.submit(convert_all, entry, data)

        def run_inline() -> Any:
            began = time.perf_counter()
            data = read_all(entry)
            read_s = time.perf_counter() - began
            if all(isinstance(d, (Rejected, _Raised)) for d in data):
                return _done(settle(entry, data))
            results = convert_all(entry, data)
            if read_s > time.perf_counter() - began - read_s:
                inline[0] = False
            return _done(results)

        if inline[0]:
            return decode_pool.submit(run_inline)
        return io_pool.submit(run)

    def take() -> Iterator[tuple[Any, Any]]:
        entry = pending.popleft()
        try:
            assert entry.future is not None
            results = entry.future.result().result()
            for item, result in zip(entry.items, results, strict=True):
                if isinstance(result, _Raised):
                    raise result.error
                yield item, result
        finally:
            give_back(entry)

    try:
        for group, nbytes in _batches(items, cost, batch_bytes):
            while not (len(pending) < window and budget.try_acquire(nbytes)):
                if not pending:
                    budget.acquire(nbytes)
                    break
                yield from take()
            entry = _InFlight(group, budget.clamp(nbytes))
            entry.future = start(entry)
            pending.append(entry)
        while pending:
            yield from take()
    finally:
        for entry in pending:  # left behind by an exception: their bytes go back
            if entry.future is not None:
                entry.future.cancel()
            give_back(entry)
        pending.clear()
