"""COCO instances JSON (``--coco FILE``): streamed, and joined to the listed images inside the pipeline.

The launcher reads only ``categories`` (``read_categories``, a streaming
parse: a multi-GB file is never loaded; the same pass refuses a panoptic file
and counts the annotations' keypoints, which are not written).
``--coco-category-offset N`` adds N to every category id, in ``categories``
and annotations alike. In the job, ``images`` and
``annotations`` are streamed from the file (two workers, one section each)
and joined by COCO image id, then by file name to the listed files (the
file name relative to ``--input``): no process holds all annotations.

    refs (Ref) ──► JoinCoco ──► {"refs": Ref with .annotations, REJECTS: image rejects,
                                 OBJECT_REJECTS: per-object rejects, SKIPPED, COUNTS: (counter, n)}

Image rejects (rejects.jsonl): ``missing_image`` (the JSON names a file that
is not under --input), ``duplicate_image_id``, ``duplicate_file_name``,
``bad_image_entry``. Object rejects (object_rejects.jsonl; the image
stays): ``unknown_image_id``, ``unknown_category``, ``bad_box``,
``box_outside_image``, ``bad_annotation``, ``bad_mask``, ``mask_size_mismatch``. A listed file the JSON does not
name is skipped (``not_in_coco``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations

from .. import storage
from ..config import MAX_CATEGORY_ID, SUPPORTED_LOCATIONS, unsupported_scheme
from ..errors import UsageError, message_lines
from ..metadata import line_break_problem
from ..sources.manifest import MAX_JSON_DEPTH
from ..sources.rules import REJECTS, SKIPPED
from ..vocab import reasons
from ..vocab.reasons import (
    BAD_IMAGE_ENTRY,
    DUPLICATE_FILE_NAME,
    DUPLICATE_IMAGE_ID,
    MISSING_IMAGE,
    UNKNOWN_IMAGE_ID,
    UNSUPPORTED_LOCATION,
)
from ..vocab.refs import reject
from . import objects
from .join import (
    COUNTS,
    IMAGES_ALL_REJECTED,  # noqa: F401 - finalize reads the counters as coco.*
    IMAGES_WITHOUT_OBJECTS,  # noqa: F401
    OBJECT_REJECTS,
    OBJECTS_KEPT,  # noqa: F401
    REFS,
    CountingDoFn,
    join_tagged,
    keyed_ref,
    sum_counts,
    untag,
)
from .objects import Annotations, Invalid, Obj

IMAGES, ANNOTATIONS = "images", "annotations"
COCO = "coco"  # the joined images' tag in the join by file name

# At most this many annotations leave the reader as one element: a run of consecutive annotations of one
# image (COCO files list an image's annotations together). It bounds the reader's buffer, not correctness:
# the join concatenates every run a key receives, whatever the file's order.
MAX_RUN = 256

NOT_IN_COCO = "not_in_coco"  # skip reason


_BOM = b"\xef\xbb\xbf"


def _open(path: str, *, on_worker: bool = False) -> Any:
    """The file, past a UTF-8 byte order mark if it starts with one (files saved on Windows do). ``on_worker``: read
    in the job, where a worker that does not see the launcher's file says so in one line (UsageError)."""
    fh = storage.open_input(path, "--coco" if on_worker else None)
    if fh.read(len(_BOM)) != _BOM:
        fh.seek(0)
    return fh


# MAX_JSON_DEPTH (listing's, as for manifests) is how deep the launcher lets the file nest (a COCO file needs
# 5: file, annotations, annotation, segmentation, polygon). ijson's prefixed parse keeps one prefix string per
# open level, so memory grows with the square of the depth: 80 KB of brackets took 3.9 GB. The launcher's
# scan refuses deeper files before any worker parses.
_OPENS = frozenset({"start_map", "start_array"})
_CLOSES = frozenset({"end_map", "end_array"})


def _json_error(e: Exception) -> str:
    """yajl's parse error in one line: its first line, and the snippet it points into ("near ...")."""
    lines = message_lines(e)
    if not lines:
        return type(e).__name__
    near = [line for line in lines[1:] if "(right here)" not in line and line != ")"]
    return f"{lines[0]}, near {near[0]!r}" if near else lines[0]


