"""The output lease: one run writes into an output folder at a time.

A run holds ``OUTPUT/.beam_pipeline-lease.json`` (its run id, host, pid and
an expiry) from before its pipeline starts until its publish is done::

    with lease.held(output, run_id):      # LeaseHeld: another live run has it
        ...                               # a heartbeat renews it meanwhile
    guard = lease.Guard(output, run_id)   # publish: checked before every change

Every change of the lease is a compare-and-swap, so two runs can never both
think they hold it:

- local folders: created whole by a hard link (fails if it exists), changed
  or removed under ``flock`` on the file, after checking it is still the
  file at that path (a removed one is retried);
- GCS: created with ``ifGenerationMatch=0``, changed or removed with
  ``ifGenerationMatch=<the generation read>``.

A lease can be taken from another run when it expired (not renewed for
``ttl`` seconds: ``TTL_S`` for a run whose launcher waits, ``DETACHED_TTL_S``
for a submitted job, whose launcher is gone), or at once when it names a
process on this host that is no longer alive (a killed local run).

Publish re-checks the lease before every file it moves or deletes, so a run
whose lease was taken (it stalled for longer than ``ttl``) stops before its
next change (fencing). A change it made after its own lease had expired
may have landed in another run's dataset: it then removes ``_SUCCESS``
rather than leave it over a mix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import storage

_LOG = logging.getLogger(__name__)

LEASE = ".beam_pipeline-lease.json"
TTL_S = 300.0
DETACHED_TTL_S = 24 * 3600.0
TTL_ENV = "BEAM_PIPELINE_LEASE_TTL_S"  # tests: a short lease
# A change finished this close to the lease's expiry counts as possibly after it (clocks of two machines differ).
CLOCK_SKEW_S = 2.0
_RETRIES = 8


class LeaseHeld(RuntimeError):
    """Another live run holds the output's lease."""


class LeaseLost(RuntimeError):
    """This run's lease is gone or another run's now: it must not change the output."""


def ttl_s(detached: bool = False) -> float:
    default = DETACHED_TTL_S if detached else TTL_S
    try:
        return float(os.environ.get(TTL_ENV, "")) if os.environ.get(TTL_ENV) else default
    except ValueError:
        return default


@dataclass(frozen=True)
class LeaseRecord:
    """The lease file's content: which run holds the output, where it runs, until when.

    Values are kept as the file holds them (``expires`` is compared as ``float(...)``), so a record read and
    written back (renewed) keeps its bytes but for what changed; keys of other versions are kept (``extra``).
    """

    run_id: str | None
    expires: float  # seconds since the epoch
    host: str | None = None
    acquired: float | None = None
    ttl: float | None = None  # how long a renewal extends it
    pid: int | None = None  # a detached run's names no process
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "expires": self.expires}
        out.update({k: getattr(self, k) for k in ("host", "acquired", "ttl", "pid") if getattr(self, k) is not None})
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LeaseRecord:
        known = ("run_id", "expires", "host", "acquired", "ttl", "pid")
        return cls(
            **{k: data.get(k) for k in known if k != "expires"},
            expires=data.get("expires", 0),
            extra={k: v for k, v in data.items() if k not in known},
        )


def describe(record: LeaseRecord) -> str:
    """``run R (host h, pid p, until 12:00:00 UTC)``: who holds a lease, for a one-line message."""
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.expires)))
    where = f"host {record.host if record.host is not None else '?'}" + (f", pid {record.pid}" if record.pid else "")
    return f"run {record.run_id} ({where}, lease until {until})"


# --- storage: read, create, replace and delete with compare-and-swap -----------------------------


