"""Byte builders for format variants that encoders rarely write but real folders hold.

Pillow's writers only produce a few layouts of each format; the decoders in
TensorFlow and Pillow must cope with many more. Each builder here writes one
file from the spec's fields directly, so a test can name exactly the
structural property it varies (a GIF without a global colour table, a BMP with
a V5 header and an embedded profile, …). ``corpus()`` gathers one file per
variant for the differential test in tests/test_tf_readable.py.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from .imagegen import encode, pixels

Palette = list[tuple[int, int, int]]

# ---- GIF -----------------------------------------------------------------------------------------


def _palette_bits(palette: Palette) -> int:
    """Size field of a colour table: the table holds 2 ** (bits + 1) entries (at least 2)."""
    bits = 0
    while (2 << bits) < len(palette):
        bits += 1
    return bits


def _colour_table(palette: Palette) -> bytes:
    size = 2 << _palette_bits(palette)
    padded = list(palette) + [(0, 0, 0)] * (size - len(palette))
    return b"".join(bytes(c) for c in padded)


def _sub_blocks(data: bytes, size: int = 255) -> bytes:
    """``data`` cut into sub-blocks of at most ``size`` bytes, then the zero-length terminator."""
    return b"".join(bytes([len(data[i : i + size])]) + data[i : i + size] for i in range(0, len(data), size)) + b"\0"


def lzw(indices: bytes, min_code_size: int) -> bytes:
    """GIF LZW data that uses literal codes only, with a clear code before the code width would grow.

    Valid for every decoder (the spec lets an encoder clear whenever it likes)
    and simple enough to check by eye; compression is not the point here.
    """
    clear, end = 1 << min_code_size, (1 << min_code_size) + 1
    width = min_code_size + 1
    per_clear = (1 << min_code_size) - 2  # literals after a clear before the table reaches 2 ** width
    acc = nbits = 0
    out = bytearray()

    def put(code: int) -> None:
        nonlocal acc, nbits
        acc |= code << nbits
        nbits += width
        while nbits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            nbits -= 8

    for start in range(0, len(indices), per_clear):
        put(clear)
        for index in indices[start : start + per_clear]:
            put(index)
    put(end)
    if nbits:
        out.append(acc & 0xFF)
    return bytes([min_code_size]) + _sub_blocks(bytes(out))


@dataclass
class GifFrame:
    """One image of a GIF: colour indices (rows top to bottom) and its descriptor."""

    indices: np.ndarray  # (h, w) uint8
    x: int = 0
    y: int = 0
    local_palette: Palette | None = None
    interlaced: bool = False
    disposal: int | None = None  # a Graphic Control Extension is written when this or transparent is set
    transparent: int | None = None
    delay: int = 10
    declared: tuple[int, int] | None = None  # (w, h) written in the descriptor, if not the data's

    def block(self, palette_bits: int) -> bytes:
        h, w = self.indices.shape
        out = b""
        if self.disposal is not None or self.transparent is not None:
            flags = ((self.disposal or 0) << 2) | (1 if self.transparent is not None else 0)
            out += b"\x21\xf9\x04" + struct.pack("<BHB", flags, self.delay, self.transparent or 0) + b"\0"
        dw, dh = self.declared or (w, h)
        flags = 0x40 if self.interlaced else 0
        if self.local_palette is not None:
            flags |= 0x80 | _palette_bits(self.local_palette)
            palette_bits = _palette_bits(self.local_palette)
        out += b"\x2c" + struct.pack("<HHHHB", self.x, self.y, dw, dh, flags)
        if self.local_palette is not None:
            out += _colour_table(self.local_palette)
        rows = self.indices
        if self.interlaced:  # passes: every 8th row from 0, every 8th from 4, every 4th from 2, every 2nd from 1
            order = [*range(0, h, 8), *range(4, h, 8), *range(2, h, 4), *range(1, h, 2)]
            rows = rows[order]
        return out + lzw(rows.astype(np.uint8).tobytes(), max(2, palette_bits + 1))


def comment(sub_blocks: list[bytes]) -> bytes:
    """A Comment Extension whose data is exactly these sub-blocks (an empty one ends it early)."""
    return b"\x21\xfe" + b"".join(bytes([len(b)]) + b for b in sub_blocks) + b"\0"


def application(identifier: bytes, payload: bytes) -> bytes:
    """An Application Extension (11-byte identifier + auth code), e.g. NETSCAPE2.0 looping or XMP."""
    return b"\x21\xff\x0b" + identifier[:11].ljust(11, b" ") + _sub_blocks(payload)


NETSCAPE_LOOP = application(b"NETSCAPE2.0", b"\x01\x00\x00")


def gif(
    screen: tuple[int, int],
    frames: list[GifFrame],
    global_palette: Palette | None,
    extensions: list[bytes] = (),  # type: ignore[assignment]
    version: bytes = b"GIF89a",
    background: int = 0,
) -> bytes:
    """A GIF file: header, logical screen (w, h), optional global table, extensions, frames, trailer."""
    flags = 0
    if global_palette is not None:
        flags = 0x80 | (7 << 4) | _palette_bits(global_palette)
    out = version + struct.pack("<HHBBB", screen[0], screen[1], flags, background, 0)
    if global_palette is not None:
        out += _colour_table(global_palette)
    out += b"".join(extensions)
    bits = _palette_bits(global_palette) if global_palette is not None else 7
    out += b"".join(f.block(bits) for f in frames)
    return out + b"\x3b"


def _raw_frame(w: int, h: int, lzw_data: bytes, x: int = 0, y: int = 0) -> bytes:
    """An image descriptor (no local table) followed by ``lzw_data`` as it is."""
    return b"\x2c" + struct.pack("<HHHHB", x, y, w, h, 0) + lzw_data


def _lzw_cut(data: bytes, min_code_size: int, pixels_kept: int) -> bytes:
    """LZW of ``data`` whose codes stop after ``pixels_kept`` pixels, with no end-of-information code."""
    full = lzw(data[:pixels_kept], min_code_size)
    # The end code is the last code written; dropping it leaves at most a few padding bits behind.
    codes = _unblock(full[1:])
    width = min_code_size + 1
    keep = (len(codes) * 8 - width) // 8
    return bytes([min_code_size]) + _sub_blocks(codes[: max(keep, 1)])


def _unblock(blocks: bytes) -> bytes:
    out, pos = bytearray(), 0
    while blocks[pos]:
        out += blocks[pos + 1 : pos + 1 + blocks[pos]]
        pos += 1 + blocks[pos]
    return bytes(out)


def rainbow(n: int, seed: int = 0) -> Palette:
    rng = np.random.default_rng(seed)
    return [tuple(int(v) for v in rng.integers(0, 256, 3)) for _ in range(n)]  # type: ignore[misc]


def indices(h: int, w: int, colours: int, seed: int = 0) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return ((xx + 2 * yy + seed) % colours).astype(np.uint8)


# ---- BMP -----------------------------------------------------------------------------------------

BI_RGB, BI_RLE8, BI_RLE4, BI_BITFIELDS = 0, 1, 2, 3
PROFILE_EMBEDDED, PROFILE_LINKED = b"MBED", b"LINK"


@dataclass
class Bmp:
    """The fields of a BMP file; ``bytes()`` lays them out (file header, info header, masks, palette, pixels).

    ``pixels`` holds colour indices (bpp <= 8) or RGB(A) values; ``header`` is
    the info header's size: 40 (V3), 108 (V4) or 124 (V5).
    """

    pixels: np.ndarray
    bpp: int
    header: int = 40
    compression: int = BI_RGB
    palette: Palette = field(default_factory=list)
    masks: tuple[int, int, int, int] | None = None  # R, G, B, A for BI_BITFIELDS / V4+
    top_down: bool = False
    profile: bytes | None = None  # V5: ICC data (embedded) or a file name (linked)
    profile_kind: bytes = PROFILE_EMBEDDED
    profile_before_pixels: bool = False
    trailing: bytes = b""

    def _rows(self) -> bytes:
        h, w = self.pixels.shape[:2]
        order = range(h) if self.top_down else range(h - 1, -1, -1)
        if self.compression == BI_RLE8:
            return _rle(self.pixels, order, 8)
        if self.compression == BI_RLE4:
            return _rle(self.pixels, order, 4)
        stride = (self.bpp * w + 31) // 32 * 4
        out = bytearray()
        for y in order:
            row = self.pixels[y]
            if self.bpp <= 8:
                per = 8 // self.bpp
                packed = bytearray()
                for x in range(0, w, per):
                    byte = 0
                    for k, v in enumerate(row[x : x + per]):
                        byte |= int(v) << (8 - self.bpp * (k + 1))
                    packed.append(byte)
                raw = bytes(packed)
            elif self.bpp == 16:
                r, g, b = (row[:, c].astype(np.uint16) >> 3 for c in range(3))
                raw = ((r << 10) | (g << 5) | b).astype("<u2").tobytes()  # 5-5-5, the BI_RGB default
            elif self.bpp == 24:
                raw = row[:, ::-1].astype(np.uint8).tobytes()
            else:  # 32: BGRA bytes, or laid out by the masks
                raw = self._pack32(row)
            out += raw.ljust(stride, b"\0")
        return bytes(out)

    def _pack32(self, row: np.ndarray) -> bytes:
        rgba = row if row.shape[1] == 4 else np.concatenate([row, np.full(row.shape[:1] + (1,), 255)], axis=1)
        masks = self.masks or (0xFF0000, 0xFF00, 0xFF, 0xFF000000)
        value = np.zeros(row.shape[0], dtype=np.uint64)
        for channel, mask in enumerate(masks):
            if mask:
                shift = (mask & -mask).bit_length() - 1
                value |= rgba[:, channel].astype(np.uint64) << np.uint64(shift)
        return value.astype("<u4").tobytes()

    def bytes(self) -> bytes:
        h, w = self.pixels.shape[:2]
        data = self._rows()
        if self.header == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes, 3-byte palette entries
            palette = b"".join(bytes((b, g, r)) for r, g, b in self.palette)
            info = struct.pack("<IHHHH", 12, w, h, 1, self.bpp)
            pixel_at = 14 + 12 + len(palette)
            return b"BM" + struct.pack("<IHHI", pixel_at + len(data), 0, 0, pixel_at) + info + palette + data
        palette = b"".join(bytes((b, g, r, 0)) for r, g, b in self.palette)
        masks = b""
        if self.compression == BI_BITFIELDS and self.header == 40:
            masks = struct.pack("<III", *(self.masks or (0, 0, 0, 0))[:3])
        profile = self.profile or b""
        before = 14 + self.header + len(masks) + len(palette)
        pixel_at = before + (len(profile) if self.profile_before_pixels else 0)
        profile_at = before if self.profile_before_pixels else pixel_at + len(data)
        info = struct.pack(
            "<IiiHHIIiiII",
            self.header, w, -h if self.top_down else h, 1, self.bpp, self.compression,
            len(data), 2835, 2835, len(self.palette), 0,
        )  # fmt: skip
        if self.header >= 108:
            cs_type = self.profile_kind if self.profile is not None else b"BGRs"
            info += struct.pack("<IIII", *(self.masks or (0xFF0000, 0xFF00, 0xFF, 0xFF000000 if self.bpp == 32 else 0)))
            info += cs_type[::-1] + b"\0" * 36 + b"\0" * 12  # colour space, endpoints, gamma
        if self.header >= 124:
            offset = profile_at - 14 if self.profile is not None else 0  # from the info header's start
            info += struct.pack("<IIII", 4, offset, len(profile), 0)  # intent: perceptual
        body = info + masks + palette
        if self.profile_before_pixels:
            body += profile + data
        else:
            body += data + profile
        body += self.trailing
        return b"BM" + struct.pack("<IHHI", 14 + len(body), 0, 0, pixel_at) + body


def _rle(pix: np.ndarray, order: range, bits: int) -> bytes:
    """RLE8/RLE4 rows: encoded runs of one value (RLE4: of one nibble pair), end-of-line, end-of-bitmap."""
    out = bytearray()
    for y in order:
        row = [int(v) for v in pix[y]]
        x = 0
        while x < len(row):
            run = 1
            while x + run < len(row) and run < 255 and row[x + run] == row[x]:
                run += 1
            value = row[x] if bits == 8 else (row[x] << 4) | row[x]
            out += bytes((run, value))
            x += run
        out += b"\x00\x00"
    return bytes(out + b"\x00\x01")


def grey_palette(n: int) -> Palette:
    return [(i, i, i) for i in range(n)]


def fake_icc() -> bytes:
    """Pillow's own sRGB profile bytes, as a camera or editor would embed them."""
    from PIL import ImageCms

    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


