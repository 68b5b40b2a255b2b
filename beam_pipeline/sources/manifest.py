"""CSV and JSONL manifests: reading rows (bounded nesting and field size), where each row's file is, which
columns give the split and the label, one row per file (the first by canonical JSON), each row's file
looked up, and the types of the extra columns.

    rows = read_manifest_rows(open_text(path), "csv")
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import replace
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from .. import storage
from ..config import SUPPORTED_LOCATIONS, Layout, unsupported_scheme
from ..errors import UsageError
from ..vocab.reasons import (
    DUPLICATE_ROW,
    MISSING,
    UNSUPPORTED_LOCATION,
)
from ..vocab.refs import Ref, reject
from .rules import (
    LABEL_COLUMN,
    PATH_COLUMN,
    REJECTS,
    RESERVED_COLUMNS,
    SPLIT_COLUMN,
    ListingRules,
    ListSettings,
    label_cell,
    make_ref,
    relative_path,
)

# A JSON escape of a UTF-16 surrogate: only lines with one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


# How deep a manifest row (or a CSV objects cell) may nest: a row with objects needs 5 (row, objects, object,
# segmentation, polygon). json.loads reads ~1,000 levels, but Beam's coders pickle a row recursively, and a
# row of a few hundred levels failed the job "while pickling an object", naming neither line nor manifest.
MAX_JSON_DEPTH = 64


def nested_deeper(text: str, value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value``, parsed from the JSON ``text``, nests more than ``limit`` levels of objects and arrays.

    Each level needs its own bracket, so a text with no more than ``limit`` of them is answered by a C-fast
    count; only such rare texts are walked (without recursion).
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def read_manifest_rows(text_stream: io.TextIOBase, fmt: str) -> Iterator[dict[str, Any]]:
    """Rows of a CSV (header row) or JSONL manifest; blank lines are ignored.

    A JSONL line that is not an object, or that escapes half of a surrogate pair
    (no UTF-8 text can hold it: Beam could not even encode the row), raises
    ValueError naming the line.
    """
    if fmt == "jsonl":
        for lineno, line in enumerate(text_stream, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"manifest line {lineno}: not JSON ({e.msg})") from None
            except RecursionError:
                raise ValueError(f"manifest line {lineno}: JSON nested deeper than Python's reader goes") from None
            if not isinstance(row, dict):
                raise ValueError(f"manifest line {lineno}: not a JSON object")
            if nested_deeper(line, row):
                raise ValueError(f"manifest line {lineno}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
            if _SURROGATE_ESCAPE.search(line):
                try:
                    json.dumps(row, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(
                        f"manifest line {lineno}: a \\u escape of half a surrogate pair (not valid Unicode)"
                    ) from None
            yield row
        return
    reader = csv.DictReader(text_stream)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:  # a field over MAX_CSV_FIELD: name the line, as for JSONL
            raise ValueError(f"manifest line {reader.line_num + 1}: not CSV the reader can take ({e})") from None
        if not any((v or "").strip() for k, v in row.items() if k is not None):
            continue
        yield {k.strip(): (v if v is not None else "") for k, v in row.items() if k is not None}


def open_text(path: str, *, on_worker: bool = False) -> io.TextIOWrapper:
    """Opens a text file through Beam FileSystems (local or gs://), BOM-tolerant. ``on_worker``: the manifest the
    launcher found, read in the job: a worker that does not see it says so in one line (UsageError)."""
    raw = storage.open_input(path, "--manifest" if on_worker else None)
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def manifest_path_of(row_path: str, layout: Layout, join: Callable[[str, str], str] = FileSystems.join) -> str:
    """A manifest ``path`` value as a full path: relative ones are under the manifest's folder."""
    if storage.is_absolute(row_path):
        return row_path
    return join(layout.root, row_path)


class _ReadManifest(beam.DoFn):
    """Streams the manifest's rows; runs once, on a worker, for the one manifest path."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def process(self, manifest: str) -> Iterator[dict[str, Any]]:
        with open_text(manifest, on_worker=True) as stream:
            yield from read_manifest_rows(stream, self._layout.manifest_format or "csv")


class Sources(NamedTuple):
    """Where a run's splits and labels come from (``Layout.split_source`` / ``label_source`` values)."""

    split: str
    label: str


def manifest_sources(cfg: ListingRules, columns: Collection[str]) -> Sources:
    """The split and label sources of a manifest whose rows have ``columns``; UsageError for a flag that
    conflicts with them (raised inside the pipeline too: the run stops with that one line).

    A column is the manifest's if any row has it: a JSONL row without a
    ``label`` key in a labelled manifest is a ``no_label`` reject, as an empty
    CSV cell is, unless ``--labels-from none``.
    """
    if SPLIT_COLUMN in columns:
        if cfg.split_ratios:
            raise UsageError("--split-ratios conflicts with the input: the manifest has a split column")
        split = "manifest"
    else:
        split = "ratios" if cfg.split_ratios else "default"
    if cfg.manifest_objects:  # the label column names the objects' classes (annotations/table.py)
        label = "none"
    elif cfg.label_regex:
        label = "regex"
    elif cfg.labels_from:
        label = cfg.labels_from
        if label == "manifest" and LABEL_COLUMN not in columns:
            raise UsageError(f"--labels-from manifest: {cfg.manifest} has no 'label' column")
    else:
        label = "manifest" if LABEL_COLUMN in columns else "none"
    return Sources(split, label)


class ReservedColumnsSeen(beam.CombineFn):
    """manifest rows → the reserved columns (path, label, split) that any row has, sorted.

    Only the three reserved names are kept: the accumulator stays tiny
    whatever the extra columns, so the combine scales with the rows.
    """

    def create_accumulator(self) -> frozenset[str]:
        return frozenset()

    def add_input(self, acc: frozenset[str], row: dict[str, Any]) -> frozenset[str]:
        return acc if acc == RESERVED_COLUMNS else acc | RESERVED_COLUMNS.intersection(row)

    def merge_accumulators(self, accs: Iterable[frozenset[str]]) -> frozenset[str]:
        return frozenset().union(*accs)

    def extract_output(self, acc: frozenset[str]) -> tuple[str, ...]:
        return tuple(sorted(acc))


def canonical_row(row: dict[str, Any]) -> str:
    """A manifest row as canonical JSON: a total order over rows that does not depend on their order."""
    return json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _path_key(path: str) -> str:
    """Rows name the same file when their paths match; ``./a.jpg`` and ``a.jpg`` are one local file."""
    return storage.same_file_key(path)


class _KeyRowByPath(beam.DoFn):
    """row → (the file it names, (its full path, row)); a row without a path is a ``missing`` reject."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def setup(self) -> None:
        # manifest_path_of per row, without looking up the root's file system each time
        self._join = FileSystems.get_filesystem(self._layout.root).join

    def process(self, row: dict[str, Any]) -> Iterator[Any]:
        raw = str(row.get(PATH_COLUMN) or "").strip()
        if not raw:
            yield beam.pvalue.TaggedOutput(REJECTS, reject("", MISSING, f"row without a path: {row}"))
            return
        scheme = unsupported_scheme(raw)
        if scheme:
            detail = f"{scheme}:// is not read; a row's path is {SUPPORTED_LOCATIONS} (or one relative to the manifest)"
            yield beam.pvalue.TaggedOutput(REJECTS, reject(raw, UNSUPPORTED_LOCATION, detail))
            return
        path = manifest_path_of(raw, self._layout, self._join)
        yield _path_key(path), (path, row)


def _canonical(path_and_row: tuple[str, dict[str, Any]]) -> str:
    return canonical_row(path_and_row[1])


def first_row(element: tuple[str, Iterable[tuple[str, dict[str, Any]]]]) -> Iterator[Any]:
    """(file, [(path, row)] naming it) → the first by the row's canonical JSON; the others as
    ``duplicate_row`` rejects.

    Two passes over the group instead of a sort, as in ``dedupe.split_duplicates``:
    only the kept row is held.
    """
    _, rows = element
    it = iter(rows)
    first = next(it)
    if next(it, None) is None:  # the usual case: one row, no JSON to make
        yield first
        return
    keep = min(rows, key=_canonical)
    yield keep
    kept, passed_keep = _canonical(keep), False
    for other in rows:
        text = _canonical(other)
        if not passed_keep and text == kept:
            passed_keep = True
            continue
        detail = f"another row names this file; kept {kept}, not this one: {text}"
        yield beam.pvalue.TaggedOutput(REJECTS, reject(other[0], DUPLICATE_ROW, detail))


def stat_literal(path: str) -> Any:
    """FileMetadata of the file at exactly ``path``, or None if there is none.

    The name is taken literally: ``FileSystems.match`` would read ``[``, ``*``
    and ``?`` as glob characters, so an existing ``a[1].jpg`` would not be
    found. Raises on errors other than "not found" (permission, network).
    """
    return storage.backend_for(path).stat(path)


# Errors a retry may cure (the storage client already retried them): they
# fail the bundle so the runner retries it, instead of turning an existing
# file into a permanent `missing` reject.
_TRANSIENT = frozenset(
    {"ServiceUnavailable", "TooManyRequests", "InternalServerError", "BadGateway", "GatewayTimeout", "RetryError"}
)


def is_transient(e: BaseException) -> bool:
    """True for an error worth retrying the bundle for (server busy, connection reset, time-out)."""
    causes = storage.causes(e)
    return any(type(c).__name__ in _TRANSIENT or isinstance(c, (ConnectionError, TimeoutError)) for c in causes)


class _StatManifestRow(beam.DoFn):
    """Looks up the row's file size (one metadata call); missing files become rejects.

    ``sources`` (a side input) are the split and label sources found over
    every row of the manifest.
    """

    def __init__(self, settings: ListSettings, layout: Layout) -> None:
        self._settings = settings
        self._layout = layout
        self._resolved: tuple[Sources, Layout] | None = None

    def _layout_for(self, sources: Sources) -> Layout:
        if self._resolved is None or self._resolved[0] != sources:
            layout = replace(self._layout, split_source=sources.split, label_source=sources.label)
            self._resolved = (sources, layout)
        return self._resolved[1]

    def process(self, element: tuple[Any, ...], sources: Sources) -> Iterator[Any]:
        # the full path the row names, the row; and with --manifest-objects the image's unchecked objects
        path, row = element[:2]
        layout = self._layout_for(sources)
        try:
            found = stat_literal(path)
        except Exception as e:  # BeamIOError wraps the file system's own error
            if is_transient(e):
                raise  # the runner retries the bundle
            yield beam.pvalue.TaggedOutput(REJECTS, reject(path, MISSING, f"cannot stat: {e}"))
            return
        if found is None:
            yield beam.pvalue.TaggedOutput(REJECTS, reject(path, MISSING, "file does not exist"))
            return
        relpath = relative_path(path, layout.root)
        extras = tuple((k, row[k]) for k in sorted(row) if k not in RESERVED_COLUMNS and row[k] not in (None, ""))
        out = make_ref(
            path,
            relpath,
            found.size_in_bytes,
            self._settings,
            layout,
            label_value=label_cell(row.get(LABEL_COLUMN)),
            split_value=None if row.get(SPLIT_COLUMN) is None else str(row.get(SPLIT_COLUMN)),
            extras=extras,
            mtime=float(getattr(found, "last_updated_in_seconds", 0.0) or 0.0),
        )
        if len(element) > 2 and isinstance(out, Ref):
            out = replace(out, annotations=element[2])  # annotations.table.RawObjects, checked after listing
        yield beam.pvalue.TaggedOutput(REJECTS, out) if isinstance(out, dict) else out


_TYPE_ORDER = {"int": 0, "float": 1, "string": 2}


_INT_RE = re.compile(r"^[+-]?\d+$")


# The longest CSV field read (csv's default, 128 KB, failed a run on one long label or objects cell that a
# JSONL line holds): set for this process when the module loads (the launcher and every worker import it).
MAX_CSV_FIELD = 64 << 20
csv.field_size_limit(MAX_CSV_FIELD)


# Plain decimal notation only: "nan", "inf" or "1_000" stay text.
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def value_type(value: Any) -> str:
    """int, float or string: the narrowest feature type that holds ``value``."""
    if isinstance(value, bool):
        return "int"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        text = value.strip()
        # the digits' count first: int() of text over 4,300 digits raises (and 20 are beyond int64 anyway)
        if _INT_RE.match(text) and len(text.lstrip("+-").lstrip("0")) <= 19 and -(2**63) <= int(text) < 2**63:
            return "int"
        if _FLOAT_RE.match(text):
            return "float"
    return "string"


def widen(a: str, b: str) -> str:
    return a if _TYPE_ORDER[a] >= _TYPE_ORDER[b] else b


def coerce(value: Any, kind: str) -> Any:
    """A manifest value as the column's inferred feature type."""
    if kind == "int":
        return int(value) if not isinstance(value, str) else int(value.strip())
    if kind == "float":
        return float(value) if not isinstance(value, str) else float(value.strip())
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class InferColumnTypes(beam.CombineFn):
    """refs → {column: 'int' | 'float' | 'string'} over every row (one global pass)."""

    def create_accumulator(self) -> dict[str, str]:
        return {}

    def add_input(self, acc: dict[str, str], ref: Ref) -> dict[str, str]:
        for column, value in ref.extras:
            kind = value_type(value)
            acc[column] = widen(acc.get(column, kind), kind)
        return acc

    def merge_accumulators(self, accs: Iterable[dict[str, str]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for acc in accs:
            for column, kind in acc.items():
                out[column] = widen(out.get(column, kind), kind)
        return out

    def extract_output(self, acc: dict[str, str]) -> dict[str, str]:
        return dict(sorted(acc.items()))
