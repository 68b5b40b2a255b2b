"""Byte-level looks at a file, before or beside Pillow: GIF, JPEG, PNG and TIFF structure, the steps a
header parser would take, and metadata stripping (--strip-exif). Nothing here decodes pixels.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..vocab.reasons import (
    TOO_MANY_CHUNKS,
)
from .options import MAX_GIF_COMMENT_BYTES, MAX_HEADER_STEPS, Cost, Rejected

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# JPEG segments and PNG chunks that carry metadata, not pixels (--strip-exif).
# APP2 (ICC profile) and APP14 (Adobe colour transform) stay: they change how pixels decode.
_JPEG_METADATA_MARKERS = {0xE1, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xEB, 0xEC, 0xED, 0xEF, 0xFE}


_PNG_METADATA_CHUNKS = {b"eXIf", b"tEXt", b"iTXt", b"zTXt", b"tIME"}


_PNG_TEXT_CHUNKS = {b"tEXt", b"iTXt", b"zTXt"}


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
