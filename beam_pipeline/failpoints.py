"""Named failpoints: make a step crash at a chosen operation, to test what a retry does.

    BEAM_PIPELINE_FAILPOINTS="publish.move:3,finalize.rename:2" python -m beam_pipeline convert ...

Each entry is ``point:k``: the k-th time this process reaches ``point`` it
raises ``FailpointError`` (before doing that operation), once; ``point:k:kill``
kills the process instead (SIGKILL: no cleanup, no ``finally``, as a machine
that dies or a user's ``kill -9``; the resume tests use it); ``point:k:pause``
stalls it there: it creates the file named by ``BEAM_PIPELINE_FAILPOINTS_PAUSE``
and waits until that file is removed (a test runs another run meanwhile). Later hits of
the point, in this process, pass. "Once" is per process: a runner that starts
a fresh worker process for the retry (or several worker processes) counts
again from zero in each, and an in-process retry (a test calling the step a
second time) passes unless ``reset()`` is called in between. Without the
variable every ``hit`` is a dictionary lookup and returns.

The points are ``POINTS`` below (each hit comes before the operation it names);
a name not among them is an error at parse, naming the known points.
"""

from __future__ import annotations

import os
import threading

ENV = "BEAM_PIPELINE_FAILPOINTS"

# Every point the code hits, and what it counts: the one list (parse refuses any other name).
POINTS: dict[str, str] = {
    "launcher.previous": "the launcher reading the previous output's dataset.json (--incremental-from)",
    "writer.record": "each record a shard writer writes",
    "writer.result": "a shard writer about to emit its shard's result",
    "writer.upload": "a finished ArrayRecord shard about to be copied from the local disk to its store (gs://)",
    "rejects.write": "each rejects part file written",
    "near_duplicates.write": "each near_duplicates.jsonl part file written",
    "finalize.rename": "each temp shard renamed to its final name in staging",
    "finalize.write": "each metadata file finalize writes (rejects.jsonl, labels.txt, dataset.json)",
    "poststeps.step": "each post-step (TFT analysis, TFDS metadata, dataset.json)",
    "publish.manifest": "writing the publish manifest",
    "publish.move": "each file moved (shards and .idx files: linked, on GCS copied) from staging into the output",
    "publish.delete": "each file of an older run deleted from the output (_SUCCESS included)",
    "publish.success": "writing _SUCCESS",
}


class FailpointError(RuntimeError):
    """Raised by an armed failpoint (never caught by this package)."""


_lock = threading.Lock()
_counts: dict[str, int] = {}
_parsed: tuple[str, dict[str, tuple[int, str]]] = ("", {})


KILL = "kill"
PAUSE = "pause"
PAUSE_ENV = "BEAM_PIPELINE_FAILPOINTS_PAUSE"


def parse(spec: str) -> dict[str, int]:
    """``"a.b:3,c.d:1"`` → {"a.b": 3, "c.d": 1}; a malformed entry raises ValueError naming it."""
    return {name: k for name, (k, _) in parse_actions(spec).items()}


def parse_actions(spec: str) -> dict[str, tuple[int, str]]:
    """``"a.b:3,c.d:1:kill"`` → {"a.b": (3, "raise"), "c.d": (1, "kill")}; ValueError names a bad entry."""
    out: dict[str, tuple[int, str]] = {}
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry:
            continue
        action = "raise"
        for special in (KILL, PAUSE):
            if entry.endswith(":" + special):
                entry, action = entry[: -len(special) - 1], special
        name, sep, k = entry.rpartition(":")
        if not sep or not name or not k.isdigit() or int(k) < 1:
            raise ValueError(f"{ENV}: bad entry {entry!r} (expected point:k, point:k:kill or point:k:pause; k >= 1)")
        if name not in POINTS:
            raise ValueError(f"{ENV}: unknown point {name!r} (known: {', '.join(POINTS)})")
        out[name] = (int(k), action)
    return out


def _armed() -> dict[str, tuple[int, str]]:
    global _parsed
    spec = os.environ.get(ENV, "")
    if spec != _parsed[0]:
        _parsed = (spec, parse_actions(spec))
    return _parsed[1]


def hit(point: str) -> None:
    """Counts one operation of ``point``; raises FailpointError (or kills the process) at the armed k-th one."""
    if not os.environ.get(ENV):
        return
    if point not in POINTS:  # a misspelt hit in the code would never fire
        raise ValueError(f"failpoint {point!r} is not in failpoints.POINTS")
    armed = _armed().get(point)
    if armed is None:
        return
    k, action = armed
    with _lock:
        n = _counts.get(point, 0) + 1
        _counts[point] = n
    if n == k:
        if action == KILL:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if action == PAUSE:
            _pause()
            return
        raise FailpointError(f"failpoint {point} at operation {k}")


def _pause() -> None:
    """Creates the pause file and waits until someone removes it."""
    import time

    path = os.environ.get(PAUSE_ENV)
    if not path:
        raise FailpointError(f"a pause failpoint needs {PAUSE_ENV} (the file to wait on)")
    with open(path, "w") as fh:
        fh.write(str(os.getpid()))
    while os.path.exists(path):
        time.sleep(0.05)


def check_env() -> None:
    """Parses the variable now, so a bad or unknown entry fails the command before it starts (ValueError)."""
    _armed()


def reset() -> None:
    """Forgets the counts of this process (tests: arm the same points again)."""
    with _lock:
        _counts.clear()