# ---- PNG -----------------------------------------------------------------------------------------


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def apng(size: tuple[int, int], frames: int, default_image_is_frame: bool = True) -> bytes:
    """An APNG of ``frames`` RGB frames; with ``default_image_is_frame=False`` the IDAT image is not
    part of the animation (a still shown by readers without APNG support, like TensorFlow)."""
    w, h = size

    def zdata(seed: int) -> bytes:
        rows = pixels(h, w, seed)
        raw = b"".join(b"\0" + rows[y].tobytes() for y in range(h))
        return zlib.compress(raw)

    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    anim = frames if default_image_is_frame else frames - 1
    out += _chunk(b"acTL", struct.pack(">II", anim, 0))
    seq = 0

    def fctl() -> bytes:
        nonlocal seq
        body = struct.pack(">IIIIIHHBB", seq, w, h, 0, 0, 1, 10, 0, 0)
        seq += 1
        return _chunk(b"fcTL", body)

    if default_image_is_frame:
        out += fctl()
    out += _chunk(b"IDAT", zdata(0))
    for i in range(1, frames):
        out += fctl()
        out += _chunk(b"fdAT", struct.pack(">I", seq) + zdata(i))
        seq += 1
    return out + _chunk(b"IEND", b"")


# ---- JPEG ----------------------------------------------------------------------------------------

