"""Resume: the shards an earlier, killed or failed run of the same output finished are not written again.

A shard writer that has closed its shard writes a **marker** into its run's
scratch folder::

    <scratch>/_done/<split>-<shard:05d>-<digest>.json     {"digest", "result"}

``digest`` (``shard_digest``) covers everything that decides the shard's
bytes and rejects: the shard's refs (path, relative path, size, mtime,
split, label, shuffle key, extra columns, annotations, and what ``--incremental-from``
attached to each) in order, the label list, the extra columns' types, the
image policy, the compression, whether previous records are reused, and the
code: beam_pipeline's version and a digest of its source files, and Pillow's
version. ``result`` is what the writer emitted: the temp shard, its index
part, its ``.idx``, its rejects part (``_done/<attempt>.rejects.jsonl``, one
reject per line, only when it has rejects), records, bytes, counts. The
marker is written whole or not at all, after those files are closed: a
marker names a finished shard. A shard with a ``missing`` or ``unreadable``
reject gets no marker: those say nothing of the file's bytes (a file gone
for a moment, a permission granted since), so it is written again.

Re-run with the same inputs, a run takes the scratch folders of earlier runs
of its output (``resume_sources``: a listing of folder names, newest
``MAX_SOURCES``); a writer whose shard has a marker with its digest (its own
scratch folder first: a bundle retried after its shard was finished) takes
that shard: it links (local) or copies (GCS, server-side) the files into its
own scratch folder under its own attempt name, replays the rejects, writes
its own marker, and emits the result, without reading or decoding one image.
The earlier run's files stay where they are (a copy, never a move): a
retried or concurrent attempt can never take a file from under another, and
a source that vanishes half-way means the shard is written afresh.

A run killed after finalize (during the TFT analysis, say) had its temp
shards renamed in its staging folder; finalize wrote where each went
(``_done/renamed.jsonl``) before renaming, and the lookup follows it. A run
killed inside its publish still has them there: publish links (GCS: copies)
shards and ``.idx`` files into the output and leaves them in the staging
folder until ``_SUCCESS`` is written (finalize.publish).

Local runs hold a lock (``_run.lock``, flock, with the host's name in it) in
their scratch folder while they run. Once a run publishes, the scratch
folders it took shards from are removed if their run is dead (its lock is
free and was taken on this host); every other one, and every one on GCS,
where nothing tells a dead run from a slow one, goes by age
(finalize.STALE_TMP_AGE_S).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import metadata, storage
from .annotations.objects import digest as annotations_digest
from .storage import open_lines, permanent_reason, write_atomic
from .vocab.reasons import MISSING
from .vocab.records import ShardResult

DONE = "_done"  # markers and rejects parts, inside a run's scratch folder; never published
RUN_LOCK = "_run.lock"  # held by a local run's launcher while it runs
RENAMED = "renamed.jsonl"  # inside DONE: {"from": temp shard, "to": staged shard} per line, written by finalize
SHARD_REFS = "_shard_refs"  # a shard's refs in pieces, on Flink and Spark (writer/pieces.py)
# Paths (relative to a scratch folder) that never leave it.
JOIN_FILES = "_previous_join"  # --incremental-from's join on the local runner (index.JoinPrevious)
SCRATCH_ONLY = (DONE + "/", RUN_LOCK, SHARD_REFS + "/", JOIN_FILES + "/")
MARKER_FORMAT = 2
# Earlier runs' scratch folders a writer looks in, newest first (each is one lookup per shard).
MAX_SOURCES = 4
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
    reuse_from: str | None = None,
    output_format: str = "tfrecord",
) -> str:
    """A digest of what decides a shard's bytes and rejects; ``refs`` in the order they are written.

    ``reuse_from``: the previous output whose records this writer copies
    (``--incremental-from``, when its records fit), else None; each ref's
    ``previous`` (where that record is, or the reject kept) counts too. ``output_format``: the shard's
    format (formats/); a TFRecord shard's digest leaves it out, so it is the digest earlier versions wrote.
    """
    versions = metadata.package_versions()
    policy = {k: v for k, v in dataclasses.asdict(image_options).items() if k not in _NOT_POLICY}
    h = hashlib.sha256()
    h.update(
        _text(
            ({"output_format": output_format} if output_format != "tfrecord" else {})
            | {
                "format": MARKER_FORMAT,
                "split": split,
                "shard": shard,
                "labels": list(labels),
                "extra_types": dict(extra_types),
                "policy": policy,
                "compression": compression,
                "versions": {k: versions.get(k) for k in ("beam_pipeline", "beam_pipeline_code", "pillow")},
                "reuse_from": reuse_from,
            }
        )
    )
    for ref in refs:
        h.update(b"\n")
        previous = list(ref.previous) if ref.previous is not None else None
        fields = [ref.path, ref.relpath, ref.size, ref.mtime, ref.split, ref.label, ref.key, ref.extras, previous]
        if ref.annotations is not None:  # an annotated image: its objects decide its record too
            fields.append(annotations_digest(ref.annotations))
            # and its objects' count given by the source decides the shard's image counters (the marker keeps them)
            fields.append(getattr(ref.annotations, "given", None))
        h.update(_text(fields))
    return h.hexdigest()


def marker_path(scratch: str, split: str, shard: int, digest: str) -> str:
    return FileSystems.join(scratch, DONE, f"{split}-{shard:05d}-{digest}.json")


def rejects_path(scratch: str, stem: str) -> str:
    """Where a writer attempt streams its shard's rejects (``stem``: split-shard-attempt)."""
    return FileSystems.join(scratch, DONE, f"{stem}.rejects.jsonl")


