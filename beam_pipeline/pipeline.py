"""The conversion pipeline, built but not run (tests and the launcher drive it).

list ──► refs ──► plan shards ──► group refs by shard ──► write shard ──► finalize ─(reshuffle)─► post-steps
              └─► labels, extra-column types (side inputs)        └─► rejects ──► counts, part files

p = build_pipeline(cfg, layout, options)   # beam.Pipeline, nothing run yet
p.run().wait_until_finish()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import WriteToTFRecord
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.typehints.decorators import no_annotations

from . import index, metadata
from .annotations.coco import COUNTS, OBJECT_REJECTS, JoinCoco
from .annotations.masks import JoinMasks
from .annotations.objects import is_gap, name_labels, object_names
from .annotations.table import CheckManifestObjects, GroupObjectRows
from .annotations.voc import JoinVoc
from .config import ConvertConfig, Layout
from .dedupe import DropDuplicates
from .formats import registry
from .formats.tfrecord import compression_type
from .leaks import DropLeaks
from .near_duplicates import FindNearDuplicates
from .planning import PlanShards, PlanSummary, ShardPlan, SplitPlanSummary
from .run.finalize import FinalizeFn, FinalizeSettings, WriteRejectPartFn, reject_bucket
from .runner import LOCAL_RUNNERS, PORTABLE_RUNNERS, runner_key
from .sources.listing import ListInputs
from .sources.manifest import InferColumnTypes
from .sources.rules import REJECTS, SKIPPED, ListSettings, label_names, with_relative_path
from .storage import read_json
from .vocab.dataset_info import OK, DatasetInfo
from .vocab.records import ShardResult
from .writer import pieces
from .writer.shard import DecodeFn, WriteShardFn


class CollectLabels(beam.PTransform):
    """refs → one element: the label list (line k = id k), or [] for an unlabelled run.

    Sorted, unless ``--labels-file`` fixes the order or ``--incremental-from``
    gives earlier ids to keep (``stable_labels``). ``sources`` (ListInputs'
    one element) says whether the run is labelled: a JSONL manifest's rows
    decide it, after the launcher read the previous run's labels in case.
    """

    def __init__(self, layout: Layout, sources: beam.PCollection) -> None:
        super().__init__()
        self._layout = layout
        self._sources = sources

    def expand(self, refs: beam.PCollection) -> beam.PCollection:
        fixed = self._layout.labels
        if fixed is not None:
            return refs.pipeline | "FixedLabels" >> beam.Create([list(fixed)])
        if self._layout.object_names:  # the objects' class names: 0 background, then 1…N
            return (
                refs
                | "ObjectNames" >> beam.FlatMap(lambda r: object_names(r.annotations))
                | "DistinctNames" >> beam.Distinct()
                | "AllNames" >> beam.combiners.ToList()
                | "SortNames" >> beam.Map(name_labels, self._layout.prior_labels or ())
            )
        return (
            refs
            # every name of a multi-label image; none of an unlabelled one
            | "LabelOf" >> beam.FlatMap(lambda r: label_names(r.label))
            | "DistinctLabels" >> beam.Distinct()
            | "AllLabels" >> beam.combiners.ToList()
            | "SortLabels"
            >> beam.Map(
                lambda found, prior, sources: stable_labels(found, prior) if sources.label != "none" else [],
                self._layout.prior_labels or (),
                beam.pvalue.AsSingleton(self._sources),
            )
        )


def stable_labels(found: list[str], prior: tuple[str, ...] = ()) -> list[str]:
    """The label list: an earlier run's labels keep their ids (line k = id k), new ones follow, sorted.

    A label of the earlier run that no longer has images keeps its id too: a
    model trained on yesterday's ids stays valid.
    """
    known = set(prior)
    return [*prior, *sorted(label for label in set(found) if label not in known)]


def _split_label_counts(pairs: list[tuple[tuple[str, str | None], int]]) -> dict[str, dict[str | None, int]]:
    """[((split, label), n)] → {split: {label: n}}; label None counts a split's unlabelled records."""
    out: dict[str, dict[str | None, int]] = {}
    for (split, label), count in sorted(pairs):
        out.setdefault(split, {})[label] = count
    return out


