"""Decoding, validating and (when needed) converting one image with Pillow.

``prepare_image(data, options)`` returns the bytes to store and what the
Example records about them (format, height, width, and the channel count
``tf.io.decode_image(data, expand_animations=False)`` produces), or raises
``Rejected`` with a reason code. Every input is decoded (every frame of an
animation), so nothing is written broken; a JPEG stored as it is decodes at
1/8 scale, which reads every bit of its compressed data (see ``_decode``).

Cost is bounded before anything is decoded (``measure``): from the headers
alone, every frame's canvas (GIF frames may declare extents far larger than
the logical screen, and Pillow grows the canvas to them), the frame count,
the pixels of all frames together and a JPEG's scan count are checked against
``ImageOptions``; the memory a decode needs is estimated from the same numbers
so the writer can hold it in a per-process budget (``prepare_image(reserve=)``).
Nothing here changes Pillow's process-wide settings: files are opened without
``Image.open``'s global pixel check (``_pillow_open``), and this module's own
limits, which are the run's, apply instead.

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
import re
import struct
import zlib
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from .decoder_noise import captured
from .vocab.reasons import (
    DECODE_ERROR,
    EMPTY,
    NOT_AN_IMAGE,
    TOO_MANY_CHUNKS,
    TOO_MANY_FRAMES,
    TOO_MANY_PIXELS,
    TOO_MANY_SCANS,
    TOO_SMALL,
    TRUNCATED,
    UNSUPPORTED_FORMAT,
)

_T = TypeVar("_T")


# Limits (README, "Bad input"). One frame: Pillow's own hard limit (2 × its
# 89 MP warning level), e.g. a 13,000 × 13,000 scan; far above imgproxy's 16.8 MP
# because training data holds large scans and panoramas, and a budget
# (writer/budget.py), not this limit, keeps several of them from running at once.
DEFAULT_MAX_PIXELS = 178_956_970
# All frames an image is decoded at, together: what the largest single frame
# may cost, twice (imgproxy counts animations against one image's resolution too).
DEFAULT_MAX_TOTAL_PIXELS = 2 * DEFAULT_MAX_PIXELS
# Frames of an animation or pages of a multi-page file: 20 s of a 25 fps GIF.
DEFAULT_MAX_FRAMES = 500
# An annotated image's masks x its pixels (annotations.objects.masks_too_large): each mask is rasterized
# and PNG-encoded at image size, ~8-15 ns per pixel, so 4 G (e.g. 1,000 masks on a 4 MP image) is ~30-60 s
# of one core and at most ~0.5 GB of PNGs: one image's annotations cannot hold a job up for hours or make a
# record of gigabytes, however small its polygons.
DEFAULT_MAX_MASK_PIXELS = 4_000_000_000
# Bytes of one file, from the listing, before it is read.
DEFAULT_MAX_FILE_BYTES = 256 * 1_000_000
# Scans of a JPEG: encoders write 1 (baseline) to ~10-20 (progressive); every
# scan of a progressive file walks all of its coefficient blocks again, so a
# small file of thousands of scans costs minutes (libjpeg-turbo's "-maxscans").
# Each scan costs ~1 ns per pixel (measured): scans × pixels is capped too, at
# 32 scans of the largest legal image (~6 s), far above any encoder's output.
MAX_JPEG_SCANS = 256
MAX_JPEG_SCAN_PIXELS = 32 * DEFAULT_MAX_PIXELS
# Steps of Pillow's pure-Python header parsers: PNG chunks (~15 µs each,
# measured), JPEG segments and stray padding bytes (1-5 µs each). A 10 MB file of
# empty chunks or fill bytes takes 12 s there; 100,000 steps take at most ~1.5 s,
# and a 256 MB PNG written in libpng's 8 KB IDAT chunks has ~31,000.
MAX_HEADER_STEPS = 100_000
# GIF comment bytes (Pillow joins them quadratically; 1 MB costs ~0.3 s).
MAX_GIF_COMMENT_BYTES = 1_000_000
# Memory for images in flight per machine (writer/budget.py splits it between file
# bytes read ahead and decoded pixels, and among a worker VM's SDK processes).
DEFAULT_MEMORY_BUDGET_BYTES = 1024 * 1_000_000
# Bytes of memory per decoded pixel Pillow holds (RGB is stored as 4 bytes).
_BYTES_PER_PIXEL = 4

# Formats TensorFlow's decode_image reads; value = the image/format text.
_TF_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp"}

# Pillow mode → channels of tf.io.decode_image, per format (measured with TF 2.21).
_PNG_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3, "RGBA": 4}

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# JPEG segments and PNG chunks that carry metadata, not pixels (--strip-exif).
# APP2 (ICC profile) and APP14 (Adobe colour transform) stay: they change how pixels decode.
_JPEG_METADATA_MARKERS = {0xE1, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xEB, 0xEC, 0xED, 0xEF, 0xFE}
_PNG_METADATA_CHUNKS = {b"eXIf", b"tEXt", b"iTXt", b"zTXt", b"tIME"}
_PNG_TEXT_CHUNKS = {b"tEXt", b"iTXt", b"zTXt"}


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
    max_pixels: int = DEFAULT_MAX_PIXELS  # per frame, canvas and frame extents included; 0 = no limit
    max_total_pixels: int = DEFAULT_MAX_TOTAL_PIXELS  # all frames together; 0 = no limit
    max_frames: int = DEFAULT_MAX_FRAMES  # 0 = no limit
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # checked by the writer from the listing; 0 = no limit
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES  # per machine, for the writer's budgets
    min_size: int = 0  # shorter side, pixels
    apply_exif_orientation: bool = False
    strip_exif: bool = False
    resize_max_side: int = 0  # 0 = keep
    reencode_quality: int = 0  # 0 = keep the original bytes where possible; else JPEG at this quality
    on_unsupported: str = "convert"  # or "reject"
    max_mask_pixels: int = DEFAULT_MAX_MASK_PIXELS  # an annotated image's masks x its pixels; 0 = no limit


@dataclass(frozen=True)
class Cost:
    """What decoding one file will take, from its headers: frames, the largest canvas, all pixels."""

    frames: int
    frame_pixels: int  # the largest canvas a frame is decoded into
    total_pixels: int  # summed over every frame decoded

    def memory_bytes(self, fmt: str | None, full: bool) -> int:
        """Memory the decode (and conversion, if ``full``) holds at its peak, estimated.

        One canvas of 4 bytes per pixel; an animation keeps the previous frame
        and a disposal area beside it; a conversion a mode-converted copy and
        the encoder's. A JPEG kept as it is decodes at 1/8 scale: 1/64 of it.
        """
        if fmt == "JPEG" and not full:
            return self.frame_pixels // 64 * _BYTES_PER_PIXEL + 1
        copies = 1 + (2 if self.frames > 1 else 0) + (2 if full else 0)
        return self.frame_pixels * _BYTES_PER_PIXEL * copies


# EXIF orientation (2-8) → the transpose that shows the image upright: ImageOps.exif_transpose's own table,
# so annotations (annotations/objects.py) follow the pixels exactly.
ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


@dataclass(frozen=True)
class Geometry:
    """How the recorded pixels came from the stored file's: what boxes and masks drawn on the stored
    image (its ``stored_width`` x ``stored_height`` frame) must go through to stay on their objects.

    ``orientation`` is the EXIF orientation actually applied (1: none; else a key of
    ORIENTATION_TRANSPOSE); ``width`` x ``height`` is the recorded size, after any resize.
    """

    stored_width: int
    stored_height: int
    width: int
    height: int
    orientation: int = 1


@dataclass(frozen=True)
class Prepared:
    data: bytes
    info: ImageInfo
    converted_from: str | None = None  # the source format when the bytes were re-encoded
    geometry: Geometry | None = None  # the stored frame and the transform applied (see Geometry)


@dataclass(frozen=True)
class _TfReading:
    """What ``tf.io.decode_image(data, expand_animations=False)`` makes of a file as it is.

    ``channels`` is set only when the file's structure is on the allow-list
    below (each property checked against TensorFlow 2.21's decoders, see
    tests/test_tf_readable.py); otherwise ``why`` says what is off it, and
    the file is converted or rejected.
    """

    channels: int | None
    why: str = ""
    index_limit: int = 0  # GIF: readable only if the first frame's colour indices are below this

    def settled(self, first_max_index: int | None) -> _TfReading:
        """The reading once the first frame is decoded (``_decode`` returns its highest colour index)."""
        if not self.index_limit or self.channels is None:
            return self
        if first_max_index is None or first_max_index >= self.index_limit:
            return _TfReading(None, f"GIF: the first frame has colour indices past its table of {self.index_limit}")
        return _TfReading(self.channels)


def _tf_reading(img: Image.Image, data: bytes, gif: _GifLayout | None) -> _TfReading:
    """Whether TensorFlow provably decodes ``data`` at Pillow's size, and to how many channels."""
    fmt, mode = img.format, img.mode
    if fmt in ("JPEG", "MPO"):
        problem = _jpeg_problem(data)
        if problem:
            return _TfReading(None, problem)
        if mode == "L":
            return _TfReading(1)
        if mode in ("RGB", "YCbCr"):
            return _TfReading(3)
    elif fmt == "PNG":
        problem = png_problem(data)
        if problem:
            return _TfReading(None, f"PNG with {problem}")
        if mode == "P":
            return _TfReading(4 if "transparency" in img.info else 3)
        if data[25:26] == b"\x04":  # grey + alpha (IHDR's colour type): Pillow opens the 16-bit one as RGBA
            return _TfReading(2)
        if mode in _PNG_CHANNELS:
            return _TfReading(_PNG_CHANNELS[mode])
    elif fmt == "GIF":
        if gif is None or gif.tf_problem:
            return _TfReading(None, f"GIF: {gif.tf_problem if gif else 'no frame'}")
        return _TfReading(3, index_limit=gif.index_limit)
    elif fmt == "WEBP":
        # TensorFlow 2.21 corrupts its heap decoding an animated WebP (the process aborts), and it
        # takes the animation path from the header's flag, whatever the frame count.
        if data[12:16] == b"VP8X" and len(data) > 20 and data[20] & 0x02:
            return _TfReading(None, "animated WebP (TensorFlow aborts on one)")
        if mode in ("RGB", "RGBA") and getattr(img, "n_frames", 1) == 1:
            return _TfReading(len(mode))
    elif fmt == "BMP":
        return _bmp_reading(img, data)
    return _TfReading(None, f"{fmt} in mode {mode}")


