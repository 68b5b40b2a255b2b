"""File operations of finalize, publish and retention: batched renames and deletes, listings with sizes,
the scratch folders of other runs.

Moving into the storage layer (issue #34).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from apache_beam.io.filesystems import FileSystems

from . import failpoints, lease, metadata, resume

_LOG = logging.getLogger(__name__)

# Renames/deletes per GCS batch request (Beam's gcsio allows at most 100).
BATCH = 100
# Scratch folders of other runs are removed only when their run started this
# long ago: a younger one may belong to a run still going on the same output.
STALE_TMP_AGE_S = 3 * 24 * 3600


def sizes_under(path: str) -> dict[str, int]:
    """{relative path: size} of every file under ``path`` (one listing; hidden folders not entered locally)."""
    prefix = path.rstrip("/") + "/"
    try:
        found = FileSystems.match([FileSystems.join(path, "**")])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing there
        return {}
    return {m.path[len(prefix) :]: m.size_in_bytes for m in found if m.path.startswith(prefix)}


def _files_under(path: str) -> list[str]:
    prefix = path.rstrip("/") + "/"
    return sorted(prefix + rel for rel in sizes_under(path))


# --- batched file operations -------------------------------------------------

_gcs_lock = threading.Lock()
_gcs_client: list[Any] = []


def _gcs() -> Any:
    """One Beam GcsIO (one storage client and HTTP session) per process, made on first use."""
    with _gcs_lock:
        if not _gcs_client:
            from apache_beam.io.gcp import gcsio

            _gcs_client.append(gcsio.GcsIO(pipeline_options=FileSystems._pipeline_options))  # noqa: SLF001
        return _gcs_client[0]


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def move_files(
    pairs: Sequence[tuple[str, str]],
    existing: set[str],
    point: str,
    guard: lease.Guard | None = None,
    kept: Iterable[str] = (),
) -> None:
    """Renames each (src, dst); a pair whose src is gone and dst present is done already.

    ``existing`` holds the paths known to exist (from listings made just
    before), so no request per file asks. A pair with neither side present
    raises FileNotFoundError: a file of the run is lost. ``guard`` (publish)
    checks the output lease right before each rename (locally) or batch (GCS).
    A src in ``kept`` stays where it is: dst becomes a hard link to it
    (locally; moved where the file system has none) or a copy (GCS).
    """
    kept = set(kept)
    todo = []
    for src, dst in pairs:
        if src in existing:
            todo.append((src, dst))
        elif dst not in existing:
            raise FileNotFoundError(f"{src}: gone, and {dst} is not there either")
    remote = [p for p in todo if "://" in p[0]]
    for src, dst in todo:
        if "://" in src:
            continue
        failpoints.hit(point)
        if guard:
            guard.before()
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if src in kept:
            _link_in_place_of(src, dst)
        else:
            os.replace(src, dst)
        if guard:
            guard.after()
    for chunk in _chunks(remote, BATCH):
        for _ in chunk:
            failpoints.hit(point)
        if guard:
            guard.before()
        gcs = _gcs()
        failed = [(s, d, e) for s, d, e in gcs.copy_batch(list(chunk)) if e is not None]
        if guard:
            guard.after()
        if failed:
            raise OSError(f"copying {failed[0][0]} to {failed[0][1]}: {failed[0][2]} ({len(failed)} failed)")
        moved = [s for s, _ in chunk if s not in kept]
        failed_deletes = [(p, e) for p, e in (gcs.delete_batch(moved) if moved else []) if e is not None]
        if failed_deletes and not all(_not_found(e) for _, e in failed_deletes):
            raise OSError(f"deleting {failed_deletes[0][0]}: {failed_deletes[0][1]}")


def _link_in_place_of(src: str, dst: str) -> None:
    """``dst`` becomes a second name of ``src`` (replacing what was there in one rename); ``src`` stays.

    The link is made beside ``src`` first (in the staging folder: a kill in between leaves nothing in the
    output). Done already when they are one file (a retried publish); moved where there are no hard links.
    """
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return
    part = src + ".link"
    if os.path.lexists(part):
        os.remove(part)
    try:
        os.link(src, part)
    except OSError as e:
        if e.errno not in resume.NO_HARD_LINKS:
            raise
        os.replace(src, dst)
        return
    os.replace(part, dst)


def _not_found(error: Any) -> bool:
    return "404" in str(error) or "Not Found" in str(error) or "NotFound" in type(error).__name__


def delete_files(paths: Sequence[str], point: str | None = None, guard: lease.Guard | None = None) -> None:
    """Deletes files (batched on GCS); one already gone is fine. ``guard``: as for move_files."""
    local = [p for p in paths if "://" not in p]
    remote = [p for p in paths if "://" in p]
    for path in local:
        if point:
            failpoints.hit(point)
        if guard:
            guard.before()
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(path, ignore_errors=True)
        if guard:
            guard.after()
    for chunk in _chunks(remote, BATCH):
        if point:
            for _ in chunk:
                failpoints.hit(point)
        if guard:
            guard.before()
        failed = [(p, e) for p, e in _gcs().delete_batch(list(chunk)) if e is not None and not _not_found(e)]
        if guard:
            guard.after()
        if failed:
            raise OSError(f"deleting {failed[0][0]}: {failed[0][1]}")


def delete_quietly(paths: Sequence[str]) -> None:
    for path in paths:
        try:
            FileSystems.delete([path])
        except Exception as e:  # noqa: BLE001 - already gone is fine
            _LOG.debug("could not delete %s: %s", path, e)


def delete_tree(path: str) -> None:
    """Deletes a scratch folder and everything under it."""
    delete_files(_files_under(path))
    if "://" not in path:
        shutil.rmtree(path, ignore_errors=True)


def _remove_empty_dirs(root: str) -> None:
    """Local only: folders left empty under ``root`` (after moving or deleting their files) go."""
    if "://" in root or not os.path.isdir(root):
        return
    for dirpath, _, _ in sorted(os.walk(root), key=lambda t: -len(t[0])):
        try:
            os.rmdir(dirpath)  # only succeeds when empty
        except OSError:
            pass


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


# --- finalize ------------------------------------------------------------------


# --- publish -------------------------------------------------------------------
