"""Scratch folders of other runs in an output: what they hold, and removing those of runs that are over.

    python -m beam_pipeline clean OUTPUT                  # remove scratch folders of runs that are over
    python -m beam_pipeline clean OUTPUT --dry-run        # only say what would go
    python -m beam_pipeline clean gs://b/out --older-than 6h

Every run works in ``OUTPUT/.beam_pipeline-tmp-<run id>/``. A run that
publishes removes its own; a killed run's stays (a later run of the same
output may resume from it, and removes it after taking shards from it, or
once it is STALE_TMP_AGE_S old). ``convert`` and ``inspect`` report the ones
they find (``report_lines``), and ``clean`` removes:

- a local folder whose run is over: its lock is free and was taken on this
  host (``resume.run_state`` DEAD), whatever its age;
- a folder nothing tells the liveness of (GCS, a lock of another host, no
  lock file) only when both its run's start and its newest file are older
  than ``--older-than`` (default STALE_TMP_AGE_S), or with ``--force``;
- never a local folder whose lock a process holds, nor the folder of the run
  that holds the output's lease (lease.py), unexpired: live runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from apache_beam.io.filesystems import FileSystems

from . import lease, metadata, resume, storage
from .errors import UsageError
from .run.files import STALE_TMP_AGE_S, run_started
from .run.publish import PUBLISH_MANIFEST
from .storage import read_json


@dataclass(frozen=True)
class Scratch:
    """One scratch folder: its size, how old its run and its newest file are, what its lock says."""

    path: str
    run_id: str
    files: int
    bytes: int
    age_s: float | None  # since its run started (from the run id), None if the name has no time
    idle_s: float | None  # since its newest file was written, None if it holds no file
    state: str  # resume.LIVE, DEAD or UNKNOWN
    cut_short: bool = False  # holds the plan of a publish cut short, the only way to finish it (never removed)

    @property
    def name(self) -> str:
        return metadata.TMP_PREFIX + self.run_id


def _contents(folder: str) -> tuple[int, int, float | None]:
    """(files, bytes, newest modification time) of everything under ``folder``."""
    return storage.usage(folder)


def _leaseholder(output: str) -> str | None:
    """The run id holding the output's lease, unexpired (alive, wherever it runs), or None; a holder on this host
    whose process is gone (a killed run) holds nothing."""
    try:
        record = lease.holder(output)
    except Exception:  # noqa: BLE001 - an unreadable lease tells nothing; the lock and age rules still hold
        return None
    if record and lease.is_live(record):
        return str(record.run_id)
    return None


def state_of(folder: str, run_id: str, leaseholder: str | None) -> str:
    """resume.run_state, and LIVE for the run that holds the output's lease (unless its local lock says it died)."""
    state = resume.run_state(folder)
    return resume.LIVE if state != resume.DEAD and run_id == leaseholder else state


def _publish_cut_short(output: str, folder: str) -> bool:
    """``folder`` holds a publish plan (a run killed while publishing) and the output has no ``_SUCCESS``: the
    same command finishes that publish from it (launcher._finish_cut_short_publish), nothing else can."""
    plan = FileSystems.join(folder, PUBLISH_MANIFEST)
    if not FileSystems.exists(plan) or FileSystems.exists(FileSystems.join(output, metadata.SUCCESS)):
        return False
    try:
        return bool(read_json(plan).get("complete", True))
    except Exception:  # noqa: BLE001 - an unreadable plan finishes nothing
        return False


def other_runs(output: str, own_run_id: str = "", now: float | None = None) -> list[Scratch]:
    """The scratch folders in ``output`` but that of run ``own_run_id``, oldest first, each sized."""
    now = time.time() if now is None else now
    holder = _leaseholder(output)
    out = []
    for folder in resume.scratch_folders(output):
        run_id = folder.rstrip("/").rsplit("/", 1)[-1][len(metadata.TMP_PREFIX) :]
        if own_run_id and run_id == own_run_id:
            continue
        files, size, newest = _contents(folder)
        started = run_started(run_id)
        out.append(
            Scratch(
                path=folder,
                run_id=run_id,
                files=files,
                bytes=size,
                age_s=None if started is None else max(0.0, now - started),
                idle_s=None if newest is None else max(0.0, now - newest),
                state=state_of(folder, run_id, holder),
                cut_short=_publish_cut_short(output, folder),
            )
        )
    return out


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "age unknown"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


