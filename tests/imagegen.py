"""Images the tests make themselves (Pillow), including broken ones."""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image


def pixels(height: int, width: int, seed: int, channels: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * (c + 1) + yy * (3 - c) + seed * 7) % 256 for c in range(channels)], axis=-1)
    noise = rng.integers(0, 40, size=base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def encode(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def image_bytes(kind: str, height: int = 24, width: int = 32, seed: int = 0) -> bytes:
    """Bytes of a small image of the named kind (format + mode)."""
    rgb = Image.fromarray(pixels(height, width, seed), "RGB")
    makers = {
        "jpeg": lambda: encode(rgb, "JPEG", quality=90),
        "jpeg_gray": lambda: encode(rgb.convert("L"), "JPEG", quality=90),
        "jpeg_progressive": lambda: encode(rgb, "JPEG", quality=90, progressive=True),
        "png": lambda: encode(rgb, "PNG"),
        "png_gray": lambda: encode(rgb.convert("L"), "PNG"),
        "png_la": lambda: encode(rgb.convert("LA"), "PNG"),
        "png_rgba": lambda: encode(Image.fromarray(pixels(height, width, seed, 4), "RGBA"), "PNG"),
        "png_palette": lambda: encode(rgb.convert("P"), "PNG"),
        "png_palette_transparent": lambda: encode(rgb.convert("P"), "PNG", transparency=0),
        "png_16bit": lambda: encode(
            Image.fromarray(pixels(height, width, seed, 1)[..., 0].astype(np.uint16) * 257), "PNG"
        ),
        "gif": lambda: encode(rgb.convert("P"), "GIF"),
        "gif_animated": lambda: encode(
            rgb.convert("P"), "GIF", save_all=True, append_images=[rgb.transpose(Image.FLIP_LEFT_RIGHT).convert("P")]
        ),
        "bmp": lambda: encode(rgb, "BMP"),
        "bmp_rgba": lambda: encode(Image.fromarray(pixels(height, width, seed, 4), "RGBA"), "BMP"),
        "bmp_gray": lambda: encode(rgb.convert("L"), "BMP"),
        "webp": lambda: encode(rgb, "WEBP", quality=90),
        "webp_rgba": lambda: encode(Image.fromarray(pixels(height, width, seed, 4), "RGBA"), "WEBP", lossless=True),
        "tiff": lambda: encode(rgb, "TIFF"),
        "bmp_palette": lambda: encode(rgb.convert("P"), "BMP"),
    }
    return makers[kind]()


def broken_bytes(kind: str, seed: int = 0) -> bytes:
    good = image_bytes("jpeg", 64, 64, seed)
    rng = np.random.default_rng(seed)
    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "text": b"this is a text file, not an image\n",
        "random": rng.bytes(2048),
    }[kind]


def write(path: str, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def photo_like(seed: int, width: int = 320, height: int = 240) -> Image.Image:
    """An RGB image whose spectrum falls off as a photo's does (1/f noise per channel): perceptual hashes of
    two such images are as far apart as two unrelated photos', unlike the gradients of ``pixels``."""
    rng = np.random.default_rng(seed)
    freq = np.fft.fftfreq(height)[:, None] ** 2 + np.fft.fftfreq(width)[None, :] ** 2
    freq[0, 0] = 1.0
    channels = []
    for _ in range(3):
        spectrum = (rng.normal(size=(height, width)) + 1j * rng.normal(size=(height, width))) / freq**0.9
        field = np.real(np.fft.ifft2(spectrum))
        channels.append((field - field.min()) / (field.max() - field.min()) * 255)
    return Image.fromarray(np.stack(channels, -1).astype(np.uint8), "RGB")
