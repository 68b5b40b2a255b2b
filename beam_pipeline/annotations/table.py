"""Objects from a CSV/JSONL manifest (``--manifest --manifest-objects rows|column``): a names-only source.

Two forms, asked for explicitly (a classification manifest with an ``xmin``
extra column keeps working as before):

* ``rows``: one row per object, columns ``xmin, ymin, xmax, ymax`` and
  ``label`` (the object's class name). A row with empty box cells and no
  label names an image without objects (a negative).
* ``column``: an ``objects`` column holding the image's objects, a list of
  ``{"xmin", "ymin", "xmax", "ymax", "label"}`` (in a CSV: its JSON text).

Rows naming one file are grouped inside the pipeline (listing's GroupByKey
by path: no process holds the manifest); their image columns (split,
extras, optional ``width``/``height``) must agree, else the image is a
``conflicting_rows`` reject. The grouped objects ride on the image's Ref
(``RawObjects``) to ``CheckManifestObjects``, which finds the frame the boxes
are in (the ``width``/``height`` columns, else the image file's header: the
size the writer decodes), checks every object and attaches ``Annotations``
with names only (ids: the run's label list, annotations.objects.name_labels).

    listed = p | ListInputs(ListSettings.of(cfg), layout, group_rows=GroupObjectRows(cfg.manifest_objects).group)
    joined = listed["refs"] | CheckManifestObjects(cfg.box_units)   # the dict shape of coco.JoinCoco
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations

from ..config import BOX_UNITS, MANIFEST_OBJECTS
from ..sources.manifest import MAX_JSON_DEPTH, canonical_row, is_transient, nested_deeper, value_type
from ..sources.rules import LABEL_COLUMN, PATH_COLUMN, REJECTS
from ..vocab import reasons
from ..vocab.reasons import BAD_IMAGE_SIZE, BAD_OBJECTS, CONFLICTING_ROWS, DUPLICATE_OBJECT, UNREADABLE
from ..vocab.refs import Ref, reject
from . import objects
from .join import COUNTS, OBJECT_REJECTS, CountingDoFn, sum_counts
from .objects import UNASSIGNED, Annotations, Invalid, Obj

ROWS, COLUMN = MANIFEST_OBJECTS
BOX_COLUMNS = ("xmin", "ymin", "xmax", "ymax")
OBJECTS_COLUMN = "objects"
WIDTH_COLUMN, HEIGHT_COLUMN = "width", "height"
FRAME_COLUMNS = (WIDTH_COLUMN, HEIGHT_COLUMN)
PIXELS, NORMALIZED = BOX_UNITS

# Image rejects (rejects.jsonl).
# Object rejects (object_rejects.jsonl; the image stays): besides reasons.BAD_BOX, BOX_OUTSIDE_IMAGE,
# UNKNOWN_CATEGORY (an empty or unusable class name) and BAD_ANNOTATION (not an object):


def object_columns(form: str) -> tuple[str, ...]:
    """The columns of the ``form`` that describe objects, not the image (never extra features)."""
    return (*BOX_COLUMNS, LABEL_COLUMN) if form == ROWS else (OBJECTS_COLUMN,)


def required_columns(form: str) -> tuple[str, ...]:
    """The columns a CSV manifest of the ``form`` must have (the launcher checks its header)."""
    return object_columns(form)


class RawObjects(NamedTuple):
    """An image's objects as its manifest rows give them, unchecked: on the Ref from listing to the check."""

    frame: tuple[Any, Any] | None  # the rows' width and height cells; None without those columns
    objects: tuple[Any, ...]  # one value per object, in a stable order (see GroupObjectRows)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _row_objects(row: Mapping[str, Any], form: str) -> list[Any] | str:
    """The objects one row gives, or why its objects cannot be known (an image reject)."""
    if form == ROWS:
        values = {c: row.get(c) for c in (*BOX_COLUMNS, LABEL_COLUMN)}
        return [] if all(_empty(v) for v in values.values()) else [values]
    cell = row.get(OBJECTS_COLUMN)
    if _empty(cell):
        return []
    if isinstance(cell, str):
        try:
            parsed = json.loads(cell)
        except json.JSONDecodeError as e:
            return f"the '{OBJECTS_COLUMN}' cell is not JSON ({e.msg})"
        except ValueError as e:  # an integer of over 4,300 digits, which Python's int() refuses
            return f"the '{OBJECTS_COLUMN}' cell is JSON Python cannot read ({e})"
        except RecursionError:
            return f"the '{OBJECTS_COLUMN}' cell is JSON nested deeper than Python's reader goes"
        # the row holds the cell: one level less (a deep one failed the job while Beam pickled the row)
        if nested_deeper(cell, parsed, MAX_JSON_DEPTH - 1):
            return f"the '{OBJECTS_COLUMN}' cell is JSON nested deeper than {MAX_JSON_DEPTH - 1} levels"
        cell = parsed
    if not isinstance(cell, list):
        return f"the '{OBJECTS_COLUMN}' value is a {type(cell).__name__}, not a list of objects"
    return cell


