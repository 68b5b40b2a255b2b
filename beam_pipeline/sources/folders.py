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
from apache_beam import coders
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations

from .. import storage
from ..config import Layout
from ..vocab.reasons import (
    UNREADABLE,
)
from ..vocab.refs import RejectRow, reject
from .rules import REJECTS, SKIPPED, ListSettings, make_ref, relative_path, skip_reason

Listed = tuple[bytes, int, float]


def _listed(path: str, size: int, mtime: float | None) -> Listed:
    """(path as bytes, size, mtime): a listed file, as the listing yields it and as it crosses the shuffle.

    Bytes, not text: a local name that is not valid UTF-8 (kept by Python as
    lone surrogates) would fail Beam's UTF-8 string coder; the ref step turns
    it into a ``bad_filename`` reject. A tuple, not Beam's FileMetadata: that
    one has no coder of its own and is pickled, 175 bytes against 61 for a
    tile's path, held by the local runner for every listed file.
    """
    return path.encode("utf-8", "surrogateescape"), int(size), float(mtime or 0.0)


def _to_listed(metadata: Any) -> Listed:
    """A glob match's FileMetadata as a listed file."""
    return _listed(metadata.path, metadata.size_in_bytes, getattr(metadata, "last_updated_in_seconds", 0.0))


def _from_listed(listed: Listed) -> tuple[str, int, float]:
    path, size, mtime = listed
    return path.decode("utf-8", "surrogateescape"), size, mtime


class _MatchedToRef(beam.DoFn):
    def __init__(self, settings: ListSettings, layout: Layout) -> None:
        self._settings = settings
        self._layout = layout

    def process(self, listed: Listed) -> Iterator[Any]:
        path, size, mtime = _from_listed(listed)
        relpath = relative_path(path, self._layout.root)
        why = skip_reason(relpath, check_extension=True)
        if why:
            yield beam.pvalue.TaggedOutput(SKIPPED, why)
            return
        out = make_ref(path, relpath, size, self._settings, self._layout, mtime=mtime)
        yield beam.pvalue.TaggedOutput(REJECTS, out) if isinstance(out, dict) else out


class _OddLocalEntries(beam.DoFn):
    """Entries Beam's local listing passes over silently: directories named like
    images and dangling symlinks. They are listed inputs too, so they become
    ``unreadable`` rejects instead of vanishing. (Glob inputs only: a whole
    folder finds them while listing, see ``_ListTree``.)"""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def process(self, pattern: str) -> Iterator[RejectRow]:
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


def _odd_directory(path: str, root: str) -> Iterator[RejectRow]:
    """A local directory (or symlink to one) that a listing passes: a reject if it is named like an input."""
    if not skip_reason(relative_path(path, root), check_extension=True):
        yield reject(path, UNREADABLE, "is a directory")


def _odd_file(path: str, root: str) -> Iterator[RejectRow]:
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


class _Lister:
    """Direct-entry and recursive listings of a local folder or a gs:// prefix (storage's backend for it)."""

    def __init__(self, root: str, flag: str = "--input") -> None:
        self._root = root
        self._flag = flag  # the flag that named root, for a worker that does not see it
        self._backend = storage.backend_for(root)

    def one_level(self, folder: str) -> Iterator[Any]:
        """Direct entries of ``folder``: subfolders as str, files as TaggedOutput(FILES, listed file),
        odd local entries as TaggedOutput(REJECTS, reject)."""
        tagged = beam.pvalue.TaggedOutput
        if folder == self._root:
            storage.check_folder_on_worker(folder, self._flag)
        for entry in self._backend.one_level(folder, self._odd):
            if isinstance(entry, str):
                yield entry
            elif isinstance(entry, tuple):
                yield tagged(FILES, _listed(*entry))
            else:
                yield tagged(REJECTS, entry)

    def tree(self, folder: str) -> Iterator[Any]:
        """Every file below ``folder`` (listed files), odd local entries as TaggedOutput(REJECTS, ...)."""

        tagged = beam.pvalue.TaggedOutput
        for entry in self._backend.tree(folder, self._odd):
            yield _listed(*entry) if isinstance(entry, tuple) else tagged(REJECTS, entry)

    def _odd(self, path: str, is_dir: bool) -> Iterator[Any]:
        """Rejects of an odd local entry (a folder or file the listing cannot take)."""
        return _odd_directory(path, self._root) if is_dir else _odd_file(path, self._root)


def _folder_bytes(folder: str) -> bytes:
    """A folder path as it crosses a shuffle: bytes, since a local name may not be valid UTF-8."""
    return folder.encode("utf-8", "surrogateescape")


def _folder_text(folder: bytes) -> str:
    return folder.decode("utf-8", "surrogateescape")


class _ListOneLevel(beam.DoFn):
    """folder (bytes) → its subfolders (main, bytes), its files (FILES), odd local entries (REJECTS)."""

    def __init__(self, root: str, flag: str) -> None:
        self._root = root
        self._flag = flag

    def setup(self) -> None:
        self._lister = _Lister(self._root, self._flag)

    def process(self, folder: bytes) -> Iterator[Any]:
        for out in self._lister.one_level(_folder_text(folder)):
            yield _folder_bytes(out) if isinstance(out, str) else out


class _ListTree(beam.DoFn):
    """folder (bytes) → every file below it (listed files, streamed), odd local entries (REJECTS)."""

    def __init__(self, root: str) -> None:
        self._root = root

    def setup(self) -> None:
        self._lister = _Lister(self._root)  # only below a root _ListOneLevel found

    def process(self, folder: bytes) -> Iterator[Any]:
        yield from self._lister.tree(_folder_text(folder))


class ListFolder(beam.PTransform):
    """pbegin → {FILES: every file under ``root`` as (path bytes, size, mtime), REJECTS: odd local entries}."""

    def __init__(self, root: str, depth: int = FANOUT_DEPTH, flag: str = "--input") -> None:
        super().__init__()
        self._root = root
        self._depth = depth
        self._flag = flag  # the flag that named root: a worker that does not see it says so

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        folders = pbegin | "Root" >> beam.Create([_folder_bytes(self._root)])
        files, odd = [], []
        for level in range(self._depth):
            out = folders | f"ListLevel{level}" >> beam.ParDo(_ListOneLevel(self._root, self._flag)).with_outputs(
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


# A batch of listed files as it crosses the spreading shuffle: one bytes object.
# The local runner keeps a shuffle's values decoded until they are read, ~200
# bytes of Python objects per listed file against ~60 encoded.
LISTED_BATCH_CODER = coders.ListCoder(
    coders.TupleCoder([coders.BytesCoder(), coders.VarIntCoder(), coders.FloatCoder()])
)


def _pack(batch: list[Listed]) -> bytes:
    return LISTED_BATCH_CODER.encode(batch)


def _unpack(packed: bytes) -> list[Listed]:
    return LISTED_BATCH_CODER.decode(packed)


class SpreadInBatches(beam.PTransform):
    """Breaks fusion and spreads listed files over the workers, in batches of SPREAD_BATCH, each one bytes."""

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (
            pcoll
            | "Batch" >> beam.BatchElements(min_batch_size=SPREAD_BATCH, max_batch_size=SPREAD_BATCH)
            # [element]: batches of one bundle, so a retried bundle re-sends the same elements
            | "Pack" >> beam.Map(_pack).with_output_types(bytes)
            | "Reshuffle" >> beam.Reshuffle()
            | "Unbatch" >> beam.FlatMap(_unpack).with_output_types(Listed)
        )
