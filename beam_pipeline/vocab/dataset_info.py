"""``dataset.json`` as a typed record (``DatasetInfo``): what finalize writes, post-steps add to, and every
reader (inspect, reader.load, an incremental run's look at the previous dataset) reads.

    info = DatasetInfo.from_json(json.loads(text))
    info.splits["train"].shards[0].file, info.rejects.total, info.status
    json.dumps(info.to_json(), indent=2, ensure_ascii=False) + "\\n" == text   # for a file of this version

The bytes of the file are part of the output: ``to_json`` gives the keys in the order this version writes
them, a key it writes only sometimes (``categories``, ``incremental``, ``transform`` ...) only when set, and
the values as they were read (no number is converted). ``from_json`` reads a file of an earlier version: a
missing key takes its default, a key this version does not know is kept (``extra``) and written back last.
A file of another shape (a sub-block that is not an object, a list that is not one) is a ``ValueError``,
as a file that is not JSON is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

OK = "ok"  # the status of a run that may publish (run.outcome names the others)


class InfoShapeError(ValueError):
    """A dataset.json whose JSON is not of the shape this tool writes."""


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InfoShapeError(f"its {where!r} is not a JSON object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InfoShapeError(f"its {where!r} is not a JSON list")
    return value


def _object_or_none(value: Any, where: str) -> Mapping[str, Any] | None:
    return None if value is None else _object(value, where)


@dataclass(frozen=True)
class ShardEntry:
    """One published shard file of a split."""

    file: str
    records: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "records": self.records, "bytes": self.bytes}

    @classmethod
    def from_json(cls, data: Any) -> ShardEntry:
        data = _object(data, "shards")
        return cls(file=data.get("file", ""), records=data.get("records", 0), bytes=data.get("bytes", 0))


@dataclass(frozen=True)
class SplitInfo:
    """A split: its totals, its shards in order, and records per label (None: the dataset is unlabelled)."""

    examples: int
    bytes: int
    num_shards: int
    shards: tuple[ShardEntry, ...]
    labels: Mapping[str, int] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "bytes": self.bytes,
            "num_shards": self.num_shards,
            "shards": [s.to_json() for s in self.shards],
            "labels": None if self.labels is None else dict(self.labels),
        }

    @classmethod
    def from_json(cls, data: Any) -> SplitInfo:
        data = _object(data, "splits")
        shards = tuple(ShardEntry.from_json(s) for s in _list(data.get("shards", []), "shards"))
        return cls(
            examples=data.get("examples", 0),
            bytes=data.get("bytes", 0),
            num_shards=data.get("num_shards", len(shards)),
            shards=shards,
            labels=_object_or_none(data.get("labels"), "labels"),
        )


@dataclass(frozen=True)
class Tally:
    """A count and its breakdown by reason, most frequent first (``rejects``, ``skipped``, object rejects)."""

    total: int = 0
    by_reason: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, by_reason: Mapping[str, int]) -> Tally:
        return cls(total=sum(by_reason.values()), by_reason=dict(by_reason))

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "by_reason": dict(self.by_reason)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Tally:
        data = _object(data, where)
        return cls(total=data.get("total", 0), by_reason=_object(data.get("by_reason", {}), where))


@dataclass(frozen=True)
class Category:
    """A detection dataset's class: its id in the records and its name (line ``id`` of labels.txt)."""

    id: int
    name: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name}

    @classmethod
    def from_json(cls, data: Any) -> Category:
        data = _object(data, "categories")
        return cls(id=data.get("id", 0), name=data.get("name", ""))


@dataclass(frozen=True)
class ObjectsInfo:
    """A detection dataset's objects: kept, rejected (their images stay), images without any."""

    kept: int = 0
    rejects: Tally = field(default_factory=Tally)
    images_without_annotations: int = 0
    images_with_every_object_rejected: int = 0
    polygons_dropped: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "rejects": self.rejects.to_json(),
            "images_without_annotations": self.images_without_annotations,
            "images_with_every_object_rejected": self.images_with_every_object_rejected,
            "polygons_dropped": self.polygons_dropped,
        }

    @classmethod
    def from_json(cls, data: Any) -> ObjectsInfo:
        data = _object(data, "objects")
        return cls(
            kept=data.get("kept", 0),
            rejects=Tally.from_json(data.get("rejects", {}), "objects.rejects"),
            images_without_annotations=data.get("images_without_annotations", 0),
            images_with_every_object_rejected=data.get("images_with_every_object_rejected", 0),
            polygons_dropped=data.get("polygons_dropped", 0),
        )


