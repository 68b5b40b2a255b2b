"""Pascal VOC XML (``--voc DIR``): one XML per image, read and joined to the listed images inside the pipeline.

The job lists ``DIR/**.xml`` (one element per file, spread over the
workers), parses each file on its own, and joins it to the listed images
by the image's path relative to ``--input``: no process holds all
annotations.

    refs (Ref) ──► JoinVoc ──► {"refs": Ref with .annotations, REJECTS: image rejects,
                                OBJECT_REJECTS: per-object rejects, SKIPPED, COUNTS: (counter, n)}

Pairing: ``<filename>`` relative to ``--input``; a bare name (no ``/``) is
taken in the folder the XML has under DIR (``DIR/cats/1.xml`` naming
``1.jpg`` is ``cats/1.jpg``). Without ``<filename>``, the last part of
``<path>`` (the annotator's absolute path, often stale: only its name is
used). ``<folder>`` is not used. Boxes follow the TF Object Detection API's
create_pascal_tf_record.py: ``xmin / width`` as written (1-based pixel
coordinates, no 1 subtracted), checked like COCO's (clipped within a pixel,
rejected beyond).

Image rejects (rejects.jsonl): ``bad_annotation`` (an XML that does not
parse, holds a DTD, or is too big: it names the XML file),
``missing_image``, ``duplicate_file_name``, ``annotation_size_mismatch``.
Object rejects (object_rejects.jsonl; the image stays): ``unknown_category``
(an empty name, a line break, ``background``), ``bad_box``,
``box_outside_image``, ``bad_annotation`` (``difficult``/``truncated`` not 0
or 1). A listed image no XML names is skipped (``not_in_voc``).
"""

from __future__ import annotations

import dataclasses
import posixpath
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations

from .. import storage
from ..sources.manifest import is_transient
from ..sources.rules import REJECTS, SKIPPED
from ..vocab import reasons
from ..vocab.reasons import DUPLICATE_FILE_NAME, MISSING_IMAGE
from ..vocab.refs import reject
from . import objects
from .join import COUNTS, OBJECT_REJECTS, REFS, CountingDoFn, join_tagged, keyed_ref, sum_counts, untag
from .objects import Annotations, Invalid, Obj

VOC = "voc"  # the parsed XML files' tag in the join by file name
NOT_IN_VOC = "not_in_voc"  # skip reason: a listed image no XML names
UNSPECIFIED_POSE = "Unspecified"  # VOC's own value for an object without a pose
# A VOC file is a few KB; a bigger one is not an annotation file (and is not read into memory).
MAX_XML_BYTES = 8 * 1024 * 1024


class VocFile(NamedTuple):
    """One parsed XML, its objects not yet checked (that needs the frame, which may be the image's own size)."""

    xml: str  # the XML file's path
    source_id: str  # image/source_id: <filename> as written (the TF OD API's), else the paired path
    width: int  # <size>; 0 when the XML gives none (then the image's own size is the frame)
    height: int
    objects: tuple[Mapping[str, Any], ...]  # per <object>: name, bndbox (4 texts or None), difficult, truncated, pose


class _NoDoctype(ET.TreeBuilder):
    """A VOC file has no DTD: refusing one refuses entity expansion (billion laughs) before it starts."""

    def doctype(self, name: str, pubid: str, system: str) -> None:
        raise ValueError("holds a DOCTYPE (entity declarations are not accepted in an annotation file)")


def parse_xml(data: bytes) -> ET.Element:
    """The XML's root element; ValueError or ET.ParseError when it is not a plain XML document."""
    parser = ET.XMLParser(target=_NoDoctype())
    parser.feed(data)
    return parser.close()


def _text(node: ET.Element | None, tag: str) -> str | None:
    child = node.find(tag) if node is not None else None
    return None if child is None or child.text is None else child.text.strip()


def _size(root: ET.Element) -> tuple[int, int]:
    """<size> width and height; (0, 0) when missing, zero or not whole numbers (the image's size is used)."""
    size = root.find("size")
    try:
        width, height = int(_text(size, "width") or 0), int(_text(size, "height") or 0)
    except ValueError:
        return 0, 0
    ok = 0 < width < objects.MAX_FRAME_SIDE and 0 < height < objects.MAX_FRAME_SIDE
    return (width, height) if ok else (0, 0)


def _object(node: ET.Element) -> dict[str, Any]:
    """An <object>'s fields as text (its <part>s, <occluded> and others are not read)."""
    box = node.find("bndbox")
    corners = None if box is None else tuple(_text(box, k) for k in ("xmin", "ymin", "xmax", "ymax"))
    return {
        "name": _text(node, "name"),
        "bndbox": corners,
        "difficult": _text(node, "difficult"),
        "truncated": _text(node, "truncated"),
        "pose": _text(node, "pose"),
    }


