"""A run's outcome: whether it may publish, what the launcher tells the user when it may not, and the
summaries ``dataset.json`` carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import metadata
from ..annotations import coco, objects
from ..config import ConvertConfig, Layout
from ..errors import RejectsError, UsageError
from ..vocab.dataset_info import OK, Category, DatasetInfo, IncrementalInfo, ObjectsInfo, ResumedInfo, Tally
from ..vocab.reasons import NEAR_DUPLICATE_LEAK, NO_LABEL
from ..vocab.records import ShardResult
from .changes import CLASS_DROPPED, dropped_class
from .preflight import flat_folder_hint


def _past_allowance(rejects: int, allowance: int) -> str:
    """Which half of the rule past the fraction a run crossed (finalize.too_many_rejects)."""
    return f"more than --reject-allowance {allowance}" if rejects > allowance else "more than half of them"


def counted_rejects(by_reason: Mapping[str, int]) -> dict[str, int]:
    """The rejects that count toward --max-reject-fraction and --reject-allowance, by reason: all but the leaks
    dropped on request (--near-duplicates drop-leaks), which are the user's choice, not bad input."""
    return {reason: n for reason, n in by_reason.items() if reason != NEAR_DUPLICATE_LEAK}


def raise_unless_publishable(cfg: ConvertConfig, layout: Layout, info: DatasetInfo, kept_old: bool) -> None:
    """The one line a run that may not publish ends with (RejectsError, exit 3; UsageError when nothing was
    listed at all); nothing for a run whose status is OK. ``kept_old``: an older dataset stays in the output."""
    status = info.status
    if status == OK:
        return
    rejects_at = layout.tmp_dir if kept_old else cfg.output
    reasons = ", ".join(f"{k} {v}" for k, v in list(info.rejects.by_reason.items())[:3])
    total = info.rejects.total
    listed = total + info.examples
    kept_where = f"the dataset already in {cfg.output} is untouched, this run is in {layout.tmp_dir}"
    if status == TOO_MANY_REJECTS:
        where = kept_where if kept_old else f"shards written without _SUCCESS, see {rejects_at}/rejects.jsonl"
        counted = counted_rejects(info.rejects.by_reason)  # leaks are set aside, by number
        leaks = total - sum(counted.values())
        reasons = ", ".join(f"{k} {v}" for k, v in list(counted.items())[:3])
        aside = f"; {leaks} near-duplicate leaks dropped on request are not counted" if leaks else ""
        raise RejectsError(
            f"{total - leaks} of {listed - leaks} inputs rejected ({reasons}{aside}): more than --max-reject-fraction "
            f"{cfg.max_reject_fraction:g} of them and {_past_allowance(total - leaks, cfg.reject_allowance)}; "
            f"{where}"
        )
    if status == NO_OBJECT_KEPT:
        objs = info.objects.rejects if info.objects is not None else Tally()
        reasons = ", ".join(f"{k} {v}" for k, v in list(objs.by_reason.items())[:3])
        where = kept_where if kept_old else "shards written without _SUCCESS"
        raise RejectsError(
            f"no object was kept: {objs.total} annotations rejected ({reasons}; see "
            f"{rejects_at}/object_rejects.jsonl); {where}"
        )
    if status == CLASS_DROPPED:
        where = kept_where if kept_old else "shards written without _SUCCESS"
        raise RejectsError(
            f"{dropped_class(info.changes, cfg.max_class_drop)} since {cfg.incremental_from}: more than "
            f"--max-class-drop {cfg.max_class_drop:g} of its images; {where}"
        )
    if status == NOTHING_CONVERTED:
        hint = ""
        if layout.label_source == "folder" and set(info.rejects.by_reason) == {NO_LABEL}:
            where = "the input" if layout.split_source != "folders" else "the input's split folders"
            hint = "; " + flat_folder_hint(where)
        raise RejectsError(
            f"no image was converted ({total} rejected: {reasons}; see {rejects_at}/rejects.jsonl){hint}"
        )
    skipped = ", ".join(f"{k} {v}" for k, v in info.skipped.by_reason.items()) or "nothing at all"
    where = cfg.manifest or cfg.input
    raise UsageError(f"no images to convert in {where} (skipped: {skipped})")


TOO_MANY_REJECTS, NOTHING_CONVERTED, EMPTY_LISTING = "too_many_rejects", "nothing_converted", "empty"


NO_OBJECT_KEPT = "no_object_kept"  # annotations given, every one rejected: a mismatch, not a dataset of negatives


def too_many_rejects(examples: int, rejects: int, max_reject_fraction: float, reject_allowance: int) -> bool:
    """More than ``max_reject_fraction`` of the listed inputs rejected, and either more than
    ``reject_allowance`` rejects or more rejects than converted images: two broken files in a folder of 30
    publish, 25 of 30 (a wrong input, a wrong format) do not."""
    if rejects / (examples + rejects) <= max_reject_fraction:
        return False
    return rejects > reject_allowance or rejects > examples