def build_pipeline(
    cfg: ConvertConfig,
    layout: Layout,
    options: PipelineOptions,
    *,
    runner: Any = None,
    wtt_shards: Mapping[str, int] | None = None,
) -> beam.Pipeline:
    """The whole conversion as one pipeline.

    ``wtt_shards`` ({split: num_shards}) is required for ``--sink
    write_to_tfrecord``: WriteToTFRecord needs its shard count when the graph
    is built, so the launcher runs the planning pipeline first.
    """
    p = beam.Pipeline(runner=runner, options=options)
    listed = _list_refs(p, cfg, layout)
    refs = listed.refs
    labels = refs | "Labels" >> CollectLabels(layout, listed.sources)
    extra_types = refs | "ColumnTypes" >> beam.CombineGlobally(InferColumnTypes())
    if cfg.sink == "planned":
        written = refs | "Write" >> WritePlannedShards(cfg, layout, listed.previous, labels, extra_types)
    else:
        if wtt_shards is None:
            raise ValueError("the write_to_tfrecord sink needs the planned shard counts")
        written = _write_with_write_to_tfrecord(refs, cfg, layout, wtt_shards, labels, extra_types)
    rejects = (listed.rejects, written[REJECTS]) | "Rejects" >> RejectParts(layout)
    near = None
    if cfg.sink == "planned" and cfg.near_duplicates != "off":
        near = written["results"] | "NearDuplicates" >> FindNearDuplicates(layout.tmp_dir, cfg.near_duplicate_distance)
    finalized = p | "Finalize" >> Finalize(
        cfg,
        layout,
        results=written["results"],
        rejects=rejects,
        skipped_counts=listed.skipped_counts,
        labels=labels,
        extra_types=extra_types,
        split_label_counts=written["split_label_counts"],
        changes=listed.changes,
        labelled=listed.labelled,
        objects=_object_parts(listed, layout, written.get(COUNTS)),
        near_duplicates=near,
    )
    _after_finalize(finalized, cfg, layout)
    return p


class Listed(NamedTuple):
    """What the listing stages give the rest of the job (``_list_refs``)."""

    refs: beam.PCollection
    rejects: beam.PCollection
    skipped_counts: beam.PCollection  # (reason, n)
    changes: beam.PCollection | None  # against the previous run (--incremental-from)
    previous: Any  # index.reusable_run: the previous run whose records may be reused, or None
    sources: beam.PCollection  # ListInputs' one element
    labelled: beam.PCollection  # whether the run is labelled
    object_rejects: beam.PCollection | None  # the annotation join's (None without annotations)
    object_counts: beam.PCollection | None


