"""Finalize: runs once, after every shard is written, and makes the run visible.

Order matters: the old ``_SUCCESS`` goes first, temp shards get their final
names (dropping empty shards and numbering the rest), stale shards of an
older run go, then ``labels.txt``, ``rejects.jsonl``, ``dataset.json`` and
``_SUCCESS`` last.  Every step can be repeated: a retried finalize finds
shards already renamed and goes on, and a retried writer's extra temp file is
never picked (finalize takes one result per shard, from committed bundles).
A run that may not publish (nothing converted, more rejects than
``--max-reject-fraction``) leaves an existing dataset untouched; into an
empty folder it writes its files without ``_SUCCESS``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from . import metadata
from .config import ConvertConfig, Layout

_LOG = logging.getLogger(__name__)


def write_text(path: str, text: str) -> None:
    with FileSystems.create(path) as fh:
        fh.write(text.encode("utf-8"))


def read_json(path: str) -> dict[str, Any]:
    """A JSON file (local or gs://), e.g. dataset.json."""
    with FileSystems.open(path, compression_type="uncompressed") as fh:
        return json.loads(fh.read().decode("utf-8"))


def list_dir(path: str) -> list[str]:
    """Full paths of the files directly inside ``path`` (local or gs://)."""
    pattern = FileSystems.join(path, "*")
    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # noqa: BLE001 - a missing folder lists as empty
        return []
    prefix = path.rstrip("/") + "/"
    return sorted(m.path for m in found if "/" not in m.path[len(prefix) :])


def delete_quietly(paths: Sequence[str]) -> None:
    for path in paths:
        try:
            FileSystems.delete([path])
        except Exception as e:  # noqa: BLE001 - already gone is fine
            _LOG.debug("could not delete %s: %s", path, e)


def delete_tree(path: str) -> None:
    """Deletes a scratch folder and everything under it."""
    delete_quietly(_files_under(path))
    if "://" not in path:
        delete_quietly([path])


def stale_tmp_dirs(out_dir: str) -> list[str]:
    """Scratch folders of earlier runs of this tool in ``out_dir``."""
    pattern = FileSystems.join(out_dir, metadata.TMP_PREFIX + "*")
    prefix = FileSystems.join(out_dir, metadata.TMP_PREFIX)
    try:
        found = FileSystems.match([pattern + "/**"])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing there
        return []
    return sorted({prefix + m.path[len(prefix) :].split("/", 1)[0] for m in found})


def choose_results(results: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], Mapping[str, Any]]:
    """One result per (split, shard); a duplicate (a retried writer) is resolved the same way every time."""
    chosen: dict[tuple[str, int], Mapping[str, Any]] = {}
    for result in sorted(results, key=lambda r: (r["split"], r["shard"], r["tmp_path"])):
        chosen.setdefault((result["split"], result["shard"]), result)
    return chosen


def final_layout(
    chosen: Mapping[tuple[str, int], Mapping[str, Any]], name: str, compression: str
) -> dict[str, list[tuple[str, Mapping[str, Any]]]]:
    """{split: [(final file name, result)]}, empty shards dropped, numbered from 0."""
    by_split: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for (split, _), result in sorted(chosen.items()):
        if result["records"] > 0:
            by_split[split].append(result)
    return {
        split: [
            (metadata.shard_name(name, split, i, len(results), compression), result) for i, result in enumerate(results)
        ]
        for split, results in sorted(by_split.items())
    }


def rename_idempotent(src: str, dst: str) -> None:
    """Renames src → dst; a retry that finds src gone and dst present is done already."""
    if not FileSystems.exists(src) and FileSystems.exists(dst):
        return
    if "://" not in dst:  # a local rename needs the destination folder
        os.makedirs(os.path.dirname(dst), exist_ok=True)
    FileSystems.rename([src], [dst])


