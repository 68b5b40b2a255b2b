"""Semantic segmentation label maps (``--masks DIR``): one PNG per image, paired by relative path in the pipeline.

An image ``INPUT/a/b.jpg`` is paired with ``DIR/a/b.png`` (its relative path
without the extension, plus ``.png``). The mask folder is listed inside the job
(``sources.folders.ListFolder``, local or gs://) and joined to the listed images by that
key (``join.join_tagged``): no process holds every mask. Only the mask's path,
size and mtime (``LabelMap``) ride on the image's Ref through the shuffle; the
shard writer reads the mask beside its image (``segmentation_features``).

    refs (Ref) ──► JoinMasks ──► {"refs": Ref with .annotations = LabelMap, REJECTS, SKIPPED}

The record gets ``image/segmentation/class/encoded`` (a single-channel 8-bit
PNG: pixel value = class id, 255 kept as it is, e.g. an "ignore" value) and
``image/segmentation/class/format`` (``png``), as TF Model Garden's semantic
segmentation decoder reads them (``tf.io.decode_image(..., channels=1)``).

Image rejects (rejects.jsonl): ``missing_mask``, ``duplicate_mask``, ``bad_mask``
(not a decodable PNG, or a class id above 255), ``mask_not_single_channel`` (RGB,
grey + alpha: not a label map), ``mask_size_mismatch``. A mask without an image
is skipped (``mask_without_image``), as is a file in DIR that is not a ``.png``
(``not_a_png_mask``) and, when DIR is inside --input, every listed file in DIR (``in_masks_folder``).
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.typehints.decorators import no_annotations

from ..images.headers import png_problem
from ..images.options import ORIENTATION_TRANSPOSE, Geometry, ImageInfo, ImageOptions, Rejected
from ..sources.folders import FILES, Listed, ListFolder, _from_listed
from ..sources.rules import REJECTS, SKIPPED, relative_path
from ..vocab.reasons import BAD_MASK, DUPLICATE_MASK, MASK_NOT_SINGLE_CHANNEL, MASK_SIZE_MISMATCH, MISSING_MASK
from ..vocab.refs import Ref, reject
from . import objects
from .join import REFS, join_tagged, untag

SEGMENTATION_ENCODED = "image/segmentation/class/encoded"
SEGMENTATION_FORMAT = "image/segmentation/class/format"

MASKS = "masks"  # the label maps' tag in the join by stem
# skip reasons (dataset.json "skipped")
MASK_WITHOUT_IMAGE = "mask_without_image"
NOT_A_MASK = "not_a_png_mask"  # a file in DIR that does not end in .png
IN_MASK_FOLDER = "in_masks_folder"  # a listed image file inside DIR (DIR under --input)

# Pillow modes whose pixel values are class ids: grey (8, 16 bit), 1-bit, palette indices.
LABEL_MODES = ("1", "L", "P", "I", "I;16", "I;16B", "I;16L")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class LabelMap:
    """An image's label map file, as listed: its path below --masks, size and mtime go into the record's
    annotation digest, so a record is reused (or a shard resumed) only while the mask file is unchanged too."""

    path: str
    size: int
    mtime: float
    relpath: str = ""  # below --masks; "": the digest names the path as given

    @property
    def digest(self) -> str:
        """As an image's own identity: where it lies below its folder, not the folder (the same masks read from
        another folder, a copy or a bucket, leave every record reusable)."""
        return objects.json_digest({"path": self.relpath or self.path, "size": self.size, "mtime": self.mtime})


def mask_key(relpath: str) -> str:
    """The join key of an image or a mask: its relative path without the extension (``a/b.jpg`` → ``a/b``)."""
    stem, _ = posixpath.splitext(relpath)
    return stem


def feature_spec() -> dict[str, dict[str, Any]]:
    """The segmentation keys in dataset.json's feature spec (``source: annotations``: compared per record by
    the annotation digest, not as the run's features)."""
    return {
        SEGMENTATION_ENCODED: {"dtype": "string", "shape": [], "source": "annotations"},
        SEGMENTATION_FORMAT: {"dtype": "string", "shape": [], "source": "annotations"},
    }


# ---- the join ------------------------------------------------------------------------------------


