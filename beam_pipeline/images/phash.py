"""The perceptual hash of an image, from the pixels the check decodes anyway (docs/leakage.md).

imagehash's pHash (64 bits: the signs of the 8 x 8 lowest frequencies of a
32 x 32 grey image's DCT, against their median). Every format is hashed from
the same normalised picture, so a PNG and a JPEG of one photo agree:

- the first frame, grey (16-bit grey as TensorFlow reads it);
- shrunk to 32 x 32, bilinear (the check decodes a JPEG kept as is at the smallest scale libjpeg
  offers that keeps both sides at least 32, ``options.check_scale``; other formats in full);
- transparent pixels flattened on white, as a JPEG conversion does;
- turned upright by its EXIF orientation, whether or not the run applies it to the record.

The hash is the 16 hex digits imagehash prints; ``distance`` is the number of bits two differ in.
"""

from __future__ import annotations

import logging

from PIL import Image

from .options import HASH_SIDE, ORIENTATION_TRANSPOSE
from .pixels import _applied_orientation, _plain_mode

_LOG = logging.getLogger(__name__)

HASH_NAME = "phash-64"  # what dataset.json names: imagehash.phash with hash_size 8


def perceptual_hash(img: Image.Image) -> str | None:
    """The 16-hex-digit pHash of ``img``'s first frame, upright; None if Pillow cannot make it grey (logged).

    ``img`` is the decoded image the check holds; it is not changed. Its hex digits are imagehash's own
    ``str()`` of the hash (the first of the 64 bits is the highest), made without its per-bit string.
    """
    import imagehash  # with SciPy: imported by the processes that decode, on their first image
    import numpy as np

    try:
        bits = imagehash.phash(_normalised(img)).hash
        return np.packbits(bits.reshape(-1)).tobytes().hex()
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a mode Pillow cannot convert: the image stays, unhashed
        _LOG.warning("no perceptual hash for a %s image in mode %s: %s", img.format, img.mode, e)
        return None


def _normalised(img: Image.Image) -> Image.Image:
    """``img``'s first frame as a HASH_SIDE x HASH_SIDE grey image, upright, on white where transparent.

    Grey first, then shrunk (a large image box-reduced to about twice HASH_SIDE first): a third of the work
    of shrinking three channels, ~0.05 ms for a JPEG the check decoded at 1/8 scale.
    """
    orientation = _applied_orientation(img)
    frame = _plain_mode(img)  # L, LA, RGB or RGBA
    factor = min(frame.size) // (2 * HASH_SIDE)
    if factor >= 2:
        frame = frame.reduce(factor)
    if frame.mode in ("RGB", "RGBA"):
        frame = frame.convert("LA" if frame.mode == "RGBA" else "L")
    small = frame.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BILINEAR)
    if small.mode == "LA":
        flat = Image.new("L", small.size, 255)
        flat.paste(small.getchannel("L"), mask=small.getchannel("A"))
        small = flat
    if orientation != 1:
        small = small.transpose(ORIENTATION_TRANSPOSE[orientation])
    return small


def valid_hash(value: object) -> str:
    """``value`` if it is a hash as this version writes it (16 lowercase hex digits), else "" (unhashed): a
    damaged index line never stops a night's join."""
    if isinstance(value, str) and len(value) == 16 and all(c in "0123456789abcdef" for c in value):
        return value
    return ""


def distance(a: str, b: str) -> int:
    """Bits two hashes differ in."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