def outcome(
    examples: int,
    rejects: int,
    max_reject_fraction: float,
    reject_allowance: int,
    objs: ObjectsInfo | None = None,
) -> str:
    """ok, or why the run must not publish (the launcher maps it to an exit code). ``objs``: a detection
    dataset's ``objects`` block (annotations given and every object rejected is a mismatch, not negatives)."""
    if examples == 0:
        return NOTHING_CONVERTED if rejects else EMPTY_LISTING
    if too_many_rejects(examples, rejects, max_reject_fraction, reject_allowance):
        return TOO_MANY_REJECTS
    if objs is not None and not objs.kept and objs.rejects.total:
        return NO_OBJECT_KEPT
    return OK


def incremental_summary(
    previous: str,
    changes: Mapping[str, Any],  # {kind: count}, and "dropped_first": the first dropped paths
    layout: Mapping[str, list[tuple[str, ShardResult]]],
    results: Iterable[ShardResult] = (),
) -> IncrementalInfo:
    """What an ``--incremental-from`` run took from the previous dataset, for dataset.json and ``inspect``.

    Listed files: ``added`` (neither in the previous index nor among its
    rejects), ``changed`` (size or mtime differ), ``unchanged``; ``dropped``:
    previous records whose file is no longer listed. Records: ``reused``
    (copied, not read or decoded) and ``converted`` (the rest; an unchanged
    file whose label id or extra columns differ is converted again).
    ``rejects_kept``: unchanged files the previous run rejected for their
    bytes, rejected again unread (``results``: every shard's, empty ones too).
    ``reconverted``: unchanged files whose previous record was gone or failed
    its checks (``index.read_previous``), converted afresh.
    ``unreadable_previous_lines`` (only when there are any): lines of the
    previous index.jsonl or rejects.jsonl that were damaged or not its own;
    their files were read and converted afresh.
    """
    records = sum(r.records for files in layout.values() for _, r in files)
    reused = sum(r.reused for files in layout.values() for _, r in files)
    kept = sum(r.rejects_kept for r in results)
    reconverted = sum(r.reconverted for r in results)
    counts = {k: int(changes.get(k, 0)) for k in ("added", "changed", "unchanged", "dropped")}
    # unreadable_previous_lines is written only when there are any: an intact previous dataset gives the same
    # dataset.json as before
    return IncrementalInfo(
        source=previous,
        reused=reused,
        converted=records - reused,
        reconverted=reconverted,
        rejects_kept=kept,
        **counts,
        unreadable_previous_lines=int(changes.get("unreadable_previous_lines", 0)),
        dropped_first=tuple(changes.get("dropped_first") or ()),
    )


def resumed_summary(layout: Mapping[str, list[tuple[str, ShardResult]]], staging: str) -> ResumedInfo | None:
    """What this run took from earlier runs' finished shards (resume.py): shards, records, run ids; None if none.

    A retried writer that took its own run's finished shard is not counted: a
    retry must not change dataset.json.
    """
    own = staging.rstrip("/")
    taken = [
        r for files in layout.values() for _, r in files if r.resumed_from and str(r.resumed_from).rstrip("/") != own
    ]
    if not taken:
        return None
    runs = {str(r.resumed_from).rstrip("/").rsplit("/", 1)[-1] for r in taken}
    return ResumedInfo(
        shards=len(taken),
        records=sum(r.records for r in taken),
        from_runs=tuple(sorted(name[len(metadata.TMP_PREFIX) :] for name in runs)),
    )


def detection_summary(
    categories: Sequence[tuple[int, str]], object_counts: Sequence[tuple[str, int]]
) -> tuple[tuple[Category, ...], ObjectsInfo]:
    """dataset.json's part for a detection dataset: its categories, and its object counts and rejects."""
    counts = objects.object_counts(object_counts)
    image_counters = (coco.OBJECTS_KEPT, coco.IMAGES_WITHOUT_OBJECTS, coco.IMAGES_ALL_REJECTED, objects.POLYGON_DROPPED)
    reasons = [(k, n) for k, n in counts.items() if k not in image_counters]
    by_reason = dict(sorted(reasons, key=lambda kv: (-kv[1], kv[0])))
    found = tuple(Category(id=cid, name=name) for cid, name in categories)
    return found, ObjectsInfo(
        kept=counts.get(coco.OBJECTS_KEPT, 0),
        rejects=Tally.of(by_reason),
        images_without_annotations=counts.get(coco.IMAGES_WITHOUT_OBJECTS, 0),
        images_with_every_object_rejected=counts.get(coco.IMAGES_ALL_REJECTED, 0),
        polygons_dropped=counts.get(objects.POLYGON_DROPPED, 0),
    )
