"""The TFT graph, reused when nothing it depends on changed: no TensorFlow import, no analysis.

The graph ``analysis`` writes (``transform_fn/``, ``transformed_metadata/``,
``metadata/``) depends on no image. Its inputs are the label list, whether
the dataset is labelled and multi-label, the image size, the pixel
statistics (``--image-stats``), the TensorFlow and tensorflow-transform
versions and this package's code. ``graph_key`` is a digest of all of them;
dataset.json's ``transform.graph_key`` records it. A graph is reused only
under the same key, from one of two places:

- the ``--incremental-from`` dataset, when its ``graph_key`` is this run's
  (a nightly job over unchanged labels: on Dataflow this is the only source);
- a local cache, for runs whose post-steps run in the launcher (the local
  default): ``$BEAM_PIPELINE_GRAPH_CACHE`` if set (``off`` turns it off),
  else ``$XDG_CACHE_HOME/beam_pipeline/tft_graphs`` (``~/.cache/...``). One
  folder per key (about 100 KB), the ``KEEP`` most recently used kept.

An entry is written into a fresh folder and renamed into place, so a reader
sees a whole entry or none; two runs storing the same key keep the first.
Anything unreadable is a miss (the graph is built), never a reuse.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from importlib import metadata as importlib_metadata
from typing import Any

from apache_beam.io.filesystems import FileSystems

from .. import metadata
from ..storage import copy_file, delete_tree, read_json
from ..vocab.dataset_info import DatasetInfo
from .publish import TFT_DIRS

_LOG = logging.getLogger(__name__)

GRAPH_CACHE_ENV = "BEAM_PIPELINE_GRAPH_CACHE"
KEEP = 16
ENTRY = "entry.json"
_STALE_SECONDS = 3600  # a half-written entry (``.new-*``) of a killed run older than this goes at the next prune
_FORMAT = 1  # bumped if an entry's layout changes
_GRAPH_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-intel",
    "tf-nightly",
    "tensorflow-transform",
    "tfx-bsl",
    "protobuf",
)
_ENTRY_NAME = re.compile(r"[0-9a-f]{32}")  # a key: the only folders the cache removes, with ``.new-*``


def graph_key(info: DatasetInfo, image_size: int, pixel_stats: Mapping[str, Any] | None) -> str:
    """The digest of everything the graph depends on (``pixel_stats`` None: no ``--image-stats``)."""

    def version(dist: str) -> str | None:
        try:
            return importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            return None

    inputs = {
        "format": _FORMAT,
        "labels": list(info.labels) if info.labels is not None else None,
        "multi_label": metadata.is_multi_label(info),
        "image_size": int(image_size),
        "image_mean": [float(v) for v in pixel_stats["image_mean"]] if pixel_stats is not None else None,
        "image_std": [float(v) for v in pixel_stats["image_std"]] if pixel_stats is not None else None,
        # whichever of these is installed (a CPU-only or nightly TensorFlow has its own name), and what the
        # graph is traced and saved with
        "versions": {dist: version(dist) for dist in _GRAPH_DISTRIBUTIONS},
        "code": metadata.code_digest(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def cache_folder() -> str | None:
    """The local cache's folder, or None when ``$BEAM_PIPELINE_GRAPH_CACHE`` is ``off``."""
    chosen = os.environ.get(GRAPH_CACHE_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "beam_pipeline", "tft_graphs")


def reuse(key: str, staging: str, *, previous: str | None, cache: str | None) -> tuple[dict[str, Any], str] | None:
    """Copies the graph with ``key`` into ``staging`` from the previous dataset or the cache.

    Returns (what dataset.json records of the transform, without ``files``; where it came from), or None.
    What a failed attempt left in the staging folder's graph folders is removed first, as a build does.
    """
    _clear(staging)
    if previous:
        found = _from_previous(key, previous, staging)
        if found is not None:
            return found, f"reused from {previous}"
    if cache:
        found = _from_cache(key, cache, staging)
        if found is not None:
            return found, "reused from the graph cache"
    return None


