"""Listing: turn a folder, glob or manifest into references, inside the pipeline.

Only the glob or the manifest path enters the job graph; the listing itself
happens on a worker (``fileio.MatchAll`` / a manifest-reading DoFn), so a
million-file input never becomes a giant ``beam.Create``.

Each listed file becomes a ``Ref`` (path, relative path, size, split, label,
shuffle key, extra manifest columns), a reject (``no_label``,
``unknown_label``, ``no_split``, ``missing``, ``duplicate_row``) or a skip
(not an image extension, hidden or OS file).

A manifest's label and split columns are those of any row (a combine over
every row, not a first look), and a file named by several rows keeps one of
them, the first by canonical JSON, whatever the rows' order.

    listed = pipeline | ListInputs(ListSettings.of(cfg), layout)
    listed["refs"], listed["rejects"], listed["skipped"]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.typehints.decorators import no_annotations

from .. import storage
from ..config import Layout
from ..vocab.refs import Ref, as_ref
from .folders import FILES, ListFolder, SpreadInBatches, _MatchedToRef, _OddLocalEntries, _to_listed, lists_whole_folder
from .manifest import (
    ReservedColumnsSeen,
    Sources,
    _KeyRowByPath,
    _ReadManifest,
    _StatManifestRow,
    first_row,
    manifest_sources,
)
from .rules import REJECTS, SKIPPED, ListSettings

# A manifest row naming a file an earlier row (by canonical JSON) names too.


# ---- listing a whole folder, fanned out --------------------------------------
#
# A folder input is listed level by level: the root's direct entries, then
# each subfolder's direct entries (one element per folder, spread over
# workers by a Reshuffle), and below FANOUT_DEPTH one recursive listing per
# remaining subfolder. No worker holds the whole listing, the list calls of
# different subfolders run on different workers, and what comes out is
# exactly what ``fileio.MatchAll`` of ``root/**`` lists (same paths, sizes,
# skipped entries), streamed instead of collected into one list.


class ListInputs(beam.PTransform):
    """pipeline → {"refs": Ref, "rejects": {path, reason, detail}, "skipped": reason text, "sources": Sources}.

    Listed files (or manifest rows) cross a shuffle before any per-file
    work: turning them into refs, the manifest's per-row lookups, dedupe's
    hashing, planning and labels are not fused with the listing and run
    spread over the workers. A manifest's rows cross it grouped by the file
    they name, which finds duplicate rows on the way. ``sources`` is one
    element: the run's split and label sources, for a manifest decided over
    every row (the launcher has only looked at its first rows).
    """

    def __init__(
        self, settings: ListSettings, layout: Layout, group_rows: Callable[[Any], Iterator[Any]] | None = None
    ) -> None:
        super().__init__()
        self._settings = settings  # what the workers see of the run's settings (built by ListSettings.of)
        self._layout = layout
        # A manifest file's rows → what StatRows takes ((path, row), or (path, row, annotations)): first_row,
        # or an annotation source's grouping of an image's object rows (annotations.table.GroupObjectRows.group).
        self._group_rows = group_rows or first_row

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        layout = self._layout
        if layout.manifest:
            return self._expand_manifest(pbegin)
        # files as (path bytes, size, mtime): the smallest element that still makes a Ref
        if lists_whole_folder(layout):
            folder = pbegin | "ListFolder" >> ListFolder(layout.root)
            files, odd = folder[FILES], folder[REJECTS]
        else:  # a glob: one match, which is how far the user's pattern can be split
            glob = pbegin | "Glob" >> beam.Create([layout.pattern])
            files = glob | "Match" >> fileio.MatchAll() | "PathAndSize" >> beam.Map(_to_listed)
            # Beam's listing passes odd entries over only on a local disk
            local = not storage.is_remote(layout.root)
            odd = glob | "OddLocalEntries" >> beam.ParDo(_OddLocalEntries(layout)) if local else None
        # the fusion break after listing: everything per file comes after it
        spread = files | "SpreadFiles" >> SpreadInBatches()
        listed = spread | "ToRefs" >> beam.ParDo(_MatchedToRef(self._settings, layout)).with_outputs(
            REJECTS, SKIPPED, main="refs"
        )
        refs = listed.refs | "Refs" >> beam.Map(as_ref).with_output_types(Ref)  # in vocab.refs.RefCoder
        rejects = listed[REJECTS]
        if odd is not None:
            rejects = (rejects, odd) | "ListingRejects" >> beam.Flatten()
        sources = pbegin | "Sources" >> beam.Create([Sources(layout.split_source, layout.label_source)])
        return {"refs": refs, REJECTS: rejects, SKIPPED: listed[SKIPPED], "sources": sources}

    def _expand_manifest(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        cfg, layout = self._settings, self._layout
        rows = (
            pbegin
            | "ManifestPath" >> beam.Create([layout.manifest])
            | "ReadManifest" >> beam.ParDo(_ReadManifest(layout))  # row dicts
        )
        sources = (
            rows
            | "ManifestColumns" >> beam.CombineGlobally(ReservedColumnsSeen())
            # a flag that conflicts with a column some row has fails the run here, naming both
            | "ManifestSources" >> beam.Map(lambda columns: manifest_sources(cfg, columns))
        )
        keyed = rows | "KeyRowsByPath" >> beam.ParDo(_KeyRowByPath(layout)).with_outputs(REJECTS, main="keyed")
        firsts = (
            keyed.keyed
            # (file, [row]): spreads the rows before the per-file lookups, and meets a file's rows
            | "GroupRowsByPath" >> beam.GroupByKey()
            | "FirstRowPerPath" >> beam.FlatMap(self._group_rows).with_outputs(REJECTS, main="rows")
        )
        stat = firsts.rows | "StatRows" >> beam.ParDo(
            _StatManifestRow(cfg, layout), beam.pvalue.AsSingleton(sources)
        ).with_outputs(REJECTS, SKIPPED, main="refs")
        refs = stat.refs | "Refs" >> beam.Map(as_ref).with_output_types(Ref)  # in vocab.refs.RefCoder
        rejects = (keyed[REJECTS], firsts[REJECTS], stat[REJECTS]) | "ManifestRejects" >> beam.Flatten()
        return {"refs": refs, REJECTS: rejects, SKIPPED: stat[SKIPPED], "sources": sources}
