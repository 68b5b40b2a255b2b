"""The per-image annotation value, box checks, and the TF Object Detection API / Model Garden Example keys.

Every annotation source (COCO today; VOC, CSV later) turns its files into one
``Annotations`` per image: boxes in pixels of the frame the source describes
(``width`` x ``height``), checked here once, whatever the source. It rides on
the image's ``Ref`` through the shuffle; the shard writer calls
``object_features`` with the ``images.Geometry`` prepare_image reports (the
stored frame, the EXIF orientation applied, the recorded size) to add the
object keys: boxes and masks follow the pixels through orientation and resize.

    kept = check_box([x, y, w, h], width=640, height=480)   # (xmin, ymin, xmax, ymax) or Invalid
    features = object_features(annotations, prepared.geometry)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..images.options import ORIENTATION_TRANSPOSE, Geometry
from ..metadata import line_break_problem
from ..vocab.dataset_info import DatasetInfo
from ..vocab.reasons import BAD_BOX, BAD_MASK, BOX_OUTSIDE_IMAGE, MASK_SIZE_MISMATCH, UNKNOWN_CATEGORY

# The Example keys (in keys.py, which the reader side imports without Pillow), named here as before.
from .keys import (
    AREA,
    CLASS_LABEL,
    CLASS_TEXT,
    DIFFICULT,
    IS_CROWD,
    MASK,
    SOURCE_ID,
    TRUNCATED,
    VIEW,
    XMAX,
    XMIN,
    YMAX,
    YMIN,
)

# Not a reject (reject reasons live in vocab.reasons): one polygon of a written object left out of its mask (a
# stray 2-point polygon beside good ones);
# a line of object_rejects.jsonl with "polygon", counted apart (dataset.json objects.polygons_dropped).
POLYGON_DROPPED = "polygon_dropped"

# Obj.label of a names-only source until the writer assigns it: ids 1…N follow the run's label list
# (labels.txt line k = id k; line 0 is BACKGROUND, the TF Object Detection API's id 0).
UNASSIGNED = -1
BACKGROUND = "background"

# A box edge at most this many pixels outside the image is clipped to it; farther is a reject.
EDGE_TOLERANCE = 1.0
# A frame side a source may give (no image is this large): beyond it the source's size is no size at all, and
# a box compared with it could overflow a float.
MAX_FRAME_SIDE = 1 << 31
# The largest finite float32 (image/object/area is a float32 feature): a larger area would be written as inf.
MAX_FLOAT32 = 3.4028234663852886e38
LABEL_MAP_PBTXT = "label_map.pbtxt"
OBJECT_REJECTS_JSONL = "object_rejects.jsonl"


@dataclass(frozen=True)
class Obj:
    """One object of an image, checked: a box in pixels of its image's annotation frame."""

    bbox: tuple[float, float, float, float]  # xmin, ymin, xmax, ymax (pixels, clipped to the frame)
    # The category id as the source has it (COCO ids stay, gaps and all); UNASSIGNED for a names-only
    # source (VOC, CSV): the writer takes the id of ``text`` from the run's label list (``class_ids``).
    label: int
    text: str  # the category's name
    is_crowd: bool = False
    area: float = 0.0  # pixels of the annotation frame; COCO: the annotation's (its mask's), as Model Garden stores it
    difficult: bool = False
    truncated: bool = False
    view: str | None = None  # Pascal VOC's <pose> (image/object/view); None: a source without poses
    # The source's instance segmentation as given (COCO polygons, uncompressed or compressed RLE), checked by
    # check_segmentation; written as image/object/mask (mask_pngs).
    segmentation: Any = None


@dataclass(frozen=True)
class Annotations:
    """What an annotation source says about one image; ``width``/``height``: the frame its boxes are in, the
    stored image's pixels (before EXIF orientation or resizing)."""

    source_id: str  # image/source_id (COCO: the image id as text)
    width: int
    height: int
    objects: tuple[Obj, ...] = ()
    # How many objects the source gave the image, rejected ones included (None: as many as were kept). Counted
    # by the writer for the records it writes (images_with_every_object_rejected); not in the digest: a record
    # stays the same whatever was rejected beside its objects.
    given: int | None = None

    @functools.cached_property
    def digest(self) -> str:
        """``digest(self)``, computed once: the writer needs it twice per image (the shard's resume digest and
        the index line), and with polygons it costs more than the rest of the object keys."""
        payload = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "given"}
        payload["objects"] = [{name: getattr(o, name) for name in _OBJ_FIELDS} for o in self.objects]
        # the JSON dataclasses.asdict gave (earlier runs' index.jsonl holds it) without its deep copy
        return json_digest(payload)


