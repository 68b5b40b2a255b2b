"""The perceptual hash of an image, from the pixels the check decodes anyway (docs/leakage.md).

imagehash's pHash (64 bits: the signs of the 8 x 8 lowest frequencies of a
32 x 32 grey image's DCT, against their median). Every format is hashed from
the same normalised picture, so a PNG and a JPEG of one photo agree:

- the first frame, in L, RGB or their alpha forms (16-bit grey as TensorFlow reads it);
- shrunk to 32 x 32 (the check decodes a JPEG kept as is at the smallest scale libjpeg
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

    ``img`` is the decoded image the check holds; it is not changed.
    """
    import imagehash  # with SciPy: imported by the processes that decode, on their first image

    try:
        small = _normalised(img)
        return str(imagehash.phash(small))
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a mode Pillow cannot convert: the image stays, unhashed
        _LOG.warning("no perceptual hash for a %s image in mode %s: %s", img.format, img.mode, e)
        return None


def _normalised(img: Image.Image) -> Image.Image:
    """``img``'s first frame as a HASH_SIDE x HASH_SIDE L or RGB image, upright, on white where transparent."""
    orientation = _applied_orientation(img)
    frame = _plain_mode(img)
    small = frame.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.LANCZOS, reducing_gap=2.0)
    if small.mode in ("LA", "RGBA"):
        flat = Image.new(small.mode[:-1], small.size, "white")
        flat.paste(small, mask=small.getchannel("A"))
        small = flat
    if orientation != 1:
        small = small.transpose(ORIENTATION_TRANSPOSE[orientation])
    return small


def distance(a: str, b: str) -> int:
    """Bits two hashes differ in."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
