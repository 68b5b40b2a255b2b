"""A run's file operations: batched moves and deletes with the failpoint named at each file (the storage
layer does the work, local or gs://), and other runs' scratch folders that are old enough to remove.

    move_files(pairs, existing, "finalize.rename")
    stale_tmp_dirs(output, keep=own_scratch)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from .. import failpoints, lease, metadata, resume, storage

# Scratch folders of other runs are removed only when their run started this
# long ago: a younger one may belong to a run still going on the same output.
STALE_TMP_AGE_S = 3 * 24 * 3600


def move_files(
    pairs: Sequence[tuple[str, str]],
    existing: set[str],
    point: str,
    guard: lease.Guard | None = None,
    kept: Iterable[str] = (),
) -> None:
    """storage.move_files with failpoint ``point`` hit before each file."""
    storage.move_files(pairs, existing, kept, lambda: failpoints.hit(point), guard)


def delete_files(paths: Sequence[str], point: str | None = None, guard: lease.Guard | None = None) -> None:
    """storage.delete_files with failpoint ``point`` (if any) hit before each file."""
    storage.delete_files(paths, (lambda: failpoints.hit(point)) if point else None, guard)


def run_started(run_id: str) -> float | None:
    """Seconds since the epoch when a run started: its id begins with the launcher's local time, YYYYmmdd-HHMMSS."""
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


def stale_tmp_dirs(out_dir: str, keep: str = "", now: float | None = None) -> list[str]:
    """Scratch folders of runs of this tool in ``out_dir`` that started over STALE_TMP_AGE_S ago.

    A younger one may be a run still going (two runs on one output): it is
    left alone. ``keep`` (this run's own) is never listed.
    """
    try:
        folders = resume.scratch_folders(out_dir)  # names only, not every file under them
    except Exception:  # noqa: BLE001 - a listing that fails leaves them for the next run
        return []
    now = time.time() if now is None else now
    out = []
    for folder in folders:
        started = run_started(folder.rsplit("/", 1)[-1][len(metadata.TMP_PREFIX) :])
        if folder.rstrip("/") != keep.rstrip("/") and started is not None and now - started > STALE_TMP_AGE_S:
            out.append(folder)
    return out
