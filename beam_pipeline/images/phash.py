"""The perceptual hash of an image and the second measure that confirms it, from the pixels the check decodes
anyway (docs/leakage.md).

imagehash's pHash (64 bits: the signs of the 8 x 8 lowest frequencies of a
32 x 32 grey image's DCT, against their median), computed as two small matrix
products (a tenth of the time of two full transforms). The bits are
imagehash's except where a coefficient equals the median (a flat or
mirror-symmetric picture, such as a tile of coarse blocks): there imagehash's
bits are float noise, and these say "not above". Every format is hashed from the same normalised picture, so a PNG
and a JPEG of one photo agree:

- the first frame, grey (16-bit grey as TensorFlow reads it);
- shrunk to 32 x 32, bilinear (the check decodes a JPEG kept as is at the smallest scale libjpeg
  offers that keeps both sides at least 32, ``options.check_scale``; other formats in full);
- transparent pixels flattened on white, as a JPEG conversion does;
- turned upright by its EXIF orientation, whether or not the run applies it to the record.

The **second measure** (``CONFIRM_NAME``) comes from the same normalised picture, in the same decode, and is
independent of the pHash's frequencies: a 64-bit dHash (the signs of the horizontal steps of a 9 x 8 grey
version) and the colour of the picture's four quarters (each quarter's red and green shares of its mean
colour, a byte each; a grey image's are all 85). A pair the pHash finds close is listed only when the second
measure agrees (``near_duplicates.confirm``).

``perceptual_hash`` returns 48 hex digits: the pHash (16, imagehash's ``str()`` of it), the dHash (16), the
colour (16). index.jsonl stores the first 16 as ``phash`` and the rest as ``confirm``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from PIL import Image

from .options import HASH_SIDE, ORIENTATION_TRANSPOSE
from .pixels import _applied_orientation, _plain_mode

_LOG = logging.getLogger(__name__)

HASH_NAME = "phash-64"  # what dataset.json names: imagehash.phash with hash_size 8
CONFIRM_NAME = "dhash-64+colour-2x2"  # the second measure (the module docstring)
HEX = 16  # hex digits of one 64-bit part
FULL = 3 * HEX  # pHash, dHash, colour


def perceptual_hash(img: Image.Image) -> str | None:
    """48 hex digits, the pHash, dHash and colour of ``img``'s first frame, upright; None if Pillow cannot make
    it grey (logged). ``img`` is the decoded image the check holds; it is not changed."""
    import numpy as np

    try:
        small, colour = _normalised(img)
        both, dct, columns = _matrices()
        pixels = np.frombuffer(small.tobytes(), np.uint8).reshape(HASH_SIDE, HASH_SIDE)
        shrunk = both @ pixels  # (8 + 8) x 32: DCT rows, then 8 averaged rows
        # imagehash.phash's 8 x 8 lowest frequencies of SciPy's DCT-II, as small products; a coefficient within
        # 1e-6 of the median (a flat or mirror-symmetric picture: 0 up to float noise) is not above it
        low = (shrunk[:8] @ dct.T).reshape(-1)
        ordered = np.sort(low)
        bits = low - (ordered[31] + ordered[32]) / 2 > 1e-6
        steps = shrunk[8:] @ columns.T  # 8 x 9, as Pillow's bilinear shrink, unrounded
        dbits = (steps[:, 1:] - steps[:, :-1] > 1e-6).reshape(-1)
        return np.packbits(np.concatenate((bits, dbits))).tobytes().hex() + colour.hex()
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a mode Pillow cannot convert: the image stays, unhashed
        _LOG.warning("no perceptual hash for a %s image in mode %s: %s", img.format, img.mode, e)
        return None


@functools.cache
def _matrices() -> tuple[Any, Any, Any]:
    """The 8 x 32 DCT-II rows SciPy's unnormalised transform uses (2 cos(pi k (2n + 1) / 64)) stacked over
    Pillow's bilinear weights shrinking 32 rows to 8; the DCT rows alone; Pillow's weights shrinking 32 columns
    to 9 (read off Pillow itself, on float images)."""
    import numpy as np

    k, n = np.arange(8)[:, None], np.arange(HASH_SIDE)[None, :]
    dct = 2 * np.cos(np.pi * k * (2 * n + 1) / (2 * HASH_SIDE))

    def weights(size: int) -> Any:
        basis = np.eye(HASH_SIDE, dtype=np.float32)
        out = [
            np.asarray(Image.fromarray(row[None, :], "F").resize((size, 1), Image.Resampling.BILINEAR))[0]
            for row in basis
        ]
        return np.array(out, dtype=np.float64).T  # (size, 32)

    return np.vstack((dct, weights(8))), dct, weights(9)


def _normalised(img: Image.Image) -> tuple[Image.Image, bytes]:
    """``img``'s first frame as a HASH_SIDE x HASH_SIDE grey image, upright, on white where transparent; and
    its four quarters' colour (red and green shares of each quarter's mean, a byte each, upright).

    A large frame is box-reduced first (to about twice HASH_SIDE a side: a box of more pixels makes the hash
    depend on the decode's scale), then its quarters' colour taken, then grey, then shrunk bilinear: ~0.1 ms
    for a JPEG the check decoded at 1/8 scale or a 96 x 96 tile.
    """
    orientation = _applied_orientation(img)
    frame = _plain_mode(img)  # L, LA, RGB or RGBA
    factor = min(frame.size) // (2 * HASH_SIDE)
    if factor >= 2:
        frame = frame.reduce(factor)
    colour = _quarters(frame, orientation)
    if frame.mode in ("RGB", "RGBA"):
        frame = frame.convert("LA" if frame.mode == "RGBA" else "L")
    small = frame.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BILINEAR)
    if small.mode == "LA":
        flat = Image.new("L", small.size, 255)
        flat.paste(small.getchannel("L"), mask=small.getchannel("A"))
        small = flat
    if orientation != 1:
        small = small.transpose(ORIENTATION_TRANSPOSE[orientation])
    return small, colour


GREY_SHARE = 85  # a grey pixel's red (or green) share of 255


def _quarters(frame: Image.Image, orientation: int) -> bytes:
    """8 bytes: for each quarter of the upright picture (row by row), the red and the green share of its mean
    colour (0-255, of R + G + B); grey and grey-with-alpha pictures are GREY_SHARE throughout."""
    if frame.mode in ("L", "LA"):
        return bytes([GREY_SHARE]) * 8
    if frame.mode == "RGBA":
        flat = Image.new("RGB", frame.size, (255, 255, 255))
        flat.paste(frame.convert("RGB"), mask=frame.getchannel("A"))
        frame = flat
    fx, fy = max(1, frame.width // 2), max(1, frame.height // 2)
    # the mean of each quarter (an odd last row or column left out): reduce() is half the time of resize()
    quarters = frame.reduce((fx, fy), box=(0, 0, 2 * fx, 2 * fy)) if frame.width > 1 and frame.height > 1 else frame
    quarters = quarters.resize((2, 2), Image.Resampling.NEAREST) if quarters.size != (2, 2) else quarters
    if orientation != 1:
        quarters = quarters.transpose(ORIENTATION_TRANSPOSE[orientation])
    rgb = quarters.tobytes()
    out = bytearray()
    for at in range(0, 12, 3):
        r, g, b = rgb[at], rgb[at + 1], rgb[at + 2]
        total = r + g + b + 3
        out += bytes(((255 * (r + 1)) // total, (255 * (g + 1)) // total))
    return bytes(out)


def valid_hash(value: object) -> str:
    """``value`` if it is a pHash as this version writes it (16 lowercase hex digits), else "" (unhashed): a
    damaged index line never stops a night's join."""
    if isinstance(value, str) and len(value) == HEX and all(c in "0123456789abcdef" for c in value):
        return value
    return ""


def entry_hash(entry: object) -> str:
    """An index line's 48 hex digits (``phash`` + ``confirm``), or its 16 pHash digits alone when it has no
    valid ``confirm`` (an index written before the second measure), or ""."""
    if not isinstance(entry, dict):
        return ""
    phash = valid_hash(entry.get("phash"))
    confirm = entry.get("confirm")
    if phash and isinstance(confirm, str) and len(confirm) == 2 * HEX and valid_hash(confirm[:HEX]):
        if valid_hash(confirm[HEX:]):
            return phash + confirm
    return phash


def distance(a: str, b: str) -> int:
    """Bits two pHashes (their first 16 hex digits) differ in."""
    return (int(a[:HEX], 16) ^ int(b[:HEX], 16)).bit_count()
