"""Finalize: runs once, after every shard is written, inside the run's staging folder.

Temp shards get their final names (empty shards dropped, the rest numbered),
the rejects parts are streamed into one ``rejects.jsonl``, then
``labels.txt``, the index files and ``dataset.json`` are written; then, when
the run has no post-steps, it is published (``run.publish``).

Every step may run again with the same inputs (Dataflow retries a bundle that
failed half-way, and re-runs a step whose output was lost): renames are
"source gone and destination present = done", and what an earlier attempt
wrote is rewritten the same. Renames and deletes on GCS go in batches through
one client per process; what exists is learnt from one listing of the staging
folder and one of the output, not one request per file.
"""

from __future__ import annotations

import collections
import json
import logging
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from .. import failpoints, index, lease, metadata, resume
from ..annotations import masks, objects
from ..config import ConvertConfig, Layout, settings_for
from ..errors import one_line
from ..hashing import part_of
from ..metadata import NEAR_DUPLICATES_JSONL, REJECT_PARTS
from ..near_duplicates import DEFAULT_DISTANCE, merge_parts
from ..storage import files_under, write_text
from ..vocab.dataset_info import DatasetInfo, ShardEntry, SplitInfo
from ..vocab.records import SIZE_BUCKETS, UNKNOWN_SIZE, ShardResult, choose_results
from ..vocab.refs import RejectRow
from .changes import CLASS_DROPPED, dropped_class, night_changes
from .files import delete_files, move_files
from .outcome import OK, counted_rejects, detection_summary, incremental_summary, outcome, resumed_summary
from .publish import publish, published_run

_LOG = logging.getLogger(__name__)

# The rejects part files (run.publish.REJECT_PARTS): one per hash bucket of the path.
REJECT_BUCKETS = 256


def final_layout(
    chosen: Mapping[tuple[str, int], ShardResult], name: str, compression: str, fmt: str = "tfrecord"
) -> dict[str, list[tuple[str, ShardResult]]]:
    """{split: [(final file name, result)]}, empty shards dropped, numbered from 0."""
    by_split: dict[str, list[ShardResult]] = collections.defaultdict(list)
    for (split, _), result in sorted(chosen.items()):
        if result.records > 0:
            by_split[split].append(result)
    return {
        split: [
            (metadata.shard_name(name, split, i, len(results), compression, fmt), result)
            for i, result in enumerate(results)
        ]
        for split, results in sorted(by_split.items())
    }


def rename_idempotent(src: str, dst: str) -> None:
    """Renames src → dst; a retry that finds src gone and dst present is done already."""
    existing = {p for p in (src, dst) if FileSystems.exists(p)}
    move_files([(src, dst)], existing, "finalize.rename")


def merge_counts(dicts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: collections.Counter[str] = collections.Counter()
    for d in dicts:
        total.update(d)
    return dict(sorted(total.items()))


def reject_bucket(path: str) -> int:
    """Which rejects part a reject goes to (a hash of its path: the same on every attempt)."""
    return part_of(path, REJECT_BUCKETS)


class WriteRejectPartFn(beam.DoFn):
    """(bucket, [reject]) → one part file of rejects.jsonl in the staging folder; yields its path.

    The part's name depends on the bucket only and its lines are sorted, so a
    retried bundle rewrites the same bytes. Memory: one bucket's rejects
    (1/REJECT_BUCKETS of them).
    """

    def __init__(self, staging: str, folder: str = "") -> None:
        self._staging = staging
        self._folder = folder  # "objects": parts of object_rejects.jsonl

    def process(self, element: tuple[int, Iterable[RejectRow]]) -> Iterator[str]:
        bucket, rejects = element
        path = FileSystems.join(self._staging, REJECT_PARTS, *filter(None, [self._folder]), f"part-{bucket:05d}.jsonl")
        failpoints.hit("rejects.write")
        write_text(path, metadata.rejects_jsonl(rejects))
        yield path


def concat_files(parts: Sequence[str], dest: str) -> None:
    """Streams the parts, in order, into one file (never more than a buffer in memory)."""
    with FileSystems.create(dest, compression_type="uncompressed") as out:
        for part in parts:
            with FileSystems.open(part, compression_type="uncompressed") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)


def write_dataset_index(layout: Mapping[str, list[tuple[str, ShardResult]]], staging: str) -> None:
    """index.jsonl from the chosen shards' index parts, in published shard order.

    Only the planned sink's writers make parts; without them (``--sink
    write_to_tfrecord``) there is no index. A retried finalize rewrites the
    same file: the parts stay until the staging folder is removed.
    """
    parts = [(r.index_path, final) for files in layout.values() for final, r in files if r.index_path]
    if not parts:
        return
    failpoints.hit("finalize.write")
    index.write_index(parts, FileSystems.join(staging, index.INDEX_JSONL))


