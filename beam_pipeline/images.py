"""Decoding, validating and (when needed) converting one image with Pillow.

``prepare_image(data, options)`` returns the bytes to store and what the
Example records about them (format, height, width, and the channel count
``tf.io.decode_image(data, expand_animations=False)`` produces), or raises
``Rejected`` with a reason code. Every input is decoded (every frame of an
animation), so nothing is written broken; a JPEG stored as it is decodes at
1/8 scale, which reads every bit of its compressed data (see ``_decode``).

Policy (README, "Formats"):
- a file TensorFlow reads back at its recorded shape is stored as it is
  (its original bytes), unless a pixel option asks otherwise;
- anything else Pillow can decode (CMYK JPEG, TIFF, palette BMP, ICO, …) is
  converted to PNG (lossless), or to JPEG with ``--reencode jpeg:Q``;
  ``on_unsupported="reject"`` rejects it as ``unsupported_format`` instead;
- pixel options (EXIF orientation, resize) re-encode: JPEG sources as JPEG
  (quality 95 or ``--reencode``), others as PNG.

    prepared = prepare_image(open("cat.jpg", "rb").read(), ImageOptions())
    prepared.info.format, prepared.info.channels, prepared.data
"""

from __future__ import annotations

import contextlib
import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

# Reason codes (stable: they appear in rejects.jsonl and dataset.json).
EMPTY = "empty"
TRUNCATED = "truncated"
NOT_AN_IMAGE = "not_an_image"
UNREADABLE = "unreadable"
MISSING = "missing"
UNSUPPORTED_FORMAT = "unsupported_format"
DECODE_ERROR = "decode_error"
TOO_MANY_PIXELS = "too_many_pixels"
TOO_SMALL = "too_small"
NO_LABEL = "no_label"
UNKNOWN_LABEL = "unknown_label"
NO_SPLIT = "no_split"
DUPLICATE = "duplicate"
BAD_FILENAME = "bad_filename"

# The pixel limit is enforced here, from the header, before decoding
# (ImageOptions.max_pixels); Pillow's own global check would stop at its default.
Image.MAX_IMAGE_PIXELS = None
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's hard limit: 2 × its 89 MP warning level

# Formats TensorFlow's decode_image reads; value = the image/format text.
_TF_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp"}

# Pillow mode → channels of tf.io.decode_image, per format (measured with TF 2.21).
_PNG_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3, "RGBA": 4}
_BMP_RAWMODE_CHANNELS = {"BGR": 3, "BGRX": 4, "BGRA": 4}

# JPEG segments and PNG chunks that carry metadata, not pixels (--strip-exif).
# APP2 (ICC profile) and APP14 (Adobe colour transform) stay: they change how pixels decode.
_JPEG_METADATA_MARKERS = {0xE1, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xEB, 0xEC, 0xED, 0xEF, 0xFE}
_PNG_METADATA_CHUNKS = {b"eXIf", b"tEXt", b"iTXt", b"zTXt", b"tIME"}


