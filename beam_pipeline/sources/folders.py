"""Listing a folder or glob inside the job: a whole folder fanned out over its subfolders (so no worker
holds the whole listing), odd local entries (a directory named like an image, a dangling link) as
rejects, and the listed paths spread over workers in batches.

    listed = pipeline | ListFolder(root, pattern)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from ..config import (
    ConvertConfig,
    Layout,
)
from ..errors import UsageError
from ..vocab.reasons import (
    UNREADABLE,
)
from ..vocab.refs import reject
from .rules import REJECTS, SKIPPED, make_ref, relative_path, skip_reason


def _to_listed(metadata: Any) -> tuple[bytes, int, float]:
    """(path as bytes, size, mtime): what crosses the shuffle after listing.

    Bytes, not text: a local name that is not valid UTF-8 (kept by Python as
    lone surrogates) would fail Beam's UTF-8 string coder; the ref step turns
    it into a ``bad_filename`` reject.
    """
    mtime = float(getattr(metadata, "last_updated_in_seconds", 0.0) or 0.0)
    return metadata.path.encode("utf-8", "surrogateescape"), metadata.size_in_bytes, mtime


def _from_listed(listed: tuple[bytes, int, float]) -> tuple[str, int, float]:
    path, size, mtime = listed
    return path.decode("utf-8", "surrogateescape"), size, mtime


class _MatchedToRef(beam.DoFn):
    def __init__(self, cfg: ConvertConfig, layout: Layout) -> None:
        self._cfg = cfg
        self._layout = layout

    def process(self, listed: tuple[bytes, int, float]) -> Iterator[Any]:
        path, size, mtime = _from_listed(listed)
        relpath = relative_path(path, self._layout.root)
        why = skip_reason(relpath, check_extension=True)
        if why:
            yield beam.pvalue.TaggedOutput(SKIPPED, why)
            return
        out = make_ref(path, relpath, size, self._cfg, self._layout, mtime=mtime)
        yield beam.pvalue.TaggedOutput(REJECTS, out) if isinstance(out, dict) else out


class _OddLocalEntries(beam.DoFn):
    """Entries Beam's local listing passes over silently: directories named like
    images and dangling symlinks. They are listed inputs too, so they become
    ``unreadable`` rejects instead of vanishing. (Glob inputs only: a whole
    folder finds them while listing, see ``_ListTree``.)"""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def process(self, pattern: str) -> Iterator[dict[str, str]]:
        import os

        from apache_beam.io.filesystem import FileSystem

        matcher = re.compile(FileSystem.translate_pattern(pattern))
        for dirpath, dirnames, filenames in os.walk(self._layout.root):
            for name in dirnames:
                path = os.path.join(dirpath, name)
                if matcher.match(path):
                    yield from _odd_directory(path, self._layout.root)
            for name in filenames:
                path = os.path.join(dirpath, name)
                if matcher.match(path):
                    yield from _odd_file(path, self._layout.root)


def _odd_directory(path: str, root: str) -> Iterator[dict[str, str]]:
    """A local directory (or symlink to one) that a listing passes: a reject if it is named like an input."""
    if not skip_reason(relative_path(path, root), check_extension=True):
        yield reject(path, UNREADABLE, "is a directory")


def _odd_file(path: str, root: str) -> Iterator[dict[str, str]]:
    """A local non-directory entry Beam's listing drops (it cannot be stat'ed): a dangling symlink."""
    import os

    if os.path.islink(path) and not os.path.exists(path):
        if not skip_reason(relative_path(path, root), check_extension=True):
            yield reject(path, UNREADABLE, f"dangling symlink to {os.readlink(path)}")


FILES = "files"


# Levels listed one folder at a time before the per-subfolder recursive
# listings: 2 covers root/{split}/{class}/ layouts such as ImageNet's.
FANOUT_DEPTH = 2


def lists_whole_folder(layout: Layout) -> bool:
    """True when the input is a folder (pattern ``root/**``), which is listed fanned out."""
    return bool(layout.pattern) and layout.pattern == FileSystems.join(layout.root, "**")


def _bucket_and_prefix(folder: str) -> tuple[str, str]:
    """gs://bucket/a/b → ("bucket", "a/b/"); the bucket itself → ("bucket", "")."""
    bucket, _, prefix = folder.split("://", 1)[1].partition("/")
    prefix = prefix.rstrip("/")
    return bucket, prefix + "/" if prefix else ""


def not_on_this_worker(folder: str) -> str:
    """The launcher found ``folder`` (its pre-flight checks passed) but the worker listing it does not: a local
    path on a cluster whose workers do not share this machine's disk. Said as such, not as an empty input."""
    import socket

    return (
        f"--input {folder}: no such folder on the worker that lists it (host {socket.gethostname()}), though "
        "the machine that started the run has it: on a cluster every worker must see the input, on a shared "
        "file system mounted at the same path or in gs://"
    )


class _Lister:
    """Direct-entry and recursive listings of a local folder or a gs:// prefix.

    One GCS client per instance (per DoFn instance on a worker), not per call.
    """

    def __init__(self, root: str) -> None:
        self._root = root
        self._gcs: Any = None

    def _client(self) -> Any:
        if self._gcs is None:
            # Beam's GCS file system builds its client from the options the
            # worker was started with (emulator, credentials); reuse it.
            self._gcs = FileSystems.get_filesystem(self._root)._gcsIO().client  # noqa: SLF001
        return self._gcs

    def one_level(self, folder: str) -> Iterator[Any]:
        """Direct entries of ``folder``: subfolders as str, files as TaggedOutput(FILES, FileMetadata),
        odd local entries as TaggedOutput(REJECTS, reject)."""
        from apache_beam.io.filesystem import FileMetadata

        tagged = beam.pvalue.TaggedOutput
        if "://" in folder:
            bucket, prefix = _bucket_and_prefix(folder)
            pages = self._client().list_blobs(bucket, prefix=prefix, delimiter="/")
            for blob in pages:
                updated = blob.updated.timestamp() if blob.updated else 0.0
                yield tagged(FILES, FileMetadata(f"gs://{bucket}/{blob.name}", blob.size or 0, updated))
            for sub in sorted(pages.prefixes):  # complete once every page was read
                yield f"gs://{bucket}/{sub.rstrip('/')}"
            return
        import os

        if folder == self._root and not os.path.isdir(folder):
            raise UsageError(not_on_this_worker(folder))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:  # as os.walk: an unreadable folder lists nothing
            return
        for entry in entries:
            if entry.is_dir():  # follows symlinks, like os.walk's dirnames
                yield from (tagged(REJECTS, r) for r in _odd_directory(entry.path, self._root))
                if not entry.is_symlink():  # os.walk does not descend into a linked folder
                    yield entry.path
                continue
            try:
                yield tagged(FILES, FileMetadata(entry.path, os.path.getsize(entry.path), os.path.getmtime(entry.path)))
            except OSError:
                yield from (tagged(REJECTS, r) for r in _odd_file(entry.path, self._root))

    def tree(self, folder: str) -> Iterator[Any]:
        """Every file below ``folder`` (FileMetadata), odd local entries as TaggedOutput(REJECTS, ...)."""
        from apache_beam.io.filesystem import FileMetadata

        if "://" in folder:
            bucket, prefix = _bucket_and_prefix(folder)
            for blob in self._client().list_blobs(bucket, prefix=prefix):
                updated = blob.updated.timestamp() if blob.updated else 0.0
                yield FileMetadata(f"gs://{bucket}/{blob.name}", blob.size or 0, updated)
            return
        import os

        tagged = beam.pvalue.TaggedOutput
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in dirnames:
                yield from (tagged(REJECTS, r) for r in _odd_directory(os.path.join(dirpath, name), self._root))
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    yield FileMetadata(path, os.path.getsize(path), os.path.getmtime(path))
                except OSError:  # Beam's listing drops it too
                    yield from (tagged(REJECTS, r) for r in _odd_file(path, self._root))


def _folder_bytes(folder: str) -> bytes:
    """A folder path as it crosses a shuffle: bytes, since a local name may not be valid UTF-8."""
    return folder.encode("utf-8", "surrogateescape")


def _folder_text(folder: bytes) -> str:
    return folder.decode("utf-8", "surrogateescape")


class _ListOneLevel(beam.DoFn):
    """folder (bytes) → its subfolders (main, bytes), its files (FILES), odd local entries (REJECTS)."""

    def __init__(self, root: str) -> None:
        self._root = root

    def setup(self) -> None:
        self._lister = _Lister(self._root)

    def process(self, folder: bytes) -> Iterator[Any]:
        for out in self._lister.one_level(_folder_text(folder)):
            yield _folder_bytes(out) if isinstance(out, str) else out


class _ListTree(beam.DoFn):
    """folder (bytes) → every file below it (FileMetadata, streamed), odd local entries (REJECTS)."""

    def __init__(self, root: str) -> None:
        self._root = root

    def setup(self) -> None:
        self._lister = _Lister(self._root)

    def process(self, folder: bytes) -> Iterator[Any]:
        yield from self._lister.tree(_folder_text(folder))


class ListFolder(beam.PTransform):
    """pbegin → {FILES: FileMetadata of every file under ``root``, REJECTS: odd local entries}."""

    def __init__(self, root: str, depth: int = FANOUT_DEPTH) -> None:
        super().__init__()
        self._root = root
        self._depth = depth

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        folders = pbegin | "Root" >> beam.Create([_folder_bytes(self._root)])
        files, odd = [], []
        for level in range(self._depth):
            out = folders | f"ListLevel{level}" >> beam.ParDo(_ListOneLevel(self._root)).with_outputs(
                FILES, REJECTS, main="folders"
            )
            files.append(out[FILES])
            odd.append(out[REJECTS])
            # one element per subfolder: different workers list different subfolders
            folders = out.folders | f"SpreadFolders{level}" >> beam.Reshuffle()
        trees = folders | "ListTrees" >> beam.ParDo(_ListTree(self._root)).with_outputs(REJECTS, main=FILES)
        files.append(trees[FILES])
        odd.append(trees[REJECTS])
        return {
            FILES: tuple(files) | "AllFiles" >> beam.Flatten(),
            REJECTS: tuple(odd) | "AllOddEntries" >> beam.Flatten(),
        }


# Elements per batch when spreading a listing: a Reshuffle of single
# elements costs the local runner a shuffle key and a list per element, all
# in memory; batches cut that to the encoded elements, and 1 M files still
# make 10,000 batches for Dataflow to spread.
SPREAD_BATCH = 100


class SpreadInBatches(beam.PTransform):
    """Breaks fusion and spreads a PCollection over the workers, in batches of SPREAD_BATCH."""

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (
            pcoll
            | "Batch" >> beam.BatchElements(min_batch_size=SPREAD_BATCH, max_batch_size=SPREAD_BATCH)
            # [element]: batches of one bundle, so a retried bundle re-sends the same elements
            | "Reshuffle" >> beam.Reshuffle()
            | "Unbatch" >> beam.FlatMap(lambda batch: batch)
        )