def merge_counts(dicts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: collections.Counter[str] = collections.Counter()
    for d in dicts:
        total.update(d)
    return dict(sorted(total.items()))


# Files and folders a run publishes besides the shards; anything of these an
# older run left and this run did not make is removed when publishing.
PUBLISHED_FILES = (
    metadata.LABELS_TXT,
    metadata.REJECTS_JSONL,
    metadata.DATASET_JSON,
    "dataset_info.json",
    "features.json",
    "image.class.label.labels.txt",  # TFDS class names (tfds_metadata.LABEL_NAMES)
    "image-class-label.labels.txt",  # the same, as runs before flat TFDS keys named it
)
PUBLISHED_DIRS = ("transform_fn", "transformed_metadata")

OK, TOO_MANY_REJECTS, NOTHING_CONVERTED, EMPTY_LISTING = "ok", "too_many_rejects", "nothing_converted", "empty"


def outcome(examples: int, rejects: int, max_reject_fraction: float) -> str:
    """ok, or why the run must not publish (the launcher maps it to an exit code)."""
    if examples == 0:
        return NOTHING_CONVERTED if rejects else EMPTY_LISTING
    if rejects / (examples + rejects) > max_reject_fraction:
        return TOO_MANY_REJECTS
    return OK


def _files_under(path: str) -> list[str]:
    try:
        return sorted(m.path for m in FileSystems.match([FileSystems.join(path, "**")])[0].metadata_list)
    except Exception:  # noqa: BLE001 - nothing there
        return []


def publish(staging: str, out_dir: str, complete: bool = True) -> None:
    """Moves a run from its staging folder into ``out_dir``; ``_SUCCESS`` last.

    Until this starts, an older dataset in ``out_dir`` is untouched. Its
    ``_SUCCESS`` goes first, so a publish that dies half-way leaves no
    ``_SUCCESS``; running it again finishes the job (moves are idempotent).
    ``complete=False`` (a run over its reject budget) moves the files but
    writes no ``_SUCCESS``.
    """
    success = FileSystems.join(out_dir, metadata.SUCCESS)
    delete_quietly([success])
    prefix = staging.rstrip("/") + "/"
    new_files = [path[len(prefix) :] for path in _files_under(staging)]
    new_top = {rel.split("/", 1)[0] for rel in new_files}
    for name in PUBLISHED_DIRS:  # whole folders are replaced, never merged
        delete_tree(FileSystems.join(out_dir, name))
    for rel in new_files:
        rename_idempotent(prefix + rel, FileSystems.join(out_dir, rel))
    stale = [
        p
        for p in list_dir(out_dir)
        if p.rsplit("/", 1)[-1] not in new_top
        and (metadata.is_shard_file(p.rsplit("/", 1)[-1]) or p.rsplit("/", 1)[-1] in PUBLISHED_FILES)
    ]
    delete_quietly(stale)
    delete_tree(staging)
    for stale_tmp in stale_tmp_dirs(out_dir):  # left by killed runs
        delete_tree(stale_tmp)
    if complete:
        write_text(success, "")


def published_run(out_dir: str, staging: str, run_id: str) -> dict[str, Any] | None:
    """dataset.json of run ``run_id`` if it is already in ``out_dir`` (a retried step), else None.

    A publish that stopped half-way is finished (only while the staging
    folder still holds files: publishing an empty one would delete the run).
    """
    info_path = FileSystems.join(out_dir, metadata.DATASET_JSON)
    if not run_id or not FileSystems.exists(info_path):
        return None
    info = read_json(info_path)
    if info.get("run_id") != run_id:
        return None
    # Over budget the run was published without _SUCCESS on purpose: nothing more to do.
    if info.get("status") == OK and not FileSystems.exists(FileSystems.join(out_dir, metadata.SUCCESS)):
        if _files_under(staging):
            publish(staging, out_dir)
    return info


class FinalizeFn(beam.DoFn):
    """Runs once: names the shards, writes the metadata into the staging folder, publishes.

    Yields the dataset.json dict. With post-steps (TFT analysis, TFDS
    metadata) the launcher publishes after them; a run that may not publish
    (too many rejects, nothing converted) leaves an older dataset untouched.
    """

    def __init__(self, cfg: ConvertConfig, layout: Layout) -> None:
        self._cfg = cfg
        self._layout = layout

    def process(
        self,
        _: Any,
        results: Sequence[Mapping[str, Any]],
        rejects: Sequence[Mapping[str, str]],
        skipped: Sequence[str],
        labels: Sequence[str],
        extra_types: Mapping[str, str],
        split_label_counts: Mapping[str, Mapping[str, int]],
    ) -> Iterator[dict[str, Any]]:
        cfg, out_dir, staging = self._cfg, self._cfg.output, self._layout.tmp_dir
        done = published_run(out_dir, staging, self._layout.run_id)
        if done is not None:
            yield done
            return
        chosen = choose_results(results)
        layout = final_layout(chosen, cfg.name, cfg.compression)
        labelled = self._layout.label_source != "none"

        splits: dict[str, Any] = {}
        for split, files in layout.items():
            label_counts = split_label_counts.get(split) or merge_counts(r.get("labels", {}) for _, r in files)
            splits[split] = {
                "examples": sum(r["records"] for _, r in files),
                "bytes": sum(r["bytes"] for _, r in files),
                "num_shards": len(files),
                "shards": [{"file": f, "records": r["records"], "bytes": r["bytes"]} for f, r in files],
                "labels": dict(label_counts) if labelled else None,
            }
        info = metadata.dataset_json(
            name=cfg.name,
            splits=splits,
            labels=list(labels) if labelled else None,
            extra_types=extra_types,
            compression=cfg.compression,
            seed=cfg.seed,
            config=cfg.as_dict(),
            rejects=metadata.count_by(r["reason"] for r in rejects),
            skipped=metadata.count_by(skipped),
            sink=cfg.sink,
        )
        info["converted"] = merge_counts(r.get("converted", {}) for files in layout.values() for _, r in files)
        info["status"] = outcome(info["examples"], len(rejects), cfg.max_reject_fraction)
        info["run_id"] = self._layout.run_id
        info_text = json.dumps(info, indent=2, ensure_ascii=False) + "\n"
        rejects_text = metadata.rejects_jsonl(rejects)

        # Temp shards get their final names inside the staging folder; what a
        # retried or empty writer left there goes.
        final_paths = set()
        for files in layout.values():
            for final, result in files:
                final_path = FileSystems.join(staging, final)
                rename_idempotent(result["tmp_path"], final_path)
                final_paths.add(final_path)
        delete_quietly([p for p in _files_under(staging) if p not in final_paths])
        if labelled:
            write_text(FileSystems.join(staging, metadata.LABELS_TXT), "".join(f"{label}\n" for label in labels))
        write_text(FileSystems.join(staging, metadata.REJECTS_JSONL), rejects_text)
        write_text(FileSystems.join(staging, metadata.DATASET_JSON), info_text)

        if info["status"] != OK:
            if not FileSystems.exists(FileSystems.join(out_dir, metadata.SUCCESS)):
                # Nothing to protect: the shards, rejects.jsonl and dataset.json
                # (which names the status) go where the user looks, but no
                # _SUCCESS marks them complete. An existing dataset stays
                # untouched and this run stays in its staging folder.
                publish(staging, out_dir, complete=False)
        elif not cfg.needs_post_steps:
            publish(staging, out_dir)
        yield info