# The DC luminance Huffman table of the JPEG spec (annex K): code counts per length 1-16, then the values.
_DC_BITS = (0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0)
_DC_VALUES = tuple(range(12))


def lossless_jpeg(grey: np.ndarray) -> bytes:
    """An 8-bit greyscale lossless JPEG (SOF3, Huffman, predictor 1: the pixel to the left; Pillow writes none).

    Each pixel is coded as its difference from the prediction (the pixel above in the first column, 128 for
    the first): a Huffman code for the difference's bit count, then that many bits, as a DC coefficient is.
    """
    codes, code, k = {}, 0, 0
    for length, count in enumerate(_DC_BITS, 1):
        for _ in range(count):
            codes[_DC_VALUES[k]] = (code, length)
            code, k = code + 1, k + 1
        code <<= 1
    bits: list[str] = []
    a = grey.astype(np.int32)
    h, w = a.shape
    for y in range(h):
        for x in range(w):
            predicted = a[y, x - 1] if x else (a[y - 1, x] if y else 128)
            diff = int(a[y, x] - predicted)
            size = abs(diff).bit_length()
            code, length = codes[size]
            bits.append(format(code, f"0{length}b"))
            if size:
                bits.append(format(diff if diff > 0 else (diff - 1) & ((1 << size) - 1), f"0{size}b"))
    stream = "".join(bits)
    stream += "1" * (-len(stream) % 8)  # padded with 1 bits
    entropy = bytes(int(stream[i : i + 8], 2) for i in range(0, len(stream), 8)).replace(b"\xff", b"\xff\x00")

    def segment(marker: int, body: bytes) -> bytes:
        return bytes((0xFF, marker)) + struct.pack(">H", len(body) + 2) + body

    return (
        b"\xff\xd8"
        + segment(0xC4, b"\x00" + bytes(_DC_BITS) + bytes(_DC_VALUES))
        + segment(0xC3, struct.pack(">BHHB", 8, h, w, 1) + b"\x01\x11\x00")
        + segment(0xDA, b"\x01\x01\x00\x01\x00\x00")  # one component, table 0, predictor 1
        + entropy
        + b"\xff\xd9"
    )


