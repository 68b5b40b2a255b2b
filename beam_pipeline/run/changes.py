"""Night over night: what an ``--incremental-from`` run changed against the dataset it started from.

Classes added or removed, class counts that moved by more than ``--change-share``, the stored images' shorter
sides (a note when the median's bucket moved), the reject rate and the reasons whose counts moved, and
near-duplicate groups that are new since then (none of their images was in a group or pair the night before:
the previous ``near_duplicates.jsonl``, either format, is read into a set of its listed paths). They go into
dataset.json's ``changes`` and the summary as notes; a change stops the publish only through
``--max-class-drop`` (docs/nightly.md#what-changed-since-the-previous-night).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apache_beam.io.filesystems import FileSystems

from .. import metadata
from ..near_duplicates import groups_of_file, merged
from ..storage import open_lines, read_json_object
from ..vocab.dataset_info import DatasetInfo
from ..vocab.records import SIZE_BUCKETS

CLASS_DROPPED = "class_dropped"  # run.outcome: a class lost more than --max-class-drop of its images


def class_counts(info: DatasetInfo) -> dict[str, int]:
    """Records per class over every split (a multi-label record under each of its classes)."""
    counts: dict[str, int] = {}
    for split in info.splits.values():
        for label, n in (split.labels or {}).items():
            counts[label] = counts.get(label, 0) + n
    return counts


def reject_rate(info: DatasetInfo) -> float:
    listed = info.examples + info.rejects.total
    return info.rejects.total / listed if listed else 0.0


def night_changes(
    previous_dir: str,
    now: DatasetInfo,
    share: float,
    near_parts: Sequence[str] | None = None,
    max_drop: float | None = None,
) -> dict[str, Any] | None:
    """dataset.json's ``changes`` against the dataset in ``previous_dir``; None if its dataset.json is gone or
    damaged (the run itself then says so elsewhere). ``near_parts``: tonight's near_duplicates.jsonl parts. A class
    is listed as moved past ``share``, or when it fell by more than ``max_drop`` (--max-class-drop)."""
    try:
        before = DatasetInfo.from_json(read_json_object(FileSystems.join(previous_dir, metadata.DATASET_JSON)))
    except (OSError, ValueError):
        if max_drop is not None:  # --max-class-drop must not pass for want of a comparison: the step fails
            raise
        return None  # no notes (dataset.json has no changes block), the run goes on
    old, new = class_counts(before), class_counts(now)
    added = sorted(k for k, n in new.items() if n and not old.get(k))
    removed = sorted(k for k, n in old.items() if n and not new.get(k))
    threshold = min(share, max_drop) if max_drop is not None else share
    moved = {
        k: {"before": old[k], "now": new[k]}
        for k in sorted(old)
        if old[k] and new.get(k) and abs(new[k] - old[k]) / old[k] > threshold
    }
    reasons = sorted(set(before.rejects.by_reason) | set(now.rejects.by_reason))
    by_reason = {
        r: {"before": before.rejects.by_reason.get(r, 0), "now": now.rejects.by_reason.get(r, 0)}
        for r in reasons
        if before.rejects.by_reason.get(r, 0) != now.rejects.by_reason.get(r, 0)
    }
    out: dict[str, Any] = {
        "share": share,
        "classes_added": added,
        "classes_removed": removed,
        "classes_moved": moved,
        "reject_rate": {"before": round(reject_rate(before), 6), "now": round(reject_rate(now), 6)},
        "rejects_by_reason": by_reason,
    }
    sizes = {"before": _sides(before), "now": _sides(now)}
    if sizes["before"] and sizes["now"] and sizes["before"] != sizes["now"]:
        out["image_sizes"] = sizes
    before_file = FileSystems.join(previous_dir, metadata.NEAR_DUPLICATES_JSONL)
    if near_parts is not None and before.near_duplicates is not None and FileSystems.exists(before_file):
        try:  # a damaged previous file costs the note, not the run
            out["near_duplicates_new"] = new_groups(before_file, (json.loads(raw) for _, raw in merged(near_parts)))
        except (ValueError, KeyError, TypeError):
            pass
    out["notes"] = notes(out)
    return out


def _sides(info: DatasetInfo) -> dict[str, int]:
    return dict((info.image_sizes or {}).get("shorter_side") or {})


def median_bucket(counts: Mapping[str, int]) -> str | None:
    """The bucket of the median image (SIZE_BUCKETS order; unknown sizes left out)."""
    known = [(b, counts.get(b, 0)) for b in SIZE_BUCKETS]
    total = sum(n for _, n in known)
    seen = 0
    for bucket, n in known:
        seen += n
        if total and seen * 2 >= total:
            return bucket
    return None


def new_groups(before: str, now: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Tonight's groups (lines of either format) none of whose listed images the file ``before`` (either
    format) has in a group or pair: how many, how many across splits, their images. ``before``'s grouped
    paths are held as a set (its listed images: at most GROUP_SIZE a group)."""
    with open_lines(before) as fh:
        seen = {p for group in groups_of_file(json.loads(raw) for raw in fh if raw.strip()) for p in group["group"]}
    groups = across = images = 0
    for group in groups_of_file(now):
        if seen.isdisjoint(group["group"]):
            groups += 1
            across += len(group["splits"]) > 1
            images += group["images"]
    return {"groups": groups, "across_splits": across, "images": images}


def notes(changes: Mapping[str, Any]) -> list[str]:
    """The changes as lines a person reads (the summary prints them)."""
    out = [f"class {k} is new" for k in changes["classes_added"]]
    out += [f"class {k} has no image any more" for k in changes["classes_removed"]]
    for k, c in changes["classes_moved"].items():
        out.append(f"class {k}: {c['before']} -> {c['now']} images ({(c['now'] - c['before']) / c['before']:+.0%})")
    rate = changes["reject_rate"]
    if abs(rate["now"] - rate["before"]) > max(0.005, changes["share"] * rate["before"]):
        out.append(f"reject rate {rate['before']:.1%} -> {rate['now']:.1%}")
    sizes = changes.get("image_sizes")
    if sizes:
        before, now = median_bucket(sizes["before"]), median_bucket(sizes["now"])
        if before != now:
            out.append(f"median shorter side {before} px -> {now} px")
    near = changes.get("near_duplicates_new")
    if near and near.get("groups"):
        out.append(
            f"{near['groups']} new near-duplicate groups ({near['images']} images), "
            f"{near['across_splits']} across splits"
        )
    return out


def dropped_class(changes: Mapping[str, Any] | None, max_drop: float | None) -> str | None:
    """The first class (by name) that lost more than ``max_drop`` of its images, as a phrase; None if none."""
    if not changes or max_drop is None:
        return None
    if changes["classes_removed"]:  # lost all of its images: past any --max-class-drop, 1 included
        return f"class {changes['classes_removed'][0]} has no image any more"
    for k, c in changes["classes_moved"].items():
        if (c["before"] - c["now"]) / c["before"] > max_drop:
            return f"class {k} went from {c['before']} to {c['now']} images"
    return None
