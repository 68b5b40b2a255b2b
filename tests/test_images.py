"""images.inspect_image: the recorded shape must be what TensorFlow decodes."""

from __future__ import annotations

import pytest

from beam_pipeline.images.check import inspect_image
from beam_pipeline.images.options import Rejected

from .imagegen import broken_bytes, image_bytes

pytestmark = pytest.mark.unit

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
def test_inspect_rejects_formats_tensorflow_cannot_read_back(kind):
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


# ---- conversion policy (prepare_image) ---------------------------------------

import collections  # noqa: E402
import io  # noqa: E402
import struct  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from beam_pipeline.images.convert import prepare_image  # noqa: E402
from beam_pipeline.images.headers import strip_metadata  # noqa: E402
from beam_pipeline.images.options import ImageOptions  # noqa: E402

from .imagegen import encode, pixels  # noqa: E402


def _tf_shape_matches(prepared, tf):
    decoded = tf.io.decode_image(prepared.data, expand_animations=False)
    assert tuple(decoded.shape) == (prepared.info.height, prepared.info.width, prepared.info.channels)
    return decoded.numpy()


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["cmyk_jpeg", "tiff", "bmp_palette", "ico"])
def test_formats_tensorflow_misreads_are_converted_to_png(kind, tf):
    rgb = Image.fromarray(pixels(24, 32, 5), "RGB")
    data = {
        "cmyk_jpeg": lambda: encode(rgb.convert("CMYK"), "JPEG", quality=95),
        "tiff": lambda: encode(rgb, "TIFF"),
        "bmp_palette": lambda: encode(rgb.convert("P"), "BMP"),
        "ico": lambda: encode(rgb, "ICO", sizes=[(32, 24)]),
    }[kind]()
    prepared = prepare_image(data)
    assert prepared.info.format == "png" and prepared.converted_from
    decoded = _tf_shape_matches(prepared, tf)
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(decoded[..., :3], expected)


def test_readable_files_keep_their_bytes():
    for kind in READABLE:
        data = image_bytes(kind)
        prepared = prepare_image(data)
        assert prepared.data == data and prepared.converted_from is None


def test_on_unsupported_reject():
    with pytest.raises(Rejected) as err:
        prepare_image(image_bytes("tiff"), ImageOptions(on_unsupported="reject"))
    assert err.value.reason == "unsupported_format"


def _png_claiming(width: int, height: int) -> bytes:
    data = bytearray(image_bytes("png", 4, 4))
    ihdr = bytearray(data[16:29])
    ihdr[0:8] = struct.pack(">II", width, height)
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF)
    return bytes(data)


def test_decompression_bomb_is_refused_from_the_header():
    # The file holds 4 x 4 pixels of data: a decode would have said "truncated".
    with pytest.raises(Rejected) as err:
        prepare_image(_png_claiming(50_000, 50_000))
    assert err.value.reason == "too_many_pixels"
    with pytest.raises(Rejected) as err:
        prepare_image(image_bytes("png", 100, 100), ImageOptions(max_pixels=5000))
    assert err.value.reason == "too_many_pixels"


def test_min_size():
    with pytest.raises(Rejected) as err:
        prepare_image(image_bytes("png", 10, 40), ImageOptions(min_size=16))
    assert err.value.reason == "too_small"
    assert prepare_image(image_bytes("png", 16, 40), ImageOptions(min_size=16)).info.height == 16


def _jpeg_with_exif(orientation: int) -> bytes:
    img = Image.fromarray(pixels(20, 40, 1), "RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x010F] = "CameraMaker"
    return encode(img, "JPEG", quality=95, exif=exif.tobytes())


def test_exif_orientation_is_applied_only_when_asked(tf):
    data = _jpeg_with_exif(6)  # rotate 90° to display
    as_is = prepare_image(data)
    assert (as_is.info.height, as_is.info.width) == (20, 40) and as_is.data == data
    turned = prepare_image(data, ImageOptions(apply_exif_orientation=True))
    assert (turned.info.height, turned.info.width) == (40, 20) and turned.info.format == "jpeg"
    _tf_shape_matches(turned, tf)


def test_strip_exif_keeps_pixels():
    data = _jpeg_with_exif(1)
    assert b"Exif" in data and b"CameraMaker" in data
    stripped = prepare_image(data, ImageOptions(strip_exif=True)).data
    assert b"Exif" not in stripped and b"CameraMaker" not in stripped
    np.testing.assert_array_equal(
        np.asarray(Image.open(io.BytesIO(stripped))), np.asarray(Image.open(io.BytesIO(data)))
    )
    png = encode(Image.fromarray(pixels(8, 8, 2), "RGB"), "PNG", pnginfo=_pnginfo())
    assert b"secret" in png and b"secret" not in strip_metadata(png)
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(strip_metadata(png)))), pixels(8, 8, 2))


def _pnginfo():
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Comment", "secret")
    return info


def test_resize_and_reencode(tf):
    shrunk = prepare_image(image_bytes("png", 48, 64), ImageOptions(resize_max_side=32))
    assert (shrunk.info.height, shrunk.info.width, shrunk.info.format) == (24, 32, "png")
    _tf_shape_matches(shrunk, tf)
    jpeg = prepare_image(image_bytes("png_rgba", 24, 32), ImageOptions(reencode_quality=80))
    assert (jpeg.info.format, jpeg.info.channels) == ("jpeg", 3)
    _tf_shape_matches(jpeg, tf)
    gif = prepare_image(image_bytes("gif_animated", 24, 32), ImageOptions(resize_max_side=16))
    assert gif.info.format == "png" and (gif.info.height, gif.info.width) == (12, 16)
    _tf_shape_matches(gif, tf)