def _list_refs(p: beam.Pipeline, cfg: ConvertConfig, layout: Layout) -> Listed:
    """List, drop duplicates (``--dedupe``), attach annotations (``--coco``, ``--masks``), join the previous run
    (``--incremental-from``)."""
    group_rows = GroupObjectRows(cfg.manifest_objects).group if cfg.manifest_objects else None
    listed = p | "List" >> ListInputs(ListSettings.of(cfg), layout, group_rows)
    refs, rejects, skipped = listed["refs"], listed[REJECTS], listed[SKIPPED]
    if cfg.dedupe:
        refs, duplicates = refs | "Dedupe" >> DropDuplicates()
        rejects = (rejects, duplicates) | "WithDuplicates" >> beam.Flatten()
    object_rejects, object_counts = None, None
    if layout.coco:
        # before the previous run's join: a record is reused only with the same annotations (index.extras_digest)
        joined = refs | "Coco" >> JoinCoco(layout.coco, layout.root, layout.categories or (), cfg.coco_category_offset)
        refs, object_rejects, object_counts = joined["refs"], joined[OBJECT_REJECTS], joined[COUNTS]
        rejects = (rejects, joined[REJECTS]) | "WithAnnotationRejects" >> beam.Flatten()
        skipped = (skipped, joined[SKIPPED]) | "WithAnnotationSkips" >> beam.Flatten()
    elif layout.voc:  # as --coco: before the previous run's join
        joined = refs | "Voc" >> JoinVoc(layout.voc, layout.root, _known_classes(layout))
        refs, object_rejects, object_counts = joined["refs"], joined[OBJECT_REJECTS], joined[COUNTS]
        rejects = (rejects, joined[REJECTS]) | "WithAnnotationRejects" >> beam.Flatten()
        skipped = (skipped, joined[SKIPPED]) | "WithAnnotationSkips" >> beam.Flatten()
    elif cfg.manifest_objects:
        # the objects grouped with their image's rows are checked here, before the previous run's join
        joined = refs | "ManifestObjects" >> CheckManifestObjects(cfg.box_units, _known_classes(layout))
        refs, object_rejects, object_counts = joined["refs"], joined[OBJECT_REJECTS], joined[COUNTS]
        rejects = (rejects, joined[REJECTS]) | "WithObjectRowRejects" >> beam.Flatten()
    elif layout.masks:
        # likewise before the previous run's join: the mask file's size and mtime are in the annotation digest
        joined = refs | "Masks" >> JoinMasks(layout.masks)
        refs = joined["refs"]
        rejects = (rejects, joined[REJECTS]) | "WithMaskRejects" >> beam.Flatten()
        skipped = (skipped, joined[SKIPPED]) | "WithMaskSkips" >> beam.Flatten()
    previous, changes = None, None
    if layout.previous:
        # unchanged files (same path, size, mtime) carry where the previous run stored their record
        # the local runner joins through files in the scratch folder, one bucket of paths at a time
        on_disk = layout.tmp_dir if _refs_path(p.options) == pieces.PACK else None
        joined = refs | "Previous" >> index.JoinPrevious(layout.previous, layout.root, on_disk)
        refs, changes = joined["refs"], joined[index.CHANGES]
        info = DatasetInfo.from_json(read_json(FileSystems.join(layout.previous, metadata.DATASET_JSON)))
        previous = index.reusable_run(layout.previous, info, cfg.as_dict())
    if cfg.near_duplicates == "drop-leaks":
        # after the previous run's join (an unchanged file keeps its hash unread), before labels and planning
        drop = DropLeaks(cfg.image_options, cfg.near_duplicate_distance, reuse=previous is not None)
        refs, leaks = refs | "DropLeaks" >> drop
        rejects = (rejects, leaks) | "WithLeaks" >> beam.Flatten()
    skipped_counts = skipped | "CountSkipReasons" >> beam.combiners.Count.PerElement()
    labelled = listed["sources"] | "IsLabelled" >> beam.Map(lambda s: s.label != "none")
    return Listed(
        refs=refs,
        rejects=rejects,
        skipped_counts=skipped_counts,
        changes=changes,
        previous=previous,
        sources=listed["sources"],
        labelled=labelled,
        object_rejects=object_rejects,
        object_counts=object_counts,
    )


def _known_classes(layout: Layout) -> frozenset[str] | None:
    """The classes a names-only source's objects may name: a --labels-file's (its line 0 is the background)."""
    if layout.labels is None:
        return None
    return frozenset(name for k, name in enumerate(layout.labels) if k > 0 and not is_gap(k, name))


def _object_parts(
    listed: Listed, layout: Layout, written: beam.PCollection | None
) -> dict[str, beam.PCollection] | None:
    """Object rejects as part files (``_rejects/objects/``) and the object counts, for finalize; None without.

    ``written``: the WriteToTFRecord sink's counts of the objects it wrote (the planned sink's shard results
    hold theirs)."""
    if listed.object_rejects is None:
        return None
    parts = (listed.object_rejects,) | "ObjectRejects" >> RejectParts(layout, folder="objects")
    counts = (
        listed.object_counts
        if written is None
        else (listed.object_counts, written) | "WrittenObjects" >> beam.Flatten()
    )
    return {"parts": parts["parts"], "counts": counts}


def _refs_path(options: PipelineOptions) -> str:
    """How a shard's refs reach its writer on this runner (writer/pieces.py): packed files on the local runner,
    whose worker processes all see the run's scratch folder; grouped pieces on Flink and Spark; one
    GroupByKey elsewhere (Dataflow, whose shuffle streams a group to the worker, and any other runner)."""
    name = runner_key(options.view_as(StandardOptions).runner)
    if name in LOCAL_RUNNERS:
        return pieces.PACK
    if name in PORTABLE_RUNNERS:
        return pieces.PIECES
    return pieces.GROUP


