"""The lines ``convert`` prints when a run ends: what was written where, what was read and rejected, what
an incremental or resumed run took over, and the post-steps' notes.

    print(summary(info, output, seconds))
"""

from __future__ import annotations

from .vocab.dataset_info import DatasetInfo

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTS = 0, 1, 2, 3


def summary(info: DatasetInfo, output: str, seconds: float, transform_note: str | None = None) -> str:
    """What ``convert`` prints when the dataset is complete: one line per split, then what else happened."""
    head = f"done in {seconds:.1f} s: {info.examples} examples, {info.bytes / 1e6:.1f} MB in {output}"
    return "\n".join(
        [head, *_split_lines(info), *_input_lines(info), *_rerun_lines(info), *_post_step_lines(info, transform_note)]
    )


def _split_lines(info: DatasetInfo) -> list[str]:
    lines = []
    for split, s in info.splits.items():
        sizes = [f.bytes for f in s.shards]
        lines.append(
            f"  {split:<12} {s.examples:>8} examples  {s.num_shards:>4} shards  "
            f"{min(sizes) / 1e6:.1f}-{max(sizes) / 1e6:.1f} MB each"
        )
    for split in info.empty_splits or ():
        lines.append(f"  {split:<12} {0:>8} examples: every listed file of this split was rejected (rejects.jsonl)")
    return lines


def _input_lines(info: DatasetInfo) -> list[str]:
    """Rejected and skipped inputs, and the labels found."""
    lines = []
    rejects = info.rejects
    if rejects.total:
        reasons = ", ".join(f"{k} {v}" for k, v in list(rejects.by_reason.items())[:5])
        lines.append(f"  rejected     {rejects.total:>8} ({reasons}) -> rejects.jsonl")
    skipped = info.skipped
    if skipped.total:
        reasons = ", ".join(f"{k} {v}" for k, v in skipped.by_reason.items())
        lines.append(f"  skipped      {skipped.total:>8} ({reasons})")
    if info.labels is not None:
        lines.append(f"  labels       {len(info.labels):>8} -> labels.txt")
    return lines + _object_lines(info) + _near_duplicate_lines(info) + _report_lines(info)


def _report_lines(info: DatasetInfo) -> list[str]:
    """convert --report: the page, or why there is none."""
    page = info.report
    if not page:
        return []
    if page.get("file"):
        groups = page.get("groups", page.get("pairs", 0))
        shown = f"{page.get('sampled', 0):>8} sampled records, {groups} near-duplicate groups shown"
        return [f"  report       {shown} -> {page['file']}"]
    why = page.get("error")
    return [f"  report       not written ({why}): inspect OUTPUT --report FILE draws it; the dataset is complete"]


def _near_duplicate_lines(info: DatasetInfo) -> list[str]:
    """One line: near-duplicate groups (those across splits: leakage), how sure."""
    from .near_duplicates import block_lines

    near = info.near_duplicates
    if not near:
        return []
    text, across = block_lines(near)
    where = ", ".join(f"{k} {n}" for k, n in across)
    return [f"  near-dups    {text}" + (f" [{where}]" if where else "") + f" -> {near.get('file')}"]


def _object_lines(info: DatasetInfo) -> list[str]:
    """A detection dataset's objects: kept, rejected (the image stays), negatives; its categories."""
    objs = info.objects
    if objs is None:
        return []
    negatives = objs.images_without_annotations + objs.images_with_every_object_rejected
    lines = [f"  objects      {objs.kept:>8} kept, {negatives} images without any"]
    rejects = objs.rejects
    if rejects.total:
        reasons = ", ".join(f"{k} {v}" for k, v in list(rejects.by_reason.items())[:5])
        lines.append(f"  objects out  {rejects.total:>8} ({reasons}) -> object_rejects.jsonl")
    if objs.polygons_dropped:
        lines.append(
            f"  polygons out {objs.polygons_dropped:>8} (under 3 points; their objects kept) -> object_rejects.jsonl"
        )
    names = [c.name for c in info.categories or ()]
    lines.append(f"  categories   {len(names):>8} -> label_map.pbtxt, labels.txt")
    folded: dict[str, str] = {}
    for name in names:
        other = folded.setdefault(name.casefold(), name)
        if other != name:  # two classes a reader that ignores case (or a person) takes for one
            lines.append(f"  note: classes {other!r} and {name!r} differ only in case: two classes")
            break
    return lines