class _Store:
    """The lease file through storage's compare-and-swap (a lock-file scheme locally, generation
    preconditions on GCS): records in, records out."""

    def __init__(self, path: str) -> None:
        self.file = storage.cas_file(path, _RETRIES)

    def read(self) -> tuple[LeaseRecord, Any] | None:
        try:
            found = self.file.read()
        except storage.ChangesTooOften as e:
            raise LeaseLost(str(e)) from None
        return None if found is None else (_parse(found[0]), found[1])

    def create(self, record: LeaseRecord) -> bool:
        return self.file.create(_dump(record))

    def replace(self, record: LeaseRecord, token: Any) -> bool:
        return self.file.replace(_dump(record), token)

    def delete(self, token: Any) -> bool:
        return self.file.delete(token)


def _store(output: str) -> _Store:
    return _Store(output.rstrip("/") + "/" + LEASE)


def _dump(record: LeaseRecord) -> bytes:
    return (json.dumps(record.to_json(), sort_keys=True) + "\n").encode("utf-8")


def _parse(data: bytes) -> LeaseRecord:
    """The record a lease file holds; a damaged one holds nobody's (expired: it can be taken)."""
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError:
        record = None
    return LeaseRecord.from_json(record) if isinstance(record, dict) else LeaseRecord(run_id=None, expires=0)


# --- the lease ---------------------------------------------------------------------------------


def _host() -> str:
    return socket.gethostname()


def _dead_here(record: LeaseRecord) -> bool:
    """A holder on this host whose process is gone (a killed run): its lease can be taken at once."""
    pid = record.pid
    if not isinstance(pid, int) or record.host != _host():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (killed, not yet reaped) is dead too
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def is_live(record: LeaseRecord) -> bool:
    """Whether a lease record may still belong to a running run: unexpired, and not a gone process of this host."""
    return float(record.expires) > time.time() and not _dead_here(record)


def _record(run_id: str, ttl: float, with_pid: bool, now: float) -> LeaseRecord:
    pid = os.getpid() if with_pid else None
    return LeaseRecord(run_id=run_id, host=_host(), acquired=now, expires=now + ttl, ttl=ttl, pid=pid)


def _extended(record: LeaseRecord, now: float, ttl: float) -> LeaseRecord:
    """The record, renewed: its own ttl (``ttl`` when it has none) from ``now``."""
    return replace(record, expires=now + float(record.ttl if record.ttl is not None else ttl))


def acquire(output: str, run_id: str, *, detached: bool = False) -> LeaseRecord:
    """Takes the lease of ``output`` for ``run_id`` (or renews it, if it is this run's already).

    Raises LeaseHeld naming the holder when another run holds a live lease.
    A detached run's lease names no process: its launcher exits at once.
    """
    store = _store(output)
    ttl = ttl_s(detached)
    for _ in range(_RETRIES):
        now = time.time()
        mine = _record(run_id, ttl, not detached, now)
        found = store.read()
        if found is None:
            if store.create(mine):
                return mine
            continue
        record, token = found
        if record.run_id == run_id:
            mine = _extended(record, now, ttl)
        elif float(record.expires) > now and not _dead_here(record):
            raise LeaseHeld(describe(record))
        else:
            _LOG.warning("taking over the output lease of %s", describe(record))
        if store.replace(mine, token):
            return mine
    raise LeaseHeld(f"the lease of {output} keeps changing hands")


def renew(output: str, run_id: str) -> LeaseRecord:
    """Extends this run's lease by its ttl; LeaseLost if it is gone or another run's.

    An expired lease nobody took is still this run's: the swap fails if
    another run takes it meanwhile.
    """
    store = _store(output)
    for _ in range(_RETRIES):
        found = store.read()
        if found is None:
            raise LeaseLost(
                f"{output}: run {run_id} no longer holds the output lease: host {socket.gethostname()} finds none "
                "there (it was released, or this host does not see the disk the run started on: on a cluster "
                "every worker must see the output, on a shared file system at the same path or in gs://)"
            )
        record, token = found
        if record.run_id != run_id:
            raise LeaseLost(f"{output}: {describe(record)} took the output lease from run {run_id}")
        renewed = _extended(record, time.time(), TTL_S)
        if store.replace(renewed, token):
            return renewed
    raise LeaseLost(f"{output}: the lease keeps changing hands")