class WritePlannedShards(beam.PTransform):
    """refs → shards planned on bytes, written by ``WriteShardFn``: {"results", REJECTS, "split_label_counts"}.

    Only references cross the shuffle; each shard's writer reads its images.
    """

    def __init__(
        self,
        cfg: ConvertConfig,
        layout: Layout,
        previous: index.PreviousRun | None,
        labels: beam.PCollection,
        extra_types: beam.PCollection,
    ) -> None:
        super().__init__()
        self._cfg, self._layout, self._previous = cfg, layout, previous
        self._labels, self._extra_types = labels, extra_types

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> dict[str, beam.PCollection]:
        cfg, layout = self._cfg, self._layout
        plans = refs | "Plan" >> PlanShards(cfg.target_shard_bytes)
        how = _refs_path(refs.pipeline.options)
        written = pieces.group_refs_by_shard(refs, plans, layout.tmp_dir, how) | "WriteShards" >> beam.ParDo(
            WriteShardFn(
                layout.tmp_dir,
                cfg.compression,
                cfg.decode_threads,
                cfg.image_options,
                self._previous,
                resume_from=layout.resume_from,
                object_names=layout.object_names,
                multi_label=cfg.label_separator is not None,
                refs_in_pieces=how != pieces.GROUP,
                output_format=cfg.format,
            ),
            beam.pvalue.AsSingleton(self._labels),
            beam.pvalue.AsSingleton(self._extra_types),
        ).with_outputs(REJECTS, main="results")
        # the shard results count labels per split themselves
        no_counts = refs.pipeline | "NoLabelCounts" >> beam.Create([{}])
        return {"results": written.results, REJECTS: written[REJECTS], "split_label_counts": no_counts}


def _write_with_write_to_tfrecord(
    refs: beam.PCollection,
    cfg: ConvertConfig,
    layout: Layout,
    wtt_shards: Mapping[str, int],
    labels: beam.PCollection,
    extra_types: beam.PCollection,
) -> dict[str, beam.PCollection]:
    """``--sink write_to_tfrecord``: records through the shuffle into ``WriteToTFRecord`` per split.

    {"results": one per shard file, REJECTS, "split_label_counts"}. Its steps
    keep top-level labels, one set per split (``WriteToTFRecord_{split}``...).
    """
    p = refs.pipeline
    decoded = refs | "Decode" >> beam.ParDo(
        DecodeFn(cfg.image_options), beam.pvalue.AsSingleton(labels), beam.pvalue.AsSingleton(extra_types)
    ).with_outputs(REJECTS, COUNTS, main="records")
    # (split, label, record)
    split_label_counts = (
        decoded.records
        # a multi-label image counts under each of its labels
        | "SplitLabel" >> beam.FlatMap(lambda t: [((t[0], n), 1) for n in label_names(t[1])] or [((t[0], None), 1)])
        | "CountSplitLabel" >> beam.CombinePerKey(sum)
        | "AllSplitLabel" >> beam.combiners.ToList()
        | "SplitLabelDict" >> beam.Map(_split_label_counts)
    )
    per_split = []
    for split, num_shards in sorted(wtt_shards.items()):
        prefix = f"{layout.tmp_dir}/wtt/{cfg.name}-{split}.tfrecord"
        files = (
            decoded.records
            | f"Only_{split}" >> beam.Filter(lambda t, s=split: t[0] == s)
            | f"Record_{split}" >> beam.Map(lambda t: t[2])
            | f"WriteToTFRecord_{split}"
            >> WriteToTFRecord(
                prefix,
                num_shards=num_shards,
                shard_name_template="-SSSSS-of-NNNNN",
                file_name_suffix=".gz" if cfg.compression == "gzip" else "",
                compression_type=compression_type(cfg.compression),
            )
            # one element per written shard file: spread them so the
            # record counts (a full read of each shard) run in parallel
            | f"SpreadShardFiles_{split}" >> beam.Reshuffle()
            | f"Describe_{split}" >> beam.Map(_describe_wtt_file, split)
        )
        per_split.append(files)
    results = tuple(per_split) | "AllShardFiles" >> beam.Flatten() if per_split else (p | "NoShards" >> beam.Create([]))
    return {
        "results": results,
        REJECTS: decoded[REJECTS],
        "split_label_counts": split_label_counts,
        COUNTS: decoded[COUNTS],  # objects of the records written (the planned sink's results hold them)
    }


