"""The rules that turn a listed file into a ``Ref`` or a reject: relative paths, skipped names, the split
a folder or column gives, the label a folder, regex or column gives (one or several), and the reject
rows as ``rejects.jsonl`` stores them.

    ref_or_reject = make_ref(path, size, mtime, cfg, layout, column_values)
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .. import hashing, storage
from ..config import (
    IMAGE_EXTENSIONS,
    OS_FILES,
    SPLIT_FOLDERS,
    ConvertConfig,
    Layout,
    closest_split,
    settings_for,
    split_name_problem,
)
from ..metadata import REJECT_FIELDS, line_break_problem
from ..vocab.reasons import (
    BAD_FILENAME,
    BAD_LABEL,
    BAD_SPLIT,
    NO_LABEL,
    NO_SPLIT,
    UNKNOWN_LABEL,
)
from ..vocab.refs import Ref, RejectRow, printable_path, reject

REJECTS = "rejects"


class ListingRules(Protocol):
    """The settings that turn a listed file or manifest row into a Ref: a ``ConvertConfig`` (the launcher's
    preflight) or the ``listing.ListSettings`` a worker sees."""

    @property
    def seed(self) -> int: ...
    @property
    def split_ratios(self) -> tuple[tuple[str, float], ...] | None: ...
    @property
    def allow_split_names(self) -> bool: ...
    @property
    def label_regex(self) -> str | None: ...
    @property
    def label_separator(self) -> str | None: ...
    @property
    def labels_from(self) -> str | None: ...
    @property
    def manifest_objects(self) -> str | None: ...
    @property
    def manifest(self) -> str | None: ...


@dataclass(frozen=True)
class ListSettings:
    """What a listing worker sees of the run's settings (``ListInputs`` and its DoFns): the fields that
    decide a file's split, label and shuffle key, and a manifest's sources; not the whole ``ConvertConfig``."""

    seed: int
    split_ratios: tuple[tuple[str, float], ...] | None
    allow_split_names: bool
    label_regex: str | None
    label_separator: str | None
    labels_from: str | None
    manifest_objects: str | None
    manifest: str | None

    @classmethod
    def of(cls, cfg: ConvertConfig) -> ListSettings:
        """Built on the launcher, from the run's config."""
        return settings_for(cls, cfg)


SKIPPED = "skipped"


# Manifest columns with a meaning of their own; every other column is an extra feature.
PATH_COLUMN, LABEL_COLUMN, SPLIT_COLUMN = "path", "label", "split"


# A label that cannot be a line of labels.txt (it holds a line break).
RESERVED_COLUMNS = frozenset({PATH_COLUMN, LABEL_COLUMN, SPLIT_COLUMN})


def with_relative_path(row: RejectRow, root: str) -> RejectRow:
    """A reject as rejects.jsonl stores it: ``path`` relative to the input root, as records' image/filename is.

    ``source`` keeps the full path (local or gs://) to find the file; a path
    outside the root (a manifest row elsewhere) stays full in both.
    """
    source = row["path"]
    prefix = printable_path(root.rstrip("/")) + "/"
    rel = source[len(prefix) :] if root and source.startswith(prefix) else source
    out: RejectRow = {"path": rel, "reason": row["reason"], "detail": row["detail"], "source": source}
    out.update((k, row[k]) for k in REJECT_FIELDS if k in row)  # type: ignore[misc]
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


def label_for(relpath: str, column_value: str | None, cfg: ListingRules, layout: Layout) -> str | None:
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
    cfg: ListingRules,
    layout: Layout,
    *,
    label_value: Any = None,
    split_value: str | None = None,
    extras: tuple[tuple[str, Any], ...] = (),
    mtime: float = 0.0,
) -> Ref | RejectRow:
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