class _KeyMasks(beam.DoFn):
    """A listed file in DIR (path bytes, size, mtime) → (key, (MASKS, LabelMap)); SKIPPED for a file that is not a
    ``.png``."""

    def __init__(self, mask_dir: str) -> None:
        self._dir = mask_dir

    def process(self, listed: Listed) -> Iterator[Any]:
        path, size, mtime = _from_listed(listed)
        rel = relative_path(path, self._dir)
        if not rel.lower().endswith(".png"):
            yield beam.pvalue.TaggedOutput(SKIPPED, NOT_A_MASK)
            return
        yield (mask_key(rel), (MASKS, LabelMap(path, size, mtime, rel)))


class _KeyRefs(beam.DoFn):
    """Ref → (key, (REFS, Ref)); SKIPPED for a listed file inside the mask folder (--masks under --input): a label map
    is not an image of the dataset."""

    def __init__(self, mask_dir: str) -> None:
        self._prefix = mask_dir.rstrip("/") + "/"

    def process(self, ref: Ref) -> Iterator[Any]:
        if ref.path.startswith(self._prefix):
            yield beam.pvalue.TaggedOutput(SKIPPED, IN_MASK_FOLDER)
            return
        yield (mask_key(ref.relpath), (REFS, ref))


class _Pair(beam.DoFn):
    """(key, [(REFS, Ref) | (MASKS, LabelMap)]) → Ref with its LabelMap; REJECTS, SKIPPED.

    Rejects here carry no size or mtime: an incremental run checks them again
    (the mask may have been added while the image stayed the same).
    """

    def process(self, element: tuple[str, Iterable[tuple[str, Any]]]) -> Iterator[Any]:
        key, values = element
        refs, found = untag(values, REFS, MASKS)
        found.sort(key=lambda m: m.path)
        tagged = beam.pvalue.TaggedOutput
        if not refs:
            for _ in found:
                yield tagged(SKIPPED, MASK_WITHOUT_IMAGE)
            return
        for ref in refs:
            if not found:
                yield tagged(REJECTS, reject(ref.path, MISSING_MASK, f"no label map {key}.png in the --masks folder"))
            elif len(found) > 1:
                names = ", ".join(m.path for m in found)
                yield tagged(REJECTS, reject(ref.path, DUPLICATE_MASK, f"more than one label map: {names}"))
            else:
                yield _with_mask(ref, found[0])


def _with_mask(ref: Ref, mask: LabelMap) -> Ref:
    import dataclasses

    return dataclasses.replace(ref, annotations=mask)


class JoinMasks(beam.PTransform):
    """refs → {"refs", REJECTS, SKIPPED}: each listed image with its label map, joined inside the pipeline."""

    def __init__(self, mask_dir: str) -> None:
        super().__init__()
        self._dir = mask_dir

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> dict[str, beam.PCollection]:
        listed = refs.pipeline | "ListMasks" >> ListFolder(self._dir, flag="--masks")
        masks = listed[FILES] | "KeyMasks" >> beam.ParDo(_KeyMasks(self._dir)).with_outputs(SKIPPED, main="masks")
        keyed = refs | "RefByStem" >> beam.ParDo(_KeyRefs(self._dir)).with_outputs(SKIPPED, main="refs")
        paired = (
            # (relative path without extension, [(REFS, Ref), (MASKS, LabelMap), ...])
            join_tagged("JoinByStem", keyed.refs, masks.masks)
            | "Pair" >> beam.ParDo(_Pair()).with_outputs(REJECTS, SKIPPED, main="refs")
        )
        # odd entries of the mask folder (an unreadable file) are not images: not rejects of this run
        skipped = (masks[SKIPPED], keyed[SKIPPED], paired[SKIPPED]) | "MaskSkips" >> beam.Flatten()
        return {"refs": paired.refs, REJECTS: paired[REJECTS], SKIPPED: skipped}


# ---- in the shard writer: the mask's bytes → the record's keys ---------------------------------