# ---- the corpus ----------------------------------------------------------------------------------


def _gif_corpus() -> dict[str, bytes]:
    pal = rainbow(16, 1)
    big = indices(20, 24, 16)
    small = indices(8, 10, 16, 3)
    out = {
        "plain": gif((24, 20), [GifFrame(big)], pal),
        "gif87a": gif((24, 20), [GifFrame(big)], pal, version=b"GIF87a"),
        "no_global_table_local": gif((24, 20), [GifFrame(big, local_palette=pal)], None),
        "global_and_local": gif((24, 20), [GifFrame(big, local_palette=rainbow(16, 9))], pal),
        "local_tables_per_frame": gif(
            (24, 20), [GifFrame(big, local_palette=rainbow(16, s), disposal=1) for s in range(3)], None
        ),
        "first_frame_smaller": gif((24, 20), [GifFrame(small)], pal),
        "first_frame_offset": gif((24, 20), [GifFrame(small, x=5, y=7)], pal),
        "first_frame_offset_then_full": gif((24, 20), [GifFrame(small, x=5, y=7), GifFrame(big)], pal),
        "first_frame_larger": gif((16, 12), [GifFrame(big)], pal),
        "first_frame_overhangs": gif((24, 20), [GifFrame(big, x=4, y=3)], pal),
        "later_frame_smaller": gif((24, 20), [GifFrame(big, disposal=1), GifFrame(small, x=3, y=2)], pal),
        "later_frame_larger": gif((24, 20), [GifFrame(big), GifFrame(indices(30, 40, 16))], pal),
        "later_frame_overhangs": gif((24, 20), [GifFrame(big), GifFrame(small, x=20, y=15)], pal),
        "first_frame_wider_only": gif((24, 20), [GifFrame(indices(10, 30, 16))], pal),
        "interlaced": gif((24, 20), [GifFrame(big, interlaced=True)], pal),
        "interlaced_animated": gif((24, 20), [GifFrame(big, interlaced=True), GifFrame(big[::-1])], pal),
        "transparent_first": gif((24, 20), [GifFrame(big, transparent=3)], pal),
        "transparent_small_first": gif((24, 20), [GifFrame(small, x=2, y=2, transparent=0)], pal),
        "transparent_later": gif((24, 20), [GifFrame(big), GifFrame(big[::-1], transparent=5, disposal=1)], pal),
        "comment_empty": gif((24, 20), [GifFrame(big)], pal, [comment([])]),
        "comment_zero_length_sub_block_first": gif((24, 20), [GifFrame(big)], pal, [comment([b"", b"hi"])]),
        "comment_long": gif((24, 20), [GifFrame(big)], pal, [comment([b"x" * 255] * 40 + [b"end"])]),
        "comment_between_frames": gif((24, 20), [GifFrame(big)], pal, [comment([b"before"])])[:-1]
        + comment([b"after"])
        + GifFrame(big[::-1]).block(3)
        + b"\x3b",
        "netscape_loop": gif((24, 20), [GifFrame(big), GifFrame(big[::-1])], pal, [NETSCAPE_LOOP]),
        "xmp_application": gif((24, 20), [GifFrame(big)], pal, [application(b"XMP DataXMP", b"<x:xmpmeta/>" * 30)]),
        "application_empty": gif((24, 20), [GifFrame(big)], pal, [b"\x21\xff\x0bNETSCAPE2.0\x00"]),
        "plain_text_extension": gif(
            (24, 20), [GifFrame(big)], pal, [b"\x21\x01\x0c" + b"\0" * 12 + _sub_blocks(b"hello")]
        ),
        "two_colour_table": gif((24, 20), [GifFrame(indices(20, 24, 2))], rainbow(2, 4)),
        "index_beyond_table": gif((24, 20), [GifFrame(indices(20, 24, 16))], rainbow(4, 5)),
        "background_beyond_table": gif((24, 20), [GifFrame(big)], pal, background=200),
        "later_frame_no_table": gif((24, 20), [GifFrame(big, local_palette=pal), GifFrame(big)], None),
        "later_frame_index_beyond_table": gif(
            (24, 20),
            [GifFrame(indices(20, 24, 2), local_palette=rainbow(2, 3)), GifFrame(indices(20, 24, 4))],
            rainbow(2, 3),
        ),
        "two_entry_table_code_size_2": gif((24, 20), [GifFrame(indices(20, 24, 2))], rainbow(2, 8)),
        "screen_zero": gif((0, 0), [GifFrame(big)], pal),
        "no_trailer": gif((24, 20), [GifFrame(big)], pal)[:-1],
        "after_trailer": gif((24, 20), [GifFrame(big)], pal) + b"junk",
        "stray_byte_between_blocks": gif((24, 20), [GifFrame(big)], pal)[:-1] + b"\0" + GifFrame(big).block(3) + b";",
        "empty_graphic_control": gif((24, 20), [GifFrame(big)], pal, [b"\x21\xf9\x00"]),
        "code_size_11": gif((24, 20), [], pal)[:-1] + _raw_frame(24, 20, lzw(big.tobytes(), 11)) + b";",
        "lzw_without_end_code": gif((24, 20), [], pal)[:-1]
        + _raw_frame(24, 20, _lzw_cut(big.tobytes(), 4, 480))
        + b";",
        "lzw_short": gif((24, 20), [], pal)[:-1] + _raw_frame(24, 20, _lzw_cut(big.tobytes(), 4, 300)) + b";",
    }
    for disposal in range(4):
        out[f"disposal_{disposal}"] = gif(
            (24, 20), [GifFrame(big, disposal=disposal), GifFrame(small, x=4, y=4, disposal=disposal)], pal
        )
    rgb = Image.fromarray(pixels(20, 24, 2), "RGB")
    out["pillow_animated_optimised"] = encode(
        rgb.convert("P"), "GIF", save_all=True, append_images=[rgb.rotate(90).convert("P")], optimize=True
    )
    return out