class Categories(NamedTuple):
    """A COCO file's categories as the dataset numbers them, and the category 0 it left out (or None)."""

    pairs: tuple[tuple[int, str], ...]  # (id, name), by id (the file's id + --coco-category-offset)
    left_out: str | None  # the name of a category 0 that no annotation names
    keypoints: int = 0  # annotations carrying 'keypoints' (a person_keypoints file): not written

    def shared_name(self) -> tuple[str, list[int]] | None:
        """A name several ids have (kept apart here; a reader that maps names to ids folds them), or None."""
        ids: dict[str, list[int]] = {}
        for cid, name in self.pairs:
            ids.setdefault(name, []).append(cid)
        return next(((name, cids) for name, cids in ids.items() if len(cids) > 1), None)


def read_categories(path: str, offset: int = 0) -> Categories:
    """A COCO file's ``categories``, streamed, their ids plus ``offset`` (--coco-category-offset); UsageError naming
    the file otherwise.

    One pass over the whole file on ijson's unprefixed events (flat memory at any depth), which also proves
    it is JSON and nests at most MAX_JSON_DEPTH levels: the workers' prefixed parse of the sections is then
    bounded. Id 0 is the background in the TF Object Detection API: a category 0 that no annotation names
    (Roboflow's dataset-wide entry) is left out, one that annotations name is refused (their objects would
    be trained as background, and the OD API refuses such a label map). A panoptic file is refused.
    """
    import ijson

    try:
        with _open(path) as fh:
            scan = _scan(ijson.basic_parse(fh, use_float=True), path)
    except ijson.JSONError as e:
        detail = _json_error(e)
        if "integer overflow" in detail:  # valid JSON, beyond the C parser's 64-bit integers
            raise UsageError(
                f"--coco {path}: an integer beyond 64 bits, which the streaming JSON parser cannot read ({detail}); "
                'write such ids as text (e.g. "18446744073709551615" in both images and annotations) or renumber'
            ) from None
        raise UsageError(f"--coco {path}: not valid JSON ({detail})") from None
    if scan.categories is _NO_KEY:
        raise UsageError(f"--coco {path}: no 'categories' (a COCO instances file lists them)")
    if not isinstance(scan.categories, list):
        raise UsageError(f"--coco {path}: 'categories' is not a list (a COCO instances file lists them)")
    if not scan.categories:
        raise UsageError(
            f"--coco {path}: no categories ('categories' is an empty list; a COCO instances file lists the classes "
            "its annotations name)"
        )
    seen: dict[int, str] = {}
    for cat in scan.categories:
        cid = cat.get("id") if isinstance(cat, dict) else None
        name = cat.get("name") if isinstance(cat, dict) else None
        if isinstance(cid, bool) or not isinstance(cid, int) or not isinstance(name, str) or not name:
            raise UsageError(f"--coco {path}: category {cat!r} needs an integer 'id' and a 'name'")
        if not 0 <= cid + offset <= MAX_CATEGORY_ID:
            shifted = f" (+ --coco-category-offset {offset}: {cid + offset})" if offset else ""
            raise UsageError(f"--coco {path}: category id {cid}{shifted} is outside 0-{MAX_CATEGORY_ID}")
        line_break = line_break_problem(name)
        if line_break:
            raise UsageError(f"--coco {path}: category name {name!r} {line_break}")
        if cid + offset in seen:
            raise UsageError(f"--coco {path}: category id {cid} is given twice ({seen[cid + offset]!r}, {name!r})")
        seen[cid + offset] = name
    left_out = seen.pop(0) if 0 in seen and not scan.zero_named else None
    if 0 in seen:
        raise UsageError(
            f"--coco {path}: category 0 ({seen[0]!r}) names objects, but id 0 is the background in the TF Object "
            "Detection API and Model Garden (a model trains them as background); pass --coco-category-offset 1 "
            "(adds 1 to every category id, as in a Label Studio export numbered from 0) or number the categories "
            "from 1"
        )
    return Categories(tuple(sorted(seen.items())), left_out, scan.keypoints)


_NO_KEY = object()  # a file without a top-level "categories"


class _Scan(NamedTuple):
    """What the launcher's pass over a COCO file found."""

    categories: Any  # the top-level ``categories`` value (a list of items), or _NO_KEY
    zero_named: bool  # an annotation names category 0
    keypoints: int  # annotations carrying 'keypoints'