class TransientMaskRead(Exception):
    """A label map read that failed for a reason other than the file (a reset connection, a GCS 503).

    The record builder's catch-all turns unforeseen errors into ``decode_error``
    rejects; this one it re-raises as ``error`` so the bundle fails and the runner retries it.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def segmentation_features(
    label_map: LabelMap,
    geometry: Geometry | None,
    info: ImageInfo,
    options: ImageOptions,
    reserve: Callable[[int], AbstractContextManager[object]] | None = None,
) -> dict[str, Any]:
    """The segmentation keys of one record: its mask read, checked against the image's stored frame and brought
    to the recorded size the way the image went (``geometry``: images.prepare_image's). Rejected with a reason
    when the mask cannot be one."""
    from ..storage import read_bytes

    try:
        data = read_bytes(label_map.path, label_map.size, options)
    except Rejected as r:  # gone since the listing, or not readable: this image has no usable label map
        raise Rejected(MISSING_MASK, f"{label_map.path}: {r.reason}: {r.detail}") from None
    except Exception as e:  # transient (read_bytes raises only those): not the files' fault
        raise TransientMaskRead(e) from e
    if geometry is None:  # no transform recorded: the image is stored as it is
        geometry = Geometry(info.width, info.height, info.width, info.height)
    stored = (geometry.stored_width, geometry.stored_height)
    held = reserve(2 * stored[0] * stored[1]) if reserve else nullcontext()
    with held:
        encoded = label_map_png(data, stored, geometry.orientation, (info.width, info.height))
    return {SEGMENTATION_ENCODED: encoded, SEGMENTATION_FORMAT: "png"}


def label_map_png(data: bytes, image_size: tuple[int, int], orientation: int, recorded: tuple[int, int]) -> bytes:
    """A label map as the single-channel 8-bit PNG to store: pixel values = class ids, exactly.

    ``image_size``: the image's stored pixels (width, height), the frame the mask
    must match; ``orientation`` turns it as the image was turned; ``recorded``:
    the stored image's size after that and ``--resize-max-side`` (nearest
    neighbour: no new class ids). An 8-bit grey PNG needing neither is kept
    byte for byte, if libpng (TensorFlow) reads its chunks as Pillow does (``images.png_problem``: a bad
    CRC, an unknown critical chunk); anything else (palette, 16-bit, 1-, 2- or 4-bit, such chunks) is
    re-encoded as 8-bit grey holding the indices — TF's decode_png turns a palette PNG into RGB colours.
    """
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if not data.startswith(PNG_SIGNATURE):
        raise Rejected(BAD_MASK, "not a PNG file (a label map must be lossless)")
    try:
        img = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise Rejected(BAD_MASK, f"cannot read the PNG: {e}") from None
    with img:
        if img.mode not in LABEL_MODES:
            raise Rejected(MASK_NOT_SINGLE_CHANNEL, f"mode {img.mode}: a label map has one channel of class ids")
        if img.size != image_size:
            w, h = img.size
            raise Rejected(MASK_SIZE_MISMATCH, f"mask is {w}x{h}, its image {image_size[0]}x{image_size[1]}")
        try:
            values = np.asarray(img)
        except (OSError, SyntaxError, ValueError) as e:  # truncated or corrupt pixel data
            raise Rejected(BAD_MASK, f"cannot decode the PNG: {e}") from None
        plain = data[24:26] == b"\x08\x00" and "transparency" not in img.info  # 8-bit grey, no tRNS
    if img.mode == "L" and data[24:26] in (b"\x02\x00", b"\x04\x00"):
        # 2- or 4-bit grey (IHDR's bit depth and colour type): Pillow scales the samples up to 8 bits (×85,
        # ×17); the class ids are the samples as written.
        values = values // (255 // ((1 << data[24]) - 1))
    if values.dtype != np.uint8:
        top = int(values.max()) if values.size else 0
        if top > 255:
            raise Rejected(BAD_MASK, f"class id {top} is above 255 (label maps are decoded as uint8)")
        values = values.astype(np.uint8)
    turn = ORIENTATION_TRANSPOSE.get(orientation)  # as the image was turned (images/convert.py)
    if plain and turn is None and image_size == recorded and not png_problem(data):
        return data
    out = Image.fromarray(values, "L")
    if turn is not None:
        out = out.transpose(turn)
    if out.size != recorded:
        out = out.resize(recorded, Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    out.save(buffer, format="PNG")
    return buffer.getvalue()