def _image_part(row: Mapping[str, Any], form: str) -> dict[str, Any]:
    """What a row says about its image (path, split, extras, frame): rows of one file must agree on it."""
    skip = (*object_columns(form), PATH_COLUMN)  # "./a.jpg" and "a.jpg" name one file: the key says so
    return {k: v for k, v in row.items() if k not in skip and not _empty(v)}


class GroupObjectRows:
    """(file, [(path, row)] naming it) → (path, image row, RawObjects), or a reject.

    Used by listing in place of ``first_row``. Rows are taken in canonical
    JSON order, so the objects' order does not depend on the manifest's row
    order (a column form's single row keeps its list order).
    """

    def __init__(self, form: str) -> None:
        self._form = form

    # A method, not __call__: Beam's runtime type check reads the __name__ of what a FlatMap maps (an instance has
    # none), so listing maps ``GroupObjectRows(form).group``.
    def group(self, element: tuple[str, Iterable[tuple[str, dict[str, Any]]]]) -> Iterator[Any]:
        _, grouped = element
        rows = sorted(grouped, key=lambda pr: canonical_row(pr[1]))
        path = rows[0][0]
        parts = [_image_part(row, self._form) for _, row in rows]
        texts = sorted({canonical_row(p) for p in parts})
        if len(texts) > 1:
            differ = sorted({k for p in parts for k in p if any(q.get(k) != p.get(k) for q in parts)})
            detail = f"{len(rows)} rows name this file and disagree on {', '.join(differ)}"
            yield beam.pvalue.TaggedOutput(REJECTS, reject(path, CONFLICTING_ROWS, detail))
            return
        found: list[Any] = []
        for _, row in rows:
            got = _row_objects(row, self._form)
            if isinstance(got, str):
                yield beam.pvalue.TaggedOutput(REJECTS, reject(path, BAD_OBJECTS, got))
                return
            found.extend(got)
        image = {k: v for k, v in parts[0].items() if k not in FRAME_COLUMNS}
        has_frame = any(k in parts[0] for k in FRAME_COLUMNS)
        frame = (parts[0].get(WIDTH_COLUMN), parts[0].get(HEIGHT_COLUMN)) if has_frame else None
        yield path, image, RawObjects(frame, tuple(found))


def _coordinate(value: Any) -> float | None:
    """A box coordinate as a float (a JSON number or a CSV cell's text); None when it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # a JSON integer beyond a float's range: no finite coordinate (check_box says so)
            return math.inf
    if isinstance(value, str) and value_type(value) != "string":  # plain decimals: "nan", "1_000" are text
        return float(value)
    return None


def looks_normalized(rows: Iterable[Mapping[str, Any]], form: str) -> bool:
    """Whether the rows give boxes and every corner of every one lies in [0, 1]: normalized coordinates
    read as pixels would make boxes of under a pixel in the image's corner."""
    boxes = 0
    for row in rows:
        found = _row_objects(row, form)
        for raw in found if isinstance(found, list) else ():
            corners = [_coordinate(raw.get(c)) for c in BOX_COLUMNS] if isinstance(raw, dict) else [None]
            if any(c is None for c in corners):
                continue
            if not all(0 <= c <= 1 for c in corners):  # type: ignore[operator]
                return False
            boxes += 1
    return boxes > 0


# Decimal digits (int() reads any script's; "²" is a digit to str.isdigit, not to int()), at most 18 after
# leading zeros (int() refuses 4,300), and "64.0" as some tools write (COCO and JSONL numbers are read so too).
_WHOLE_TEXT = re.compile(r"0*(\d{1,18})(?:\.0*)?")