def test_sixteen_bit_png_converted_keeps_tensorflow_scaling(tf):
    data = image_bytes("png_16bit", 24, 32)
    shrunk = prepare_image(data, ImageOptions(resize_max_side=32))  # no resize needed: forces nothing
    assert shrunk.data == data
    converted = prepare_image(data, ImageOptions(reencode_quality=95))
    assert converted.info.channels == 1
    _tf_shape_matches(converted, tf)


# ---- the validate-only JPEG decode (1/8 scale) -------------------------------


def _jpeg_variants():
    rgb = Image.fromarray(pixels(96, 128, 11), "RGB")
    return {
        "baseline_420": encode(rgb, "JPEG", quality=90),
        "baseline_444": encode(rgb, "JPEG", quality=90, subsampling=0),
        "gray": encode(rgb.convert("L"), "JPEG", quality=85),
        "progressive": encode(rgb, "JPEG", quality=90, progressive=True),
        "optimized": encode(rgb, "JPEG", quality=75, optimize=True),
        "restart_markers": encode(rgb, "JPEG", quality=90, restart_marker_blocks=4),
        "odd_size": encode(rgb.crop((0, 0, 101, 77)), "JPEG", quality=80),
    }


def _corruptions(data: bytes, rng):
    """(kind, bytes): truncations, bit flips, overwritten runs and deleted runs of ``data``."""
    for cut in range(0, len(data), max(1, len(data) // 60)):
        yield "cut", data[:cut]
    for _ in range(150):
        x = bytearray(data)
        x[rng.integers(len(x))] ^= 1 << int(rng.integers(8))
        yield "flip", bytes(x)
    for _ in range(100):
        x = bytearray(data)
        at, n = int(rng.integers(len(x))), int(rng.integers(1, 64))
        x[at : at + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        yield "overwrite", bytes(x)
    for _ in range(50):
        x = bytearray(data)
        at = int(rng.integers(len(x)))
        del x[at : at + int(rng.integers(1, 200))]
        yield "delete", bytes(x)


def _verdict(data: bytes, options: ImageOptions | None = None) -> str:
    try:
        prepare_image(data, options)
        return "ok"
    except Rejected as r:
        return r.reason


@pytest.mark.e2e
def test_validate_only_jpeg_decode_rejects_the_same_files_as_a_full_decode():
    # A JPEG kept as it is is only decoded at 1/8 scale; --reencode needs every
    # pixel, so the same file goes through Pillow's full decode. Both must agree
    # on every corrupted file: same accept/reject, same reason.
    rng = np.random.default_rng(7)
    full = ImageOptions(reencode_quality=90)
    differ, seen = [], collections.Counter()
    for name, data in _jpeg_variants().items():
        for kind, broken in _corruptions(data, rng):
            quick, thorough = _verdict(broken, ImageOptions()), _verdict(broken, full)
            seen[kind, thorough] += 1
            if quick != thorough:
                differ.append((name, kind, len(broken), quick, thorough))
    assert not differ, differ[:10]
    # The corpus must hold many files both decodes reject, also with the damage
    # inside the data (not only cut short), or agreeing proves nothing.
    rejected_inside = sum(n for (kind, verdict), n in seen.items() if kind != "cut" and verdict != "ok")
    assert rejected_inside >= 100 and seen["cut", "truncated"] >= 300, seen
    assert sum(n for (_, verdict), n in seen.items() if verdict == "ok") >= 1000, seen


def _files_of_every_kind() -> dict[str, bytes]:
    """The test's own image kinds, the format-variant corpus, and formats Pillow opens without a signature check
    (TGA) or with one that comes after those in Pillow's list (JPEG, MPO, TIFF, WebP)."""
    import io

    from PIL import Image

    from .imagegen import pixels
    from .variants import corpus

    files = {kind: image_bytes(kind) for kind in [*READABLE, "tiff", "bmp_palette"]}
    files.update(corpus())
    rgb = Image.fromarray(pixels(24, 32, 3), "RGB")
    for fmt in ("TGA", "PCX", "PPM", "SGI", "ICO", "IM", "SPIDER"):
        out = io.BytesIO()
        (rgb.convert("L") if fmt == "SPIDER" else rgb).save(out, fmt)
        files[fmt.lower()] = out.getvalue()
    return files


@pytest.mark.e2e
def test_pillow_open_picks_the_format_image_open_picks():
    """images.check._pillow_open tries the plugins with a signature check before those without one (Image.open tries
    IM, IMT and IPTC before JPEG): every file still opens as the format Image.open gives it, or neither opens it."""
    import io
    import warnings

    from PIL import Image

    from beam_pipeline.images.check import _pillow_open

    for name, data in _files_of_every_kind().items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = Image.open(io.BytesIO(data)).format
        except Exception:  # noqa: BLE001 - any failure to open: ours must fail too
            expected = None
        try:
            got = _pillow_open(data).format
        except Exception:  # noqa: BLE001
            got = None
        assert got == expected, name


def test_pillow_open_follows_a_plugin_registered_again_under_a_known_name():
    """The plugin order is kept between calls; a plugin registered again under a name Pillow knows (as
    pillow-avif-plugin does for AVIF) is used from then on, as Image.open uses it."""
    from PIL import Image, PngImagePlugin

    from beam_pipeline.images.check import _pillow_open

    data = image_bytes("png")
    assert type(_pillow_open(data)) is PngImagePlugin.PngImageFile

    class MyPng(PngImagePlugin.PngImageFile):
        pass

    original = Image.OPEN["PNG"]
    Image.register_open("PNG", MyPng, original[1])
    try:
        assert type(_pillow_open(data)) is MyPng
    finally:
        Image.OPEN["PNG"] = original
    assert type(_pillow_open(data)) is PngImagePlugin.PngImageFile