class RejectParts(beam.PTransform):
    """(listing rejects, writer rejects) → {"counts": (reason, n), "parts": part file paths}.

    Finalize's side inputs stay small at any scale: rejects are counted by
    reason here and written as sorted part files (one per hash bucket of the
    path) that finalize streams into rejects.jsonl; only the part paths reach it.
    """

    def __init__(self, layout: Layout, folder: str = "") -> None:
        super().__init__()
        self._layout = layout
        self._folder = folder  # a subfolder of the parts: "objects" for object_rejects.jsonl

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, rejects_in: tuple[beam.PCollection, ...]) -> dict[str, beam.PCollection]:
        rejects = (
            rejects_in
            | "AllRejects" >> beam.Flatten()
            # {"path": relative to the input root, "reason", "detail", "source": full path}
            | "RejectPathsRelative" >> beam.Map(with_relative_path, self._layout.root)
        )
        counts = (
            rejects
            | "RejectReasonOf" >> beam.Map(lambda r: r["reason"])
            | "CountRejectReasons" >> beam.combiners.Count.PerElement()
        )
        parts = (
            rejects
            | "RejectBucketOf" >> beam.Map(lambda r: (reject_bucket(r["path"]), r))
            | "GroupRejectBuckets" >> beam.GroupByKey()
            | "WriteRejectParts" >> beam.ParDo(WriteRejectPartFn(self._layout.tmp_dir, self._folder))
        )
        return {"counts": counts, "parts": parts}


class Finalize(beam.PTransform):
    """Once every shard is written: ``FinalizeFn`` over the shard results and small side inputs → dataset.json."""

    def __init__(
        self,
        cfg: ConvertConfig,
        layout: Layout,
        *,
        results: beam.PCollection,
        rejects: Mapping[str, beam.PCollection],
        skipped_counts: beam.PCollection,
        labels: beam.PCollection,
        extra_types: beam.PCollection,
        split_label_counts: beam.PCollection,
        changes: beam.PCollection | None,
        labelled: beam.PCollection,
        objects: Mapping[str, beam.PCollection] | None = None,
        near_duplicates: Mapping[str, beam.PCollection] | None = None,
    ) -> None:
        super().__init__()
        self._objects = objects
        self._near = near_duplicates
        self._settings, self._layout = FinalizeSettings.of(cfg), layout  # what the Finalize step sees
        self._results, self._rejects, self._skipped_counts = results, rejects, skipped_counts
        self._labels, self._extra_types, self._split_label_counts = labels, extra_types, split_label_counts
        self._changes, self._labelled = changes, labelled

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        changes = [beam.pvalue.AsSingleton(self._changes)] if self._changes is not None else []
        objects = {}
        if self._objects is not None:
            objects = {
                "object_parts": beam.pvalue.AsList(self._objects["parts"]),
                "object_counts": beam.pvalue.AsList(self._objects["counts"]),
            }
        if self._near is not None:
            objects["near_parts"] = beam.pvalue.AsList(self._near["parts"])
            objects["near_summary"] = beam.pvalue.AsSingleton(self._near["summary"])
        return (
            root
            | "Once" >> beam.Create([None])
            | "Finalize"
            >> beam.ParDo(
                FinalizeFn(self._settings, self._layout),
                beam.pvalue.AsList(self._results),
                beam.pvalue.AsList(self._rejects["parts"]),
                beam.pvalue.AsList(self._rejects["counts"]),
                beam.pvalue.AsList(self._skipped_counts),
                beam.pvalue.AsSingleton(self._labels),
                beam.pvalue.AsSingleton(self._extra_types),
                beam.pvalue.AsSingleton(self._split_label_counts),
                *changes,
                labelled=beam.pvalue.AsSingleton(self._labelled),
                **objects,
            )
        )


def _after_finalize(finalized: beam.PCollection, cfg: ConvertConfig, layout: Layout) -> None:
    """With ``--post-steps job``: the post-steps (TFT, TFDS, publish) and ``--keep-last`` as the job's last steps.

    Top-level labels (``AfterFinalize``, ``TrainPixelStats``, ``PostSteps``, ``KeepLast``): the
    job's step names say what it does (the launcher's ``--dry_run`` lists them).
    """
    if cfg.needs_post_steps and cfg.post_steps == "job":
        from .run.poststeps import PostStepsFn, PostStepsSettings

        # The Reshuffle commits finalize's output before the post-steps start:
        # a failed (retried) post-step does not run finalize again.
        committed = finalized | "AfterFinalize" >> beam.Reshuffle()
        stats = []
        if cfg.transform and cfg.image_stats:
            from .analysis import TrainPixelStats

            # every train shard decoded on some worker; one small dict comes back
            pixel_stats = committed | "TrainPixelStats" >> TrainPixelStats(layout.tmp_dir, cfg.output, cfg.image_size)
            stats = [beam.pvalue.AsSingleton(pixel_stats)]
        finalized = committed | "PostSteps" >> beam.ParDo(PostStepsFn(PostStepsSettings.of(cfg), layout), *stats)
    if cfg.keep_last and cfg.post_steps == "job":
        # After the job published (--detach: the launcher is gone by then); a retry deletes what is left.
        _ = finalized | "KeepLast" >> beam.Map(_keep_last_after_publish, cfg, layout)


