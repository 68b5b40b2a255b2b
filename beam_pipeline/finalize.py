"""Finalize: runs once, after every shard is written, and makes the run visible.

Order matters: the old ``_SUCCESS`` goes first, temp shards get their final
names (dropping empty shards and numbering the rest), stale shards of an
older run go, then ``labels.txt``, ``rejects.jsonl``, ``dataset.json`` and
``_SUCCESS`` last.  Every step can be repeated: a retried finalize finds
shards already renamed and goes on, and a retried writer's extra temp file is
never picked (finalize takes one result per shard, from committed bundles).
A run that converts no image leaves an existing dataset untouched.
"""

from __future__ import annotations

import collections
import json
import logging
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
    try:
        files = [m.path for m in FileSystems.match([FileSystems.join(path, "**")])[0].metadata_list]
    except Exception:  # noqa: BLE001
        files = []
    delete_quietly(files)
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
    FileSystems.rename([src], [dst])


def merge_counts(dicts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: collections.Counter[str] = collections.Counter()
    for d in dicts:
        total.update(d)
    return dict(sorted(total.items()))


class FinalizeFn(beam.DoFn):
    """One element in, the finished dataset out (yields the dataset.json dict)."""

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
        cfg, out_dir = self._cfg, self._cfg.output
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
        info_text = json.dumps(info, indent=2, ensure_ascii=False) + "\n"
        rejects_text = metadata.rejects_jsonl(rejects)
        success = FileSystems.join(out_dir, metadata.SUCCESS)

        if info["examples"] == 0:
            # Nothing converted: keep whatever complete dataset is there.
            target = self._layout.tmp_dir if FileSystems.exists(success) else out_dir
            write_text(FileSystems.join(target, metadata.REJECTS_JSONL), rejects_text)
            write_text(FileSystems.join(target, metadata.DATASET_JSON), info_text)
            yield info
            return

        delete_quietly([success] if FileSystems.exists(success) else [])
        new_names = set()
        for files in layout.values():
            for final, result in files:
                rename_idempotent(result["tmp_path"], FileSystems.join(out_dir, final))
                new_names.add(final)
        stale = [
            p
            for p in list_dir(out_dir)
            if metadata.is_shard_file(p.rsplit("/", 1)[-1]) and p.rsplit("/", 1)[-1] not in new_names
        ]
        delete_quietly(stale)
        labels_path = FileSystems.join(out_dir, metadata.LABELS_TXT)
        if labelled:
            write_text(labels_path, "".join(f"{label}\n" for label in labels))
        elif FileSystems.exists(labels_path):
            delete_quietly([labels_path])
        write_text(FileSystems.join(out_dir, metadata.REJECTS_JSONL), rejects_text)
        write_text(FileSystems.join(out_dir, metadata.DATASET_JSON), info_text)
        delete_tree(self._layout.tmp_dir)
        for stale_tmp in stale_tmp_dirs(out_dir):  # left by killed runs
            delete_tree(stale_tmp)
        if not cfg.needs_post_steps:  # else the launcher writes it after TFT/TFDS metadata
            write_text(success, "")
        yield info
