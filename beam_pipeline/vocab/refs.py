"""``Ref``: one listed input image, before its bytes are read; and the reject rows stages pass on.

ref = Ref(path="gs://b/cats/1.jpg", relpath="cats/1.jpg", size=1234, split="train", label="cats", key=7)
reject(ref.path, reasons.MISSING, "gone before it was read")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict


@dataclass(frozen=True)
class Ref:
    """One input image, before its bytes are read."""

    path: str  # as listed: absolute path or URL
    relpath: str  # relative to the input root; image/filename
    size: int
    split: str
    # The label text; a multi-label run (--label-separator): the image's labels, distinct, sorted by name.
    label: str | tuple[str, ...] | None
    key: int  # salted shuffle key: the record's place in the global order
    extras: tuple[tuple[str, Any], ...] = ()
    # Source modification time (seconds; GCS: the object's update time), as
    # listed: with the size it says whether a file changed since an earlier run.
    mtime: float = 0.0
    # --incremental-from: where the previous run stored this unchanged file's
    # record (an index.Previous), set by index.JoinPrevious; None otherwise.
    previous: tuple[Any, ...] | None = None
    # An annotation source's objects for this image (annotations.objects.Annotations), attached by
    # its join (e.g. annotations.coco.JoinCoco); None for a dataset without objects.
    annotations: Any = None


def printable_path(path: str) -> str:
    """``path`` as valid UTF-8 text: bytes of a local name that are not UTF-8 become ``\\xNN``."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:  # Python keeps such bytes as lone surrogates
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class _RejectText(TypedDict):
    path: str  # the input's printable path; relative to the input root once rules.with_relative_path ran
    reason: str  # a code of vocab.reasons
    detail: str  # for people


class RejectRow(_RejectText, total=False):
    """A reject as stages pass it on and ``rejects.jsonl`` / ``object_rejects.jsonl`` store it: three text fields
    always, the others where they apply (metadata.REJECT_FIELDS says what each is for). Its values are not all
    text: Beam (2.78 on) reads this hint as ``Dict[str, Any]`` and codes the values by their own types."""

    source: str  # the full path (local or gs://), set with the relative path
    size: int
    mtime: float
    extras: str  # the digest of a manifest row's extra columns
    annotation_id: Any  # an object reject's annotation: a COCO "id" as the file has it (any JSON value), a VOC file
    object: int  # the object's place among its image's
    polygon: int  # the place of a polygon left out of a written object's mask


def reject(path: str, reason: str, detail: str = "") -> RejectRow:
    """A reject row: the input's printable path, a reason code (``vocab.reasons``) and a detail for people."""
    return {"path": printable_path(path), "reason": reason, "detail": detail}


def file_reject(ref: Ref, reason: str, detail: str = "") -> RejectRow:
    """A reject of a listed file, with its listed size and mtime: an incremental run keeps it while they stay."""
    return {**reject(ref.path, reason, detail), "size": ref.size, "mtime": ref.mtime}