def write_marker(scratch: str, split: str, shard: int, digest: str, result: Mapping[str, Any]) -> None:
    text = json.dumps({"format": MARKER_FORMAT, "digest": digest, "result": dict(result)})
    write_atomic(marker_path(scratch, split, shard, digest), text + "\n")


def _read_text(path: str) -> str:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        return fh.read().decode("utf-8")


def _missing(error: BaseException) -> bool:
    return permanent_reason(error) == MISSING


_RENAMED: dict[str, dict[str, str]] = {}
_RENAMED_LOCK = threading.Lock()


def _renamed(scratch: str) -> dict[str, str]:
    """{temp file: staged file} of a finalized run, or {} if it never got there.

    Read once per process for a finalized run (its renames never change
    again; every writer instance of the process shares the map); a run not
    finalized is asked again next time.
    """
    with _RENAMED_LOCK:
        if scratch in _RENAMED:
            return _RENAMED[scratch]
        path = FileSystems.join(scratch, DONE, RENAMED)
        moves: dict[str, str] = {}
        if FileSystems.exists(path):
            for line in _read_text(path).splitlines():
                if line.strip():
                    entry = json.loads(line)
                    moves[entry["from"]] = entry["to"]
            _RENAMED[scratch] = moves
        return moves


def _sizes(paths: Sequence[str]) -> dict[str, int]:
    """{path: size} of those of ``paths`` that exist (one match call)."""
    out: dict[str, int] = {}
    for path, found in zip(paths, FileSystems.match(list(paths)), strict=True):
        for m in found.metadata_list:
            if m.path.rstrip("/") == path.rstrip("/") or m.path == path:
                out[path] = m.size_in_bytes
    return out


def find_finished(sources: Sequence[str], split: str, shard: int, digest: str, own: str = "") -> ShardResult | None:
    """The result of a finished shard with this digest in one of ``sources`` (in order), files checked; or None.

    A marker whose files are gone (or of another size) is passed over. A
    transient storage error is raised: the bundle fails and is retried.
    ``resumed_from`` names the scratch folder the shard is taken from; found
    in ``own`` (this run's: a retried bundle), it keeps naming the earlier run
    the first attempt took it from, if any.
    """
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
        keys = [k for k in FILE_KEYS if result.get(k)]
        have = _sizes([result[k] for k in keys])
        gone = [k for k in keys if result[k] not in have]
        if gone:  # finalized since: follow the renames (the shard and its .idx)
            moves = _renamed(scratch)
            for key in gone:
                if result[key] in moves:
                    result[key] = moves[result[key]]
            have.update(_sizes([result[k] for k in gone]))
        if all(result[k] in have for k in keys) and have[result["tmp_path"]] == result["bytes"]:
            if scratch != own or not result.get("resumed_from"):
                result["resumed_from"] = scratch
            return ShardResult.from_json(result)
    return None


def _link_or_copy(src: str, dst: str) -> None:
    storage.link_or_copy(src, dst)