CUT_SHORT = "its run was killed while publishing; run the same command again to finish that publish"
_STATE_TEXT = {resume.LIVE: "its run is live", resume.DEAD: "its run is over", resume.UNKNOWN: "liveness unknown"}


def report_lines(output: str, found: Sequence[Scratch]) -> list[str]:
    """A few lines (80 columns) naming the scratch folders of other runs, their size and age, and the fix."""
    if not found:
        return []
    total = sum(s.bytes for s in found)
    lines = [f"scratch folders of other runs: {len(found)}, {size_text(total)} (.beam_pipeline-tmp-*)"]
    for s in found[:5]:
        state = "publish cut short" if s.cut_short and s.state != resume.LIVE else _STATE_TEXT[s.state]
        lines.append(f"  {s.run_id[:32]:<32} {size_text(s.bytes):>10}  {age_text(s.age_s):>10}  {state}")
    if len(found) > 5:
        lines.append(f"  ... {len(found) - 5} more")
    lines.append("  to remove those of runs that are over (never a live run's):")
    lines.append(f"    beam-pipeline clean {output}")
    return lines


def parse_age(text: str) -> float:
    """``90s``, ``30m``, ``6h``, ``3d`` (a bare number is seconds) → seconds; UsageError names the flag."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise UsageError(f"--older-than {text!r}: expected a number with s, m, h or d (e.g. 6h, 3d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def why_removable(s: Scratch, older_than_s: float, force: bool) -> str | None:
    """Why ``s`` may be removed, or None to keep it. A live run's folder is never removed."""
    if s.state == resume.LIVE or s.cut_short:
        return None
    if s.state == resume.DEAD:
        return "its run is over (lock free)"
    if force:
        return "--force"
    ages = [a for a in (s.age_s, s.idle_s) if a is not None]
    if ages and min(ages) > older_than_s:
        return f"started and last written over {age_text(older_than_s)} ago"
    return None


def _delete(s: Scratch) -> None:
    storage.remove_tree(s.path)


def clean(
    output: str,
    older_than_s: float = STALE_TMP_AGE_S,
    force: bool = False,
    dry_run: bool = False,
    now: float | None = None,
) -> list[tuple[Scratch, str | None]]:
    """Removes the scratch folders of runs that are over (see the module doc); [(folder, why removed or None)].

    Liveness is asked again right before each removal: a run that took its
    lock since the listing keeps its folder.
    """
    if not storage.is_folder(output):
        raise UsageError(f"{output}: no such folder")
    done = []
    for s in other_runs(output, now=now):
        why = why_removable(s, older_than_s, force)
        if why is not None and state_of(s.path, s.run_id, _leaseholder(output)) == resume.LIVE:
            why = None
        if why is not None and _publish_cut_short(output, s.path):
            why = None
        if why is not None and not dry_run:
            _delete(s)
        done.append((s, why))
    return done


def clean_lines(results: Sequence[tuple[Scratch, str | None]], older_than_s: float, dry_run: bool) -> list[str]:
    """What ``clean`` did, a line per folder and a total."""
    if not results:
        return ["no scratch folders of other runs"]
    lines = []
    for s, why in results:
        what = f"{s.name} ({size_text(s.bytes)}, {age_text(s.age_s)} old)"
        if why is not None:
            lines.append(f"{'would remove' if dry_run else 'removed'} {what}: {why}")
        elif s.state == resume.LIVE:
            lines.append(f"kept {what}: its run is live (it holds its folder's lock or the output's lease)")
        elif s.cut_short:
            lines.append(f"kept {what}: {CUT_SHORT}")
        else:
            lines.append(
                f"kept {what}: nothing tells whether its run is live; removed once older than "
                f"{age_text(older_than_s)} (--older-than AGE), or with --force if no run of this output is going"
            )
    freed = sum(s.bytes for s, why in results if why is not None)
    lines.append(f"{'would free' if dry_run else 'freed'} {size_text(freed)}")
    return lines
