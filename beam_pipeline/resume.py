"""Resume: the shards an earlier, killed or failed run of the same output finished are not written again.

A shard writer that has closed its shard writes a **marker** into its run's
scratch folder::

    <scratch>/_done/<split>-<shard:05d>-<digest>.json     {"digest", "result"}

``digest`` (``shard_digest``) covers everything that decides the shard's
bytes and rejects: the shard's refs (path, relative path, size, mtime,
split, label, shuffle key, extra columns) in order, the label list, the
extra columns' types, the image policy, the compression and the
beam_pipeline/Pillow versions. ``result`` is what the writer emitted: the
temp shard, its index part and its rejects part (``_done/<attempt>.rejects.jsonl``,
one reject per line, written as the shard was), records, bytes, counts.
The marker is written whole or not at all, after the three files are
closed: a marker names a finished shard.

Re-run with the same inputs, a run lists the scratch folders of earlier runs
of its output that hold markers (``resume_sources``); a writer whose shard
has a marker with its digest (its own scratch folder first: a bundle retried
after its shard was finished) takes that shard: it links (local) or copies
(GCS, server-side) the three files into its own scratch folder under its
own attempt name, replays the rejects, writes its own marker, and emits the
result, without reading or decoding one image. The earlier run's files stay
where they are (a copy, never a move): a retried or concurrent attempt can
never take a file from under another.

A run killed after finalize (during the TFT analysis, say) had its temp
shards renamed in its staging folder; finalize wrote where each went
(``_done/renamed.jsonl``) before renaming, and the lookup follows it.

Local runs hold a lock (``_run.lock``, flock) in their scratch folder while
they run; once a run publishes, the scratch folders of earlier local runs
whose lock is free (dead runs) are removed. On GCS nothing says a run is
dead: their scratch folders go after three days (finalize.STALE_TMP_AGE_S).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import metadata

DONE = "_done"  # markers and rejects parts, inside a run's scratch folder; never published
RUN_LOCK = "_run.lock"  # held by a local run's launcher while it runs
RENAMED = "renamed.jsonl"  # inside DONE: {"from": temp shard, "to": staged shard} per line, written by finalize
# Paths (relative to a scratch folder) that never leave it.
SCRATCH_ONLY = (DONE + "/", RUN_LOCK)
MARKER_FORMAT = 1
# The files of a writer's result: the temp shard, its index part, its rejects part, its .idx (uncompressed).
FILE_KEYS = ("tmp_path", "index_path", "rejects_path", "idx_path")
# Settings of images.ImageOptions that do not change what is written.
_NOT_POLICY = {"memory_budget_bytes"}


def _text(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")


def shard_digest(
    split: str,
    shard: int,
    refs: Sequence[Any],
    labels: Sequence[str],
    extra_types: Mapping[str, str],
    image_options: Any,
    compression: str,
) -> str:
    """A digest of what decides a shard's bytes and rejects; ``refs`` in the order they are written."""
    versions = metadata.package_versions()
    policy = {k: v for k, v in dataclasses.asdict(image_options).items() if k not in _NOT_POLICY}
    h = hashlib.sha256()
    h.update(
        _text(
            {
                "format": MARKER_FORMAT,
                "split": split,
                "shard": shard,
                "labels": list(labels),
                "extra_types": dict(extra_types),
                "policy": policy,
                "compression": compression,
                "versions": {k: versions.get(k) for k in ("beam_pipeline", "pillow")},
            }
        )
    )
    for ref in refs:
        h.update(b"\n")
        h.update(_text([ref.path, ref.relpath, ref.size, ref.mtime, ref.split, ref.label, ref.key, ref.extras]))
    return h.hexdigest()


def marker_path(scratch: str, split: str, shard: int, digest: str) -> str:
    return FileSystems.join(scratch, DONE, f"{split}-{shard:05d}-{digest}.json")


def rejects_path(scratch: str, stem: str) -> str:
    """Where a writer attempt streams its shard's rejects (``stem``: split-shard-attempt)."""
    return FileSystems.join(scratch, DONE, f"{stem}.rejects.jsonl")


def write_atomic(path: str, text: str) -> None:
    """Whole or not at all: a GCS object appears complete; locally a rename makes it so."""
    data = text.encode("utf-8")
    if "://" in path:
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.write(data)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    part = f"{path}.{os.getpid()}-{threading.get_ident()}.part"
    with open(part, "wb") as fh:
        fh.write(data)
    os.replace(part, path)


def write_marker(scratch: str, split: str, shard: int, digest: str, result: Mapping[str, Any]) -> None:
    text = json.dumps({"format": MARKER_FORMAT, "digest": digest, "result": dict(result)})
    write_atomic(marker_path(scratch, split, shard, digest), text + "\n")


def _read_text(path: str) -> str:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        return fh.read().decode("utf-8")


def _missing(error: BaseException) -> bool:
    from .writing import MISSING, permanent_reason

    return permanent_reason(error) == MISSING