def _bmp_corpus() -> dict[str, bytes]:
    rgb = pixels(9, 7, 4)  # odd width: rows need padding
    rgba = pixels(9, 7, 5, 4)
    idx16 = indices(9, 7, 16)
    idx2 = indices(9, 7, 2)
    idx256 = indices(9, 7, 200)
    icc = fake_icc()
    out: dict[str, bytes] = {}
    for header in (40, 108, 124):
        out[f"v{header}_24"] = Bmp(rgb, 24, header).bytes()
        out[f"v{header}_32"] = Bmp(rgba, 32, header).bytes()
        out[f"v{header}_24_top_down"] = Bmp(rgb, 24, header, top_down=True).bytes()
    out["v124_24_embedded_profile"] = Bmp(rgb, 24, 124, profile=icc).bytes()
    # BGRX with X = 0, as Windows writes 32-bit BMPs: Pillow reads RGB, TensorFlow takes X for alpha (all 0)
    out["v40_32_x_zero"] = Bmp(np.concatenate([rgba[..., :3], np.zeros_like(rgba[..., :1])], axis=-1), 32).bytes()
    out["v124_32_embedded_profile"] = Bmp(rgba, 32, 124, profile=icc).bytes()
    out["v124_24_profile_before_pixels"] = Bmp(rgb, 24, 124, profile=icc, profile_before_pixels=True).bytes()
    out["v124_24_linked_profile"] = Bmp(rgb, 24, 124, profile=b"C:\\sRGB.icc\0", profile_kind=PROFILE_LINKED).bytes()
    out["v40_24_trailing_bytes"] = Bmp(rgb, 24, trailing=b"\0\0").bytes()
    out["v40_1bit"] = Bmp(idx2, 1, palette=[(0, 0, 0), (255, 255, 255)]).bytes()
    out["v40_1bit_colour"] = Bmp(idx2, 1, palette=rainbow(2, 7)).bytes()
    out["v40_4bit"] = Bmp(idx16, 4, palette=rainbow(16, 2)).bytes()
    out["v40_8bit_colour"] = Bmp(idx256, 8, palette=rainbow(256, 3)).bytes()
    out["v40_8bit_grey"] = Bmp(idx256, 8, palette=grey_palette(256)).bytes()
    out["v40_8bit_grey_short_palette"] = Bmp(idx16, 8, palette=grey_palette(16)).bytes()
    out["v40_8bit_two_greys"] = Bmp(idx2 * 255, 8, palette=[(0, 0, 0)] + [(255, 255, 255)] * 255).bytes()
    out["v40_rle8"] = Bmp(idx256, 8, compression=BI_RLE8, palette=rainbow(256, 3)).bytes()
    out["v40_rle8_grey"] = Bmp(idx256, 8, compression=BI_RLE8, palette=grey_palette(256)).bytes()
    out["v40_rle4"] = Bmp(idx16, 4, compression=BI_RLE4, palette=rainbow(16, 2)).bytes()
    out["v40_16bit_555"] = Bmp(rgb, 16).bytes()
    out["v40_32_bitfields_bgra"] = Bmp(rgba, 32, compression=BI_BITFIELDS, masks=(0xFF0000, 0xFF00, 0xFF, 0)).bytes()
    out["v108_32_bitfields_bgra"] = Bmp(
        rgba, 32, 108, compression=BI_BITFIELDS, masks=(0xFF0000, 0xFF00, 0xFF, 0xFF000000)
    ).bytes()
    out["v108_32_bitfields_rgba"] = Bmp(
        rgba, 32, 108, compression=BI_BITFIELDS, masks=(0xFF, 0xFF00, 0xFF0000, 0xFF000000)
    ).bytes()
    out["os2_core_24"] = Bmp(rgb, 24, 12).bytes()
    out["os2_core_8bit_grey"] = Bmp(idx256, 8, 12, palette=grey_palette(256)).bytes()
    out["v108_8bit_grey"] = Bmp(idx256, 8, 108, palette=grey_palette(256)).bytes()
    out["v40_8bit_grey_trailing_bytes"] = Bmp(idx256, 8, palette=grey_palette(256), trailing=b"\0" * 4).bytes()
    out["pillow_rgb"] = encode(Image.fromarray(rgb, "RGB"), "BMP")
    out["pillow_rgba"] = encode(Image.fromarray(rgba, "RGBA"), "BMP")
    out["pillow_1bit"] = encode(Image.fromarray(rgb, "RGB").convert("1"), "BMP")
    return out


