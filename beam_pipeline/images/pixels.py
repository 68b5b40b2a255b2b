"""Pixels as both a conversion and the perceptual hash need them: the EXIF orientation, a plain mode."""

from __future__ import annotations

from PIL import Image

from .options import ORIENTATION_TRANSPOSE


def _applied_orientation(img: Image.Image) -> int:
    """The orientation ImageOps.exif_transpose will apply to ``img``: its EXIF tag if it names a transpose,
    else 1 (it leaves other values, and an image whose EXIF cannot be read, as they are)."""
    try:
        value = img.getexif().get(0x0112, 1)
        return int(value) if value in ORIENTATION_TRANSPOSE else 1
    except Exception:  # noqa: BLE001 - a broken EXIF block is no orientation (as _orientation)
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