def _from_previous(key: str, previous: str, staging: str) -> dict[str, Any] | None:
    info_path = FileSystems.join(previous, metadata.DATASET_JSON)
    try:
        before = read_json(info_path)
        transform = dict(DatasetInfo.from_json(before).transform or {})
    except Exception:  # noqa: BLE001 - no dataset.json, or one this version cannot read: build the graph
        return None
    if transform.get("graph_key") != key:
        return None
    files = transform.pop("files", None)
    transform.pop("graph_key", None)
    if not _graph_files(files):
        return None
    try:
        for rel in files:
            copy_file(FileSystems.join(previous, rel), FileSystems.join(staging, rel))
        # another run published into that dataset meanwhile: its files may be of another graph
        unchanged = read_json(info_path) == before
    except Exception as e:  # noqa: BLE001 - a file gone meanwhile: what was copied is replaced by the build
        _LOG.info("the previous dataset's TFT graph could not be copied (%s): building it", e)
        unchanged = False
    if not unchanged:
        _clear(staging)
        return None
    return transform


def _graph_files(files: Any) -> bool:
    """Whether ``files`` is a non-empty list of relative paths inside the graph's folders."""
    if not isinstance(files, list) or not files:
        return False
    for rel in files:
        parts = rel.split("/") if isinstance(rel, str) else []
        if len(parts) < 2 or parts[0] not in TFT_DIRS or any(p in ("", ".", "..") for p in parts):
            return False
    return True


def _from_cache(key: str, cache: str, staging: str) -> dict[str, Any] | None:
    entry = os.path.join(cache, key)
    try:
        with open(os.path.join(entry, ENTRY), encoding="utf-8") as fh:
            record = json.load(fh)
        if record.get("key") != key or not isinstance(record.get("transform"), dict):
            return None
        if not _graph_files(record.get("files")):
            return None
        for rel in record["files"]:
            copy_file(os.path.join(entry, rel), FileSystems.join(staging, rel))
    except FileNotFoundError:  # no entry for this key (the usual miss): nothing was copied
        if not os.path.isdir(entry):
            return None
        _clear(staging)  # an entry missing a file: what was copied goes
        return None
    except Exception as e:  # noqa: BLE001 - a damaged entry: build the graph
        _LOG.info("graph cache entry %s unusable (%s): building the graph", entry, e)
        _clear(staging)
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # most recently used
    return record["transform"]


def remember(key: str, staging: str, transform: Mapping[str, Any], files: list[str], cache: str | None) -> None:
    """Stores the graph just built in ``staging`` under ``key``; keeps the ``KEEP`` newest entries.

    A cache that cannot be written is noted and skipped: the run has its graph already.
    """
    if not cache:
        return
    entry = os.path.join(cache, key)
    if os.path.isdir(entry):
        return
    try:
        os.makedirs(cache, exist_ok=True)
        fresh = tempfile.mkdtemp(prefix=".new-", dir=cache)
        try:
            for rel in files:
                copy_file(FileSystems.join(staging, rel), os.path.join(fresh, rel))
            record = {"key": key, "transform": dict(transform), "files": list(files)}
            with open(os.path.join(fresh, ENTRY), "w", encoding="utf-8") as fh:
                json.dump(record, fh, indent=1)
            try:
                os.rename(fresh, entry)
            except OSError:  # another run stored the same key first
                pass
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
        _prune(cache)
    except OSError as e:
        _LOG.warning("the TFT graph cache %s could not be written (%s); the run goes on", cache, e)


def _prune(cache: str) -> None:
    entries = []
    now = time.time()
    for e in os.scandir(cache):
        if not e.is_dir(follow_symlinks=False):
            continue
        with contextlib.suppress(OSError):
            if _ENTRY_NAME.fullmatch(e.name) and os.path.isfile(os.path.join(e.path, ENTRY)):
                entries.append((e.stat().st_mtime, e.name))
            elif e.name.startswith(".new-") and now - e.stat().st_mtime > _STALE_SECONDS:
                shutil.rmtree(e.path, ignore_errors=True)  # a store killed half-way
        # anything else in the folder is not the cache's (a user may point it at a shared folder)
    for _, name in sorted(entries, reverse=True)[KEEP:]:
        shutil.rmtree(os.path.join(cache, name), ignore_errors=True)


def _clear(staging: str) -> None:
    """Removes what a failed reuse copied, so the build starts from a clean staging folder."""
    for name in TFT_DIRS:
        delete_tree(FileSystems.join(staging, name))