def release(output: str, run_id: str) -> None:
    """Removes the lease if it is still this run's (never another run's)."""
    store = _store(output)
    for _ in range(_RETRIES):
        found = store.read()
        if found is None or found[0].run_id != run_id:
            return
        if store.delete(found[1]):
            return


def holder(output: str) -> LeaseRecord | None:
    """The lease record of ``output``, or None."""
    found = _store(output).read()
    return found[0] if found else None


class _Heartbeat(threading.Thread):
    """Renews the lease every third of its ttl until stopped, or until it is lost (publish then refuses)."""

    def __init__(self, output: str, run_id: str, interval: float) -> None:
        super().__init__(daemon=True, name="lease-heartbeat")
        self._output, self._run_id, self._interval = output, run_id, interval
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self._interval):
            try:
                renew(self._output, self._run_id)
            except LeaseLost as e:  # released by this run's publish, or taken: nothing to renew any more
                _LOG.info("lease heartbeat stops: %s", e)
                return
            except Exception as e:  # noqa: BLE001 - a transient error: the next beat tries again
                _LOG.warning("renewing the output lease: %s", e)

    def stop(self) -> None:
        self._halt.set()
        self.join()


@contextlib.contextmanager
def held(output: str, run_id: str, *, detached: bool = False) -> Iterator[LeaseRecord]:
    """Holds the lease for the block, renewed in the background; released after it.

    ``detached``: the job (whose launcher is gone) releases it when it publishes; kept here.
    """
    record = acquire(output, run_id, detached=detached)
    beat = _Heartbeat(output, run_id, float(record.ttl if record.ttl is not None else ttl_s(detached)) / 3)
    beat.start()
    keep = False
    try:
        yield record
        keep = detached
    finally:
        beat.stop()
        if not keep:
            release(output, run_id)


class Guard:
    """Publish's view of the lease: checked before each change of the output, renewed as it goes.

    ``must_hold``: the launcher took the lease for this run, so a missing one
    means it was taken and released meanwhile (LeaseLost); otherwise (a step
    run without the launcher) a free lease is taken here.
    """

    def __init__(self, output: str, run_id: str, *, must_hold: bool) -> None:
        self.output, self.run_id, self.must_hold = output, run_id, must_hold
        self.took = False  # this guard acquired the lease (and releases it at the end of publish)
        self._expires = 0.0
        self._last_check = 0.0
        self.changed_late = False  # a change finished when the lease may have expired

    def start(self) -> None:
        """Before the first change: the lease is this run's (taken here if free and allowed)."""
        if self.must_hold:
            record = renew(self.output, self.run_id)
        else:
            had = holder(self.output)
            try:
                record = acquire(self.output, self.run_id)
            except LeaseHeld as e:
                raise LeaseLost(f"{self.output}: {e} is writing it; run {self.run_id} does not publish") from None
            self.took = had is None or had.run_id != self.run_id
        self._expires = float(record.expires)
        self._last_check = time.time()

    def before(self) -> None:
        """Right before a change: still this run's (read every time, rewritten once a quarter of the ttl went)."""
        now = time.time()
        ttl = max(self._expires - self._last_check, 1.0)
        if now - self._last_check > ttl / 4 or now > self._expires - CLOCK_SKEW_S:
            record = renew(self.output, self.run_id)
            self._expires, self._last_check = float(record.expires), now
            return
        found = holder(self.output)
        if found is None or found.run_id != self.run_id:
            raise LeaseLost(
                f"{self.output}: "
                + (f"{describe(found)} took the output lease" if found else "the output lease was released")
                + f"; run {self.run_id} stops publishing"
            )

    def after(self) -> None:
        """Right after a change: note whether it may have landed after the lease expired."""
        if time.time() > self._expires - CLOCK_SKEW_S:
            self.changed_late = True

    def release(self) -> None:
        release(self.output, self.run_id)
