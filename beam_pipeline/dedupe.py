"""``--dedupe``: one record per distinct content, across splits.

Each ref's bytes are hashed (one extra read, no decode); refs are grouped by
sha256 — only the digest and the ref cross the shuffle — and the copy whose
relative path sorts first is kept. The others become ``duplicate`` rejects
naming the kept copy.

The refs arrive spread over the workers (``ListInputs`` ends in a
Reshuffle), so the hashing runs in parallel on every worker, never on the
one that listed the folder. Which copy is kept depends only on the paths,
not on the order or the worker the copies arrive in, so a retried bundle or
a re-run keeps the same one.

    kept, rejects = refs | DropDuplicates()
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations

from .sources.rules import REJECTS
from .vocab.reasons import DUPLICATE
from .vocab.refs import Ref, as_ref, reject

_CHUNK = 1 << 20


def content_digest(path: str) -> str | None:
    """sha256 hex of the file, or None if it cannot be read (the writer reports why)."""
    digest = hashlib.sha256()
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    except Exception:  # noqa: BLE001 - unreadable files are judged by the writer
        return None
    return digest.hexdigest()


def _keyed(ref: Ref) -> tuple[str, Ref]:
    digest = content_digest(ref.path)
    return (digest if digest is not None else f"unreadable:{ref.path}"), ref


def _order(ref: Ref) -> tuple[str, str]:
    return ref.relpath, ref.path


def split_duplicates(element: tuple[str, Iterable[Ref]]) -> Iterator[Any]:
    """(digest, refs) → the first ref by relative path; the rest as tagged duplicate rejects.

    Two passes over the grouped refs instead of sorting them: a runner may
    stream a large group (a million copies of one blank image) from its
    shuffle, and the passes keep only the kept ref in memory.
    """
    _, refs = element
    keep = min(refs, key=_order)
    yield keep
    kept, passed_keep = _order(keep), False
    for other in refs:
        if not passed_keep and _order(other) == kept:  # a manifest may list one path twice
            passed_keep = True
            continue
        yield beam.pvalue.TaggedOutput(REJECTS, reject(other.path, DUPLICATE, f"same bytes as {keep.relpath}"))


class DropDuplicates(beam.PTransform):
    """refs → (kept refs, duplicate rejects)."""

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        out = (
            refs
            | "Digest" >> beam.Map(_keyed)
            # (sha256, Ref): only digests and references cross the shuffle
            | "GroupByContent" >> beam.GroupByKey()
            | "KeepFirst" >> beam.FlatMap(split_duplicates).with_outputs(REJECTS, main="kept")
        )
        return out.kept | "Kept" >> beam.Map(as_ref).with_output_types(Ref), out[REJECTS]