def json_digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


_OBJ_FIELDS = tuple(f.name for f in dataclasses.fields(Obj))


class Invalid(NamedTuple):
    """Why one object cannot be written (reason code, detail)."""

    reason: str
    detail: str


def _number(value: Any) -> float | None:
    """A finite JSON number as float (bools and text are not numbers), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return out if math.isfinite(out) else None


def check_box(xywh: Any, width: int, height: int) -> tuple[float, float, float, float] | Invalid:
    """A COCO-style [x, y, w, h] box as (xmin, ymin, xmax, ymax) inside a width x height frame, or Invalid.

    Zero or negative sizes and non-numbers are ``bad_box``; an edge up to
    EDGE_TOLERANCE pixels outside the frame (rounding in the annotation tool)
    is clipped, farther is ``box_outside_image``.
    """
    if not isinstance(xywh, (list, tuple)) or len(xywh) != 4:
        return Invalid(BAD_BOX, f"bbox {xywh!r} is not four numbers [x, y, width, height]")
    x, y, w, h = xywh
    if type(x) is float and type(y) is float and type(w) is float and type(h) is float:  # most boxes: no copies
        if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(w) and math.isfinite(h)):
            return Invalid(BAD_BOX, f"bbox {list(xywh)!r} holds a value that is not a finite number")
    else:
        values = [_number(v) for v in xywh]
        if any(v is None for v in values):
            return Invalid(BAD_BOX, f"bbox {list(xywh)!r} holds a value that is not a finite number")
        x, y, w, h = values  # type: ignore[assignment]
    if w <= 0 or h <= 0:
        return Invalid(BAD_BOX, f"bbox {list(xywh)!r} has zero or negative size")
    xmin, ymin, xmax, ymax = x, y, x + w, y + h
    tol = EDGE_TOLERANCE
    if xmin < -tol or ymin < -tol or xmax > width + tol or ymax > height + tol:
        return Invalid(
            BOX_OUTSIDE_IMAGE,
            f"bbox {list(xywh)!r} reaches beyond the {width}x{height} image by more than {tol:g} pixel",
        )
    box = (max(xmin, 0.0), max(ymin, 0.0), min(xmax, float(width)), min(ymax, float(height)))
    if box[2] <= box[0] or box[3] <= box[1]:
        return Invalid(BAD_BOX, f"bbox {list(xywh)!r} has nothing left inside the {width}x{height} image")
    return box


def polygon_problem(polygon: Any) -> str | None:
    """Why one COCO polygon cannot be drawn, or None: it must be a list of at least 3 x, y pairs."""
    if (
        not isinstance(polygon, list)
        or len(polygon) < 6
        or len(polygon) % 2
        or any(_number(v) is None for v in polygon)
    ):
        return "a polygon is not a list of at least 3 x, y pairs"
    return None


def dropped_polygons(segmentation: Any) -> list[int]:
    """The places of the polygons a segmentation's mask leaves out: those that cannot be drawn, when at least
    one can (with none, the object is a bad_mask reject); [] for an RLE."""
    if not isinstance(segmentation, list):
        return []
    bad = [place for place, polygon in enumerate(segmentation) if polygon_problem(polygon)]
    return bad if len(bad) < len(segmentation) else []


def drawn_polygons(segmentation: Any) -> Any:
    """``segmentation`` without the polygons ``dropped_polygons`` names (an RLE as it is)."""
    dropped = set(dropped_polygons(segmentation))
    return [p for place, p in enumerate(segmentation) if place not in dropped] if dropped else segmentation


def check_segmentation(segmentation: Any, width: int, height: int) -> Invalid | None:
    """Why a COCO segmentation cannot become a mask of a width x height image, or None.

    Polygons: a list of [x1, y1, x2, y2, ...] lists of at least three points (``drawn_polygons`` leaves out
    the others first, when one is left).
    RLE: {"counts": [int, ...] (uncompressed) or str (compressed), "size": [height, width]}.
    """
    if isinstance(segmentation, list):
        for polygon in segmentation:
            problem = polygon_problem(polygon)
            if problem:
                return Invalid(BAD_MASK, problem)
            # pycocotools walks every edge pixel by pixel, inside the image or not: a point at 1e8 costs gigabytes
            xs, ys = polygon[0::2], polygon[1::2]
            if min(xs) < -width or max(xs) > 2 * width or min(ys) < -height or max(ys) > 2 * height:
                detail = f"a polygon point lies beyond the {width}x{height} image by more than its size"
                return Invalid(BAD_MASK, detail)
        return None if segmentation else Invalid(BAD_MASK, "no polygon")
    if isinstance(segmentation, dict):
        counts, size = segmentation.get("counts"), segmentation.get("size")
        if (
            not isinstance(size, list)
            or len(size) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in size)
        ):
            return Invalid(BAD_MASK, f"RLE size {size!r} is not [height, width]")
        if list(size) != [height, width]:
            return Invalid(MASK_SIZE_MISMATCH, f"RLE of {size[1]}x{size[0]} for a {width}x{height} image")
        if isinstance(counts, str) and counts:
            runs = compressed_counts(counts)
            if runs is None or any(c < 0 for c in runs):
                return Invalid(BAD_MASK, "RLE counts are not a compressed COCO RLE string")
            if sum(runs) != width * height:
                return Invalid(BAD_MASK, f"RLE counts cover {sum(runs)} pixels, the image has {width * height}")
            return None
        if isinstance(counts, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            if sum(counts) != width * height:
                return Invalid(BAD_MASK, f"RLE counts cover {sum(counts)} pixels, the image has {width * height}")
            return None
        return Invalid(BAD_MASK, "RLE counts are neither a list of run lengths nor a compressed string")
    return Invalid(BAD_MASK, f"segmentation of type {type(segmentation).__name__}")


def compressed_counts(text: str) -> list[int] | None:
    """The run lengths of a compressed COCO RLE string (pycocotools' rleFrString), or None if it is not one.

    pycocotools decodes counts that do not cover the image without a word (the mask is whatever is left in
    its buffer) or raises in the writer, so the check reads them first.
    """
    runs: list[int] = []
    place = 0
    while place < len(text):
        value, shift, more = 0, 0, True
        while more:
            if place >= len(text):
                return None  # the last character says more follows
            code = ord(text[place]) - 48
            if not 0 <= code < 64:
                return None  # outside the 64 characters '0'…'o' the encoding uses
            value |= (code & 0x1F) << shift
            more = bool(code & 0x20)
            place += 1
            shift += 5
            if not more and code & 0x10:
                value |= -1 << shift  # a negative difference
        if len(runs) > 2:
            value += runs[-2]  # runs after the third are stored as differences to the run two back
        runs.append(value)
    return runs


def oriented_box(
    box: tuple[float, float, float, float], width: int, height: int, orientation: int
) -> tuple[float, float, float, float]:
    """``box`` (xmin, ymin, xmax, ymax in a width x height frame) where it lies once the image is turned by
    its EXIF ``orientation`` as ImageOps.exif_transpose turns the pixels (2-8; anything else: unchanged).

    Orientations 5-8 swap the axes: the result is in a height x width frame.
    """
    x0, y0, x1, y1 = box
    w, h = float(width), float(height)
    corners = {
        2: (w - x1, y0, w - x0, y1),  # mirrored left-right
        3: (w - x1, h - y1, w - x0, h - y0),  # turned 180 degrees
        4: (x0, h - y1, x1, h - y0),  # mirrored top-bottom
        5: (y0, x0, y1, x1),  # transposed (mirrored about the main diagonal)
        6: (h - y1, x0, h - y0, x1),  # turned 90 degrees clockwise
        7: (h - y1, w - x1, h - y0, w - x0),  # transversed (mirrored about the other diagonal)
        8: (y0, w - x1, y1, w - x0),  # turned 90 degrees counter-clockwise
    }
    return corners.get(orientation, box)


def _mask(obj: Obj, width: int, height: int) -> Any:
    """The object's segmentation as a height x width uint8 array, 1 inside (pycocotools decodes both kinds of
    RLE and rasterizes polygons)."""
    import numpy as np
    from pycocotools import mask as coco_mask

    seg = obj.segmentation
    if isinstance(seg, dict) and isinstance(seg.get("counts"), str):
        rles = {"size": seg["size"], "counts": seg["counts"].encode("ascii")}  # compressed: already an RLE
    else:  # polygons or an uncompressed RLE
        rles = coco_mask.frPyObjects(seg, height, width)
    if isinstance(rles, list):  # polygons: one RLE each, merged (their union) before decoding into one layer
        rles = coco_mask.merge(rles)  # decoding the list would make a height x width layer per polygon
    return np.asarray(coco_mask.decode(rles), dtype=np.uint8)


def has_masks(objs: Sequence[Obj]) -> bool:
    """Whether an image's record gets instance masks: every one of its objects has a segmentation (one mask per
    box, or none)."""
    return bool(objs) and all(o.segmentation is not None for o in objs)


def masks_too_large(annotations: Annotations, geometry: Geometry, max_mask_pixels: int) -> str | None:
    """Why an image's masks would take more pixels than ``--max-mask-pixels`` (0 = no limit), or None.

    Each mask is rasterized on the stored image and PNG-encoded at the recorded size, so the work and the
    PNG bytes grow with masks x pixels, whatever the polygons' own size.
    """
    objs = annotations.objects
    if not max_mask_pixels or not has_masks(objs):
        return None
    pixels = len(objs) * max(geometry.stored_width * geometry.stored_height, geometry.width * geometry.height)
    if pixels > max_mask_pixels:
        return (
            f"{len(objs):,} masks of {geometry.stored_width}x{geometry.stored_height} are {pixels:,} mask pixels, "
            f"over --max-mask-pixels {max_mask_pixels}"
        )
    return None


def mask_pngs(objs: Sequence[Obj], geometry: Geometry) -> list[bytes]:
    """One PNG per object at the recorded size, 1 inside the instance and 0 outside (as Model Garden writes them).

    Each mask is rasterized in the annotation frame (the stored image), turned with the pixels (the same
    Image.transpose ImageOps.exif_transpose uses) and resized to the recorded size with nearest neighbour,
    so it stays 0/1.
    """
    import io
    import zlib

    from PIL import Image

    method = ORIENTATION_TRANSPOSE.get(geometry.orientation)
    size = (geometry.width, geometry.height)
    out = []
    for obj in objs:
        mask = Image.fromarray(_mask(obj, geometry.stored_width, geometry.stored_height), mode="L")
        if method is not None:
            mask = mask.transpose(method)
        if mask.size != size:
            mask = mask.resize(size, Image.Resampling.NEAREST)
        buffer = io.BytesIO()
        # zlib's run-length strategy: a mask is long runs of 0 and 1; a third less CPU than the default
        # strategy and a smaller PNG (the pixel values, what Model Garden's decoder reads, are the same)
        mask.save(buffer, format="PNG", compress_type=zlib.Z_RLE)
        out.append(buffer.getvalue())
    return out


def check_class_name(name: Any, known: Collection[str] | None = None) -> Invalid | None:
    """Why a names-only source's class name cannot name a class (a labels.txt line), or None. ``known``: the
    classes of a --labels-file (None: any name)."""
    if name is not None and not isinstance(name, str):
        return Invalid(UNKNOWN_CATEGORY, f"class name {name!r} is not text (one class per object)")
    if not isinstance(name, str) or not name.strip():
        return Invalid(UNKNOWN_CATEGORY, f"class name {name!r} is empty")
    line_break = line_break_problem(name)
    if line_break:
        return Invalid(UNKNOWN_CATEGORY, f"class name {name!r} {line_break}")
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # JSON's \ud800 escape: half a surrogate pair, which no text file can hold
            return Invalid(UNKNOWN_CATEGORY, f"class name {name!r} holds half a surrogate pair (not valid Unicode)")
    if name == BACKGROUND:
        return Invalid(UNKNOWN_CATEGORY, f"class name {BACKGROUND!r} is id 0, kept for the background")
    if known is not None and name not in known:
        return Invalid(UNKNOWN_CATEGORY, f"class name {name!r} is not in --labels-file")
    return None


def fixed_object_labels(lines: Sequence[str]) -> tuple[str, ...] | str:
    """A names-only source's label list from a --labels-file (line k of labels.txt = id k): the file as it is
    when its line 0 is ``background`` (a labels.txt this tool wrote), else ``background`` then the file's
    names, ids 1…N in its order; or why the file cannot be one."""
    names = lines[1:] if is_background(lines[0]) else lines
    if not names:
        return "no class names in it"
    for name in names:
        if is_background(name):
            return f"{name!r} is id 0, the background: give it on the first line or not at all"
        if name != name.strip():
            # the sources' names are stripped: such a line would name no object, and its id would be lost
            return f"class name {name!r} has spaces around it (the annotations' class names are read stripped)"
    return (BACKGROUND, *names)


def is_background(name: str) -> bool:
    """A class list's name for id 0: ``background`` in any letter case with any underscores around it (the OD
    API's ``background``, torchvision's and detectron2's ``__background__`` or ``Background``, labelme's
    ``_background_``). docs/detection.md names them; tests/test_docs.py checks it."""
    return name.strip("_").lower() == BACKGROUND


def is_gap(k: int, name: str) -> bool:
    """Line k of a labels.txt holds an id without a category (an earlier COCO run's ``unused_<k>``)."""
    return name == _unused(k)


def object_names(annotations: Annotations | None) -> Iterator[str]:
    """The class names a names-only source gave an image's objects (their ids are assigned by the run)."""
    if annotations is not None:
        yield from (o.text for o in annotations.objects if o.label == UNASSIGNED)


def name_labels(found: Iterable[str], prior: Sequence[str] = ()) -> list[str]:
    """The label list of a names-only source: line 0 BACKGROUND, then the names sorted (ids 1…N).

    An earlier run's list (``--incremental-from``) keeps its ids; new names follow it, sorted.
    """
    first = list(prior) or [BACKGROUND]
    known = set(first)
    return [*first, *sorted({name for name in found if name not in known})]


def categories_from_labels(labels: Sequence[str], prior: Sequence[str] = ()) -> tuple[tuple[int, str], ...]:
    """(id, name) of a names-only run's label list: every line but the background's, and but the ``unused_<k>``
    lines an earlier COCO run's list (``prior``) holds for its gaps: they keep their ids, they are no classes."""
    return tuple(
        (k, name)
        for k, name in enumerate(labels)
        if k > 0 and name != BACKGROUND and not (k < len(prior) and is_gap(k, name))
    )


def object_features(
    annotations: Annotations, geometry: Geometry, class_ids: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The object keys of one record, boxes and masks on the recorded pixels.

    ``class_ids``: name → id of the run's label list, for objects of a names-only source (UNASSIGNED).

    ``geometry`` (from prepare_image) says how the recorded image came from the stored one, whose frame the
    annotations are in (a Rejected with ``annotation_size_mismatch`` is the caller's to raise when that frame
    is not the annotations'). Boxes are turned by the EXIF orientation applied, then normalized by the
    turned frame: a resize scales the whole image, so normalized boxes stay as they are. ``image/object/area``
    is scaled to the recorded pixels (the frame Model Garden's evaluator denormalizes boxes to), so it is the
    source's area unchanged unless the image was resized. An image without objects gets ``image/source_id``
    only (empty lists are not written, as Model Garden writes a negative). Masks are written when every
    object has a segmentation (one mask per box, or none).
    """
    objs = annotations.objects
    masked = has_masks(objs)
    stored_w, stored_h, orientation = geometry.stored_width, geometry.stored_height, geometry.orientation
    boxes = [oriented_box(o.bbox, stored_w, stored_h, orientation) for o in objs]
    # the turned frame: orientations 5-8 swap the axes
    frame_w, frame_h = (stored_h, stored_w) if orientation in (5, 6, 7, 8) else (stored_w, stored_h)
    scale = 1.0
    if (geometry.width, geometry.height) != (frame_w, frame_h):
        scale = geometry.width * geometry.height / (frame_w * frame_h)
    return {
        MASK: mask_pngs(objs, geometry) if masked else [],
        SOURCE_ID: annotations.source_id,
        XMIN: [b[0] / frame_w for b in boxes],
        YMIN: [b[1] / frame_h for b in boxes],
        XMAX: [b[2] / frame_w for b in boxes],
        YMAX: [b[3] / frame_h for b in boxes],
        CLASS_LABEL: [_class_id(o, class_ids) for o in objs],
        CLASS_TEXT: [o.text for o in objs],
        IS_CROWD: [int(o.is_crowd) for o in objs],
        AREA: [float(o.area) * scale for o in objs],
        DIFFICULT: [int(o.difficult) for o in objs],
        TRUNCATED: [int(o.truncated) for o in objs],
        # written only when every object has one (VOC), so a COCO record's bytes stay the same
        VIEW: [o.view for o in objs] if all(o.view is not None for o in objs) else [],
    }


def _class_id(obj: Obj, class_ids: Mapping[str, int] | None) -> int:
    if obj.label != UNASSIGNED:
        return obj.label
    if class_ids is None or obj.text not in class_ids:  # the run's label list holds every name it found
        raise ValueError(f"class {obj.text!r} has no id in the run's label list")
    return class_ids[obj.text]


def size_mismatch(annotations: Annotations, geometry: Geometry) -> str | None:
    """Why the stored image (before EXIF orientation or resizing) is not the frame the boxes are in, or None."""
    if (annotations.width, annotations.height) == (geometry.stored_width, geometry.stored_height):
        return None
    turned = (annotations.width, annotations.height) == (geometry.stored_height, geometry.stored_width)
    hint = " (turned: an EXIF orientation the annotating tool applied? boxes must be in stored pixels)"
    return (
        f"the annotations describe a {annotations.width}x{annotations.height} image, "
        f"the file decodes to {geometry.stored_width}x{geometry.stored_height}{hint if turned else ''}"
    )


def feature_spec() -> dict[str, dict[str, Any]]:
    """The object keys in dataset.json's feature spec (shape [None]: one value per object)."""
    many = {"shape": [None], "optional": True, "source": "annotations"}
    spec = {SOURCE_ID: {"dtype": "string", "shape": [], "source": "annotations"}}
    for key in (XMIN, YMIN, XMAX, YMAX, AREA):
        spec[key] = {"dtype": "float32", **many}
    for key in (CLASS_LABEL, IS_CROWD, DIFFICULT, TRUNCATED):
        spec[key] = {"dtype": "int64", **many}
    spec[CLASS_TEXT] = {"dtype": "string", **many}
    spec[VIEW] = {"dtype": "string", **many}
    spec[MASK] = {"dtype": "string", **many}
    return spec


def digest(annotations: Any) -> str:
    """A short digest of an image's annotations: a record is reused (or a shard resumed) only if it is unchanged.

    ``Annotations`` keep theirs (computed once), and so does a ``masks.LabelMap`` (its file's path below --masks,
    size and mtime).
    """
    if annotations is None:
        return ""
    return annotations.digest


# ---- the category list: labels.txt and label_map.pbtxt ---------------------------------------


def labels_lines(categories: Sequence[tuple[int, str]]) -> list[str]:
    """labels.txt of a detection dataset: line k is the name of category id k, as for classification.

    Ids without a category keep their line so the numbering holds: id 0 (the
    background in the TF Object Detection API) is ``background``, a gap
    ``unused_<k>`` (COCO's 80 categories use ids 1-90).
    """
    names = dict(categories)
    top = max(names, default=-1)
    return [names.get(k, BACKGROUND if k == 0 else _unused(k)) for k in range(top + 1)]


def _unused(k: int) -> str:
    """labels.txt's line for an id without a category."""
    return f"unused_{k}"


def _pbtxt_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def label_map_pbtxt(categories: Iterable[tuple[int, str]]) -> str:
    """The TF Object Detection API's label map (``item { id: N name: 'x' }``), ids as the source has them."""
    return "".join(f"item {{\n  id: {cid}\n  name: {_pbtxt_string(name)}\n}}\n" for cid, name in sorted(categories))


def object_counts(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """(counter, n) pairs → {counter: total}, sorted: dataset.json's ``objects`` counts."""
    out: dict[str, int] = {}
    for key, n in pairs:
        out[key] = out.get(key, 0) + n
    return dict(sorted(out.items()))


def categories_of(info: DatasetInfo) -> list[tuple[int, str]] | None:
    """A dataset.json's categories as (id, name) pairs, or None for a dataset without objects."""
    cats = info.categories
    return None if cats is None else [(int(c.id), str(c.name)) for c in cats]