def _scan(events: Iterable[tuple[str, Any]], path: str) -> _Scan:
    """The top-level ``categories``, built from the parse events of the whole file, and what the annotations'
    keys say: whether one names category 0, how many carry keypoints; a UsageError for a panoptic file."""
    import ijson

    depth, key, inside, items = 0, None, False, []
    found: Any = _NO_KEY  # items once the "categories" array opens; another value: that value (an object: {})
    builder: Any = None
    zero_named, category_key, keypoints = False, False, 0  # category_key: the last event was "category_id"
    for event, value in events:
        if category_key:
            category_key = False
            zero_named = zero_named or (event == "number" and value == 0)
        if event in _OPENS:
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise UsageError(f"--coco {path}: JSON nested deeper than {MAX_JSON_DEPTH} levels (COCO needs 5)")
            if depth == 2 and key == "categories":
                if event == "start_map":
                    found = {}
                else:
                    inside, found = True, items
                    continue
        elif event in _CLOSES:
            depth -= 1
            if inside and depth == 1:
                inside = False
                continue
        elif event == "map_key":
            if depth == 1:
                key = value
                continue
            if depth == 3 and key == ANNOTATIONS:
                category_key = value == "category_id"
                if value == "keypoints":
                    keypoints += 1
                if value == "segments_info":
                    raise UsageError(
                        f"--coco {path}: its annotations carry 'segments_info': a COCO panoptic file, which this "
                        "tool does not convert (it takes a COCO instances file, one annotation per object with "
                        "'bbox' and 'segmentation', such as the instances_*.json of the same set)"
                    )
        elif depth == 1 and key == "categories":  # a scalar value
            found = value
        if not inside:
            continue
        if builder is None:
            if depth == 2:  # a scalar item
                items.append(value)
                continue
            builder = ijson.ObjectBuilder()
        builder.event(event, value)
        if depth == 2:  # the item's own object or array closed
            items.append(builder.value)
            builder = None
    return _Scan(found, zero_named, keypoints)


def _id_key(value: Any) -> str:
    """An image id as a join key: its JSON text (the ids 1 and "1" are not the same image)."""
    return json.dumps(value, sort_keys=True)


def input_roots(root: str) -> tuple[str, ...]:
    """The prefixes an absolute file_name under the input folder ``root`` may start with: the folder, and for a
    local one the folder its links lead to (each ending in "/")."""
    tops = storage.names_of(root)
    return tuple(dict.fromkeys(top.rstrip("/") + "/" for top in tops))


def file_key(file_name: str, roots: Sequence[str] = ()) -> str:
    """A COCO ``file_name`` as the relative path a listed file has (``./a/b.jpg`` → ``a/b.jpg``; an absolute
    path under the input folder (``roots``: ``input_roots``), as labelme2coco and FiftyOne may write it, → its
    path below it)."""
    name = file_name.replace("\\", "/")
    top = next((top for top in roots if name.startswith(top)), "")
    return posixpath.normpath(name[len(top) :]).lstrip("/")


def _absolute(file_name: str) -> bool:
    """A file_name that names a place of its own: ``/x``, ``C:/x`` or ``C:\\x``, ``gs://b/x``."""
    windows = file_name.startswith("\\") or re.match(r"[A-Za-z]:[/\\]", file_name) is not None
    return storage.is_absolute(file_name) or windows


def _unknown_id_detail(key: str) -> str:
    """Why an annotation's image_id (as JSON text) joins no images entry; a hint if it is a number in quotes."""
    raw = json.loads(key)
    text = raw.strip() if isinstance(raw, str) else ""
    hint = ""
    if text.isascii() and text.isdigit() and len(text) <= 19:  # int() reads it ("²" is a digit to isdigit only)
        hint = f" (a string: an images id written as the number {int(text)} is another image; write both alike)"
    return f"image_id {key} is not in the file's images{hint}"


class CocoImage(NamedTuple):
    """One ``images`` entry joined with its checked objects, on its way to the listed file it names."""

    annotations: Annotations
    total: int  # annotations naming it
    rejected: int  # of those, rejected
    file_name: str = ""  # as the entry gives it


