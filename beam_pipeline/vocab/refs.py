"""``Ref``: one listed input image, before its bytes are read; and the reject rows stages pass on.

ref = Ref(path="gs://b/cats/1.jpg", relpath="cats/1.jpg", size=1234, split="train", label="cats", key=7)
reject(ref.path, reasons.MISSING, "gone before it was read")
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

from apache_beam import coders
from apache_beam.coders.stream import InputStream, OutputStream


class Previous(NamedTuple):
    """Where a previous run stored an unchanged file's record, and what went into it."""

    shard: str  # full path of the previous shard
    offset: int  # where its format finds the record (formats: TFRecord's byte offset, else its position)
    length: int
    sha256: str
    label: str | tuple[str, ...] | None  # a multi-label run's: the names, sorted
    label_id: int | list[int] | None
    extras: str
    converted: str | None = None  # the source format its stored bytes were converted from (index "converted")
    phash: str | None = None  # the source's hashes (index "phash" + "confirm"), carried to tonight's index
    size: tuple[int, int] | None = None  # the stored image's (width, height) (index "width", "height")


class PreviousReject(NamedTuple):
    """The previous run rejected this unchanged file for what its bytes are: the reject is kept, unread."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
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


# RefCoder's first byte: which fields follow, and how.
_PATH_ENDS_WITH_RELPATH = 1  # path is stored as the part before relpath (a listed folder's root)
_LABEL_TEXT = 2
_LABEL_NAMES = 4  # a multi-label image's names
_MORE = 8  # extras, a PreviousReject or annotations follow, as one tuple in Beam's primitives coder
_PREVIOUS = 16  # a Previous follows, field by field (an --incremental-from night: most refs carry one)

# A Previous's first byte: which of its fields follow, and how.
_PREV_LABEL_SAME = 1  # its label is the ref's (not stored)
_PREV_LABEL_ID = 2  # its label id is an int >= 0
_PREV_SIZE = 4  # its size is two ints >= 0
_PREV_ODD = 8  # label, id and size follow in the primitives coder (not all three in the shapes above)
_PREV_CONVERTED = 16
_PREV_PHASH = 32


class RefCoder(coders.Coder):
    """``Ref`` ⇄ bytes: 82 bytes for a listed tile of a 1 M-tile folder, where Beam's fallback (a pickle naming
    the class, and every field before ``Ref`` had slots) took 259, and takes 172 now.

    Refs are what every shuffle and buffer of a run carries once per image (the listing's output, the refs
    grouped by shard, the local runner's buffers), so their size is most of the memory a run needs per image
    and what one element of the shard write carries to a worker (docs/engines.md). A listed file's path is
    its folder's root followed by its relative path: only the root part is stored beside the relative path.
    A night's previous record of an unchanged file (a ``Previous``) follows field by field. The rare fields (a
    manifest row's extra columns, a kept previous reject, an annotation source's objects) follow as one tuple
    in Beam's ``FastPrimitivesCoder``. Deterministic.
    Text is UTF-8 with lone surrogates passed through (a manifest may name any path).
    """

    _more = coders.FastPrimitivesCoder()

    def encode(self, ref: Ref) -> bytes:
        out = OutputStream()
        flags = 0
        relpath, path = ref.relpath, ref.path
        if relpath and path.endswith(relpath):
            flags |= _PATH_ENDS_WITH_RELPATH
            path = path[: len(path) - len(relpath)]
        label = ref.label
        if isinstance(label, str):
            flags |= _LABEL_TEXT
        elif label is not None:
            flags |= _LABEL_NAMES
        previous = ref.previous
        compact = isinstance(previous, Previous)  # a PreviousReject (rare) goes with the rare fields
        if compact:
            flags |= _PREVIOUS
        more = ref.extras or (previous is not None and not compact) or ref.annotations is not None
        if more:
            flags |= _MORE
        out.write_byte(flags)
        _write_text(out, relpath)
        _write_text(out, path)
        out.write_var_int64(ref.size)
        out.write_bigendian_uint64(ref.key)
        out.write_bigendian_double(ref.mtime)
        _write_text(out, ref.split)
        if isinstance(label, str):
            _write_text(out, label)
        elif label is not None:
            out.write_var_int64(len(label))
            for name in label:
                _write_text(out, name)
        if compact:
            self._encode_previous(out, previous, label)
        if more:
            kind = type(previous).__name__ if previous is not None and not compact else ""
            # a PreviousReject (the NamedTuple above) as its kind and a plain tuple
            as_tuple = tuple(previous) if kind else None
            out.write(self._more.encode((ref.extras, kind, as_tuple, ref.annotations)), True)
        return out.get()

    def _encode_previous(self, out: OutputStream, previous: Previous, label: Any) -> None:
        """~110 bytes for a tile's, where its tuple in the primitives coder took ~190: a night's refs wait in
        every buffer of the run, as a first run's do. Label, id and size in their usual shapes are flags and
        varints; any other shape of them follows in the primitives coder."""
        flags = 0
        label_id, size = previous.label_id, previous.size
        if previous.label == label:
            flags |= _PREV_LABEL_SAME
        if _count(label_id):
            flags |= _PREV_LABEL_ID
        if size is not None and isinstance(size, tuple) and len(size) == 2 and all(map(_count, size)):
            flags |= _PREV_SIZE
        usual = flags & _PREV_LABEL_SAME and flags & _PREV_LABEL_ID and (size is None or flags & _PREV_SIZE)
        if not usual:
            flags |= _PREV_ODD
        for present, flag in ((previous.converted, _PREV_CONVERTED), (previous.phash, _PREV_PHASH)):
            if present is not None:
                flags |= flag
        out.write_byte(flags)
        _write_text(out, previous.shard)
        out.write_var_int64(previous.offset)
        out.write_var_int64(previous.length)
        _write_hex(out, previous.sha256)
        _write_text(out, previous.extras)
        if previous.converted is not None:
            _write_text(out, previous.converted)
        if previous.phash is not None:
            _write_hex(out, previous.phash)
        if flags & _PREV_ODD:
            out.write(self._more.encode((previous.label, label_id, size)), True)
        else:
            out.write_var_int64(label_id)
            if size is not None:
                out.write_var_int64(size[0])
                out.write_var_int64(size[1])

    def _decode_previous(self, stream: InputStream, label: Any) -> Previous:
        flags = stream.read_byte()
        shard = sys.intern(_read_text(stream))  # a few shards' paths over all the refs: one string each
        offset = stream.read_var_int64()
        length = stream.read_var_int64()
        sha256 = _read_hex(stream)
        extras = _read_text(stream)
        converted = _read_text(stream) if flags & _PREV_CONVERTED else None
        phash = _read_hex(stream) if flags & _PREV_PHASH else None
        size: Any = None
        if flags & _PREV_ODD:
            previous_label, label_id, size = self._more.decode(stream.read_all(True))
        else:
            previous_label, label_id = label, stream.read_var_int64()
            if flags & _PREV_SIZE:
                size = (stream.read_var_int64(), stream.read_var_int64())
        return Previous(shard, offset, length, sha256, previous_label, label_id, extras, converted, phash, size)

    def decode(self, encoded: bytes) -> Ref:
        stream = InputStream(encoded)
        flags = stream.read_byte()
        relpath = _read_text(stream)
        path = _read_text(stream)
        if flags & _PATH_ENDS_WITH_RELPATH:
            path += relpath
        size = stream.read_var_int64()
        key = stream.read_bigendian_uint64()
        mtime = stream.read_bigendian_double()
        # a split's and a label's text repeat over the refs: one string each, however many refs are decoded
        split = sys.intern(_read_text(stream))
        label: str | tuple[str, ...] | None = None
        if flags & _LABEL_TEXT:
            label = sys.intern(_read_text(stream))
        elif flags & _LABEL_NAMES:
            label = tuple(sys.intern(_read_text(stream)) for _ in range(stream.read_var_int64()))
        extras: tuple[tuple[str, Any], ...] = ()
        previous, annotations = None, None
        if flags & _PREVIOUS:
            previous = self._decode_previous(stream, label)
        if flags & _MORE:
            extras, kind, as_tuple, annotations = self._more.decode(stream.read_all(True))
            if kind:
                previous = (Previous if kind == "Previous" else PreviousReject)(*as_tuple)
        return Ref(path, relpath, size, split, label, key, extras, mtime, previous, annotations)

    def estimate_size(self, ref: Ref) -> int:
        """About the bytes ``encode`` gives, without encoding (exact when the rare fields are present)."""
        if ref.extras or ref.previous is not None or ref.annotations is not None:
            return len(self.encode(ref))
        label = ref.label
        names = (label,) if isinstance(label, str) else label or ()
        relpath, path = ref.relpath, ref.path
        paths = len(path) if relpath and path.endswith(relpath) else len(path) + len(relpath)
        # the texts with a length byte each (characters: bytes for ASCII); flags, size, key, mtime
        return paths + 3 + len(ref.split) + sum(len(n) + 1 for n in names) + 21

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self) -> type:
        return Ref


def _write_text(out: OutputStream, text: str) -> None:
    out.write(text.encode("utf-8", "surrogatepass"), True)


def _read_text(stream: InputStream) -> str:
    return stream.read_all(True).decode("utf-8", "surrogatepass")


def _count(value: Any) -> bool:
    """An int a varint holds (a damaged index line may carry any JSON number: those take the primitives coder)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _write_hex(out: OutputStream, text: str) -> None:
    """Lower-case hex digits (a digest, a hash) as their bytes, half the length; any other text as text."""
    try:
        raw = bytes.fromhex(text) if len(text) % 2 == 0 else None
    except ValueError:
        raw = None
    if raw is not None and raw.hex() == text:
        out.write_byte(1)
        out.write(raw, True)
    else:
        out.write_byte(0)
        _write_text(out, text)


def _read_hex(stream: InputStream) -> str:
    if stream.read_byte() == 1:
        return stream.read_all(True).hex()
    return _read_text(stream)


coders.registry.register_coder(Ref, RefCoder)
REF_CODER = RefCoder()  # the one the modules that encode refs by hand use (pieces files, the join, the planner)


def as_ref(ref: Ref) -> Ref:
    """The ref as it is: ``beam.Map(as_ref).with_output_types(Ref)`` after a step with tagged outputs.

    Beam's type check holds a step's output hint against each of its outputs (its rejects too), so the Ref
    hint that picks ``RefCoder`` goes on this step, fused with the one before it."""
    return ref


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