def _png_corpus() -> dict[str, bytes]:
    rgb = Image.fromarray(pixels(12, 17, 6), "RGB")
    grey16 = Image.fromarray(pixels(12, 17, 7, 1)[..., 0].astype(np.uint16) * 257)
    rgb16 = io.BytesIO()
    # 16-bit RGB: Pillow cannot write it, so the rows are written here.
    wide = (pixels(12, 17, 8).astype(">u2") * 257).reshape(12, -1)
    raw = b"".join(b"\0" + row.tobytes() for row in wide)
    rgb16.write(
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", 17, 12, 16, 2, 0, 0, 0))
        + _chunk(b"IDAT", zlib.compress(raw))
        + _chunk(b"IEND", b"")
    )
    # 16-bit grey + alpha (colour type 4): Pillow opens it as RGBA, libpng (TensorFlow) gives 2 channels.
    la16 = (pixels(12, 17, 9)[..., :2].astype(">u2") * 257).reshape(12, -1)
    return {
        "rgb": encode(rgb, "PNG"),
        "grey16": encode(grey16, "PNG"),
        "grey_alpha16": b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", 17, 12, 16, 4, 0, 0, 0))
        + _chunk(b"IDAT", zlib.compress(b"".join(b"\0" + row.tobytes() for row in la16)))
        + _chunk(b"IEND", b""),
        "rgb16": rgb16.getvalue(),
        "palette_trns": encode(rgb.convert("P"), "PNG", transparency=2),
        "palette": encode(rgb.convert("P"), "PNG"),
        "grey_trns": encode(rgb.convert("L"), "PNG", transparency=7),
        "rgb_trns": encode(rgb, "PNG", transparency=(1, 2, 3)),
        "bilevel": encode(rgb.convert("1"), "PNG"),
        "interlaced": _interlaced_png(rgb),
        "apng": apng((17, 12), 3),
        "apng_hidden_default": apng((17, 12), 3, default_image_is_frame=False),
        "pillow_apng": encode(rgb, "PNG", save_all=True, append_images=[rgb.rotate(180)]),
        "icc": encode(rgb, "PNG", icc_profile=fake_icc()),
        "after_iend": encode(rgb, "PNG") + b"junk",
        "text_chunk_bad_crc": _png_with_bad_text_crc(encode(rgb, "PNG")),
        # A zTXt that inflates past Pillow's 1 MB limit (PngImagePlugin.MAX_TEXT_CHUNK), before the pixels or
        # after them (Pillow reads it then while decoding); TF reads both files.
        "ztxt_over_pillows_limit": _png_edit(
            encode(rgb, "PNG"), lambda k, b: [(k, b, None)] + _after(k, b"IHDR", b"zTXt", _BIG_ZTXT)
        ),
        "ztxt_after_pixels_over_pillows_limit": _png_edit(
            encode(rgb, "PNG"), lambda k, b: [(k, b, None)] + _after(k, b"IDAT", b"zTXt", _BIG_ZTXT)
        ),
        # libpng (TensorFlow) wants IHDR first and 13 bytes long; Pillow opens both of these.
        "text_before_ihdr": _png_edit(
            encode(rgb, "PNG"),
            lambda k, b: ([(b"tEXt", b"Comment\0x\x04", None)] if k == b"IHDR" else []) + [(k, b, None)],
        ),
        "ihdr_14_bytes": _png_edit(encode(rgb, "PNG"), lambda k, b: [(k, b + b"\0" if k == b"IHDR" else b, None)]),
        # libpng (TensorFlow) refuses these; Pillow reads them (it checks CRCs only before the image data).
        "idat_bad_crc": _png_edit(encode(rgb, "PNG"), lambda k, b: [(k, b, 0 if k == b"IDAT" else None)]),
        "iend_bad_crc": encode(rgb, "PNG")[:-4] + b"\0\0\0\0",
        "no_iend": encode(rgb, "PNG")[:-12],
        "zeros_for_iend": encode(rgb, "PNG")[:-12] + b"\0" * 12,
        "unknown_critical_chunk": _png_edit(
            encode(rgb, "PNG"), lambda k, b: [(k, b, None)] + _after(k, b"IHDR", b"ABCD")
        ),
        "unknown_critical_after_idat": _png_edit(
            encode(rgb, "PNG"), lambda k, b: [(k, b, None)] + _after(k, b"IDAT", b"ABCD")
        ),
        "bad_chunk_name_after_idat": _png_edit(
            encode(rgb, "PNG"), lambda k, b: [(k, b, None)] + _after(k, b"IDAT", b"a1cd")
        ),
        # libpng ignores a palette's tRNS that is empty or longer than the palette (3 channels, not 4).
        "palette_trns_empty": _png_edit(
            encode(rgb.convert("P"), "PNG"), lambda k, b: [(k, b, None)] + _after(k, b"PLTE", b"tRNS", b"")
        ),
        "palette_trns_too_long": _png_edit(
            encode(rgb.convert("P"), "PNG"), lambda k, b: [(k, b, None)] + _after(k, b"PLTE", b"tRNS", b"\x80" * 257)
        ),
    }