def _rerun_lines(info: DatasetInfo) -> list[str]:
    """Conversions, what --incremental-from reused, what a re-run resumed, what --keep-last deleted."""
    from .inspection import converted_count

    lines = []
    converted = converted_count(info)
    if converted:
        lines.append(f"  converted    {converted[0]:>8} {converted[1]}")
    return lines + _incremental_lines(info) + _change_lines(info) + _resumed_lines(info) + _keep_last_lines(info)


def _change_lines(info: DatasetInfo) -> list[str]:
    """What moved since the --incremental-from dataset (run/changes.py): a note per line, at most 6."""
    notes = list((info.changes or {}).get("notes") or [])
    lines = [f"  note         {note}" for note in notes[:6]]
    if len(notes) > 6:
        lines.append(f"  note         ... {len(notes) - 6} more in dataset.json's changes")
    return lines


def _incremental_lines(info: DatasetInfo) -> list[str]:
    inc = info.incremental
    if inc is None:
        return []
    files = ", ".join(f"{k} {getattr(inc, k)}" for k in ("unchanged", "added", "changed", "dropped"))
    kept = f", {inc.rejects_kept} rejects kept unread" if inc.rejects_kept else ""
    lines = [
        f"  incremental  reused {inc.reused} records, converted {inc.converted} (files: {files}{kept})",
        f"               from {inc.source}",
    ]
    if inc.unreadable_previous_lines:
        lines.append(
            f"               damaged lines left out of its index.jsonl/rejects.jsonl: "
            f"{inc.unreadable_previous_lines} (their files were converted afresh)"
        )
    return lines


def _resumed_lines(info: DatasetInfo) -> list[str]:
    resumed = info.resumed
    if resumed is None:
        return []
    runs = len(resumed.from_runs) or 1
    return [
        f"  resumed      {resumed.shards} shards ({resumed.records} records) from "
        + ("an earlier run" if runs == 1 else f"{runs} earlier runs")
        + " that did not finish"
    ]


def _keep_last_lines(info: DatasetInfo) -> list[str]:
    kept_last = info.keep_last
    if not kept_last:
        return []
    lines = []
    deleted = kept_last["deleted"]
    if deleted:
        names = ", ".join(_dated_name(d, kept_last["template"]) for d in deleted)
        lines.append(f"  keep-last    deleted {len(deleted)}: {names}")
    for folder, why in kept_last["left"]:
        lines.append(f"  keep-last    left {_dated_name(folder, kept_last['template'])}: {why}")
    lines.extend(f"  keep-last    {problem}" for problem in kept_last.get("errors", ()))
    return lines


def _post_step_lines(info: DatasetInfo, transform_note: str | None) -> list[str]:
    """The TFT artifacts (or why there are none) and whether TFDS can load the folder."""
    lines = []
    if info.transform is not None:
        lines.append(
            f"  transform    tensorflow-transform graph -> transform_fn/ (image {info.transform['image_size']}px)"
        )
    if transform_note:
        lines.append(f"  transform    {transform_note}")
    tfds = info.tfds
    if tfds is not None and tfds.files is not None:
        lines.append("  TFDS         tfds.builder_from_directory() can load this folder")
    elif tfds is not None:
        lines.append(f"  TFDS         no metadata: {tfds.skipped}")
    return lines


def _dated_name(folder: str, template: str) -> str:
    """The date part of a dated output folder (the whole path when it cannot be found)."""
    from .retention import date_of

    return date_of(template, folder) or folder