def write_detection_files(staging: str, categories: Sequence[tuple[int, str]], object_parts: Sequence[str]) -> None:
    """labels.txt (line k = category id k), label_map.pbtxt and object_rejects.jsonl into the staging folder."""
    failpoints.hit("finalize.write")
    lines = objects.labels_lines(categories)
    write_text(FileSystems.join(staging, metadata.LABELS_TXT), "".join(f"{name}\n" for name in lines))
    failpoints.hit("finalize.write")
    write_text(FileSystems.join(staging, objects.LABEL_MAP_PBTXT), objects.label_map_pbtxt(categories))
    failpoints.hit("finalize.write")
    concat_files(sorted(set(object_parts)), FileSystems.join(staging, objects.OBJECT_REJECTS_JSONL))


@dataclass(frozen=True)
class FinalizeSettings:
    """What the finalize worker sees of the run's settings: names, the reject limits, whether it publishes,
    and the config block of dataset.json (``ConvertConfig.as_dict()``, computed on the launcher)."""

    output: str
    name: str
    compression: str
    format: str
    seed: int
    sink: str
    multi_label: bool  # --label-separator given
    max_reject_fraction: float
    reject_allowance: int
    detach: bool
    needs_post_steps: bool
    change_share: float
    max_class_drop: float | None
    report: bool
    config: Mapping[str, Any]

    @classmethod
    def of(cls, cfg: ConvertConfig) -> FinalizeSettings:
        """Built on the launcher, from the run's config."""
        return settings_for(cls, cfg, multi_label=cfg.label_separator is not None, config=cfg.as_dict())