_BIG_ZTXT = b"Comment\0\0" + zlib.compress(b"C" * 1_100_000)


def _after(kind: bytes, where: bytes, new: bytes, body: bytes = b"xyz") -> list[tuple[bytes, bytes, int | None]]:
    return [(new, body, None)] if kind == where else []


def _png_edit(data: bytes, edit: Callable[[bytes, bytes], list[tuple[bytes, bytes, int | None]]]) -> bytes:
    """``data``'s chunks rewritten by ``edit`` (a CRC of None is computed; a number is written as it is)."""
    out, pos = [data[:8]], 8
    while pos + 12 <= len(data):
        length = struct.unpack_from(">I", data, pos)[0]
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        for k, b, crc in edit(kind, body):
            crc = zlib.crc32(k + b) & 0xFFFFFFFF if crc is None else crc
            out.append(struct.pack(">I", len(b)) + k + b + struct.pack(">I", crc))
        pos += 12 + length
    return b"".join(out)


def _png_with_bad_text_crc(data: bytes) -> bytes:
    """A tEXt chunk with a wrong CRC after IHDR (an ancillary chunk: libpng warns, Pillow refuses)."""
    text = _chunk(b"tEXt", b"Comment\0hello")
    return data[:33] + text[:-4] + b"\0\0\0\0" + data[33:]


def _interlaced_png(img: Image.Image) -> bytes:
    """An Adam7-interlaced PNG (Pillow writes none): the seven passes, each row filter 0."""
    a = np.asarray(img)
    h, w = a.shape[:2]
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = a[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\0" + row.tobytes() for row in sub)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def _webp_corpus() -> dict[str, bytes]:
    rgb = Image.fromarray(pixels(12, 17, 9), "RGB")
    rgba = Image.fromarray(pixels(12, 17, 10, 4), "RGBA")
    return {
        "lossy": encode(rgb, "WEBP", quality=80),
        "lossless": encode(rgb, "WEBP", lossless=True),
        "lossy_alpha": encode(rgba, "WEBP", quality=80),
        "lossless_alpha": encode(rgba, "WEBP", lossless=True),
        "animated": encode(rgb, "WEBP", save_all=True, append_images=[rgb.rotate(180)], duration=50),
        "animated_one_frame": _one_frame_animation(
            encode(rgb, "WEBP", save_all=True, append_images=[rgb.rotate(180)], duration=50)
        ),
        "alpha_flag_without_alpha": _vp8x_alpha_flag(encode(rgb, "WEBP", quality=80)),
    }


def _riff_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], 12
    while pos + 8 <= len(data):
        kind, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        out.append((kind, data[pos + 8 : pos + 8 + size]))
        pos += 8 + size + (size & 1)
    return out


