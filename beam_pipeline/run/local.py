"""The launching process's own things: the live progress line and the run's temporary folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from apache_beam.runners.runner import PipelineState

from .. import resume
from ..errors import PipelineError


class LiveProgress:
    """Prints images done, rate and shards written on one updating stderr line (terminals only)."""

    def __init__(self, stream: Any = None, interval: float = 0.5) -> None:
        import threading

        self._stream = stream or sys.stderr
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LiveProgress:
        if self._stream.isatty():
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self._stream.write("\r" + " " * 79 + "\r")
            self._stream.flush()

    def _run(self) -> None:
        from ..writer.shard import PROGRESS

        started = time.monotonic()
        base = PROGRESS.snapshot()
        while not self._stop.wait(self._interval):
            images, rejected, shards = (a - b for a, b in zip(PROGRESS.snapshot(), base, strict=True))
            elapsed = time.monotonic() - started
            rate = images / elapsed if elapsed > 0 else 0.0
            line = f"converting: {images:,} images ({rate:,.0f}/s), {rejected:,} rejected, {shards:,} shards written"
            self._stream.write("\r" + line[:79].ljust(79))
            self._stream.flush()


def wait_for(result: Any) -> None:
    state = result.wait_until_finish()
    if state not in (PipelineState.DONE, None):
        raise PipelineError(f"the pipeline ended in state {state}")


RUN_TEMPORARY_PREFIX = "beam_pipeline-run-"


class _RunTemporaryFolder:
    """One temporary folder for the runs of this process, removed with what was left in it when the last one
    ends (runs in threads share it; each makes its own files in it). In a process the tool owns (the command
    line, ``redirect``), it is also ``tempfile``'s default folder while the runs last, so what Beam's stager
    and TensorFlow leave there goes with it; a program that calls ``run_convert`` itself keeps its
    ``tempfile`` folder (its own threads' files must not be removed with the run's).

    A process that is killed (SIGKILL, the OOM killer) cannot remove its folder. It holds a lock in it
    (``resume.run_lock``) while its runs last, so the next process to start a run removes the folders whose
    lock is free and was taken on this host (``resume.run_state`` DEAD); a live run's, another host's and one
    without a lock file are left alone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs = 0
        self._folder = ""
        self._before: str | None = None
        self._system = ""
        self._held: contextlib.ExitStack | None = None
        self._redirected = False

    def system_folder(self) -> str:
        """tempfile's folder outside the runs (for caches meant to outlive them)."""
        import tempfile

        with self._lock:
            return self._system if self._runs else tempfile.gettempdir()

    @contextlib.contextmanager
    def held(self, redirect: bool = False) -> Iterator[str]:
        import tempfile

        with self._lock:
            if self._runs == 0:
                self._system = tempfile.gettempdir()
                self._before = tempfile.tempdir
                self._folder = tempfile.mkdtemp(prefix=RUN_TEMPORARY_PREFIX)
                self._held = contextlib.ExitStack()
                self._held.enter_context(resume.run_lock(self._folder))
                _remove_dead_run_folders(self._system, self._folder)
                self._redirected = redirect
                if redirect:
                    tempfile.tempdir = self._folder
            self._runs += 1
            folder = self._folder
        try:
            yield folder
        finally:
            with self._lock:
                self._runs -= 1
                if self._runs == 0:
                    if self._redirected:
                        tempfile.tempdir = self._before
                    if self._held is not None:
                        self._held.close()  # the lock goes with the folder
                    shutil.rmtree(folder, ignore_errors=True)


def _remove_dead_run_folders(system: str, own: str) -> None:
    """Removes the run folders in ``system`` that processes killed on this host left (their lock is free)."""

    try:
        entries = [
            e.path
            for e in os.scandir(system)
            if e.name.startswith(RUN_TEMPORARY_PREFIX) and e.is_dir(follow_symlinks=False)
        ]
    except OSError:
        return
    for path in entries:
        try:
            mine = os.stat(path).st_uid == os.getuid()  # another user's folder is theirs to clean
        except (OSError, AttributeError):  # gone meanwhile; no uids (not POSIX)
            continue
        if mine and path != own and resume.run_state(path) == resume.DEAD:
            shutil.rmtree(path, ignore_errors=True)


RUN_TEMPORARY_FOLDER = _RunTemporaryFolder()