def adopt(found: ShardResult, paths: Mapping[str, str]) -> ShardResult | None:
    """Copies (links) a finished shard's files to this attempt's ``paths`` (FILE_KEYS: shard, parts, .idx).

    None when a source file vanished meanwhile (its run was cleaned up): the
    caller writes the shard afresh; what was copied already is left for
    finalize, which removes files no result names.
    """
    moved = {}
    for key in FILE_KEYS:
        source = getattr(found, key)
        if source:
            try:
                _link_or_copy(source, paths[key])
            except Exception as e:
                if _missing(e):
                    return None
                raise
            moved[key] = paths[key]
    return dataclasses.replace(found, **moved)


def read_rejects(path: str | None) -> Iterator[dict[str, Any]]:
    if not path:  # the shard had no rejects
        return
    with open_lines(path) as fh:
        for raw in fh:
            if raw.strip():
                yield json.loads(raw.decode("utf-8"))


def scratch_folders(output: str) -> list[str]:
    """The scratch folders of runs of this tool in ``output`` (names only: no file under them is listed).

    Locally one ``listdir``; on GCS one listing with a delimiter (folder
    prefixes, not the objects in them). A missing output has none; any other
    error is raised.
    """
    return storage.subfolders(output.rstrip("/") + "/" + metadata.TMP_PREFIX)


def _has_markers(folder: str) -> bool:
    """Whether a scratch folder has a DONE folder (a run that got as far as finishing a shard)."""
    return storage.has_any(FileSystems.join(folder, DONE))


def resume_sources(output: str, own_scratch: str) -> tuple[str, ...]:
    """Scratch folders of earlier runs of ``output`` to take finished shards from: the newest MAX_SOURCES
    that hold any (runs that failed before finishing a shard are passed over; at most 4 * MAX_SOURCES asked)."""
    folders = [f for f in scratch_folders(output) if f.rstrip("/") != own_scratch.rstrip("/")]
    # run ids start with the start time (YYYYmmdd-HHMMSS-): newest first
    newest = sorted(folders, reverse=True)[: 4 * MAX_SOURCES]
    return tuple([f for f in newest if _has_markers(f)][:MAX_SOURCES])


# ---- liveness of local runs ------------------------------------------------------------------


def _host() -> str:
    import socket

    return socket.gethostname()


@contextlib.contextmanager
def run_lock(scratch: str) -> Iterator[None]:
    """Holds ``scratch``/_run.lock for the block (local scratch folders; elsewhere nothing is held).

    The lock file is made, locked and given this host's name under a
    temporary name, then renamed into place: nobody ever sees it unlocked
    while the run lives. Where the file system has no flock (some network
    mounts), the run goes on without a lock file, and counts as live.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: every run counts as live (scratch folders go by age)
        yield
        return
    if storage.is_remote(scratch):  # a lock is a process's hold on a local file
        yield
        return
    os.makedirs(scratch, exist_ok=True)
    part = os.path.join(scratch, f"{RUN_LOCK}.{os.getpid()}.part")
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # ENOLCK, ENOSYS, EOPNOTSUPP: no locks here
            os.close(fd)
            fd = -1
            os.remove(part)
        else:
            os.write(fd, _host().encode("utf-8", "replace"))
            os.replace(part, os.path.join(scratch, RUN_LOCK))
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


# What a scratch folder's lock says of its run (run_state).
LIVE, DEAD, UNKNOWN = "live", "dead", "unknown"


def run_state(scratch: str) -> str:
    """LIVE while a process holds the folder's lock; DEAD when its run is over (killed, failed or finished):
    its lock file names this host and nobody holds the lock; UNKNOWN otherwise.

    UNKNOWN: a lock taken on another host (a shared mount whose locks may be
    per host), a folder without a lock file (a run of an older version, one on
    a file system without locks, or one that is just starting), and GCS.
    """
    try:
        import fcntl
    except ImportError:
        return UNKNOWN
    if storage.is_remote(scratch):  # a lock is a process's hold on a local file
        return UNKNOWN
    try:
        # never blocking, never through a link, a regular file only: a FIFO or a device planted as the lock
        # file in a shared folder must not stall the run that looks at it (write access: flock over NFS needs it)
        fd = os.open(os.path.join(scratch, RUN_LOCK), os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return UNKNOWN
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return UNKNOWN
        if os.read(fd, 4096).decode("utf-8", "replace") != _host():
            return UNKNOWN
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # EWOULDBLOCK: a process holds it
        return LIVE
    except OSError:
        return UNKNOWN
    finally:
        os.close(fd)
    return DEAD


def is_dead_local_run(scratch: str) -> bool:
    """True for a local scratch folder whose run is over (run_state DEAD); False while it may be going."""
    return run_state(scratch) == DEAD