@dataclass(frozen=True)
class IncrementalInfo:
    """What an ``--incremental-from`` run took from the previous dataset (run.outcome.incremental_summary)."""

    source: str  # "from" in the file: the previous dataset
    reused: int = 0
    converted: int = 0
    reconverted: int = 0
    rejects_kept: int = 0
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    dropped: int = 0
    unreadable_previous_lines: int = 0  # written only when there are any
    # the first DROPPED_NAMED paths (in order) of the dropped records; written only when there are any
    dropped_first: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.source}
        for name in ("reused", "converted", "reconverted", "rejects_kept", "added", "changed", "unchanged", "dropped"):
            out[name] = getattr(self, name)
        if self.unreadable_previous_lines:
            out["unreadable_previous_lines"] = self.unreadable_previous_lines
        if self.dropped_first:
            out["dropped_first"] = list(self.dropped_first)
        return out

    @classmethod
    def from_json(cls, data: Any) -> IncrementalInfo:
        data = _object(data, "incremental")
        known = {f.name for f in fields(cls)} - {"source", "dropped_first"}
        first = data.get("dropped_first")
        named = tuple(str(p) for p in first) if isinstance(first, list) else ()
        return cls(source=data.get("from", ""), dropped_first=named, **{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class ResumedInfo:
    """What a run took from earlier runs' finished shards (resume.py)."""

    shards: int
    records: int
    from_runs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"shards": self.shards, "records": self.records, "from_runs": list(self.from_runs)}

    @classmethod
    def from_json(cls, data: Any) -> ResumedInfo:
        data = _object(data, "resumed")
        runs = tuple(_list(data.get("from_runs", []), "resumed.from_runs"))
        return cls(shards=data.get("shards", 0), records=data.get("records", 0), from_runs=runs)


@dataclass(frozen=True)
class TfdsInfo:
    """The TFDS metadata post-step: the files it wrote, or why it wrote none."""

    files: tuple[str, ...] | None = None
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"files": list(self.files)} if self.files is not None else {"skipped": self.skipped}

    @classmethod
    def from_json(cls, data: Any) -> TfdsInfo:
        data = _object(data, "tfds")
        files = data.get("files")
        return cls(files=None if files is None else tuple(_list(files, "tfds.files")), skipped=data.get("skipped"))


# The keys of dataset.json in the order this version writes them (to_json); the Python name where it differs.
_ORDER = (
    "format_version",
    "name",
    "splits",
    "examples",
    "bytes",
    "labels",
    "num_classes",
    "features",
    "compression",
    "seed",
    "sink",
    "rejects",
    "skipped",
    "config",
    "versions",
    "categories",
    "objects",
    "converted",
    "image_sizes",
    "empty_splits",
    "idx_files",
    "near_duplicates",
    "incremental",
    "changes",
    "report",
    "resumed",
    "status",
    "run_id",
    "transform",
    "tfds",
    "keep_last",
)
# Written whatever their value (null included); every other key is left out while it is None.
_ALWAYS = frozenset(("labels", "num_classes"))