class _ReadSection(beam.DoFn):
    """(section, COCO path) → that section's items, streamed, keyed by image id and tagged by section:
    (id, (IMAGES, entry)), or (image_id, (ANNOTATIONS, [(place in the file, annotation), ...])).

    Annotations leave in runs of consecutive ones naming the same image (at most MAX_RUN each): one element
    per image for a file that lists an image's annotations together, instead of one per annotation. The
    places keep the file's order, which the join loses.
    """

    def process(self, element: tuple[str, str]) -> Iterator[tuple[str, tuple[str, Any]]]:
        import ijson

        section, path = element
        with _open(path, on_worker=True) as fh:
            items = ijson.items(fh, f"{section}.item", use_float=True)
            if section == IMAGES:
                for entry in items:
                    yield (_id_key(entry.get("id")) if isinstance(entry, dict) else "null", (IMAGES, entry))
                return
            key, run = "", []  # the current run's image id key and its placed annotations
            # the raw image_id of the last annotation: no JSON text needed for the same int or str id (other
            # values Python calls equal may be other JSON: 0.0 and -0.0, {"k": 1} and {"k": true})
            last: Any = None
            for position, ann in enumerate(items):
                if isinstance(ann, dict):
                    raw = ann.get("image_id")
                    if not (run and type(raw) in (int, str) and type(raw) is type(last) and raw == last):
                        raw_key = _id_key(raw)
                    else:
                        raw_key = key
                    last = raw
                else:
                    raw_key, last = "null", None
                if run and (raw_key != key or len(run) >= MAX_RUN):
                    yield (key, (ANNOTATIONS, run))
                    run = []
                key = raw_key
                run.append((position, ann))
            if run:
                yield (key, (ANNOTATIONS, run))


def check_annotation(ann: Any, names: Mapping[int, str], width: int, height: int, offset: int = 0) -> Obj | Invalid:
    """One COCO annotation as a checked Obj (box clipped within 1 pixel), or why it cannot be one.

    ``names``: the dataset's ids (the file's + ``offset``, --coco-category-offset) and their names.
    """
    if not isinstance(ann, dict):
        return Invalid(reasons.BAD_ANNOTATION, "not a JSON object")
    cid = ann.get("category_id")
    if isinstance(cid, bool) or not isinstance(cid, int) or cid + offset not in names:
        return Invalid(reasons.UNKNOWN_CATEGORY, f"category_id {cid!r} is not in the file's categories")
    cid += offset
    box = objects.check_box(ann.get("bbox"), width, height)
    if isinstance(box, Invalid):
        return box
    crowd = ann.get("iscrowd", 0)
    if crowd not in (0, 1) or isinstance(crowd, float):
        return Invalid(reasons.BAD_ANNOTATION, f"iscrowd {crowd!r} is not 0 or 1")
    segmentation = objects.drawn_polygons(ann.get("segmentation")) or None  # [] or absent: no mask
    if segmentation is not None:
        invalid = objects.check_segmentation(segmentation, width, height)
        if invalid is not None:
            return invalid
    area = ann.get("area")
    if area is None:
        area = (box[2] - box[0]) * (box[3] - box[1])  # no mask area given: the box's
    elif objects._number(area) is None or not 0 <= area <= objects.MAX_FLOAT32:  # noqa: SLF001 - same module family
        return Invalid(reasons.BAD_ANNOTATION, f"area {area!r} is not a non-negative number within float32's range")
    return Obj(
        bbox=box,
        label=cid,
        text=names[cid],
        is_crowd=bool(crowd),
        area=float(area),
        segmentation=segmentation,
    )


def _object_reject(where: str, ann: Any, invalid: Invalid, position: int | None) -> dict[str, Any]:
    ann_id = ann.get("id") if isinstance(ann, dict) else None
    row = reject(where, invalid.reason, f"annotation id {ann_id!r}: {invalid.detail}")
    row["annotation_id"] = ann_id
    if position is not None:
        row["object"] = position  # its place among the image's annotations, in the file's order
    return row


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "an images entry is not a JSON object"
    if not isinstance(entry.get("file_name"), str) or not entry["file_name"]:
        return f"image id {entry.get('id')!r} has no file_name"
    for key in ("width", "height"):
        value = entry.get(key)
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # 64.0 as some tools write
        if isinstance(value, bool) or not whole or not 0 < value < objects.MAX_FRAME_SIDE:
            return f"image id {entry.get('id')!r}: {key} {value!r} is not a positive whole number below 2**31"
    return None


