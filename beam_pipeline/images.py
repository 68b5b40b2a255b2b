"""Decoding and validating one image with Pillow.

``inspect_image(data)`` fully decodes the bytes (every frame of an animation)
and returns what the Example records: format, height, width and the channel
count ``tf.io.decode_image(data, expand_animations=False)`` will produce.  It
raises ``Rejected`` with a reason code for anything that would be written
broken: empty, truncated, not an image, or a format/mode TensorFlow cannot read
back at the recorded shape.

    info = inspect_image(open("cat.jpg", "rb").read())
    info.format, info.height, info.width, info.channels   # ('jpeg', 480, 640, 3)
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

# Reason codes (stable: they appear in rejects.jsonl and dataset.json).
EMPTY = "empty"
TRUNCATED = "truncated"
NOT_AN_IMAGE = "not_an_image"
UNREADABLE = "unreadable"
MISSING = "missing"
UNSUPPORTED_FORMAT = "unsupported_format"
DECODE_ERROR = "decode_error"
TOO_MANY_PIXELS = "too_many_pixels"
NO_LABEL = "no_label"
UNKNOWN_LABEL = "unknown_label"
NO_SPLIT = "no_split"

# Pillow refuses (DecompressionBombError) above twice this; 2 × 89 MP by default.
Image.MAX_IMAGE_PIXELS = 89_478_485

# Formats TensorFlow's decode_image reads; value = the image/format text.
_TF_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp"}

# Pillow mode → channels of tf.io.decode_image, per format (measured with TF 2.21).
_PNG_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3, "RGBA": 4}
_BMP_RAWMODE_CHANNELS = {"BGR": 3, "BGRX": 4, "BGRA": 4}


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


def _channels(img: Image.Image) -> int:
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


def inspect_image(data: bytes) -> ImageInfo:
    """Fully decodes ``data``; returns its ImageInfo or raises Rejected."""
    if not data:
        raise Rejected(EMPTY, "zero bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.format not in _TF_FORMATS:
                raise Rejected(UNSUPPORTED_FORMAT, f"{img.format} is not read back by TensorFlow")
            channels = _channels(img)  # needs the header tile, before load()
            width, height = img.size
            img.load()
            for frame in range(1, getattr(img, "n_frames", 1)):
                img.seek(frame)
                img.load()
    except Rejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise Rejected(TOO_MANY_PIXELS, str(e)) from None
    except UnidentifiedImageError:
        raise Rejected(NOT_AN_IMAGE, "not a recognised image format") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        text = str(e)
        low = text.lower()
        if "truncated" in low or isinstance(e, EOFError) or "broken data stream" in low:
            raise Rejected(TRUNCATED, text) from None
        raise Rejected(DECODE_ERROR, f"{type(e).__name__}: {text}") from None
    except Exception as e:  # Pillow plugins raise assorted types on hostile input
        raise Rejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None
    if width <= 0 or height <= 0:
        raise Rejected(DECODE_ERROR, f"image has size {width}x{height}")
    return ImageInfo(_TF_FORMATS[img.format], height, width, channels)