def image_key(root: ET.Element, xml_relpath: str) -> str | None:
    """The relative path under --input of the image an XML describes (the pairing rule above), or None."""
    name = _text(root, "filename")
    if not name:
        path = (_text(root, "path") or "").replace("\\", "/")
        name = path.rsplit("/", 1)[-1]
    if not name:
        return None
    name = name.replace("\\", "/")
    if "/" not in name:
        name = posixpath.join(posixpath.dirname(xml_relpath), name)
    return posixpath.normpath(name).lstrip("/")


class _ParseXml(beam.DoFn):
    """An XML file's metadata → (image key, VocFile); tagged REJECTS: an XML that cannot be read as VOC."""

    def __init__(self, voc_dir: str) -> None:
        self._dir = voc_dir.rstrip("/")

    def process(self, meta: Any) -> Iterator[Any]:
        path = meta.path
        relpath = path[len(self._dir) :].lstrip("/")
        data = b""
        if meta.size_in_bytes <= MAX_XML_BYTES:
            # I/O errors are not caught: a transient one is retried by the runner, not turned into a reject
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
                data = fh.read(MAX_XML_BYTES + 1)  # the file may have grown since it was listed
        if meta.size_in_bytes > MAX_XML_BYTES or len(data) > MAX_XML_BYTES:
            detail = f"larger than {MAX_XML_BYTES} bytes (not a VOC annotation file)"
            yield beam.pvalue.TaggedOutput(REJECTS, reject(path, reasons.BAD_ANNOTATION, detail))
            return
        try:
            root = parse_xml(data)
        except (ET.ParseError, ValueError, LookupError) as e:  # LookupError: an encoding Python does not know
            yield beam.pvalue.TaggedOutput(REJECTS, reject(path, reasons.BAD_ANNOTATION, f"not a VOC XML file: {e}"))
            return
        key = image_key(root, relpath) if root.tag == "annotation" else None
        if key is None:
            why = "no <filename> or <path>" if root.tag == "annotation" else f"root element <{root.tag}>"
            yield beam.pvalue.TaggedOutput(REJECTS, reject(path, reasons.BAD_ANNOTATION, f"not a VOC XML file: {why}"))
            return
        width, height = _size(root)
        source_id = _text(root, "filename") or key
        yield (key, (VOC, VocFile(path, source_id, width, height, tuple(_object(o) for o in root.findall("object")))))


def _number(text: str | None) -> float | None:
    try:
        return objects._number(float(text)) if text is not None else None  # noqa: SLF001 - same package
    except ValueError:
        return None


def check_object(
    raw: Mapping[str, Any], width: int, height: int, known: Collection[str] | None = None
) -> Obj | Invalid:
    """One <object> as a checked Obj: a names-only class (its id is the run's), the box as the TF OD API reads it.
    ``known``: the classes of a --labels-file (None: any name)."""
    name = raw.get("name")
    invalid = objects.check_class_name(name, known)
    if invalid is not None:
        return invalid
    corners = raw.get("bndbox")
    if corners is None:
        return Invalid(reasons.BAD_BOX, "no <bndbox>")
    values = [_number(v) for v in corners]
    if any(v is None for v in values):
        return Invalid(reasons.BAD_BOX, f"bndbox {list(corners)!r} holds a value that is not a finite number")
    xmin, ymin, xmax, ymax = (float(v) for v in values)  # type: ignore[arg-type]
    if xmax <= xmin or ymax <= ymin:
        return Invalid(reasons.BAD_BOX, f"bndbox {list(corners)!r} has zero or negative size")
    box = objects.check_box([xmin, ymin, xmax - xmin, ymax - ymin], width, height)
    if isinstance(box, Invalid):
        return Invalid(box.reason, f"bndbox {list(corners)!r}: {box.detail}")
    flags = {}
    for key in ("difficult", "truncated"):
        text = raw.get(key) or "0"
        if text not in ("0", "1"):
            return Invalid(reasons.BAD_ANNOTATION, f"<{key}> {text!r} is not 0 or 1")
        flags[key] = text == "1"
    return Obj(
        bbox=box,
        label=objects.UNASSIGNED,
        text=name,
        area=(box[2] - box[0]) * (box[3] - box[1]),
        difficult=flags["difficult"],
        truncated=flags["truncated"],
        view=raw.get("pose") or UNSPECIFIED_POSE,
    )


