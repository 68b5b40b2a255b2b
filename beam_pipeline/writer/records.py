"""One image to one record: validate and decode (``images``), build the Example (``examples``), or a reject.

Plain functions the shard writer (``writer.shard``) and the ``WriteToTFRecord``
sink's decode step call; a Rejected is returned, not raised, for the caller
to route to ``rejects.jsonl``.

    record, prepared, sha256 = build_record(ref, data, label_ids, extra_types, image_options)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .. import examples, index, metadata
from ..annotations.masks import LabelMap, TransientMaskRead, segmentation_features
from ..annotations.objects import masks_too_large, object_features, size_mismatch
from ..images.convert import prepare_image
from ..images.options import Geometry, ImageOptions, Prepared, Rejected
from ..sources.manifest import coerce
from ..sources.rules import class_values
from ..storage import read_bytes
from ..vocab.reasons import ANNOTATION_SIZE_MISMATCH, BAD_VALUE, DECODE_ERROR, MASKS_TOO_LARGE
from ..vocab.refs import Ref, file_reject

# A manifest row whose value cannot be stored (an int column's value beyond int64).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def reject_row(ref: Ref, rejected: Rejected) -> dict[str, Any]:
    """A file's reject as rejects.jsonl keeps it: with the digest of its manifest row's extra columns (as
    index.jsonl has), so an incremental run keeps it only while file and row are unchanged."""
    row = file_reject(ref, rejected.reason, rejected.detail)
    digest = index.extras_digest(ref)
    if digest:
        row["extras"] = digest
    return row


class Record(NamedTuple):
    """One image's Example record, the bytes it stores (Prepared) and their sha256: hashed once, kept for the index."""

    record: bytes
    prepared: Prepared
    sha256: str


def build_record(
    ref: Ref,
    data: bytes,
    label_ids: Mapping[str, int],
    extra_types: Mapping[str, str],
    image_options: ImageOptions | None = None,
    reserve: Callable[[int], Any] | None = None,
) -> Record:
    """Validates ``data`` (prepare_image decodes it), converts it if the policy says so; its Record."""
    options = image_options or ImageOptions()
    prepared = prepare_image(data, options, reserve)
    info = prepared.info
    sha256 = hashlib.sha256(prepared.data).hexdigest()
    features: dict[str, Any] = {
        examples.ENCODED: prepared.data,
        examples.FORMAT: info.format,
        examples.HEIGHT: info.height,
        examples.WIDTH: info.width,
        examples.CHANNELS: info.channels,
        examples.FILENAME: ref.relpath,
        examples.SHA256: sha256,
    }
    if isinstance(ref.annotations, LabelMap):  # --masks: the label map is read here, beside its image
        features.update(segmentation_features(ref.annotations, prepared.geometry, info, options, reserve))
    elif ref.annotations is not None:
        features.update(annotation_features(ref.annotations, prepared.geometry, label_ids, options.max_mask_pixels))
    if ref.label is not None:
        features[examples.LABEL], features[examples.LABEL_TEXT] = class_values(ref.label, label_ids)
    for column, value in ref.extras:
        try:
            features[column] = coerce(value, extra_types.get(column, "string"))
        except (TypeError, ValueError):
            continue  # an empty/odd value in a numeric column: feature left out
        if isinstance(features[column], int) and not INT64_MIN <= features[column] <= INT64_MAX:
            # the row's fault, not the image's: a reason of its own (an incremental run retries it once the row
            # changes, see index.kept_reject), not the decode_error the Example's serializer would raise
            raise Rejected(BAD_VALUE, f"manifest column {column!r}: {value} is outside int64")
    return Record(examples.build_example(dict(sorted(features.items()))), prepared, sha256)


def annotation_features(
    annotations: Any,
    geometry: Geometry | None,
    label_ids: Mapping[str, int] | None = None,
    max_mask_pixels: int = 0,
) -> dict[str, Any]:
    """The object keys of an annotated image (boxes and masks following its pixels through EXIF orientation
    and resizing); Rejected when the stored image is not the frame its boxes are in, or when its masks would
    take more than ``max_mask_pixels`` (0: no limit). ``label_ids``: the run's ids of a names-only source's
    classes."""
    assert geometry is not None, "prepare_image reports the geometry of every image it prepares"
    problem = size_mismatch(annotations, geometry)
    if problem:
        raise Rejected(ANNOTATION_SIZE_MISMATCH, problem)
    problem = masks_too_large(annotations, geometry, max_mask_pixels)
    if problem:
        raise Rejected(MASKS_TOO_LARGE, problem)
    return object_features(annotations, geometry, label_ids)


def convert_one(
    ref: Ref,
    label_ids: Mapping[str, int],
    extra_types: Mapping[str, str],
    image_options: ImageOptions | None = None,
    reserve: Callable[[int], Any] | None = None,
) -> Record | Rejected:
    """Reads and converts one ref; a Rejected is returned (not raised) for the writer to route.

    I/O errors that are not the file's fault are raised (see read_bytes).
    """
    options = image_options or ImageOptions()
    try:
        data = read_bytes(ref.path, ref.size, options)
    except Rejected as r:
        return r
    return decode_one(ref, data, label_ids, extra_types, options, reserve)


def decode_one(
    ref: Ref,
    data: bytes,
    label_ids: Mapping[str, int],
    extra_types: Mapping[str, str],
    image_options: ImageOptions | None = None,
    reserve: Callable[[int], Any] | None = None,
) -> Record | Rejected:
    """Converts one file's bytes; a Rejected is returned (not raised).

    An error nobody foresaw (a Pillow plugin failing in a new way on a hostile
    file) rejects that one input as ``decode_error`` with the exception in the
    detail: one odd file must not fail the job. A MemoryError is the
    machine's, not the file's (every size was checked from the headers): it
    fails the bundle, and the runner retries it.
    """
    try:
        return build_record(ref, data, label_ids, extra_types, image_options, reserve)
    except Rejected as r:
        return r
    except MemoryError:
        raise
    except TransientMaskRead as e:  # not the files' fault: the runner retries the bundle
        raise e.error from None
    except Exception as e:  # noqa: BLE001 - see above
        return Rejected(DECODE_ERROR, f"unexpected {type(e).__name__}: {e}")


class Reused(NamedTuple):
    """A previous run's record of an unchanged file (``--incremental-from``), copied as it is."""

    record: bytes


def examples_features(
    labels: Sequence[str], extra_types: Mapping[str, str], multi_label: bool = False
) -> dict[str, Any]:
    """This run's feature spec, as dataset.json stores it: a previous run's records fit only if it is the same."""
    return metadata.feature_spec(bool(labels), extra_types, multi_label=multi_label)


def result_bytes(result: Any) -> int:
    """Bytes a finished result of WriteShardFn holds while it waits: its record (a reject: nothing)."""
    if isinstance(result, Rejected):
        return 0
    if isinstance(result, Reused):
        return len(result.record)
    return len(result[0]) + len(result[1].data)


def read_cost(ref: Ref, reuse: bool, limit: int) -> int:
    """Bytes the read budget is charged for ``ref``: its file, its previous record when reused, or nothing."""
    if limit and ref.size > limit:
        return 0  # never read (too_large)
    if reuse and isinstance(ref.previous, index.PreviousReject):
        return 0  # the previous reject is kept
    if reuse and isinstance(ref.previous, index.Previous):
        return max(ref.previous.length, 0)
    mask = ref.annotations.size if isinstance(ref.annotations, LabelMap) else 0  # read beside the image
    return max(ref.size, 0) + max(mask, 0)