class FinalizeFn(beam.DoFn):
    """Runs once: names the shards, writes the metadata into the staging folder, publishes.

    Yields dataset.json's record (``DatasetInfo``). With post-steps (TFT analysis, TFDS
    metadata) those publish after them; a run that may not publish (too many
    rejects, nothing converted) leaves an older dataset untouched.

    Side inputs stay small whatever the input size: one result per shard,
    one rejects part path per non-empty hash bucket, counts per reason.
    """

    def __init__(self, settings: FinalizeSettings, layout: Layout) -> None:
        self._settings = settings
        self._layout = layout

    def process(
        self,
        _: Any,
        results: Sequence[ShardResult],
        reject_parts: Sequence[str],
        reject_counts: Sequence[tuple[str, int]],
        skipped_counts: Sequence[tuple[str, int]],
        labels: Sequence[str],
        extra_types: Mapping[str, str],
        split_label_counts: Mapping[str, Mapping[str | None, int]],  # label None: unlabelled records
        changes: Mapping[str, Any] | None = None,
        labelled: bool | None = None,  # whether the run is labelled, when the pipeline decided it (JSONL rows)
        object_parts: Sequence[str] = (),  # a detection dataset's object rejects parts
        object_counts: Sequence[tuple[str, int]] = (),  # and its object counts (annotations.coco.COUNTS)
        near_parts: Sequence[str] | None = None,  # near_duplicates.jsonl's sorted parts (None: not searched)
        near_summary: Mapping[str, Any] | None = None,  # dataset.json's near_duplicates block
    ) -> Iterator[DatasetInfo]:
        staging = self._layout.tmp_dir
        done = published_run(self._settings.output, staging, self._layout.run_id, self._layout.leased)
        if done is not None:  # a retried step whose run is published, or half-published and now finished
            yield done
            return
        chosen = choose_results(results)
        layout = final_layout(chosen, self._settings.name, self._settings.compression, self._settings.format)
        labelled = self._layout.label_source != "none" if labelled is None else labelled
        categories = self._categories(labels)
        info = self._describe(
            chosen,
            layout,
            labelled,
            labels,
            extra_types,
            split_label_counts,
            reject_counts,
            skipped_counts,
            categories,
            object_counts,
        )
        if near_parts is not None:
            info = info.with_(near_duplicates=near_summary)
        if self._layout.previous:
            incremental = incremental_summary(self._layout.previous, changes or {}, layout, chosen.values())
            info = info.with_(incremental=incremental)
            cfg = self._settings
            info = info.with_(
                changes=night_changes(self._layout.previous, info, cfg.change_share, near_parts, cfg.max_class_drop)
            )
        info = info.with_(resumed=resumed_summary(layout, staging))
        total_rejects = sum(counted_rejects(info.rejects.by_reason).values())
        status = outcome(
            info.examples,
            total_rejects,
            self._settings.max_reject_fraction,
            self._settings.reject_allowance,
            info.objects,
        )
        if status == OK and dropped_class(info.changes, self._settings.max_class_drop):
            status = CLASS_DROPPED
        info = info.with_(status=status, run_id=self._layout.run_id)
        name_shards(layout, staging)
        if near_parts is not None:  # after name_shards (which clears the staging folder), before dataset.json
            failpoints.hit("finalize.write")
            distance = (near_summary or {}).get("max_distance", DEFAULT_DISTANCE)
            merge_parts(near_parts, FileSystems.join(staging, NEAR_DUPLICATES_JSONL), distance)
        info = self._write_metadata(info, layout, reject_parts, labels if labelled else None, categories, object_parts)
        self._publish_or_hold(info)
        yield info

    def _categories(self, labels: Sequence[str]) -> Sequence[tuple[int, str]] | None:
        """A detection dataset's (id, name) categories: COCO's, or a names-only source's from the label list."""
        if self._layout.object_names:  # a names-only source: the run's label list names the ids
            # a --labels-file (the fixed list) is the prior list of its own gaps, as an earlier run's labels.txt
            prior = self._layout.labels or self._layout.prior_labels or ()
            return objects.categories_from_labels(labels, prior)
        return self._layout.categories

    def _describe(
        self,
        chosen: Mapping[tuple[str, int], ShardResult],
        layout: Mapping[str, list[tuple[str, ShardResult]]],
        labelled: bool,
        labels: Sequence[str],
        extra_types: Mapping[str, str],
        split_label_counts: Mapping[str, Mapping[str | None, int]],  # label None: unlabelled records
        reject_counts: Sequence[tuple[str, int]],
        skipped_counts: Sequence[tuple[str, int]],
        categories: Sequence[tuple[int, str]] | None,
        object_counts: Sequence[tuple[str, int]],
    ) -> DatasetInfo:
        """dataset.json's content: splits and their shards, labels, features, objects, rejects and skips (in
        this order: the file's key order is part of the output)."""
        cfg = self._settings
        splits: dict[str, SplitInfo] = {}
        for split, files in layout.items():
            label_counts = split_label_counts.get(split) or merge_counts(r.labels for _, r in files)
            splits[split] = SplitInfo(
                examples=sum(r.records for _, r in files),
                bytes=sum(r.bytes for _, r in files),
                num_shards=len(files),
                shards=tuple(ShardEntry(file=f, records=r.records, bytes=r.bytes) for f, r in files),
                labels=dict(label_counts) if labelled else None,
            )
        info = metadata.dataset_json(
            name=cfg.name,
            splits=splits,
            labels=list(labels) if labelled else None,
            extra_types=extra_types,
            compression=cfg.compression,
            seed=cfg.seed,
            config=cfg.config,
            rejects=dict(sorted(reject_counts, key=lambda kv: (-kv[1], kv[0]))),
            skipped=dict(sorted(skipped_counts, key=lambda kv: (-kv[1], kv[0]))),
            sink=cfg.sink,
            multi_label=cfg.multi_label,
        )
        info = self._describe_objects(info, layout, categories, object_counts)
        info = info.with_(converted=merge_counts(r.converted for files in layout.values() for _, r in files))
        sizes = merge_counts(r.sizes for files in layout.values() for _, r in files)
        if sizes:  # the planned sink's writers count them
            order = {name: i for i, name in enumerate((*SIZE_BUCKETS, UNKNOWN_SIZE))}
            ordered = sorted(sizes.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
            info = info.with_(image_sizes={"shorter_side": dict(ordered)})
        empty = sorted({split for split, _ in chosen} - set(layout))
        if empty:  # listed files, every one rejected: no shard, so no split, and a reader asking for it fails
            info = info.with_(empty_splits=tuple(empty))
        if any(r.idx_path for files in layout.values() for _, r in files):
            # per shard: offset and frame size of each record
            info = info.with_(idx_files=f"{index.IDX_DIR}/{{file}}.idx")
        return info

    def _describe_objects(
        self,
        info: DatasetInfo,
        layout: Mapping[str, list[tuple[str, ShardResult]]],
        categories: Sequence[tuple[int, str]] | None,
        object_counts: Sequence[tuple[str, int]],
    ) -> DatasetInfo:
        """A detection or segmentation dataset's additions to dataset.json: object counts and features."""
        if categories is not None:
            # the planned sink's writers counted the objects of the records they wrote, per shard
            written = [kv for files in layout.values() for _, r in files for kv in r.objects.items()]
            found, counted = detection_summary(categories, [*object_counts, *written])
            features = dict(sorted({**info.features, **objects.feature_spec()}.items()))
            info = info.with_(categories=found, objects=counted, features=features)
        if self._layout.masks:
            info = info.with_(features=dict(sorted({**info.features, **masks.feature_spec()}.items())))
        return info

    def _write_metadata(
        self,
        info: DatasetInfo,
        layout: Mapping[str, list[tuple[str, ShardResult]]],
        reject_parts: Sequence[str],
        labels: Sequence[str] | None,
        categories: Sequence[tuple[int, str]] | None,
        object_parts: Sequence[str],
    ) -> DatasetInfo:
        """The index, rejects.jsonl, labels.txt, the detection files, report.html (--report), and dataset.json
        last; returns ``info`` as dataset.json holds it."""
        staging = self._layout.tmp_dir
        write_dataset_index(layout, staging)
        failpoints.hit("finalize.write")
        concat_files(sorted(set(reject_parts)), FileSystems.join(staging, metadata.REJECTS_JSONL))
        if labels is not None:
            failpoints.hit("finalize.write")
            write_text(FileSystems.join(staging, metadata.LABELS_TXT), "".join(f"{label}\n" for label in labels))
        if categories is not None:
            write_detection_files(staging, categories, object_parts)
        if self._settings.report:  # the page of the staged dataset, published with it
            info = info.with_(report=self._write_report(info))
        failpoints.hit("finalize.write")
        write_text(FileSystems.join(staging, metadata.DATASET_JSON), info.to_text())
        return info

    def _write_report(self, info: DatasetInfo) -> dict[str, Any]:
        """Draws report.html from the staged files (all but dataset.json, whose ``info`` it is given); returns
        dataset.json's ``report``. The page is a view of the dataset, not part of it: a page that cannot be drawn
        (a bug, a record its code cannot read) is named there and in the summary, and the dataset publishes."""
        staging = self._layout.tmp_dir
        failpoints.hit("finalize.write")
        page = FileSystems.join(staging, metadata.REPORT_HTML)
        try:
            from ..report import write_report  # matplotlib: only for a run that asks for the page

            counts = write_report(staging, info, page, seed=self._settings.seed, shown_as=self._settings.output)
        except Exception as e:  # noqa: BLE001 - any failure of the page: said in dataset.json, never a lost dataset
            _LOG.warning("report.html not written: %s", e, exc_info=True)
            # A write cut short: no half page is published. A delete that fails fails the step, as any of
            # finalize's writes does, and its retry draws the page again.
            delete_files([page])
            return {"file": None, "error": f"{type(e).__name__}: {one_line(e)}"}
        return {"file": metadata.REPORT_HTML, **counts}

    def _publish_or_hold(self, info: DatasetInfo) -> None:
        """Publishes a run without post-steps; a run that may not publish goes into an empty output without
        ``_SUCCESS``, or stays in its staging folder beside the dataset it leaves untouched."""
        cfg, out_dir, staging, leased = self._settings, self._settings.output, self._layout.tmp_dir, self._layout.leased
        if info.status != OK:
            if not FileSystems.exists(FileSystems.join(out_dir, metadata.SUCCESS)):
                # Nothing to protect: the shards, rejects.jsonl and dataset.json
                # (which names the status) go where the user looks, but no
                # _SUCCESS marks them complete. An existing dataset stays
                # untouched and this run stays in its staging folder.
                publish(staging, out_dir, complete=False, leased=leased)
            elif cfg.detach:  # nothing to publish, and the launcher that took the lease is gone: give it up here
                lease.release(out_dir, self._layout.run_id)
        elif not cfg.needs_post_steps:
            publish(staging, out_dir, leased=leased)


def name_shards(layout: Mapping[str, list[tuple[str, ShardResult]]], staging: str) -> None:
    """Temp shards (and their .idx files) get their final names inside the staging folder: one listing,
    batched renames; what a retried or empty writer left there goes. The rejects parts stay until the
    staging folder is removed."""
    prefix = staging.rstrip("/") + "/"
    in_staging = set(files_under(staging))
    pairs = [
        (result.tmp_path, FileSystems.join(staging, final)) for files in layout.values() for final, result in files
    ]
    pairs += [
        (result.idx_path, FileSystems.join(staging, index.IDX_DIR, final + ".idx"))
        for files in layout.values()
        for final, result in files
        if result.idx_path
    ]
    # Where each shard goes, for a later run that resumes from this one if it dies before publishing.
    # Only while there is a shard to rename: a late attempt whose run published (and removed its staging
    # folder) meanwhile must not recreate that folder; an earlier attempt wrote it before renaming.
    if any(src in in_staging for src, _ in pairs):
        resume.write_atomic(
            FileSystems.join(staging, resume.DONE, resume.RENAMED),
            "".join(json.dumps({"from": src, "to": dst}) + "\n" for src, dst in pairs),
        )
    move_files(pairs, in_staging, "finalize.rename")
    keep = {dst for _, dst in pairs}
    parts = (REJECT_PARTS + "/", index.INDEX_PARTS + "/", *resume.SCRATCH_ONLY)
    delete_files([p for p in files_under(staging) if p not in keep and not p[len(prefix) :].startswith(parts)])