def _bmp_reading(img: Image.Image, data: bytes) -> _TfReading:
    """TensorFlow's BMP decoder reads only the file header's pixel offset and the info header's width,
    height and bit count: it ignores compression and palette, and requires the file to end exactly
    where the last pixel row does. So only uncompressed 24/32-bit files, and 8-bit ones whose palette
    is the identity grey ramp (TF returns the indices), laid out that way, are stored as they are."""
    if len(data) < 34:
        return _TfReading(None, "BMP header cut short")
    offset, header = struct.unpack_from("<II", data, 10)
    width, height, _, bpp, compression = struct.unpack_from("<iiHHI", data, 18)
    if header not in (40, 108, 124):  # V3/V4/V5; an OS/2 header keeps its sizes elsewhere
        return _TfReading(None, f"BMP with a {header}-byte info header")
    if compression != 0:
        return _TfReading(None, "compressed BMP (RLE or bit fields)")
    if bpp not in (8, 24, 32) or (bpp == 8 and img.mode != "L"):
        return _TfReading(None, f"{bpp}-bit BMP in mode {img.mode} (TensorFlow reads 8-bit as grey indices)")
    row = (bpp // 8 * width + 3) // 4 * 4
    if width <= 0 or height == 0 or len(data) != offset + row * abs(height):
        return _TfReading(None, "BMP with bytes after its pixel rows (e.g. a colour profile)")
    if bpp == 32 and not _any_fourth_byte(data, offset, row * abs(height)):
        # BGRX as Windows writes it: Pillow reads RGB, TensorFlow takes X for alpha (a transparent image)
        return _TfReading(None, "32-bit BMP whose fourth bytes are all 0 (TensorFlow would read them as alpha)")
    return _TfReading(bpp // 8)


def _any_fourth_byte(data: bytes, offset: int, size: int) -> bool:
    """Whether any fourth byte of the ``size`` bytes at ``offset`` is not 0 (a view, no copy)."""
    import numpy as np

    return bool(np.frombuffer(data, np.uint8, count=size, offset=offset)[3::4].any())


_PNG_CRITICAL_CHUNKS = {b"IHDR", b"PLTE", b"IDAT", b"IEND"}


def png_problem(data: bytes) -> str:
    """What in a PNG's chunks libpng (TensorFlow) refuses or reads differently from Pillow; "" if nothing.

    Pillow checks CRCs only of the chunks before the image data and stops at the first broken chunk after
    it; libpng fails on a bad CRC in any critical chunk, an unknown critical chunk, a malformed chunk or
    a missing IEND. It also ignores a palette's tRNS that is empty or longer than the palette, which
    Pillow takes as transparency (4 channels where TensorFlow gives 3). The chunk count is already
    bounded (``_header_steps``); CRCs are computed on views, without copies.
    """
    if data[8:16] != b"\x00\x00\x00\x0dIHDR":  # libpng wants IHDR first, 13 bytes long (Pillow does not)
        return "no 13-byte IHDR chunk first"
    view, n, pos = memoryview(data), len(data), 8
    palette, trns, image_data = 0, [], False
    while pos + 12 <= n:
        length, kind = int.from_bytes(data[pos : pos + 4], "big"), data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if length > 0x7FFFFFFF or end > n or not kind.isalpha():
            return f"a malformed chunk at byte {pos}"
        if not kind[0] & 0x20:  # a critical chunk (upper-case first letter)
            if kind not in _PNG_CRITICAL_CHUNKS:
                return f"an unknown critical chunk {kind.decode()}"
            if zlib.crc32(view[pos + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
                return f"a bad CRC in its {kind.decode()} chunk"
        if kind == b"IEND":
            break
        image_data = image_data or kind == b"IDAT"
        if not image_data and kind == b"PLTE":
            palette = length // 3
        elif not image_data and kind == b"tRNS":
            trns.append(length)
        pos = end
    else:
        return "no IEND chunk"
    if data[25:26] == b"\x03" and trns and not any(1 <= t <= palette for t in trns):
        return "a tRNS chunk that does not fit its palette"
    return ""


# Start-of-frame markers of the JPEG processes TensorFlow's libjpeg decodes: baseline, extended and
# progressive Huffman (not lossless, hierarchical or arithmetic coding).
_JPEG_SOF_MARKERS = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_TF_JPEG_SOF_MARKERS = {0xC0, 0xC1, 0xC2}


def _jpeg_problem(data: bytes) -> str:
    """What keeps TensorFlow from decoding a JPEG (the first image of an MPO) that Pillow decodes; "" if nothing.

    TensorFlow's libjpeg stops on a file whose data ends before the end-of-image marker (Pillow accepts
    one whose scans are complete, e.g. zero padding where the marker belongs), and decodes only the
    Huffman-coded sequential and progressive processes.
    """
    frame, ended = _jpeg_walk(data)[1:]
    if frame is not None and frame not in _TF_JPEG_SOF_MARKERS:
        what = "lossless" if frame in (0xC3, 0xC7, 0xCB, 0xCF) else "hierarchical or arithmetic-coded"
        return f"{what} JPEG (SOF {frame:#04x})"
    if not ended:
        return "JPEG with no end-of-image marker"
    return ""


def _tf_reading_or_none(img: Image.Image, data: bytes, gif: _GifLayout | None) -> _TfReading:
    if img.format not in _TF_FORMATS:
        return _TfReading(None, f"{img.format} in mode {img.mode}")
    return _tf_reading(img, data, gif)


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
        # The machine, not the file: every size was checked from the headers
        # first, so this is memory pressure. Failing the bundle lets the runner
        # retry it; a reject would drop a good image for good.
        raise
    except Exception as e:  # Pillow plugins raise assorted types on hostile input
        raise Rejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None


def _pillow_open(data: bytes) -> ImageFile.ImageFile:
    """``Image.open(BytesIO(data))`` without its check against ``Image.MAX_IMAGE_PIXELS``.

    That check reads a process-wide setting (whose hard limit is 179 M
    pixels): changing it would change every other user of Pillow in the
    process. This tries Pillow's registered format plugins the way
    ``Image.open`` does; ``_check`` then applies the run's own limits to the
    same header, before anything is decoded.
    """
    prefix = data[:16]
    fp = io.BytesIO(data)
    tried: tuple[str, ...] = ()
    for loader in (Image.preinit, Image.init):  # common plugins first, then all (as Image.open does)
        loader()
        registered = tuple(Image.ID)
        for factory, accept in _plugin_order(registered, tried):
            verdict = accept(prefix) if accept else True
            if not verdict or isinstance(verdict, str):  # a str is Pillow's "looks like it, but unsupported"
                continue
            fp.seek(0)
            try:
                return factory(fp, "")
            except (SyntaxError, IndexError, TypeError, struct.error):
                continue
        tried = registered
    raise UnidentifiedImageError("cannot identify image file")


_PLUGIN_ORDERS: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[tuple[Any, ...], tuple[tuple[Any, Any], ...]]] = {}


def _plugin_order(registered: tuple[str, ...], tried: tuple[str, ...]) -> tuple[tuple[Any, Any], ...]:
    """(factory, accept) of the ``registered`` formats not ``tried``: those with a signature check first, then
    those without one (IM, IMT, IPTC, PCD, SPIDER, TGA), each in Pillow's order.

    Image.open tries them in one list, where IM, IMT and IPTC come before JPEG: each JPEG would cost three
    failed parses (~17 µs of the GIL per image). Only a file built to be two formats at once, one of them
    among those, can open as another format than Image.open gives it. Kept per list of names, and made
    again when a plugin registered again under a known name changed Image.OPEN.
    """
    fresh = [fmt for fmt in registered if fmt not in tried]
    kept = _PLUGIN_ORDERS.get((registered, tried))
    if kept is not None and all(Image.OPEN.get(fmt) is plugin for fmt, plugin in zip(fresh, kept[0], strict=True)):
        return kept[1]
    plugins = tuple(Image.OPEN[fmt] for fmt in fresh)
    order = tuple(p for p in plugins if p[1] is not None) + tuple(p for p in plugins if p[1] is None)
    _PLUGIN_ORDERS[(registered, tried)] = (plugins, order)
    return order


@dataclass(frozen=True)
class _GifLayout:
    """A GIF's block structure: what decoding it costs, and what keeps TensorFlow from reading it as Pillow does."""

    cost: Cost
    tf_problem: str  # "" when TensorFlow decodes the first frame at the logical screen's size
    index_limit: int = 0  # the first frame's colour indices must be below this (0: they cannot be over)


def _gif_frame_problem(index: int, screen: tuple[int, int], frame: tuple[int, ...], table: int, code_size: int) -> str:
    """What about one frame's descriptor TensorFlow (giflib) reads differently from Pillow; "" if nothing.

    TensorFlow's output is as large as the largest frame (not the logical
    screen, not the frames' offsets), and it places the first frame at the
    top left: so the first frame must be the screen exactly and no frame
    may reach outside it. giflib fails on LZW code sizes over 8 in any
    frame. TensorFlow refuses a frame without a colour table, and (with
    ``expand_animations=False`` only the first frame is decoded) a first
    frame with a colour index past its table: checked after decoding
    (``_TfReading.index_limit``) unless its table has 2 ** code size entries.
    """
    x, y, w, h = frame
    if w == 0 or h == 0:
        return f"frame {index} is empty"
    if index == 0 and (x, y, w, h) != (0, 0, *screen):
        return f"the first frame ({w}x{h} at {x},{y}) is not the logical screen ({screen[0]}x{screen[1]})"
    if x + w > screen[0] or y + h > screen[1]:
        return f"frame {index} reaches outside the logical screen"
    if not table:
        return f"frame {index} has no colour table"
    if not 2 <= code_size <= 8:
        return f"frame {index} has LZW code size {code_size}"
    return ""


def _gif_layout(data: bytes, max_frames: int) -> _GifLayout | None:
    """Frames and canvases of a GIF from its block structure, without Pillow; None if not a GIF.

    Pillow grows the canvas to cover every frame's declared extent (up to
    65,535 + 65,535 pixels a side, whatever the logical screen says) and
    allocates it on opening or seeking, before any limit of ours could look
    at it: so GIFs are measured here, before Pillow opens them. Stops counting
    after ``max_frames`` + 1 frames.

    The same walk notes what TensorFlow would read differently (``tf_problem``):
    besides the frames (``_gif_frame_problem``), an extension whose first
    sub-block is empty (giflib then reads the next block's first byte as a
    length and loses the image), bytes between blocks, or a missing trailer.
    """
    if data[:6] not in (b"GIF87a", b"GIF89a") or len(data) < 13:
        return None
    width, height = struct.unpack_from("<HH", data, 6)
    screen = (width, height)
    flags = data[10]
    global_table = (2 << (flags & 7)) if flags & 0x80 else 0
    pos = 13 + 3 * global_table
    n = len(data)

    def skip_blocks(at: int) -> tuple[int, int]:
        count = 0
        while at < n:
            size = data[at]
            at += 1 + size
            count += 1
            if size == 0:
                break
        return at, count

    frames = biggest = total = 0
    ext_blocks = comment_bytes = 0
    problem = "no trailer"
    problems: list[str] = []
    index_limit = 0
    while pos < n:
        kind = data[pos]
        pos += 1
        if kind == 0x3B:  # trailer
            problem = ""
            break
        if kind == 0x21:  # extension: label, then data sub-blocks
            label, start = data[pos : pos + 1], pos + 1
            if start < n and data[start] == 0:
                problems.append("an extension without data")
            pos, count = skip_blocks(start)
            # Pillow reads extension sub-blocks one by one in Python, and joins a
            # comment's by concatenation (quadratic: an 800 KB comment took 7 s).
            ext_blocks += count
            if label == b"\xfe":
                comment_bytes += pos - start
            if ext_blocks > MAX_HEADER_STEPS or comment_bytes > MAX_GIF_COMMENT_BYTES:
                raise Rejected(TOO_MANY_CHUNKS, "GIF extension blocks over the limit (too many, or comments too long)")
        elif kind == 0x2C:  # image descriptor: x, y, w, h, flags
            if pos + 9 > n:
                break
            x, y, w, h, frame_flags = struct.unpack_from("<HHHHB", data, pos)
            local_table = (2 << (frame_flags & 7)) if frame_flags & 0x80 else 0
            pos += 9 + 3 * local_table
            code_size = data[pos] if pos < n else 0
            table = local_table or global_table
            if not problems:
                found = _gif_frame_problem(frames, screen, (x, y, w, h), table, code_size)
                problems += [found] if found else []
            if frames == 0 and table < 1 << code_size:  # literal codes run up to 2 ** code size - 1
                index_limit = table
            pos, _ = skip_blocks(pos + 1)  # LZW code size, then the data sub-blocks
            width, height = max(width, x + w), max(height, y + h)  # as Pillow grows its canvas
            frames += 1
            biggest = max(biggest, width * height)
            total += width * height
            if max_frames and frames > max_frames:
                break
        else:  # Pillow skips any other byte; giflib may not
            problems.append("bytes between blocks")
    if not frames:
        return None
    return _GifLayout(Cost(frames, biggest, total), problems[0] if problems else problem, index_limit)


_NOT_FF = re.compile(rb"[^\xff]")


def _header_steps(data: bytes, cap: int = MAX_HEADER_STEPS) -> int:
    """Steps Pillow's Python header loop would take on a PNG, JPEG or TIFF (0 for others); counts to cap + 1.

    PNG: every chunk (Pillow reads them one by one, IDAT included). TIFF: every
    tag of every page (``_tiff_entries``). JPEG: every
    marker segment before the first scan, and every padding or stray byte
    between them (Pillow skips those one byte at a time). Runs of such bytes
    are measured with C-speed searches, so this costs one Python step per
    segment or chunk, stopping after ``cap``.
    """
    n = len(data)
    steps = 0
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        pos = 8
        while pos + 8 <= n and steps <= cap:
            length = int.from_bytes(data[pos : pos + 4], "big")
            steps += 1
            if data[pos + 4 : pos + 8] == b"IEND":
                break
            pos += 12 + length
        return steps
    if data[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return _tiff_entries(data, cap)
    if data[:3] != b"\xff\xd8\xff":  # what Pillow takes for a JPEG
        return 0
    pos = 2
    while pos < n and steps <= cap:
        if data[pos] != 0xFF:  # stray bytes up to the next FF
            nxt = data.find(b"\xff", pos)
            nxt = n if nxt < 0 else nxt
            steps += nxt - pos
            pos = nxt
            continue
        code_at = _NOT_FF.search(data, pos)
        if code_at is None:
            break
        steps += code_at.start() - pos  # FF padding before the marker code
        pos = code_at.start() + 1
        code = data[pos - 1]
        if code == 0xDA:  # start of scan: libjpeg (C) takes over
            break
        if code == 0x00 or code == 0x01 or 0xD0 <= code <= 0xD9:  # no length field
            continue
        if pos + 2 > n:
            break
        pos += (data[pos] << 8) | data[pos + 1]
    return steps


def _tiff_entries(data: bytes, cap: int) -> int:
    """Directory entries (tags) of every page of a TIFF or BigTIFF, one Python step per page; to cap + 1.

    Pillow parses every tag of every page it seeks past in Python (~5 µs a
    tag): 400 pages of 5,000 tags, 24 MB, took 28 s.
    """
    order = "<" if data[:2] == b"II" else ">"
    big = data[2:4] in (b"+\x00", b"\x00+")
    head, entry, link = (8, 20, "Q") if big else (2, 12, "I")
    n = len(data)
    try:
        offset = struct.unpack_from(order + link, data, 8 if big else 4)[0]
        steps = 0
        seen: set[int] = set()
        while offset and offset not in seen and offset + head <= n and steps <= cap:
            seen.add(offset)
            count = struct.unpack_from(order + ("Q" if big else "H"), data, offset)[0]
            steps += 1 + count
            after = offset + head + entry * count
            if after + struct.calcsize(link) > n:
                break
            offset = struct.unpack_from(order + link, data, after)[0]
        return steps
    except struct.error:
        return 0


# A marker where entropy-coded data ends: FF then anything but 00 (stuffing), D0-D7 (restarts) or FF (fill).
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _jpeg_scans(data: bytes) -> int:
    """Start-of-scan markers of the first image, found by walking its segments up to its end (EOI).

    Segments are skipped by their length and each scan's entropy-coded data
    up to the next real marker, so FF DA bytes inside metadata (an EXIF
    thumbnail is a whole JPEG), an MPO's later frames or data appended after
    EOI (motion photos) are not counted.
    """
    return _jpeg_walk(data)[0]


def _jpeg_walk(data: bytes) -> tuple[int, int | None, bool]:
    """The first image's scans, its first start-of-frame marker (None if none), and whether EOI ends it."""
    pos, n, scans, frame = 2, len(data), 0, None
    while pos + 2 <= n:
        if data[pos] != 0xFF or data[pos + 1] == 0xFF:  # fill bytes, or lost sync: to the next marker
            found = _JPEG_MARKER.search(data, pos + 1)
            if found is None:
                break
            pos = found.start()
            continue
        marker = data[pos + 1]
        if marker == 0xD9:  # end of image
            return scans, frame, True
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            pos += 2
            continue
        if frame is None and marker in _JPEG_SOF_MARKERS:
            frame = marker
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xDA:
            scans += 1
            found = _JPEG_MARKER.search(data, pos)
            if found is None:
                break
            pos = found.start()
    return scans, frame, False


def decoded_frames(img: Image.Image) -> int:
    """How many frames of ``img`` are decoded: every frame of a GIF (TensorFlow decodes them
    all), else the first only (TensorFlow reads an MPO's first image and an APNG's default
    image; a converted file, a TIFF or an animated WebP, keeps its first frame)."""
    return getattr(img, "n_frames", 1) if img.format == "GIF" else 1


def measure(img: Image.Image, options: ImageOptions) -> Cost:
    """Frames and pixels decoding ``img`` will take, from headers only (no pixel is decoded).

    ``frames`` counts every frame or page (the --max-frames limit); the pixel
    totals count only the frames ``decoded_frames`` says are decoded. APNG,
    WebP and MPO declare their frame count; multi-page TIFFs are walked page
    by page, stopping after ``max_frames`` + 1, though only the first page is
    decoded.
    """
    width, height = img.size
    canvas = width * height
    if img.format in ("PNG", "WEBP", "MPO"):
        frames = getattr(img, "n_frames", 1)
        return Cost(frames, canvas, decoded_frames(img) * canvas)
    if not getattr(img, "is_animated", False) and img.format != "TIFF":
        return Cost(1, canvas, canvas)
    if img.tell() != 0:
        # A layered PSD: Pillow opens it at its composite image (the one decoded) and numbers the layers from
        # 1; seeking to a layer would leave that layer's pixels in place of the composite.
        return Cost(getattr(img, "n_frames", 1), canvas, canvas)
    sizes = []
    limit = options.max_frames + 1 if options.max_frames else 1 << 31
    for i in range(limit):
        try:
            img.seek(i)
        except EOFError:
            break
        sizes.append(img.size[0] * img.size[1])
    img.seek(0)
    decoded = sizes[: decoded_frames(img)] or [canvas]
    return Cost(len(sizes), max(decoded), sum(decoded))


def _check(cost: Cost, options: ImageOptions, what: str) -> None:
    """Rejected if ``cost`` is over a limit of ``options``."""
    if options.max_frames and cost.frames > options.max_frames:
        more = "+" if cost.frames == options.max_frames + 1 else ""
        raise Rejected(TOO_MANY_FRAMES, f"{cost.frames}{more} frames is over --max-frames {options.max_frames}")
    if options.max_pixels and cost.frame_pixels > options.max_pixels:
        raise Rejected(
            TOO_MANY_PIXELS, f"{what} ({cost.frame_pixels} pixels) is over --max-pixels {options.max_pixels}"
        )
    if options.max_total_pixels and cost.total_pixels > options.max_total_pixels:
        raise Rejected(
            TOO_MANY_PIXELS,
            f"{cost.frames} frames of {cost.total_pixels} pixels in all is over "
            f"--max-total-pixels {options.max_total_pixels}",
        )


def _open(data: bytes, options: ImageOptions) -> tuple[Image.Image, _TfReading, Cost]:
    """Opens (headers only) and checks every limit; Rejected on failure.

    Also returns what TF makes of the file as it is (``_TfReading``: its
    channels, or why it is not on the allow-list), and the decode's Cost.
    """
    if not data:
        raise Rejected(EMPTY, "zero bytes")
    with _reasons():
        steps = _header_steps(data)
        if steps > MAX_HEADER_STEPS:
            raise Rejected(
                TOO_MANY_CHUNKS, f"over {MAX_HEADER_STEPS} chunks, segments or padding bytes around the pixel data"
            )
        gif = _gif_layout(data, options.max_frames)
        if gif is None and data[:6] in (b"GIF87a", b"GIF89a"):
            raise Rejected(TRUNCATED, "no complete frame in the GIF")
        if gif is not None:
            _check(gif.cost, options, "a frame's canvas")  # before Pillow allocates it
        img = _pillow_open(data)
        width, height = img.size
        if width <= 0 or height <= 0:
            raise Rejected(DECODE_ERROR, f"image has size {width}x{height}")
        if options.max_pixels and width * height > options.max_pixels:
            raise Rejected(TOO_MANY_PIXELS, f"{width}x{height} is over --max-pixels {options.max_pixels}")
        if img.format in ("JPEG", "MPO") and img.info.get("progressive"):
            # Only progressive scans each revisit the whole image: libjpeg
            # stops a sequential file at its first scan too many.
            scans = _jpeg_scans(data)
            if scans > MAX_JPEG_SCANS or scans * width * height > MAX_JPEG_SCAN_PIXELS:
                raise Rejected(
                    TOO_MANY_SCANS,
                    f"{scans} scans of {width}x{height} (at most {MAX_JPEG_SCANS}, "
                    f"and scans x pixels at most {MAX_JPEG_SCAN_PIXELS})",
                )
        cost = gif.cost if gif is not None else measure(img, options)
        _check(cost, options, "a frame")
        if options.min_size and min(width, height) < options.min_size:
            raise Rejected(TOO_SMALL, f"{width}x{height} is under --min-size {options.min_size}")
        return img, _tf_reading_or_none(img, data, gif), cost


def check_header(prefix: bytes, options: ImageOptions) -> Rejected | None:
    """A limit the first bytes of a file already prove it breaks, or None (also when they prove nothing).

    Lets the writer read a large file's head, refuse a 60,000 × 60,000 PNG
    from its 33-byte header, and only then read the rest. Only for formats
    whose size comes first (a TIFF's directories may sit at its end; Pillow
    warns about a cut one).
    """
    if not prefix.startswith((b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM", b"RIFF")):
        return None
    try:
        _quietly(lambda: _open(prefix, options))
    except Rejected as r:
        if r.reason in (TOO_MANY_PIXELS, TOO_MANY_FRAMES, TOO_MANY_SCANS, TOO_MANY_CHUNKS):
            return r
    except Exception:  # noqa: BLE001 - a cut-off header proves nothing either way
        return None
    return None


def _decode(img: Image.Image, *, pixels: bool = True) -> int | None:
    """Decodes the frames ``decoded_frames`` names (every frame TensorFlow decodes); Rejected on failure.

    Returns the first frame's highest colour index (palette images), for ``_TfReading.settled``.

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
        first_max_index = img.getextrema()[1] if img.mode == "P" else None  # type: ignore[index]
        frames = decoded_frames(img)
        for frame in range(1, frames):
            img.seek(frame)
            img.load()
        if frames > 1:
            img.seek(0)
    return first_max_index  # type: ignore[return-value]


def inspect_image(data: bytes, options: ImageOptions | None = None) -> ImageInfo:
    """Fully decodes ``data`` as it is; its ImageInfo, or Rejected (also for formats TF misreads)."""
    return _quietly(lambda: _inspect(data, options))


def _inspect(data: bytes, options: ImageOptions | None) -> ImageInfo:
    img, tf_reading, _ = _open(data, options or ImageOptions())
    tf_reading = tf_reading.settled(_decode(img))
    if tf_reading.channels is None:
        raise Rejected(UNSUPPORTED_FORMAT, f"{tf_reading.why}: not read back by TensorFlow as Pillow reads it")
    width, height = img.size
    return ImageInfo(_TF_FORMATS[img.format], height, width, tf_reading.channels)


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
        target = "LA" if has_alpha else "L"
    else:
        target = "RGBA" if has_alpha else "RGB"
    return img if img.mode == target else img.convert(target)  # no copy of a 179 MP image for nothing


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
    if data[:8] == _PNG_SIGNATURE:
        return _png_without(data, _PNG_METADATA_CHUNKS)
    return data


def _png_without(data: bytes, kinds: Collection[bytes], which: Callable[[bytes, bytes], bool] | None = None) -> bytes:
    """A PNG's bytes without its chunks of these ``kinds`` (only those ``which(kind, body)`` says, if given)."""
    out = [data[:8]]
    i = 8
    while i + 8 <= len(data):
        length = struct.unpack(">I", data[i : i + 4])[0]
        kind = data[i + 4 : i + 8]
        end = i + 12 + length
        if kind not in kinds or (which is not None and not which(kind, data[i + 8 : end - 4])):
            out.append(data[i:end])
        i = end
    return b"".join(out)


def _text_over_limit(kind: bytes, body: bytes) -> bool:
    """Whether a zTXt or compressed iTXt chunk's text inflates past Pillow's PngImagePlugin.MAX_TEXT_CHUNK."""
    from PIL import PngImagePlugin

    keyword_end = body.find(b"\0")
    if kind == b"zTXt":
        compressed = body[keyword_end + 2 :]  # keyword, NUL, method
    elif kind == b"iTXt" and body[keyword_end + 1 : keyword_end + 2] == b"\1":  # the compression flag
        rest = body[keyword_end + 3 :]  # keyword, NUL, flag, method, then language and translated keyword
        parts = rest.split(b"\0", 2)
        if len(parts) < 3:
            return False
        compressed = parts[2]
    else:
        return False
    inflater = zlib.decompressobj()
    try:
        inflater.decompress(compressed, PngImagePlugin.MAX_TEXT_CHUNK)
    except zlib.error:
        return False
    return bool(inflater.unconsumed_tail)


def _quietly(work: Callable[[], _T]) -> _T:
    """``work()`` with what decoders say caught (decoder_noise), not printed; added to a reject's detail."""
    with captured() as notes:
        try:
            return work()
        except Rejected as r:
            if not notes:
                raise
            said = "; ".join(notes)
            raise Rejected(r.reason, f"{r.detail} (decoder said: {said})" if r.detail else said) from None


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


def _prepare(
    data: bytes, options: ImageOptions, reserve: Callable[[int], AbstractContextManager[object]] | None
) -> Prepared:
    img, tf_reading, cost = _open(data, options)
    width, height = img.size
    source = img.format or "unknown"
    shrink = bool(options.resize_max_side and max(img.size) > options.resize_max_side)
    reencode = bool(options.reencode_quality)
    # A GIF whose colour indices are checked after decoding may still need converting: reserved as such.
    maybe_convert = tf_reading.channels is None or bool(tf_reading.index_limit)
    full = bool(maybe_convert or shrink or reencode or options.apply_exif_orientation)
    held = reserve(cost.memory_bytes(source, full)) if reserve else contextlib.nullcontext()
    with held:
        # EXIF orientation is read after a full decode (a PNG may keep it after its pixels).
        tf_reading = tf_reading.settled(_decode(img, pixels=full))
        channels = tf_reading.channels
        readable = channels is not None
        rotate = options.apply_exif_orientation and _orientation(img) != 1
        if readable and not (rotate or shrink or reencode):
            stored = strip_metadata(data) if options.strip_exif else data
            info = ImageInfo(_TF_FORMATS[source], height, width, channels)  # type: ignore[arg-type]
            return Prepared(stored, info, geometry=Geometry(width, height, width, height))
        if not readable and options.on_unsupported == "reject" and not (rotate or shrink or reencode):
            raise Rejected(UNSUPPORTED_FORMAT, f"{tf_reading.why}: not read back by TensorFlow as Pillow reads it")
        orientation = _applied_orientation(img) if rotate else 1
        encoded = _convert(img, options, source, readable, rotate, shrink)
        del img  # the decoded source goes before the check below decodes the result
        info = _inspect(encoded, ImageOptions(max_pixels=0, max_total_pixels=0, max_frames=0))
    geometry = Geometry(width, height, info.width, info.height, orientation)
    return Prepared(encoded, info, converted_from=source.lower(), geometry=geometry)


def _applied_orientation(img: Image.Image) -> int:
    """The orientation ImageOps.exif_transpose will apply to ``img``: its EXIF tag if it names a transpose,
    else 1 (it leaves other values, and an image whose EXIF cannot be read, as they are)."""
    try:
        value = img.getexif().get(0x0112, 1)
        return int(value) if value in ORIENTATION_TRANSPOSE else 1
    except Exception:  # noqa: BLE001 - a broken EXIF block is no orientation (as _orientation)
        return 1


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