def _keep_last_after_publish(info: DatasetInfo, cfg: ConvertConfig, layout: Layout) -> None:
    """--keep-last in the job, once this run's dataset is published (its dataset.json and _SUCCESS are there)."""
    from . import retention

    published = info.status == OK and info.run_id == layout.run_id
    if not published or not FileSystems.exists(FileSystems.join(cfg.output, metadata.SUCCESS)):
        return  # this run did not publish (too many rejects, nothing converted)
    retention.apply(cfg, layout)


def _describe_wtt_file(path: str, split: str) -> ShardResult:
    from apache_beam.io.filesystems import FileSystems

    stem = path[:-3] if path.endswith(".gz") else path
    index = int(stem.rsplit("-of-", 1)[0].rsplit("-", 1)[1])
    size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    return ShardResult(split=split, shard=index, tmp_path=path, records=registry.of_shard(path).count(path), bytes=size)


def build_plan_pipeline(
    cfg: ConvertConfig, layout: Layout, options: PipelineOptions, plan_path: str, *, runner: Any = None
) -> beam.Pipeline:
    """Listing and planning only (no pixels read): writes the plan as JSON to ``plan_path``.

    {"splits": {split: {num_shards, estimated_bytes, shard_bytes, examples, labels}},
     "rejects": {reason: n}, "skipped": {reason: n}}
    """
    p = beam.Pipeline(runner=runner, options=options)
    listed = p | "List" >> ListInputs(ListSettings.of(cfg), layout)
    refs = listed["refs"]
    plans = refs | "Plan" >> PlanShards(cfg.target_shard_bytes)
    label_counts = (
        refs
        # (split, "") counts the examples; (split, name) each label, a multi-label image under each of its labels
        | "SplitLabelOf" >> beam.FlatMap(lambda r: [((r.split, n), 1) for n in ("", *label_names(r.label))])
        | "CountSplitLabels" >> beam.CombinePerKey(sum)
        | "AllSplitLabels" >> beam.combiners.ToList()
    )
    reject_counts = (
        listed[REJECTS]
        | "RejectReason" >> beam.Map(lambda r: r["reason"])
        | "CountRejects" >> (beam.combiners.Count.PerElement())
        | "AllRejectCounts" >> beam.combiners.ToList()
    )
    skipped_counts = (
        listed[SKIPPED] | "CountSkipped" >> beam.combiners.Count.PerElement() | "AllSkipped" >> beam.combiners.ToList()
    )
    _ = plans | "WritePlan" >> beam.Map(
        _write_plan,
        plan_path,
        beam.pvalue.AsSingleton(label_counts),
        beam.pvalue.AsSingleton(reject_counts),
        beam.pvalue.AsSingleton(skipped_counts),
    )
    return p


def plan_summary(
    plans: Mapping[str, ShardPlan],
    label_counts: list[tuple[tuple[str, str], int]] | None = None,
    reject_counts: list[tuple[str, int]] | None = None,
    skipped_counts: list[tuple[str, int]] | None = None,
) -> PlanSummary:
    splits: dict[str, SplitPlanSummary] = {}
    for split, plan in sorted(plans.items()):
        labels = {label: n for (s, label), n in sorted(label_counts or []) if s == split}
        splits[split] = {
            "num_shards": plan.num_shards,
            "estimated_bytes": sum(plan.estimated_bytes),
            "shard_bytes": list(plan.estimated_bytes),
            "examples": labels.get("", 0),
            "labels": {k: v for k, v in labels.items() if k},
        }
    return {
        "splits": splits,
        "rejects": dict(sorted(reject_counts or [], key=lambda kv: -kv[1])),
        "skipped": dict(sorted(skipped_counts or [], key=lambda kv: -kv[1])),
    }


def _write_plan(plans: Mapping[str, ShardPlan], plan_path: str, labels: Any, rejects: Any, skipped: Any) -> None:
    import json

    from .storage import write_text

    write_text(plan_path, json.dumps(plan_summary(plans, labels, rejects, skipped)))


__all__ = ["build_pipeline", "build_plan_pipeline"]