def _renamed(scratch: str, cache: dict[str, dict[str, str]]) -> dict[str, str]:
    """{temp file: staged file} of a finalized run (empty if it never got there), read once per ``cache``."""
    if scratch not in cache:
        path = FileSystems.join(scratch, DONE, RENAMED)
        moves: dict[str, str] = {}
        if FileSystems.exists(path):
            for line in _read_text(path).splitlines():
                if line.strip():
                    entry = json.loads(line)
                    moves[entry["from"]] = entry["to"]
        cache[scratch] = moves
    return cache[scratch]


def _sizes(paths: Sequence[str]) -> dict[str, int]:
    """{path: size} of those of ``paths`` that exist (one match call)."""
    out: dict[str, int] = {}
    for path, found in zip(paths, FileSystems.match(list(paths)), strict=True):
        for m in found.metadata_list:
            if m.path.rstrip("/") == path.rstrip("/") or m.path == path:
                out[path] = m.size_in_bytes
    return out


def find_finished(
    sources: Sequence[str], split: str, shard: int, digest: str, cache: dict[str, dict[str, str]] | None = None
) -> dict[str, Any] | None:
    """The result of a finished shard with this digest in one of ``sources`` (in order), files checked; or None.

    A marker whose files are gone (or of another size) is passed over. A
    transient storage error is raised: the bundle fails and is retried.
    ``cache`` keeps the finalized runs' renames (one read per source and
    writer instance; a run still going may finalize later, so not longer).
    """
    cache = {} if cache is None else cache
    for scratch in sources:
        path = marker_path(scratch, split, shard, digest)
        try:
            if not FileSystems.exists(path):
                continue
            marker = json.loads(_read_text(path))
        except Exception as e:
            if _missing(e):  # removed since (a run that published cleaned up)
                continue
            raise
        if marker.get("format") != MARKER_FORMAT or marker.get("digest") != digest:
            continue
        result = dict(marker["result"])
        keys = [k for k in FILE_KEYS if k in result]
        have = _sizes([result[k] for k in keys])
        gone = [k for k in keys if result[k] not in have]
        if gone:  # finalized since: follow the renames (the shard and its .idx)
            moves = _renamed(scratch, cache)
            for key in gone:
                if result[key] in moves:
                    result[key] = moves[result[key]]
            have.update(_sizes([result[k] for k in gone]))
        if all(result[k] in have for k in keys) and have[result["tmp_path"]] == result["bytes"]:
            result["resumed_from"] = scratch
            return result
    return None


def _link_or_copy(src: str, dst: str) -> None:
    if "://" in src or "://" in dst:
        FileSystems.copy([src], [dst])
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)  # no second copy of the bytes
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EOPNOTSUPP):
            raise
        FileSystems.copy([src], [dst])


def adopt(found: Mapping[str, Any], paths: Mapping[str, str]) -> dict[str, Any]:
    """Copies (links) a finished shard's files to this attempt's ``paths`` (FILE_KEYS: shard, parts, .idx)."""
    result = dict(found)
    for key in FILE_KEYS:
        if key in found:
            _link_or_copy(found[key], paths[key])
            result[key] = paths[key]
    return result


def read_rejects(path: str) -> Iterator[dict[str, Any]]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        for raw in fh:
            if raw.strip():
                yield json.loads(raw.decode("utf-8"))


def resume_sources(output: str, own_scratch: str) -> tuple[str, ...]:
    """Scratch folders of earlier runs of ``output`` that hold shard markers, newest run first (one listing)."""
    prefix = FileSystems.join(output, metadata.TMP_PREFIX)
    try:
        found = FileSystems.match([prefix + "*/" + DONE + "/*.json"])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing there
        return ()
    folders = {prefix + m.path[len(prefix) :].split("/", 1)[0] for m in found if m.path.startswith(prefix)}
    folders.discard(own_scratch.rstrip("/"))
    # run ids start with the start time (YYYYmmdd-HHMMSS-): newest first
    return tuple(sorted(folders, reverse=True))


# ---- liveness of local runs ------------------------------------------------------------------


@contextlib.contextmanager
def run_lock(scratch: str) -> Iterator[None]:
    """Holds ``scratch``/_run.lock for the block (local scratch folders; elsewhere nothing is held)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: every run counts as live (scratch folders go by age)
        yield
        return
    if "://" in scratch:
        yield
        return
    os.makedirs(scratch, exist_ok=True)
    fd = os.open(os.path.join(scratch, RUN_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)  # releases the lock


def is_dead_local_run(scratch: str) -> bool:
    """True for a local scratch folder whose run holds no lock on it: killed, failed or finished.

    False when its lock is held (a run going on), when it has no lock file
    (a run of an older version, or a run that is just starting), and for GCS.
    """
    try:
        import fcntl
    except ImportError:
        return False
    if "://" in scratch:
        return False
    try:
        fd = os.open(os.path.join(scratch, RUN_LOCK), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