def _riff(chunks: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(k + struct.pack("<I", len(v)) + v + (b"\0" if len(v) & 1 else b"") for k, v in chunks)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def _one_frame_animation(animated: bytes) -> bytes:
    """An animated WebP (VP8X animation flag, ANIM, ANMF) that holds a single frame."""
    chunks = _riff_chunks(animated)
    first = next(i for i, (k, _) in enumerate(chunks) if k == b"ANMF")
    return _riff([c for i, c in enumerate(chunks) if c[0] != b"ANMF" or i == first])


def _vp8x_alpha_flag(still: bytes) -> bytes:
    """A lossy RGB WebP behind a VP8X header that claims alpha (and holds no ALPH chunk)."""
    ((kind, vp8),) = _riff_chunks(still)
    w, h = struct.unpack_from("<HH", vp8, 6)
    vp8x = bytes([0x10, 0, 0, 0]) + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    return _riff([(b"VP8X", vp8x), (kind, vp8)])


def psd(layers: int, w: int = 10, h: int = 7) -> bytes:
    """A Photoshop file (RGB, 8-bit, raw) with ``layers`` full-size layers and its composite image (what Pillow
    opens; it numbers the layers from 1, not 0)."""
    composite = pixels(h, w, 80)
    records, channels = b"", b""
    for k in range(layers):
        layer = pixels(h, w, 81 + k)
        records += struct.pack(">iiiiH", 0, 0, h, w, 3) + b"".join(struct.pack(">hI", c, 2 + w * h) for c in range(3))
        name = f"L{k}".encode()
        extra = struct.pack(">II", 0, 0) + (bytes([len(name)]) + name).ljust(4, b"\0")
        records += b"8BIMnorm" + bytes((255, 0, 0, 0)) + struct.pack(">I", len(extra)) + extra
        channels += b"".join(b"\0\0" + layer[..., c].tobytes() for c in range(3))
    info = struct.pack(">h", layers) + records + channels
    info += b"\0" * (len(info) % 2)
    layer_and_mask = struct.pack(">I", len(info)) + info + struct.pack(">I", 0)
    header = b"8BPS" + struct.pack(">H6sHIIHH", 1, b"\0" * 6, 3, h, w, 8, 3)
    image = b"\0\0" + b"".join(composite[..., c].tobytes() for c in range(3))
    return header + struct.pack(">II", 0, 0) + struct.pack(">I", len(layer_and_mask)) + layer_and_mask + image


def _other_corpus() -> dict[str, bytes]:
    rgb = Image.fromarray(pixels(12, 17, 11), "RGB")
    rgba = Image.fromarray(pixels(12, 17, 12, 4), "RGBA")
    grey16 = Image.fromarray(pixels(12, 17, 7, 1)[..., 0].astype(np.uint16) * 257)
    return {
        "jpeg": encode(rgb, "JPEG"),
        "jpeg_grey": encode(rgb.convert("L"), "JPEG"),
        "jpeg_cmyk": encode(rgb.convert("CMYK"), "JPEG"),
        "jpeg_progressive": encode(rgb, "JPEG", progressive=True),
        "jpeg_after_eoi": encode(rgb, "JPEG") + b"junk",
        "jpeg_icc": encode(rgb, "JPEG", icc_profile=fake_icc()),
        # Zero padding where the end-of-image marker belongs: Pillow decodes it, TensorFlow refuses it.
        "jpeg_zeros_for_eoi": encode(rgb, "JPEG")[:-2] + b"\0" * 16,
        # Lossless (SOF3): libjpeg-turbo 3 in Pillow decodes it, TensorFlow's does not.
        "jpeg_lossless": lossless_jpeg(np.asarray(rgb.convert("L"))),
        "mpo": encode(rgb, "MPO", save_all=True, append_images=[rgb.rotate(180)]),
        "tiff_rgb": encode(rgb, "TIFF"),
        "tiff_lzw": encode(rgb, "TIFF", compression="tiff_lzw"),
        "tiff_deflate_rgba": encode(rgba, "TIFF", compression="tiff_adobe_deflate"),
        "tiff_grey16": encode(grey16, "TIFF"),
        "tiff_pages": encode(rgb, "TIFF", save_all=True, append_images=[rgb.rotate(180)]),
        "ico": encode(rgb, "ICO", sizes=[(17, 12)]),
        "ppm": encode(rgb, "PPM"),
        "pgm": encode(rgb.convert("L"), "PPM"),
        "tga": encode(rgb, "TGA"),
        "pcx": encode(rgb, "PCX"),
        "qoi": encode(rgb, "QOI"),
        "dds": encode(rgba, "DDS"),
        "sgi": encode(rgb, "SGI"),
        "psd_one_layer": psd(1),
        "psd_two_layers": psd(2),
    }


def corpus() -> dict[str, bytes]:
    """{"format/variant": bytes} for every variant above."""
    out: dict[str, bytes] = {}
    for fmt, part in (("gif", _gif_corpus()), ("bmp", _bmp_corpus()), ("png", _png_corpus()),
                      ("webp", _webp_corpus()), ("other", _other_corpus())):  # fmt: skip
        out.update({f"{fmt}/{name}": data for name, data in part.items()})
    return out