class _JoinImageObjects(CountingDoFn):
    """(image id, [(IMAGES, entry) | (ANNOTATIONS, [(place, ann), ...])]) → (file key, (COCO, CocoImage | reject
    dict)).

    Tagged OBJECT_REJECTS: one per annotation that cannot be written (the image stays); COUNTS: their reasons,
    summed per bundle.
    An image's objects keep the order the file lists them in, as Model Garden's create_coco_tf_record.py
    writes them (a model reading both gets the same tensors); the order is not the annotation ids'.
    """

    def __init__(self, coco_path: str, root: str, categories: Sequence[tuple[int, str]], offset: int = 0) -> None:
        super().__init__()
        self._coco_path = coco_path
        self._root = root
        self._roots = input_roots(root)  # here, on the launcher: a worker may not see a local root's links
        self._names = dict(categories)
        self._offset = offset

    def process(self, element: tuple[str, Iterable[tuple[str, Any]]]) -> Iterator[Any]:
        for out in self._join(*element):
            if isinstance(out, beam.pvalue.TaggedOutput):
                self._counts.add(out.value["reason"])
            yield out

    def _join(self, key: str, values: Iterable[tuple[str, Any]]) -> Iterator[Any]:
        entries, runs = untag(values, IMAGES, ANNOTATIONS)
        anns = [ann for _, ann in sorted((placed for run in runs for placed in run), key=lambda placed: placed[0])]
        tagged = beam.pvalue.TaggedOutput
        if not entries:
            for ann in anns:
                invalid = Invalid(UNKNOWN_IMAGE_ID, _unknown_id_detail(key))
                yield tagged(OBJECT_REJECTS, _object_reject(self._coco_path, ann, invalid, None))
            return
        if len(entries) > 1:
            for entry in entries:
                name = entry.get("file_name") if isinstance(entry, dict) else None
                row = reject(self._where(name), DUPLICATE_IMAGE_ID, f"image id {key} names {len(entries)} images")
                yield (self._file_key(name) if isinstance(name, str) else "", (COCO, row))
            return
        entry = entries[0]
        name = entry.get("file_name") if isinstance(entry, dict) else None
        scheme = unsupported_scheme(name) if isinstance(name, str) else None
        if scheme:  # never listed under --input: no file key to join on
            detail = (
                f"image id {key}: {scheme}:// is not read; a file_name is relative to --input or {SUPPORTED_LOCATIONS}"
            )
            yield ("", (COCO, reject(name, UNSUPPORTED_LOCATION, detail)))
            return
        problem = _entry_problem(entry)
        if problem:
            name = entry.get("file_name") if isinstance(entry, dict) else None
            key = self._file_key(name) if isinstance(name, str) and name else ""
            yield (key, (COCO, reject(self._where(name), BAD_IMAGE_ENTRY, problem)))
            return
        width, height, where = int(entry["width"]), int(entry["height"]), ""  # where: made at the first reject
        kept: list[Obj] = []
        for position, ann in enumerate(anns):
            obj = check_annotation(ann, self._names, width, height, self._offset)
            if isinstance(obj, Invalid):
                where = where or self._where(entry["file_name"])
                yield tagged(OBJECT_REJECTS, _object_reject(where, ann, obj, position))
                continue
            kept.append(obj)
            segmentation = ann.get("segmentation")
            if not obj.segmentation or len(obj.segmentation) == len(segmentation):
                continue  # every polygon drawn (or an RLE, or none): no second look at them
            for place in objects.dropped_polygons(segmentation):
                problem = objects.polygon_problem(segmentation[place])
                left = Invalid(objects.POLYGON_DROPPED, f"polygon {place} left out of the mask ({problem})")
                where = where or self._where(entry["file_name"])
                row = _object_reject(where, ann, left, position)
                row["polygon"] = place
                yield tagged(OBJECT_REJECTS, row)
        annotations = Annotations(str(entry["id"]), width, height, tuple(kept), given=len(anns))
        found = CocoImage(annotations, len(anns), len(anns) - len(kept), entry["file_name"])
        yield (self._file_key(entry["file_name"]), (COCO, found))

    def _file_key(self, file_name: str) -> str:
        """``file_key`` under this input; a local absolute name outside it may reach it through a link."""
        if file_name.startswith("/") and not storage.is_remote(self._root) and not file_name.startswith(self._roots):
            file_name = os.path.realpath(file_name)
        return file_key(file_name, self._roots)

    def _where(self, file_name: Any) -> str:
        """Where a reject points: the image file the entry names, or the COCO file itself."""
        if isinstance(file_name, str) and file_name:
            return FileSystems.join(self._root, self._file_key(file_name))
        return self._coco_path


