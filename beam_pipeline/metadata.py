"""The dataset's self-description: shard names, labels.txt, rejects.jsonl, dataset.json.

shard_name("pets", "train", 0, 4, "gzip")   # 'pets-train.tfrecord-00000-of-00004.gz'
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from . import __version__, examples
from .formats import registry
from .vocab.dataset_info import DatasetInfo, SplitInfo, Tally
from .vocab.refs import RejectRow

FORMAT_VERSION = 1
DATASET_JSON = "dataset.json"
LABELS_TXT = "labels.txt"
REJECTS_JSONL = "rejects.jsonl"
NEAR_DUPLICATES_JSONL = "near_duplicates.jsonl"  # near_duplicates.py
REPORT_HTML = "report.html"  # convert --report: report.py's page, published with the dataset
# The staging folder's part files of rejects.jsonl (and, in subfolders, of object_rejects.jsonl and
# near_duplicates.jsonl): never published.
REJECT_PARTS = "_rejects"
SUCCESS = "_SUCCESS"
TMP_PREFIX = ".beam_pipeline-tmp-"

_FEATURE_DTYPES = {"int": "int64", "float": "float32", "string": "string"}

# Every character str.splitlines() splits on (tests/test_listing.py checks the list against all of Unicode).
LINE_BREAKS = {
    "\n": "line feed",
    "\r": "carriage return",
    "\x0b": "vertical tab",
    "\x0c": "form feed",
    "\x1c": "file separator",
    "\x1d": "group separator",
    "\x1e": "record separator",
    "\x85": "next line",
    "\u2028": "line separator",
    "\u2029": "paragraph separator",
}
_LINE_BREAK = re.compile("[" + "".join(LINE_BREAKS) + "]")


def line_break_problem(name: str) -> str | None:
    """Why ``name`` cannot be a line of labels.txt (it holds a character ``str.splitlines()`` splits on, so a
    reader splitting the file that way gets one label more and shifted ids), or None. Text to follow the name:
    ``f"label {name!r} {problem}"``."""
    found = _LINE_BREAK.search(name)
    if found is None:
        return None
    char = found.group()
    return f"holds {char!r} ({LINE_BREAKS[char]}), a line break to str.splitlines() (labels.txt has one per line)"


def shard_name(name: str, split: str, index: int, count: int, compression: str, fmt: str | None = None) -> str:
    """A shard's file name in format ``fmt`` (default TFRecord): ``{name}-{split}.{format}-00000-of-00004``."""
    return registry.get(fmt).shard_name(name, split, index, count, compression)


def is_shard_file(basename: str) -> bool:
    """A file name this tool writes as a shard (any dataset name, split, compression, format)."""
    return registry.shard_parts(basename) is not None


def is_idx_file(rel: str) -> bool:
    """``idx/<shard file>.idx``, relative to the output: a shard's record index this tool writes."""
    folder, sep, name = rel.partition("/")
    return folder == "idx" and sep == "/" and "/" not in name and name.endswith(".idx") and is_shard_file(name[:-4])


def feature_spec(
    labelled: bool, extra_types: Mapping[str, str], multi_label: bool = False
) -> dict[str, dict[str, Any]]:
    """Every feature of a record: dtype (int64, float32, string) and shape ([] = one value, [None] = a list:
    a multi-label run's label ids and names)."""
    spec: dict[str, dict[str, Any]] = {
        examples.ENCODED: {"dtype": "string", "shape": []},
        examples.FORMAT: {"dtype": "string", "shape": []},
        examples.HEIGHT: {"dtype": "int64", "shape": []},
        examples.WIDTH: {"dtype": "int64", "shape": []},
        examples.CHANNELS: {"dtype": "int64", "shape": []},
        examples.FILENAME: {"dtype": "string", "shape": []},
        examples.SHA256: {"dtype": "string", "shape": []},
    }
    if labelled:
        shape = [None] if multi_label else []
        spec[examples.LABEL] = {"dtype": "int64", "shape": shape}
        spec[examples.LABEL_TEXT] = {"dtype": "string", "shape": shape}
    for column, kind in sorted(extra_types.items()):
        spec[column] = {"dtype": _FEATURE_DTYPES[kind], "shape": [], "optional": True, "source": "manifest"}
    return spec


def is_multi_label(info: DatasetInfo) -> bool:
    """Whether a dataset.json describes a multi-label dataset: image/class/label is a list of ids."""
    return info.features.get(examples.LABEL, {}).get("shape") == [None]


@functools.cache
def code_digest() -> str:
    """A digest of beam_pipeline's own source files: any change of the code that makes records changes it.

    The version number alone does not (it changes with releases, the code
    with every commit); resumed shards and reused records must come from the
    same code as the rest of the dataset.
    """
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    # every subpackage too (writer/, annotations/ build records); an install that ships compiled files
    # only: those are the code
    files = sorted(here.rglob("*.py")) or sorted(here.rglob("__pycache__/*.pyc"))
    for path in files:
        h.update(path.relative_to(here).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def package_versions() -> dict[str, str]:
    out = {"beam_pipeline": __version__, "beam_pipeline_code": code_digest(), "python": platform.python_version()}
    for dist in ("apache-beam", "pillow", "protobuf", "tensorflow", "tensorflow-transform"):
        try:
            out[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            pass
    return out


def count_by(items: Iterable[str]) -> dict[str, int]:
    return dict(sorted(collections.Counter(items).items(), key=lambda kv: (-kv[1], kv[0])))


# A reject's fields beyond path, reason and detail, kept when present. size and mtime: the file's as listed, for
# files that were read (an incremental run keeps such a reject while they stay the same, and the manifest row's
# "extras" digest with them); annotation_id, object: an object reject's annotation and its place among its
# image's (object_rejects.jsonl); polygon: the place of a polygon left out of a written object's mask.
REJECT_FIELDS = ("size", "mtime", "extras", "annotation_id", "object", "polygon")


def rejects_jsonl(rejects: Iterable[RejectRow]) -> str:
    rows = sorted(rejects, key=lambda r: (r["path"], r["reason"], r.get("detail", "")))
    # path: relative to the input root (as image/filename); source: the full path, when known
    keys = ("path", "reason", "detail")
    optional = ("source", *REJECT_FIELDS)
    return "".join(
        json.dumps({**{k: r.get(k, "") for k in keys}, **{k: r[k] for k in optional if k in r}}, ensure_ascii=False)
        + "\n"
        for r in rows
    )


def dataset_json(
    *,
    name: str,
    splits: Mapping[str, SplitInfo],
    labels: Sequence[str] | None,
    extra_types: Mapping[str, str],
    compression: str,
    seed: int,
    config: Mapping[str, Any],
    rejects: Mapping[str, int],
    skipped: Mapping[str, int],
    sink: str,
    multi_label: bool = False,
) -> DatasetInfo:
    """dataset.json's core: what every run writes (finalize adds the rest)."""
    return DatasetInfo(
        format_version=FORMAT_VERSION,
        name=name,
        splits=dict(splits),
        examples=sum(s.examples for s in splits.values()),
        bytes=sum(s.bytes for s in splits.values()),
        labels=tuple(labels) if labels is not None else None,
        num_classes=len(labels) if labels is not None else None,
        features=feature_spec(labels is not None, extra_types, multi_label),
        compression=compression,
        seed=seed,
        sink=sink,
        rejects=Tally.of(rejects),
        skipped=Tally.of(skipped),
        config=dict(config),
        versions=package_versions(),
    )
