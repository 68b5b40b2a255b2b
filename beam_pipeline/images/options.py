"""What a run asks of its images and what the check says of one: limits, options, costs, results."""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

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


# The side of the grey square the perceptual hash is computed from (images/phash.py: imagehash's pHash
# of hash_size 8 takes 8 x its highfreq_factor 4). The check decodes no image smaller than that.
HASH_SIDE = 32


def check_scale(width: int, height: int) -> int:
    """1/n: the scale the check decodes a JPEG kept as it is at. The smallest libjpeg offers (1/8) that
    keeps both sides at least HASH_SIDE, as Pillow's ``draft(None, (HASH_SIDE, HASH_SIDE))`` picks it."""
    for n in (8, 4, 2):
        if width >= HASH_SIDE * n and height >= HASH_SIDE * n:
            return n
    return 1


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
    perceptual_hash: bool = True  # each record's pHash in index.jsonl (--near-duplicates off: none)


@dataclass(frozen=True)
class Cost:
    """What decoding one file will take, from its headers: frames, the largest canvas, all pixels."""

    frames: int
    frame_pixels: int  # the largest canvas a frame is decoded into
    total_pixels: int  # summed over every frame decoded

    def memory_bytes(self, fmt: str | None, full: bool, width: int = 0, height: int = 0) -> int:
        """Memory the decode (and conversion, if ``full``) holds at its peak, estimated.

        One canvas of 4 bytes per pixel; an animation keeps the previous frame
        and a disposal area beside it; a conversion a mode-converted copy and
        the encoder's. A JPEG kept as it is decodes at 1/n scale (``check_scale``, 1/8 but for small
        images): 1/n² of it.
        """
        if fmt == "JPEG" and not full:
            n = check_scale(width, height) if width and height else 8
            return self.frame_pixels // (n * n) * _BYTES_PER_PIXEL + 1
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
    phash: str | None = None  # the source's perceptual hash (images/phash.py); None: not asked for, or unmade
