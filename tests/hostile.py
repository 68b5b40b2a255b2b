"""Files that are cheap to store and costly to decode, made here (tests and scripts/benchmark.py hostile).

Each maker returns bytes (or writes a sparse file); none needs more than a few
MB of memory to build, whatever it claims to hold.
"""

from __future__ import annotations

import io
import os
import struct
import zlib

from PIL import Image


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png(ihdr: bytes, idat: bytes) -> bytes:
    """A PNG file of one IHDR, one IDAT and IEND."""
    chunks = [_png_chunk(b"IHDR", ihdr), _png_chunk(b"IDAT", idat), _png_chunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


def zero_png(width: int, height: int, mode: str = "RGB", seed_row: int = 0) -> bytes:
    """A valid 8-bit PNG of ``width`` × ``height`` black pixels: its zlib stream is ~1/1000 of what it expands to.

    ``seed_row`` puts one grey pixel in that row so files of equal size differ.
    Built row by row (never the whole raw image in memory).
    """
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    color_type = {"L": 0, "RGB": 2, "RGBA": 6}[mode]
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + width * channels)  # filter byte 0, then black pixels
    marked = b"\x00" + bytes([seed_row % 251 + 1]) * channels + b"\x00" * ((width - 1) * channels)
    parts = []
    for y in range(height):
        parts.append(comp.compress(marked if y == seed_row else row))
    parts.append(comp.flush())
    return _png(ihdr, b"".join(parts))


def png_stream_bomb(width: int = 64, height: int = 64, expands_to: int = 400_000_000) -> bytes:
    """A small PNG whose zlib stream expands to ``expands_to`` bytes, far more than its IHDR needs."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    comp = zlib.compressobj(9)
    block = b"\x00" * (1 << 20)
    parts = [comp.compress(block) for _ in range(expands_to >> 20)]
    parts.append(comp.flush())
    return _png(ihdr, b"".join(parts))


def _gif_frame_block(width: int, height: int) -> tuple[bytes, bytes]:
    """(header up to the first frame, one frame: its image descriptor and LZW data) of a one-colour GIF."""
    data = io.BytesIO()
    Image.new("P", (width, height), 0).save(data, "GIF")
    raw = data.getvalue()
    flags = raw[10]
    pos = 13 + ((3 << ((flags & 7) + 1)) if flags & 0x80 else 0)
    while raw[pos] == 0x21:  # extensions before the frame
        pos += 2
        while raw[pos]:
            pos += 1 + raw[pos]
        pos += 1
    return raw[:pos], raw[pos:-1]  # drop the trailer


def gif_with_extents(screen: tuple[int, int], frames: list[tuple[int, int, int, int]]) -> bytes:
    """A GIF whose logical screen is ``screen`` and whose frames declare (x, y, w, h) extents.

    The frame data is a tiny one-colour image: only the descriptors lie.
    """
    head, frame = _gif_frame_block(4, 4)
    head = head[:6] + struct.pack("<HH", *screen) + head[10:]
    body = []
    for x, y, w, h in frames:
        body.append(b"\x2c" + struct.pack("<HHHH", x, y, w, h) + frame[9:])
    return head + b"".join(body) + b"\x3b"


def many_frame_gif(frames: int, width: int = 256, height: int = 256) -> bytes:
    """A GIF of ``frames`` one-colour frames (a few bytes each) of ``width`` × ``height``."""
    head, frame = _gif_frame_block(width, height)
    gce = b"\x21\xf9\x04\x04\x0a\x00\x00\x00"  # 100 ms, disposal: leave in place
    return head + (gce + frame) * frames + b"\x3b"


def many_page_tiff(pages: int, width: int = 32, height: int = 32) -> bytes:
    """A multi-page TIFF (each page a small RGB image)."""
    first = Image.new("RGB", (width, height), (10, 20, 30))
    rest = [Image.new("RGB", (width, height), (i % 256, 0, 0)) for i in range(1, pages)]
    out = io.BytesIO()
    first.save(out, "TIFF", save_all=True, append_images=rest)
    return out.getvalue()


def jpeg_scan_bomb(scans: int, width: int = 512, height: int = 512) -> bytes:
    """A progressive JPEG whose last scan is repeated until it has ``scans`` scans."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 200)).save(out, "JPEG", progressive=True, quality=90)
    data = out.getvalue()
    last = data.rindex(b"\xff\xda")
    scan = data[last:-2]  # the last SOS segment and its entropy-coded data, without EOI
    return data[:-2] + scan * (scans - data.count(b"\xff\xda")) + b"\xff\xd9"


def sparse_file(path: str, size: int) -> str:
    """A file of ``size`` bytes that takes no disk space (a hole), e.g. a 4 GB ``.jpg``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb"):
        pass
    os.truncate(path, size)
    return path


def png_many_chunks(chunks: int = 400_000) -> bytes:
    """A 64 x 64 PNG with ``chunks`` empty private chunks before its pixels (Pillow reads each in Python)."""
    good = io.BytesIO()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(good, "PNG")
    data = good.getvalue()
    return data[:33] + _png_chunk(b"abCd", b"") * chunks + data[33:]


def jpeg_padding(nbytes: int = 4_000_000) -> bytes:
    """A 64 x 64 JPEG with ``nbytes`` of 0xFF fill bytes before a marker (Pillow skips them one at a time)."""
    good = io.BytesIO()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(good, "JPEG")
    data = good.getvalue()
    return data[:2] + b"\xff" * nbytes + data[2:]


def gif_comment_bomb(sub_blocks: int = 400_000) -> bytes:
    """A 4 x 4 GIF whose comment is ``sub_blocks`` one-byte sub-blocks (Pillow joins them quadratically)."""
    head, frame = _gif_frame_block(4, 4)
    return head + b"\x21\xfe" + b"\x01x" * sub_blocks + b"\x00" + frame + b"\x3b"


def tiff_many_tags(pages: int = 400, tags: int = 5000) -> bytes:
    """A TIFF of ``pages`` 8 x 8 pages, each with ``tags`` private tags (Pillow parses each tag in Python)."""
    width = height = 8
    pixels = b"\x10" * (width * height * 3)
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    for page in range(pages):
        entries = [(256, 3, width), (257, 3, height), (258, 3, 8), (259, 3, 1), (262, 3, 2), (273, 4, 0),
                   (277, 3, 3), (278, 3, height), (279, 4, len(pixels))]  # fmt: skip
        entries += [(60000 + i, 3, 0) for i in range(tags)]
        entries.sort()
        start = len(out)
        pixel_at = start + 2 + 12 * len(entries) + 4
        out += struct.pack("<H", len(entries))
        for tag, kind, value in entries:
            value = pixel_at if tag == 273 else value
            layout = "<HHII" if kind == 4 else "<HHIHxx"  # LONG, or SHORT padded to 4 bytes
            out += struct.pack(layout, tag, kind, 1, value)
        nxt = pixel_at + len(pixels) if page < pages - 1 else 0
        out += struct.pack("<I", nxt) + pixels
    return bytes(out)
