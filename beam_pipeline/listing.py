"""Listing: turn a folder, glob or manifest into references, inside the pipeline.

Only the glob or the manifest path enters the job graph; the listing itself
happens on a worker (``fileio.MatchAll`` / a manifest-reading DoFn), so a
million-file input never becomes a giant ``beam.Create``.

Each listed file becomes a ``Ref`` (path, relative path, size, split, label,
shuffle key, extra manifest columns), a reject (``no_label``,
``unknown_label``, ``no_split``, ``missing``, ``duplicate_row``) or a skip
(not an image extension, hidden or OS file).

A manifest's label and split columns are those of any row (a combine over
every row, not a first look), and a file named by several rows keeps one of
them, the first by canonical JSON, whatever the rows' order.

    listed = pipeline | ListInputs(cfg, layout)
    listed["refs"], listed["rejects"], listed["skipped"]
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import hashing, storage
from .config import (
    IMAGE_EXTENSIONS,
    OS_FILES,
    SPLIT_FOLDERS,
    ConvertConfig,
    Layout,
    closest_split,
    split_name_problem,
)
from .errors import UsageError
from .metadata import REJECT_FIELDS, line_break_problem
from .vocab.reasons import (
    BAD_FILENAME,
    BAD_LABEL,
    BAD_SPLIT,
    DUPLICATE_ROW,
    MISSING,
    NO_LABEL,
    NO_SPLIT,
    UNKNOWN_LABEL,
    UNREADABLE,
)
from .vocab.refs import Ref, printable_path, reject

REJECTS = "rejects"
SKIPPED = "skipped"

# Manifest columns with a meaning of their own; every other column is an extra feature.
PATH_COLUMN, LABEL_COLUMN, SPLIT_COLUMN = "path", "label", "split"
# A label that cannot be a line of labels.txt (it holds a line break).
RESERVED_COLUMNS = frozenset({PATH_COLUMN, LABEL_COLUMN, SPLIT_COLUMN})
# A manifest row naming a file an earlier row (by canonical JSON) names too.


def with_relative_path(row: dict[str, str], root: str) -> dict[str, str]:
    """A reject as rejects.jsonl stores it: ``path`` relative to the input root, as records' image/filename is.

    ``source`` keeps the full path (local or gs://) to find the file; a path
    outside the root (a manifest row elsewhere) stays full in both.
    """
    source = row["path"]
    prefix = printable_path(root.rstrip("/")) + "/"
    rel = source[len(prefix) :] if root and source.startswith(prefix) else source
    out = {"path": rel, "reason": row["reason"], "detail": row["detail"], "source": source}
    out.update((k, row[k]) for k in REJECT_FIELDS if k in row)
    return out


def relative_path(path: str, root: str) -> str:
    """``path`` relative to ``root`` with ``/`` separators; the path itself if outside it."""
    root = root.rstrip("/")
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path if storage.is_remote(path) else path.lstrip("/")


def skip_reason(relpath: str, check_extension: bool) -> str | None:
    """Why a listed file is not an input at all (hidden/OS file, not an image), or None."""
    parts = relpath.split("/")
    name = parts[-1]
    if any(p.startswith(".") for p in parts) or name.lower() in OS_FILES:
        return "hidden_or_os_file"
    if check_extension and posixpath.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
        return "not_an_image_extension"
    return None


def folder_split_and_rest(relpath: str, layout: Layout) -> tuple[str | None, list[str]]:
    """The split from a ``root/{train,val,test}/`` layout, and the path parts below it."""
    parts = relpath.split("/")
    if layout.split_source != "folders":
        return None, parts
    if len(parts) > 1 and parts[0] in SPLIT_FOLDERS:
        return SPLIT_FOLDERS[parts[0]], parts[1:]
    return None, parts


def _outside_split_folders(relpath: str) -> str:
    """A no_split reject's detail for a file of a folder input with split folders: what its top folder may be."""
    top = relpath.split("/")[0] if "/" in relpath else ""
    guess = closest_split(top) if top else None
    where = f"in {top}/{f', did you mean {guess}/?' if guess else ''}" if top else "directly in the input folder"
    return (
        f"not inside a train/validation/test folder ({where}; if the input's train/ val/ test/ folders are "
        "classes, not splits, pass --no-split-folders)"
    )


def label_for(relpath: str, column_value: str | None, cfg: ConvertConfig, layout: Layout) -> str | None:
    """The label text of one input under the run's label source; None if it has none."""
    source = layout.label_source
    if source == "none":
        return None
    if source == "manifest":
        value = (column_value or "").strip()
        return value or None
    if source == "regex":
        match = re.search(cfg.label_regex or "", relpath.rsplit("/", 1)[-1])
        return match.group(1) if match and match.group(1) else None
    _, rest = folder_split_and_rest(relpath, layout)
    return rest[0] if len(rest) > 1 else None


def label_names(label: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """A Ref's label as names: none, one, or (multi-label run) several. Every label an image counts under."""
    if label is None:
        return ()
    return label if isinstance(label, tuple) else (label,)


def class_values(
    label: str | tuple[str, ...] | None, label_ids: Mapping[str, int]
) -> tuple[int | list[int] | None, str | list[str] | None]:
    """(image/class/label, image/class/text) of a Ref's label: one id and name, or (multi-label) lists sorted by
    id, the names in the ids' order. KeyError for a name without an id."""
    if label is None or isinstance(label, str):
        return (None, None) if label is None else (label_ids[label], label)
    pairs = sorted((label_ids[name], name) for name in label)
    return [i for i, _ in pairs], [name for _, name in pairs]


def split_labels(value: Any, separator: str | None) -> tuple[tuple[str, ...], str]:
    """A manifest label cell as a multi-label run reads it: (distinct labels sorted, "") or ((), why it is bad).

    A JSONL list is taken item by item (items are not split); text is split on
    ``separator``. Each label is stripped; an empty one (``cat||dog``, ``cat|``)
    makes the row a bad label, a repeated one counts once. An empty cell gives
    no labels (a ``no_label`` reject, as in a single-label run).
    """
    if value is None:
        return (), ""
    if isinstance(value, list):
        if separator is None:
            return (), "the label is a JSON list: pass --label-separator for several labels per image"
        if any(not isinstance(item, str) for item in value):
            return (), f"label list {json.dumps(value, ensure_ascii=False)}: every item must be text"
        parts = [item.strip() for item in value]
        where = f"label list {json.dumps(value, ensure_ascii=False)}"
    else:
        text = str(value).strip()
        if not text:
            return (), ""
        parts = [part.strip() for part in text.split(separator)]
        where = f"label {text!r}"
    if any(not part for part in parts):
        return (), f"{where} holds an empty label"
    return tuple(sorted(set(parts))), ""


def make_ref(
    path: str,
    relpath: str,
    size: int,
    cfg: ConvertConfig,
    layout: Layout,
    *,
    label_value: Any = None,
    split_value: str | None = None,
    extras: tuple[tuple[str, Any], ...] = (),
    mtime: float = 0.0,
) -> Ref | dict[str, str]:
    """A Ref for a listed file, or a reject dict saying why it cannot be one."""
    if printable_path(relpath) != relpath:
        return reject(path, BAD_FILENAME, "the file name is not valid UTF-8 (records store it as text)")
    if layout.split_source == "manifest":
        split = SPLIT_FOLDERS.get((split_value or "").strip(), (split_value or "").strip())
        if not split:
            return reject(path, NO_SPLIT, "the manifest row has no split (empty or left out)")
        # A typo in one row of a long manifest is a reject (counted, named in rejects.jsonl), not a new split,
        # and not a failed run: the launcher cannot read every row before the pipeline starts.
        problem = split_name_problem(split, cfg.allow_split_names)
        if problem:
            return reject(path, BAD_SPLIT, f"split column: {problem}")
    elif layout.split_source == "folders":
        folder_split, _ = folder_split_and_rest(relpath, layout)
        if folder_split is None:
            return reject(path, NO_SPLIT, _outside_split_folders(relpath))
        split = folder_split
    elif layout.split_source == "ratios":
        split = hashing.split_for(relpath, cfg.split_ratios or (("train", 1.0),))
    else:
        split = "train"

    label: str | tuple[str, ...] | None
    if layout.label_source == "manifest" and not isinstance(label_value, (str, list, type(None))):
        return reject(path, BAD_LABEL, not_text_label(label_value))  # its Python text (True, nan) is no label
    if layout.label_source == "manifest" and (cfg.label_separator is not None or isinstance(label_value, list)):
        names, problem = split_labels(label_value, cfg.label_separator)
        if problem:
            return reject(path, BAD_LABEL, problem)
        label = names or None
    else:
        label = label_for(relpath, label_value if not isinstance(label_value, list) else None, cfg, layout)
    if layout.label_source != "none":
        if label is None:
            return reject(path, NO_LABEL, f"no label from the {layout.label_source}")
        for name in label_names(label):
            line_break = line_break_problem(name)  # labels.txt holds one label per line, kept exactly otherwise
            if line_break:
                return reject(path, BAD_LABEL, f"label {name!r} {line_break}")
            if layout.labels is not None and name not in layout.labels:
                return reject(path, UNKNOWN_LABEL, f"label {name!r} is not in --labels-file")
    return Ref(path, relpath, size, split, label, hashing.shuffle_key(relpath, cfg.seed), extras, mtime)


def _to_listed(metadata: Any) -> tuple[bytes, int, float]:
    """(path as bytes, size, mtime): what crosses the shuffle after listing.

    Bytes, not text: a local name that is not valid UTF-8 (kept by Python as
    lone surrogates) would fail Beam's UTF-8 string coder; the ref step turns
    it into a ``bad_filename`` reject.
    """
    mtime = float(getattr(metadata, "last_updated_in_seconds", 0.0) or 0.0)
    return metadata.path.encode("utf-8", "surrogateescape"), metadata.size_in_bytes, mtime


def _from_listed(listed: tuple[bytes, int, float]) -> tuple[str, int, float]:
    path, size, mtime = listed
    return path.decode("utf-8", "surrogateescape"), size, mtime


class _MatchedToRef(beam.DoFn):
    def __init__(self, cfg: ConvertConfig, layout: Layout) -> None:
        self._cfg = cfg
        self._layout = layout

    def process(self, listed: tuple[bytes, int, float]) -> Iterator[Any]:
        path, size, mtime = _from_listed(listed)
        relpath = relative_path(path, self._layout.root)
        why = skip_reason(relpath, check_extension=True)
        if why:
            yield beam.pvalue.TaggedOutput(SKIPPED, why)
            return
        out = make_ref(path, relpath, size, self._cfg, self._layout, mtime=mtime)
        yield beam.pvalue.TaggedOutput(REJECTS, out) if isinstance(out, dict) else out


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


def open_text(path: str) -> io.TextIOWrapper:
    """Opens a text file through Beam FileSystems (local or gs://), BOM-tolerant."""
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
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
        with open_text(manifest) as stream:
            yield from read_manifest_rows(stream, self._layout.manifest_format or "csv")


class Sources(NamedTuple):
    """Where a run's splits and labels come from (``Layout.split_source`` / ``label_source`` values)."""

    split: str
    label: str


def manifest_sources(cfg: ConvertConfig, columns: Collection[str]) -> Sources:
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

    def __init__(self, cfg: ConvertConfig, layout: Layout) -> None:
        self._cfg = cfg
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
            self._cfg,
            layout,
            label_value=label_cell(row.get(LABEL_COLUMN)),
            split_value=None if row.get(SPLIT_COLUMN) is None else str(row.get(SPLIT_COLUMN)),
            extras=extras,
            mtime=float(getattr(found, "last_updated_in_seconds", 0.0) or 0.0),
        )
        if len(element) > 2 and isinstance(out, Ref):
            out = replace(out, annotations=element[2])  # annotations.table.RawObjects, checked after listing
        yield beam.pvalue.TaggedOutput(REJECTS, out) if isinstance(out, dict) else out


def label_cell(value: Any) -> Any:
    """A row's label value for make_ref: text; a JSONL whole number as its digits (``3`` and ``3.0`` are the
    class ``3``, as a CSV's ``3`` is); a list (a multi-label row) as is; any other JSON value (true, NaN, 2.5,
    an object) as is, which make_ref rejects as not text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():  # NaN and infinities are not
        return str(int(value))
    return value


def not_text_label(value: Any) -> str:
    """A bad_label detail for a JSONL label that is neither text, a whole number nor a list."""
    if isinstance(value, dict):
        return "the label is a JSON object, not text (or a list of texts)"
    kind = "a JSON true/false" if isinstance(value, bool) else "a JSON number that is not a whole number"
    return f"the label is {json.dumps(value)}, {kind}, not text (put it in quotes if it names a class)"


class _OddLocalEntries(beam.DoFn):
    """Entries Beam's local listing passes over silently: directories named like
    images and dangling symlinks. They are listed inputs too, so they become
    ``unreadable`` rejects instead of vanishing. (Glob inputs only: a whole
    folder finds them while listing, see ``_ListTree``.)"""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def process(self, pattern: str) -> Iterator[dict[str, str]]:
        import os

        from apache_beam.io.filesystem import FileSystem

        matcher = re.compile(FileSystem.translate_pattern(pattern))
        for dirpath, dirnames, filenames in os.walk(self._layout.root):
            for name in dirnames:
                path = os.path.join(dirpath, name)
                if matcher.match(path):
                    yield from _odd_directory(path, self._layout.root)
            for name in filenames:
                path = os.path.join(dirpath, name)
                if matcher.match(path):
                    yield from _odd_file(path, self._layout.root)


def _odd_directory(path: str, root: str) -> Iterator[dict[str, str]]:
    """A local directory (or symlink to one) that a listing passes: a reject if it is named like an input."""
    if not skip_reason(relative_path(path, root), check_extension=True):
        yield reject(path, UNREADABLE, "is a directory")


def _odd_file(path: str, root: str) -> Iterator[dict[str, str]]:
    """A local non-directory entry Beam's listing drops (it cannot be stat'ed): a dangling symlink."""
    import os

    if os.path.islink(path) and not os.path.exists(path):
        if not skip_reason(relative_path(path, root), check_extension=True):
            yield reject(path, UNREADABLE, f"dangling symlink to {os.readlink(path)}")


# ---- listing a whole folder, fanned out --------------------------------------
#
# A folder input is listed level by level: the root's direct entries, then
# each subfolder's direct entries (one element per folder, spread over
# workers by a Reshuffle), and below FANOUT_DEPTH one recursive listing per
# remaining subfolder. No worker holds the whole listing, the list calls of
# different subfolders run on different workers, and what comes out is
# exactly what ``fileio.MatchAll`` of ``root/**`` lists (same paths, sizes,
# skipped entries), streamed instead of collected into one list.

FILES = "files"
# Levels listed one folder at a time before the per-subfolder recursive
# listings: 2 covers root/{split}/{class}/ layouts such as ImageNet's.
FANOUT_DEPTH = 2


def lists_whole_folder(layout: Layout) -> bool:
    """True when the input is a folder (pattern ``root/**``), which is listed fanned out."""
    return bool(layout.pattern) and layout.pattern == FileSystems.join(layout.root, "**")


def not_on_this_worker(folder: str) -> str:
    """The launcher found ``folder`` (its pre-flight checks passed) but the worker listing it does not: a local
    path on a cluster whose workers do not share this machine's disk. Said as such, not as an empty input."""
    import socket

    return (
        f"--input {folder}: no such folder on the worker that lists it (host {socket.gethostname()}), though "
        "the machine that started the run has it: on a cluster every worker must see the input, on a shared "
        "file system mounted at the same path or in gs://"
    )


class _Lister:
    """Direct-entry and recursive listings of a local folder or a gs:// prefix (storage's backend for it)."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._backend = storage.backend_for(root)

    def one_level(self, folder: str) -> Iterator[Any]:
        """Direct entries of ``folder``: subfolders as str, files as TaggedOutput(FILES, FileMetadata),
        odd local entries as TaggedOutput(REJECTS, reject)."""
        from apache_beam.io.filesystem import FileMetadata

        tagged = beam.pvalue.TaggedOutput
        if folder == self._root and not self._backend.is_folder(folder):
            raise UsageError(not_on_this_worker(folder))
        for entry in self._backend.one_level(folder, self._odd):
            if isinstance(entry, str):
                yield entry
            elif isinstance(entry, tuple):
                yield tagged(FILES, FileMetadata(*entry))
            else:
                yield tagged(REJECTS, entry)

    def tree(self, folder: str) -> Iterator[Any]:
        """Every file below ``folder`` (FileMetadata), odd local entries as TaggedOutput(REJECTS, ...)."""
        from apache_beam.io.filesystem import FileMetadata

        tagged = beam.pvalue.TaggedOutput
        for entry in self._backend.tree(folder, self._odd):
            yield FileMetadata(*entry) if isinstance(entry, tuple) else tagged(REJECTS, entry)

    def _odd(self, path: str, is_dir: bool) -> Iterator[Any]:
        """Rejects of an odd local entry (a folder or file the listing cannot take)."""
        return _odd_directory(path, self._root) if is_dir else _odd_file(path, self._root)


def _folder_bytes(folder: str) -> bytes:
    """A folder path as it crosses a shuffle: bytes, since a local name may not be valid UTF-8."""
    return folder.encode("utf-8", "surrogateescape")


def _folder_text(folder: bytes) -> str:
    return folder.decode("utf-8", "surrogateescape")


class _ListOneLevel(beam.DoFn):
    """folder (bytes) → its subfolders (main, bytes), its files (FILES), odd local entries (REJECTS)."""

    def __init__(self, root: str) -> None:
        self._root = root

    def setup(self) -> None:
        self._lister = _Lister(self._root)

    def process(self, folder: bytes) -> Iterator[Any]:
        for out in self._lister.one_level(_folder_text(folder)):
            yield _folder_bytes(out) if isinstance(out, str) else out


class _ListTree(beam.DoFn):
    """folder (bytes) → every file below it (FileMetadata, streamed), odd local entries (REJECTS)."""

    def __init__(self, root: str) -> None:
        self._root = root

    def setup(self) -> None:
        self._lister = _Lister(self._root)

    def process(self, folder: bytes) -> Iterator[Any]:
        yield from self._lister.tree(_folder_text(folder))


class ListFolder(beam.PTransform):
    """pbegin → {FILES: FileMetadata of every file under ``root``, REJECTS: odd local entries}."""

    def __init__(self, root: str, depth: int = FANOUT_DEPTH) -> None:
        super().__init__()
        self._root = root
        self._depth = depth

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        folders = pbegin | "Root" >> beam.Create([_folder_bytes(self._root)])
        files, odd = [], []
        for level in range(self._depth):
            out = folders | f"ListLevel{level}" >> beam.ParDo(_ListOneLevel(self._root)).with_outputs(
                FILES, REJECTS, main="folders"
            )
            files.append(out[FILES])
            odd.append(out[REJECTS])
            # one element per subfolder: different workers list different subfolders
            folders = out.folders | f"SpreadFolders{level}" >> beam.Reshuffle()
        trees = folders | "ListTrees" >> beam.ParDo(_ListTree(self._root)).with_outputs(REJECTS, main=FILES)
        files.append(trees[FILES])
        odd.append(trees[REJECTS])
        return {
            FILES: tuple(files) | "AllFiles" >> beam.Flatten(),
            REJECTS: tuple(odd) | "AllOddEntries" >> beam.Flatten(),
        }


# Elements per batch when spreading a listing: a Reshuffle of single
# elements costs the local runner a shuffle key and a list per element, all
# in memory; batches cut that to the encoded elements, and 1 M files still
# make 10,000 batches for Dataflow to spread.
SPREAD_BATCH = 100


class SpreadInBatches(beam.PTransform):
    """Breaks fusion and spreads a PCollection over the workers, in batches of SPREAD_BATCH."""

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (
            pcoll
            | "Batch" >> beam.BatchElements(min_batch_size=SPREAD_BATCH, max_batch_size=SPREAD_BATCH)
            # [element]: batches of one bundle, so a retried bundle re-sends the same elements
            | "Reshuffle" >> beam.Reshuffle()
            | "Unbatch" >> beam.FlatMap(lambda batch: batch)
        )


class ListInputs(beam.PTransform):
    """pipeline → {"refs": Ref, "rejects": {path, reason, detail}, "skipped": reason text, "sources": Sources}.

    Listed files (or manifest rows) cross a shuffle before any per-file
    work: turning them into refs, the manifest's per-row lookups, dedupe's
    hashing, planning and labels are not fused with the listing and run
    spread over the workers. A manifest's rows cross it grouped by the file
    they name, which finds duplicate rows on the way. ``sources`` is one
    element: the run's split and label sources, for a manifest decided over
    every row (the launcher has only looked at its first rows).
    """

    def __init__(
        self, cfg: ConvertConfig, layout: Layout, group_rows: Callable[[Any], Iterator[Any]] | None = None
    ) -> None:
        super().__init__()
        self._cfg = cfg
        self._layout = layout
        # A manifest file's rows → what StatRows takes ((path, row), or (path, row, annotations)): first_row,
        # or an annotation source's grouping of an image's object rows (annotations.table.GroupObjectRows).
        self._group_rows = group_rows or first_row

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        layout = self._layout
        if layout.manifest:
            return self._expand_manifest(pbegin)
        if lists_whole_folder(layout):
            folder = pbegin | "ListFolder" >> ListFolder(layout.root)
            files, odd = folder[FILES], folder[REJECTS]
        else:  # a glob: one match, which is how far the user's pattern can be split
            glob = pbegin | "Glob" >> beam.Create([layout.pattern])
            files = glob | "Match" >> fileio.MatchAll()  # FileMetadata
            # Beam's listing passes odd entries over only on a local disk
            local = not storage.is_remote(layout.root)
            odd = glob | "OddLocalEntries" >> beam.ParDo(_OddLocalEntries(layout)) if local else None
        spread = (
            files
            | "PathAndSize" >> beam.Map(_to_listed)
            # (path bytes, size, mtime): the fusion break after listing, with the smallest
            # element that still makes a Ref; everything per file comes after it
            | "SpreadFiles" >> SpreadInBatches()
        )
        listed = spread | "ToRefs" >> beam.ParDo(_MatchedToRef(self._cfg, layout)).with_outputs(
            REJECTS, SKIPPED, main="refs"
        )
        rejects = listed[REJECTS]
        if odd is not None:
            rejects = (rejects, odd) | "ListingRejects" >> beam.Flatten()
        sources = pbegin | "Sources" >> beam.Create([Sources(layout.split_source, layout.label_source)])
        return {"refs": listed.refs, REJECTS: rejects, SKIPPED: listed[SKIPPED], "sources": sources}

    def _expand_manifest(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        cfg, layout = self._cfg, self._layout
        rows = (
            pbegin
            | "ManifestPath" >> beam.Create([layout.manifest])
            | "ReadManifest" >> beam.ParDo(_ReadManifest(layout))  # row dicts
        )
        sources = (
            rows
            | "ManifestColumns" >> beam.CombineGlobally(ReservedColumnsSeen())
            # a flag that conflicts with a column some row has fails the run here, naming both
            | "ManifestSources" >> beam.Map(lambda columns: manifest_sources(cfg, columns))
        )
        keyed = rows | "KeyRowsByPath" >> beam.ParDo(_KeyRowByPath(layout)).with_outputs(REJECTS, main="keyed")
        firsts = (
            keyed.keyed
            # (file, [row]): spreads the rows before the per-file lookups, and meets a file's rows
            | "GroupRowsByPath" >> beam.GroupByKey()
            | "FirstRowPerPath" >> beam.FlatMap(self._group_rows).with_outputs(REJECTS, main="rows")
        )
        stat = firsts.rows | "StatRows" >> beam.ParDo(
            _StatManifestRow(cfg, layout), beam.pvalue.AsSingleton(sources)
        ).with_outputs(REJECTS, SKIPPED, main="refs")
        rejects = (keyed[REJECTS], firsts[REJECTS], stat[REJECTS]) | "ManifestRejects" >> beam.Flatten()
        return {"refs": stat.refs, REJECTS: rejects, SKIPPED: stat[SKIPPED], "sources": sources}


# ---- extra manifest columns -------------------------------------------------

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