class _AttachAnnotations(beam.DoFn):
    """(relative path, [(REFS, Ref) | (COCO, CocoImage | reject)]) → Ref with its annotations, or why not.

    Tagged: REJECTS (image rejects), SKIPPED (a listed file the JSON does not name). The objects kept and the
    image counters are counted by the writer, for the records it writes.
    Image rejects found here carry no size or mtime: an incremental run checks them again (the JSON may
    have been fixed while the image stayed the same).
    """

    def process(self, element: tuple[str, Iterable[tuple[str, Any]]]) -> Iterator[Any]:
        refs, entries = untag(element[1], REFS, COCO)
        tagged = beam.pvalue.TaggedOutput
        if not entries:
            for _ in refs:
                yield tagged(SKIPPED, NOT_IN_COCO)
            return
        images = [e for e in entries if isinstance(e, CocoImage)]
        rows = sorted((e for e in entries if not isinstance(e, CocoImage)), key=lambda r: (r["reason"], r["detail"]))
        if not refs:
            yield from (tagged(REJECTS, row) for row in rows)
            for image in images:
                name = image.file_name
                why = (
                    f"its file_name {name!r} is absolute and not under --input"
                    if _absolute(name)
                    else "a file_name is taken relative to --input"
                )
                detail = (
                    f"COCO image id {image.annotations.source_id} ({image.total} annotations): no such file ({why})"
                )
                yield tagged(REJECTS, reject(self._missing_path(element[0]), MISSING_IMAGE, detail))
            return
        # A listed file is one reject however many entries name it (merged files repeat them).
        if len(images) > 1:
            ids = ", ".join(sorted(i.annotations.source_id for i in images))
            for ref in refs:
                yield tagged(REJECTS, reject(ref.path, DUPLICATE_FILE_NAME, f"named by COCO image ids {ids}"))
            return
        if rows:
            for ref in refs:
                yield tagged(REJECTS, {**rows[0], "path": ref.path})
            return
        image = images[0]
        for ref in refs:
            yield dataclasses.replace(ref, annotations=image.annotations)

    def __init__(self, root: str) -> None:
        self._root = root

    def _missing_path(self, relpath: str) -> str:
        return FileSystems.join(self._root, relpath)


class JoinCoco(beam.PTransform):
    """refs → {"refs", REJECTS, OBJECT_REJECTS, SKIPPED, COUNTS: (counter, n)}: each listed image with its
    COCO annotations, joined inside the pipeline (by image id, then by file name).

    ``categories``: ``read_categories``' pairs, whose ids are the file's + ``offset`` (--coco-category-offset).
    """

    def __init__(self, coco_path: str, root: str, categories: Sequence[tuple[int, str]], offset: int = 0) -> None:
        super().__init__()
        self._coco_path = coco_path
        self._root = root
        self._categories = tuple(categories)
        self._offset = offset

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> dict[str, beam.PCollection]:
        p = refs.pipeline
        sections = (
            p
            | "CocoSections" >> beam.Create([(IMAGES, self._coco_path), (ANNOTATIONS, self._coco_path)])
            # one section per worker: the two streaming reads run side by side
            | "SpreadSections" >> beam.Reshuffle()
            | "ReadCoco" >> beam.ParDo(_ReadSection())
        )
        by_image = (
            # (image id, [(IMAGES, entry), (ANNOTATIONS, [(place, ann), ...]), ...]): one image at a time
            join_tagged("JoinById", sections)
            | "CheckObjects"
            >> beam.ParDo(_JoinImageObjects(self._coco_path, self._root, self._categories, self._offset)).with_outputs(
                OBJECT_REJECTS, COUNTS, main="images"
            )
        )
        attached = (
            # (relative path, [(REFS, Ref), (COCO, CocoImage | reject), ...])
            join_tagged("JoinByFileName", refs | "RefByPath" >> beam.Map(keyed_ref), by_image.images)
            | "Attach" >> beam.ParDo(_AttachAnnotations(self._root)).with_outputs(REJECTS, SKIPPED, main="refs")
        )
        counts = sum_counts(by_image[COUNTS])
        return {
            "refs": attached.refs,
            REJECTS: attached[REJECTS],
            OBJECT_REJECTS: by_image[OBJECT_REJECTS],
            SKIPPED: attached[SKIPPED],
            COUNTS: counts,
        }