class Rejected(Exception):
    """An input that cannot become a record; ``reason`` is a stable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageInfo:
    format: str
    height: int
    width: int
    channels: int


@dataclass(frozen=True)
class ImageOptions:
    max_pixels: int = DEFAULT_MAX_PIXELS  # 0 = no limit
    min_size: int = 0  # shorter side, pixels
    apply_exif_orientation: bool = False
    strip_exif: bool = False
    resize_max_side: int = 0  # 0 = keep
    reencode_quality: int = 0  # 0 = keep the original bytes where possible; else JPEG at this quality
    on_unsupported: str = "convert"  # or "reject"


@dataclass(frozen=True)
class Prepared:
    data: bytes
    info: ImageInfo
    converted_from: str | None = None  # the source format when the bytes were re-encoded


def _channels(img: Image.Image) -> int:
    """Channels of tf.io.decode_image for this file as it is; raises Rejected if TF misreads it."""
    fmt, mode = img.format, img.mode
    if fmt in ("JPEG", "MPO"):
        if mode == "L":
            return 1
        if mode in ("RGB", "YCbCr"):
            return 3
    elif fmt == "PNG":
        if mode == "P":
            return 4 if "transparency" in img.info else 3
        if mode in _PNG_CHANNELS:
            return _PNG_CHANNELS[mode]
    elif fmt == "GIF":
        return 3
    elif fmt == "WEBP":
        if mode in ("RGB", "RGBA"):
            return len(mode)
    elif fmt == "BMP":
        # TF reads 8-bit BMPs as raw palette indices: only a grey palette is safe.
        rawmode = img.tile[0].args[0] if img.tile else None
        if img.info.get("compression", 0) == 0:
            if rawmode in _BMP_RAWMODE_CHANNELS:
                return _BMP_RAWMODE_CHANNELS[rawmode]
            if mode == "L":
                return 1
    raise Rejected(UNSUPPORTED_FORMAT, f"{fmt} in mode {mode} is not read back by TensorFlow")


def _tf_channels_or_none(img: Image.Image) -> int | None:
    if img.format not in _TF_FORMATS:
        return None
    try:
        return _channels(img)
    except Rejected:
        return None


@contextlib.contextmanager
def _reasons() -> Iterator[None]:
    """Turns what Pillow raises on a bad file into a Rejected with its reason code."""
    try:
        yield
    except Rejected:
        raise
    except Image.DecompressionBombError as e:
        raise Rejected(TOO_MANY_PIXELS, str(e)) from None
    except UnidentifiedImageError:
        raise Rejected(NOT_AN_IMAGE, "not a recognised image format") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        text = str(e)
        low = text.lower()
        if "truncated" in low or isinstance(e, EOFError) or "broken data stream" in low:
            raise Rejected(TRUNCATED, text) from None
        raise Rejected(DECODE_ERROR, f"{type(e).__name__}: {text}") from None
    except MemoryError:
        raise Rejected(TOO_MANY_PIXELS, "not enough memory to decode") from None
    except Exception as e:  # Pillow plugins raise assorted types on hostile input
        raise Rejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None


def _open(data: bytes, options: ImageOptions) -> tuple[Image.Image, int | None]:
    """Opens (header only) and checks the size limits; Rejected on failure.

    Also returns the channels TF decodes the file as it is to, or None if TF
    misreads it (judged from the header, which decoding may change).
    """
    if not data:
        raise Rejected(EMPTY, "zero bytes")
    with _reasons():
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        if width <= 0 or height <= 0:
            raise Rejected(DECODE_ERROR, f"image has size {width}x{height}")
        if options.max_pixels and width * height > options.max_pixels:
            raise Rejected(TOO_MANY_PIXELS, f"{width}x{height} is over --max-pixels {options.max_pixels}")
        if options.min_size and min(width, height) < options.min_size:
            raise Rejected(TOO_SMALL, f"{width}x{height} is under --min-size {options.min_size}")
        return img, _tf_channels_or_none(img)


def _decode(img: Image.Image, *, pixels: bool = True) -> None:
    """Decodes every frame; Rejected on failure.

    ``pixels=False`` (the file is stored as it is and only has to be proven
    sound): a JPEG is decoded at 1/8 scale. libjpeg still entropy-decodes
    every coefficient of every scan, which is where a corrupt or truncated
    file fails, and skips the full-size inverse DCT, upsampling and colour
    conversion, which cannot fail on data. It rejects the same files as a
    full decode (tests/test_images.py checks ~2,500 damaged JPEGs)
    at ~60 % of the cost. Other formats are always decoded in full.
    """
    with _reasons():
        if not pixels and img.format == "JPEG":
            img.draft(None, (1, 1))  # the smallest scale libjpeg offers (1/8)
        img.load()
        for frame in range(1, getattr(img, "n_frames", 1)):
            img.seek(frame)
            img.load()
        if getattr(img, "n_frames", 1) > 1:
            img.seek(0)


def inspect_image(data: bytes, options: ImageOptions | None = None) -> ImageInfo:
    """Fully decodes ``data`` as it is; its ImageInfo, or Rejected (also for formats TF misreads)."""
    img, channels = _open(data, options or ImageOptions())
    _decode(img)
    if channels is None:
        raise Rejected(UNSUPPORTED_FORMAT, f"{img.format} in mode {img.mode} is not read back by TensorFlow")
    width, height = img.size
    return ImageInfo(_TF_FORMATS[img.format], height, width, channels)


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a broken EXIF block is no orientation
        return 1


def _plain_mode(img: Image.Image) -> Image.Image:
    """The first frame in L, LA, RGB or RGBA (what PNG/JPEG store and TF reads)."""
    has_alpha = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
    grey = img.mode in ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
    if img.mode in ("I", "I;16", "I;16B", "I;16L"):  # 16-bit grey → 8-bit, as TF decodes it
        import numpy as np

        wide = np.asarray(img).astype(np.uint32)
        img = Image.fromarray(np.clip(wide >> 8, 0, 255).astype(np.uint8), "L")
    elif img.mode == "F":
        img = img.convert("L")
    if grey:
        return img.convert("LA" if has_alpha else "L")
    return img.convert("RGBA" if has_alpha else "RGB")


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


def strip_metadata(data: bytes) -> bytes:
    """JPEG/PNG bytes without EXIF/XMP/comments/text chunks; pixels untouched (other formats as they are)."""
    if data[:2] == b"\xff\xd8":
        out = [data[:2]]
        i = 2
        while i + 4 <= len(data) and data[i] == 0xFF:
            marker = data[i + 1]
            if marker == 0xDA:  # start of scan: the rest is image data
                break
            length = struct.unpack(">H", data[i + 2 : i + 4])[0]
            if marker not in _JPEG_METADATA_MARKERS:
                out.append(data[i : i + 2 + length])
            i += 2 + length
        out.append(data[i:])
        return b"".join(out)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        out = [data[:8]]
        i = 8
        while i + 8 <= len(data):
            length = struct.unpack(">I", data[i : i + 4])[0]
            kind = data[i + 4 : i + 8]
            end = i + 12 + length
            if kind not in _PNG_METADATA_CHUNKS:
                out.append(data[i:end])
            i = end
        return b"".join(out)
    return data


def prepare_image(data: bytes, options: ImageOptions | None = None) -> Prepared:
    """The bytes to store for this input and their ImageInfo, under the conversion policy."""
    options = options or ImageOptions()
    img, channels = _open(data, options)
    width, height = img.size
    source = img.format or "unknown"
    readable = channels is not None
    shrink = options.resize_max_side and max(img.size) > options.resize_max_side
    reencode = bool(options.reencode_quality)
    # EXIF orientation is read after a full decode (a PNG may keep it after its pixels).
    _decode(img, pixels=bool(not readable or shrink or reencode or options.apply_exif_orientation))
    rotate = options.apply_exif_orientation and _orientation(img) != 1

    if readable and not (rotate or shrink or reencode):
        stored = strip_metadata(data) if options.strip_exif else data
        return Prepared(stored, ImageInfo(_TF_FORMATS[source], height, width, channels))
    if not readable and options.on_unsupported == "reject" and not (rotate or shrink or reencode):
        raise Rejected(UNSUPPORTED_FORMAT, f"{source} in mode {img.mode} is not read back by TensorFlow")

    try:
        if rotate:
            img = ImageOps.exif_transpose(img)
        pixels = _plain_mode(img)
        if shrink:
            pixels.thumbnail((options.resize_max_side, options.resize_max_side), Image.Resampling.LANCZOS)
        quality = options.reencode_quality or (95 if source in ("JPEG", "MPO") and readable else 0)
        encoded = _encode(pixels, quality)
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001 - a mode Pillow cannot convert
        raise Rejected(UNSUPPORTED_FORMAT, f"cannot convert {source} in mode {img.mode}: {e}") from None
    info = inspect_image(encoded, ImageOptions(max_pixels=0))  # what TF will see, checked again
    return Prepared(encoded, info, converted_from=source.lower())