def _header_size(path: str) -> tuple[int, int]:
    """An image's size from its header (Pillow opens lazily), for an XML without <size>; (0, 0) if unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh, Image.open(fh) as img:
            return img.size
    except (UnidentifiedImageError, ValueError, OSError) as e:
        if is_transient(e):  # a busy server is not a bad file: the runner retries the bundle
            raise
        return 0, 0  # not an image: the writer rejects it with why


class _Attach(CountingDoFn):
    """(relative path, [(REFS, Ref) | (VOC, VocFile)]) → Ref with its checked objects, or why not.

    Tagged: REJECTS, OBJECT_REJECTS, SKIPPED (a listed image no XML names), COUNTS ((counter, n) per bundle).
    """

    def __init__(self, root: str, known: Collection[str] | None = None) -> None:
        super().__init__()
        self._root = root
        self._known = known

    def process(self, element: tuple[str, Iterable[tuple[str, Any]]]) -> Iterator[Any]:
        key, values = element
        refs, files = untag(values, REFS, VOC)
        files.sort(key=lambda f: f.xml)
        tagged = beam.pvalue.TaggedOutput
        if not files:
            for _ in refs:
                yield tagged(SKIPPED, NOT_IN_VOC)
            return
        if not refs:
            for f in files:
                detail = f"named by {f.xml} ({len(f.objects)} objects): no such file under --input"
                yield tagged(REJECTS, reject(FileSystems.join(self._root, key), MISSING_IMAGE, detail))
            return
        if len(files) > 1:
            xmls = ", ".join(f.xml for f in files)
            for ref in refs:
                yield tagged(REJECTS, reject(ref.path, DUPLICATE_FILE_NAME, f"named by {len(files)} XML files: {xmls}"))
            return
        [voc] = files
        for ref in refs:
            width, height = (voc.width, voc.height) if voc.width else _header_size(ref.path)
            if not width:  # no <size> and no readable header: not an image (the writer rejects it with why)
                yield dataclasses.replace(ref, annotations=Annotations(voc.source_id, 0, 0))
                continue
            kept: list[Obj] = []
            for position, raw in enumerate(voc.objects):
                obj = check_object(raw, width, height, self._known)
                if isinstance(obj, Invalid):
                    row = reject(
                        ref.path, obj.reason, f"{voc.xml}: object {position} ({raw.get('name')!r}): {obj.detail}"
                    )
                    self._counts.add(obj.reason)
                    yield tagged(OBJECT_REJECTS, {**row, "annotation_id": voc.xml, "object": position})
                else:
                    kept.append(obj)
            annotations = Annotations(voc.source_id, width, height, tuple(kept), given=len(voc.objects))
            yield dataclasses.replace(ref, annotations=annotations)


class JoinVoc(beam.PTransform):
    """refs → {"refs", REJECTS, OBJECT_REJECTS, SKIPPED, COUNTS: (counter, n)}: each listed image with the
    objects of the VOC XML that names it, read and joined inside the pipeline."""

    def __init__(self, voc_dir: str, root: str, known: Collection[str] | None = None) -> None:
        super().__init__()
        self._dir = voc_dir
        self._root = root
        self._known = known  # a --labels-file's classes: other names are unknown_category

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> dict[str, beam.PCollection]:
        parsed = (
            refs.pipeline
            | "VocFolder" >> beam.Create([self._dir])
            # a worker that does not see the folder would match no file: every image without annotations
            | "SeenHere" >> beam.Map(storage.check_folder_on_worker, "--voc")
            | "XmlPattern" >> beam.Map(lambda folder: FileSystems.join(folder, "**.xml"))
            | "MatchXml" >> fileio.MatchAll()
            | "SpreadXml" >> beam.Reshuffle()  # one file per element, parsed on every worker
            | "ParseXml" >> beam.ParDo(_ParseXml(self._dir)).with_outputs(REJECTS, main="files")
        )
        attached = (
            # (relative path, [(REFS, Ref), (VOC, VocFile), ...])
            join_tagged("JoinByFileName", refs | "RefByPath" >> beam.Map(keyed_ref), parsed.files)
            | "Attach"
            >> beam.ParDo(_Attach(self._root, self._known)).with_outputs(
                REJECTS, OBJECT_REJECTS, SKIPPED, COUNTS, main="refs"
            )
        )
        rejects = (parsed[REJECTS], attached[REJECTS]) | "VocRejects" >> beam.Flatten()
        return {
            "refs": attached.refs,
            REJECTS: rejects,
            OBJECT_REJECTS: attached[OBJECT_REJECTS],
            SKIPPED: attached[SKIPPED],
            COUNTS: sum_counts(attached[COUNTS]),
        }