@dataclass(frozen=True)
class DatasetInfo:
    """dataset.json: a dataset's splits and shards, labels, features, rejects, how and by what it was made."""

    name: str
    splits: Mapping[str, SplitInfo]
    examples: int
    bytes: int
    labels: tuple[str, ...] | None  # None: unlabelled (line k of labels.txt is id k)
    num_classes: int | None
    # {feature key: {"dtype", "shape", ...}}: open-ended, as a manifest's extra columns and each annotation
    # source add their own keys (and older versions others); reader.load builds its parsing spec from it
    features: Mapping[str, Mapping[str, Any]]
    compression: str
    seed: int
    format_version: int = 1
    sink: str = "planned"
    rejects: Tally = field(default_factory=Tally)
    skipped: Tally = field(default_factory=Tally)
    # the run's settings as ConvertConfig.as_dict gave them: open-ended, each version writes its own flags,
    # and a later run compares those it cares about (index.reuse_problem)
    config: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)  # package: version (metadata.package_versions)
    categories: tuple[Category, ...] | None = None  # a detection dataset's
    objects: ObjectsInfo | None = None  # a detection dataset's
    converted: Mapping[str, int] = field(default_factory=dict)  # images re-encoded, per source format
    # {"shorter_side": {bucket: records}} of the stored images (vocab.records.size_bucket); planned sink only
    image_sizes: Mapping[str, Any] | None = None
    empty_splits: tuple[str, ...] | None = None  # listed splits whose every file was rejected
    idx_files: str | None = None  # "idx/{file}.idx": each shard's record index
    # near_duplicates.summary_block: the hash, the distance, pair and group counts per split and across splits
    near_duplicates: Mapping[str, Any] | None = None
    incremental: IncrementalInfo | None = None
    # run/changes.night_changes: what moved since the --incremental-from dataset, and the notes saying so
    changes: Mapping[str, Any] | None = None
    # convert --report: {"file": "report.html", "sampled", "groups"}, or {"file": null, "error"} for a page that
    # could not be drawn (the dataset published without it)
    report: Mapping[str, Any] | None = None
    resumed: ResumedInfo | None = None
    status: str = OK  # run.outcome: ok, or why the run did not publish
    run_id: str | None = None
    # what the TFT analysis recorded (analysis.run_analysis: image size, outputs, statistics, its files): kept
    # as the JSON object it is, its keys depend on the flags (--image-stats) and on the version
    transform: Mapping[str, Any] | None = None
    tfds: TfdsInfo | None = None
    # --keep-last's outcome (retention.Outcome.as_dict): run.convert adds it to what it returns, never written
    keep_last: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys of other versions, kept as they were

    @property
    def labelled(self) -> bool:
        return self.labels is not None

    def with_(self, **changes: Any) -> DatasetInfo:
        """A copy with ``changes`` (dataclasses.replace)."""
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of dataset.json, keys in the order this version writes them."""
        out: dict[str, Any] = {}
        for key in _ORDER:
            value = getattr(self, key)
            if value is None and key not in _ALWAYS:
                continue
            out[key] = _json_value(value)
        out.update(self.extra)
        return out

    def to_text(self) -> str:
        """dataset.json's bytes (as text): two-space indents, non-ASCII as it is, a final newline."""
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, data: Any) -> DatasetInfo:
        """The record a dataset.json (this version's or an earlier one's) describes; InfoShapeError (a
        ValueError) for JSON of another shape."""
        data = _object(data, "dataset.json")
        splits = {name: SplitInfo.from_json(s) for name, s in _object(data.get("splits", {}), "splits").items()}
        labels = data.get("labels")
        categories = data.get("categories")
        empty = data.get("empty_splits")
        return cls(
            format_version=data.get("format_version", 1),
            name=data.get("name", ""),
            splits=splits,
            examples=data.get("examples", sum(s.examples for s in splits.values())),
            bytes=data.get("bytes", sum(s.bytes for s in splits.values())),
            labels=None if labels is None else tuple(_list(labels, "labels")),
            num_classes=data.get("num_classes"),
            features={k: _object(v, "features") for k, v in _object(data.get("features", {}), "features").items()},
            compression=data.get("compression", "none"),
            seed=data.get("seed", 0),
            sink=data.get("sink", "planned"),
            rejects=Tally.from_json(data.get("rejects", {}), "rejects"),
            skipped=Tally.from_json(data.get("skipped", {}), "skipped"),
            config=_object(data.get("config", {}), "config"),
            versions=_object(data.get("versions", {}), "versions"),
            categories=None
            if categories is None
            else tuple(Category.from_json(c) for c in _list(categories, "categories")),
            objects=None if data.get("objects") is None else ObjectsInfo.from_json(data["objects"]),
            converted=_object(data.get("converted", {}), "converted"),
            image_sizes=_object_or_none(data.get("image_sizes"), "image_sizes"),
            empty_splits=None if empty is None else tuple(_list(empty, "empty_splits")),
            idx_files=data.get("idx_files"),
            near_duplicates=_object_or_none(data.get("near_duplicates"), "near_duplicates"),
            incremental=None if data.get("incremental") is None else IncrementalInfo.from_json(data["incremental"]),
            changes=_object_or_none(data.get("changes"), "changes"),
            report=_object_or_none(data.get("report"), "report"),
            resumed=None if data.get("resumed") is None else ResumedInfo.from_json(data["resumed"]),
            status=data.get("status", OK),
            run_id=data.get("run_id"),
            transform=_object_or_none(data.get("transform"), "transform"),
            tfds=None if data.get("tfds") is None else TfdsInfo.from_json(data["tfds"]),
            keep_last=_object_or_none(data.get("keep_last"), "keep_last"),
            extra={k: v for k, v in data.items() if k not in _ORDER},
        )

    @property
    def format(self) -> str:
        """The shards' output format (``--format``, kept in the config block; older outputs are TFRecord)."""
        value = self.config.get("format") if isinstance(self.config, Mapping) else None
        return value if isinstance(value, str) and value else "tfrecord"

    def shard_files(self, split: str | None = None) -> list[str]:
        """The shard files (relative to the output) of ``split``, or of every split, in published order."""
        return [s.file for name, info in self.splits.items() if split in (None, name) for s in info.shards]


def _json_value(value: Any) -> Any:
    """A field as JSON: records by their to_json, tuples as lists, mappings as dicts."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def tally_sorted(counts: Iterable[tuple[str, int]]) -> Tally:
    """A Tally of (reason, count) pairs, most frequent first (then by name): dataset.json's order."""
    return Tally.of(dict(sorted(counts, key=lambda kv: (-kv[1], kv[0]))))
