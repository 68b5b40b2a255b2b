"""Conversion: the bytes a record stores, the file as it is when TensorFlow reads it back and no pixel
option asks otherwise, else re-encoded (EXIF orientation, resizing, PNG or JPEG).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from contextlib import AbstractContextManager

from PIL import Image, ImageOps

from ..vocab.reasons import (
    UNSUPPORTED_FORMAT,
)
from .check import _TF_FORMATS, _decode, _inspect, _open, _quietly, _TfReading
from .headers import _PNG_SIGNATURE, _PNG_TEXT_CHUNKS, _png_without, _text_over_limit, strip_metadata
from .options import Geometry, ImageInfo, ImageOptions, Prepared, Rejected
from .phash import perceptual_hash
from .pixels import _applied_orientation, _plain_mode


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a broken EXIF block is no orientation
        return 1


def _encode(img: Image.Image, jpeg_quality: int) -> bytes:
    buf = io.BytesIO()
    if jpeg_quality:
        if img.mode in ("RGBA", "LA"):  # JPEG has no alpha: flatten on white
            background = Image.new("RGB" if img.mode == "RGBA" else "L", img.size, "white")
            background.paste(img, mask=img.getchannel("A"))
            img = background
        img.save(buf, "JPEG", quality=jpeg_quality, optimize=True)
    else:
        img.save(buf, "PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def prepare_image(
    data: bytes,
    options: ImageOptions | None = None,
    reserve: Callable[[int], AbstractContextManager[object]] | None = None,
) -> Prepared:
    """The bytes to store for this input and their ImageInfo, under the conversion policy.

    ``reserve(nbytes)``, if given, is entered around the decode with the
    memory it is estimated to need (from the headers, after every limit
    passed): the writer's per-process budget of decoded pixels in flight.
    Decoder warnings and messages are kept out of the terminal (``_quietly``).
    """
    options = options or ImageOptions()
    try:
        return _quietly(lambda: _prepare(data, options, reserve))
    except Rejected as r:
        if data[:8] != _PNG_SIGNATURE or "MAX_TEXT" not in r.detail:
            raise
        refused = r
    # Pillow refuses a compressed text chunk that inflates past its limit (PngImagePlugin.MAX_TEXT_CHUNK, 1 MB,
    # a setting of the whole process), before the pixels or after them, and text chunks over MAX_TEXT_MEMORY
    # in all. The pixels are the same without them: the PNG is checked once more without the compressed text
    # chunks over the limit (the others may hold the EXIF orientation: ImageMagick's "Raw profile type exif",
    # XMP), then, if Pillow still refuses, without any text chunk, and stored as that. Anything else Pillow
    # refuses that way (an iCCP profile) stays the reject it was.
    tried = data
    for without in (_png_without(data, _PNG_TEXT_CHUNKS, _text_over_limit), _png_without(data, _PNG_TEXT_CHUNKS)):
        if without == tried:
            continue
        tried = without
        try:
            return _quietly(lambda: _prepare(without, options, reserve))  # noqa: B023 - called at once
        except Rejected as r:
            if "MAX_TEXT" not in r.detail:
                raise
            refused = r
    raise refused


def needs_full_decode(img: Image.Image, tf_reading: _TfReading, options: ImageOptions) -> bool:
    """Whether the check decodes ``img`` in full (its pixels are converted, or may be), not at 1/8 scale. The
    leak pass (leaks.py) decides the same way, so it hashes the pixels the writer hashes."""
    shrink = bool(options.resize_max_side and max(img.size) > options.resize_max_side)
    # A GIF whose colour indices are checked after decoding may still need converting: reserved as such.
    maybe_convert = tf_reading.channels is None or bool(tf_reading.index_limit)
    return bool(maybe_convert or shrink or options.reencode_quality or options.apply_exif_orientation)


def _prepare(
    data: bytes, options: ImageOptions, reserve: Callable[[int], AbstractContextManager[object]] | None
) -> Prepared:
    img, tf_reading, cost = _open(data, options)
    width, height = img.size
    source = img.format or "unknown"
    shrink = bool(options.resize_max_side and max(img.size) > options.resize_max_side)
    reencode = bool(options.reencode_quality)
    full = needs_full_decode(img, tf_reading, options)
    held = reserve(cost.memory_bytes(source, full, width, height)) if reserve else contextlib.nullcontext()
    with held:
        # EXIF orientation is read after a full decode (a PNG may keep it after its pixels).
        tf_reading = tf_reading.settled(_decode(img, pixels=full))
        phash = perceptual_hash(img) if options.perceptual_hash else None
        channels = tf_reading.channels
        readable = channels is not None
        rotate = options.apply_exif_orientation and _orientation(img) != 1
        if readable and not (rotate or shrink or reencode):
            stored = strip_metadata(data) if options.strip_exif else data
            info = ImageInfo(_TF_FORMATS[source], height, width, channels)  # type: ignore[arg-type]
            return Prepared(stored, info, geometry=Geometry(width, height, width, height), phash=phash)
        if not readable and options.on_unsupported == "reject" and not (rotate or shrink or reencode):
            raise Rejected(UNSUPPORTED_FORMAT, f"{tf_reading.why}: not read back by TensorFlow as Pillow reads it")
        orientation = _applied_orientation(img) if rotate else 1
        encoded = _convert(img, options, source, readable, rotate, shrink)
        del img  # the decoded source goes before the check below decodes the result
        info = _inspect(encoded, ImageOptions(max_pixels=0, max_total_pixels=0, max_frames=0))
    geometry = Geometry(width, height, info.width, info.height, orientation)
    return Prepared(encoded, info, converted_from=source.lower(), geometry=geometry, phash=phash)


def _convert(img: Image.Image, options: ImageOptions, source: str, readable: bool, rotate: bool, shrink: bool) -> bytes:
    """The decoded first frame as PNG or JPEG bytes, after rotation/resizing; Rejected if Pillow cannot."""
    mode = img.mode
    try:
        if rotate:
            img = ImageOps.exif_transpose(img)
        pixels = _plain_mode(img)
        del img
        if shrink:
            pixels.thumbnail((options.resize_max_side, options.resize_max_side), Image.Resampling.LANCZOS)
        quality = options.reencode_quality or (95 if source in ("JPEG", "MPO") and readable else 0)
        return _encode(pixels, quality)
    except Rejected:
        raise
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a mode Pillow cannot convert
        raise Rejected(UNSUPPORTED_FORMAT, f"cannot convert {source} in mode {mode}: {e}") from None
