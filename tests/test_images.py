"""images.inspect_image: the recorded shape must be what TensorFlow decodes."""

from __future__ import annotations

import pytest

from beam_pipeline.images import Rejected, inspect_image

from .imagegen import broken_bytes, image_bytes

READABLE = [
    "jpeg",
    "jpeg_gray",
    "jpeg_progressive",
    "png",
    "png_gray",
    "png_la",
    "png_rgba",
    "png_palette",
    "png_palette_transparent",
    "png_16bit",
    "gif",
    "gif_animated",
    "bmp",
    "bmp_rgba",
    "bmp_gray",
    "webp",
    "webp_rgba",
]


@pytest.mark.parametrize("kind", READABLE)
def test_recorded_shape_matches_tensorflow_decode(kind, tf):
    data = image_bytes(kind, height=24, width=32, seed=3)
    info = inspect_image(data)
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert tuple(decoded.shape) == (info.height, info.width, info.channels)
    assert (info.height, info.width) == (24, 32)


@pytest.mark.parametrize(
    "kind,fmt",
    [("jpeg", "jpeg"), ("png", "png"), ("gif", "gif"), ("bmp", "bmp"), ("webp", "webp")],
)
def test_format_comes_from_content(kind, fmt):
    assert inspect_image(image_bytes(kind)).format == fmt


@pytest.mark.parametrize("kind", ["tiff", "bmp_palette"])
def test_formats_tensorflow_cannot_read_back_are_rejected(kind):
    with pytest.raises(Rejected) as err:
        inspect_image(image_bytes(kind))
    assert err.value.reason == "unsupported_format"


@pytest.mark.parametrize(
    "kind,reason",
    [("empty", "empty"), ("truncated", "truncated"), ("text", "not_an_image"), ("random", "not_an_image")],
)
def test_broken_files_get_a_reason(kind, reason):
    with pytest.raises(Rejected) as err:
        inspect_image(broken_bytes(kind))
    assert err.value.reason == reason


def test_truncated_png_is_truncated_not_accepted():
    data = image_bytes("png", 64, 64)
    with pytest.raises(Rejected) as err:
        inspect_image(data[: len(data) - 40])
    assert err.value.reason == "truncated"