def _whole(value: Any) -> int | None:
    """A positive whole number below objects.MAX_FRAME_SIDE from a JSON number or a CSV cell, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        whole = _WHOLE_TEXT.fullmatch(value.strip())
        value = int(whole[1]) if whole else None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 0 < value < objects.MAX_FRAME_SIDE else None


def check_object(raw: Any, width: int, height: int, units: str, known: Collection[str] | None = None) -> Obj | Invalid:
    """One manifest object as a checked names-only Obj (box clipped within one pixel), or why not. ``known``: the
    classes of a --labels-file (None: any name)."""
    if not isinstance(raw, dict):
        return Invalid(reasons.BAD_ANNOTATION, f"{raw!r} is not an object with xmin, ymin, xmax, ymax and label")
    name = raw.get(LABEL_COLUMN)
    name = name.strip() if isinstance(name, str) else name
    invalid = objects.check_class_name(name, known)
    if invalid is not None:
        return invalid
    corners = [_coordinate(raw.get(c)) for c in BOX_COLUMNS]
    given = {c: raw.get(c) for c in BOX_COLUMNS}
    absent = [c for c in BOX_COLUMNS if c not in raw]
    if absent:
        keys = ", ".join(map(repr, raw)) or "none"
        return Invalid(reasons.BAD_BOX, f"the object has no {', '.join(absent)} (its keys: {keys})")
    if any(v is None for v in corners):
        return Invalid(reasons.BAD_BOX, f"box {given} holds a value that is not a number")
    xmin, ymin, xmax, ymax = corners  # type: ignore[misc]
    if units == NORMALIZED:  # one pixel's worth of tolerance, as for pixel boxes
        xmin, xmax, ymin, ymax = xmin * width, xmax * width, ymin * height, ymax * height
    box = objects.check_box([xmin, ymin, xmax - xmin, ymax - ymin], width, height)
    if isinstance(box, Invalid):
        return Invalid(box.reason, f"box {given} ({units}): {box.detail}")
    area = (box[2] - box[0]) * (box[3] - box[1])
    return Obj(bbox=box, label=UNASSIGNED, text=name, area=area)


def _object_reject(ref: Ref, invalid: Invalid, position: int) -> dict[str, Any]:
    return {**reject(ref.path, invalid.reason, invalid.detail), "object": position}


def image_size(path: str) -> tuple[int, int]:
    """(width, height) from the file's header: the size the writer decodes (without EXIF rotation)."""
    from PIL import Image

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh, Image.open(fh) as img:
        return img.size


class _CheckObjects(CountingDoFn):
    """Ref with RawObjects → Ref with checked Annotations. Tagged: REJECTS (the image's), OBJECT_REJECTS,
    COUNTS ((counter, n) per bundle, as join.sum_counts takes them)."""

    def __init__(self, units: str, known: Collection[str] | None = None) -> None:
        super().__init__()
        self._units = units
        self._known = known

    def process(self, ref: Ref) -> Iterator[Any]:
        tagged = beam.pvalue.TaggedOutput
        raw = ref.annotations
        if not isinstance(raw, RawObjects):
            yield ref
            return
        frame = self._frame(ref, raw)
        if isinstance(frame, dict):
            yield tagged(REJECTS, frame)
            return
        width, height = frame
        kept: list[Obj] = []
        seen: set[str] = set()
        for position, value in enumerate(raw.objects):
            text = canonical_row(value) if isinstance(value, dict) else repr(value)
            if text in seen:
                invalid: Obj | Invalid = Invalid(DUPLICATE_OBJECT, f"{text} is given twice for this image")
            else:
                seen.add(text)
                invalid = check_object(value, width, height, self._units, self._known)
            if isinstance(invalid, Invalid):
                self._counts.add(invalid.reason)
                yield tagged(OBJECT_REJECTS, _object_reject(ref, invalid, position))
            else:
                kept.append(invalid)
        annotations = Annotations(ref.relpath, width, height, tuple(kept), given=len(raw.objects))
        yield dataclasses.replace(ref, annotations=annotations)

    def _frame(self, ref: Ref, raw: RawObjects) -> tuple[int, int] | dict[str, Any]:
        """The frame the boxes are in, or the image's reject (no size or mtime: checked again next run)."""
        if raw.frame is not None:
            width, height = (_whole(v) for v in raw.frame)
            if width is None or height is None:
                detail = f"width {raw.frame[0]!r}, height {raw.frame[1]!r}: not positive whole numbers (below 2**31)"
                return reject(ref.path, BAD_IMAGE_SIZE, detail)
            return width, height
        try:
            return image_size(ref.path)
        except Exception as e:  # noqa: BLE001 - Pillow raises many kinds for a file it cannot read
            if is_transient(e):
                raise  # the runner retries the bundle
            return reject(ref.path, UNREADABLE, f"cannot read the image size its boxes refer to: {e}")


class CheckManifestObjects(beam.PTransform):
    """refs (with RawObjects) → {"refs", REJECTS, OBJECT_REJECTS, COUNTS: (counter, n)}: JoinCoco's shape,
    so the rest of the pipeline and finalize's object accounting work unchanged."""

    def __init__(self, units: str, known: Collection[str] | None = None) -> None:
        super().__init__()
        self._units = units
        self._known = known  # a --labels-file's classes: other names are unknown_category

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> dict[str, beam.PCollection]:
        checked = refs | "CheckObjects" >> beam.ParDo(_CheckObjects(self._units, self._known)).with_outputs(
            REJECTS, OBJECT_REJECTS, COUNTS, main="refs"
        )
        counts = sum_counts(checked[COUNTS])
        out = {"refs": checked.refs, REJECTS: checked[REJECTS], OBJECT_REJECTS: checked[OBJECT_REJECTS]}
        return {**out, COUNTS: counts}
