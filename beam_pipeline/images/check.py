"""The check: what one file costs to decode (from its headers), whether TensorFlow reads it back as
Pillow does, and a full decode; ``Rejected`` with a reason code for anything that cannot be a record.
"""

from __future__ import annotations

import contextlib
import io
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from PIL import Image, ImageFile, UnidentifiedImageError

from ..decoder_noise import captured
from ..vocab.reasons import (
    DECODE_ERROR,
    EMPTY,
    NOT_AN_IMAGE,
    TOO_MANY_CHUNKS,
    TOO_MANY_FRAMES,
    TOO_MANY_PIXELS,
    TOO_MANY_SCANS,
    TOO_SMALL,
    TRUNCATED,
    UNSUPPORTED_FORMAT,
)
from .headers import _any_fourth_byte, _gif_layout, _GifLayout, _header_steps, _jpeg_problem, _jpeg_scans, png_problem
from .options import (
    HASH_SIDE,
    MAX_HEADER_STEPS,
    MAX_JPEG_SCAN_PIXELS,
    MAX_JPEG_SCANS,
    Cost,
    ImageInfo,
    ImageOptions,
    Rejected,
)

# Formats TensorFlow's decode_image reads; value = the image/format text.
_TF_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp"}


# Pillow mode → channels of tf.io.decode_image, per format (measured with TF 2.21).
_PNG_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3, "RGBA": 4}


@dataclass(frozen=True)
class _TfReading:
    """What ``tf.io.decode_image(data, expand_animations=False)`` makes of a file as it is.

    ``channels`` is set only when the file's structure is on the allow-list
    below (each property checked against TensorFlow 2.21's decoders, see
    tests/test_tf_readable.py); otherwise ``why`` says what is off it, and
    the file is converted or rejected.
    """

    channels: int | None
    why: str = ""
    index_limit: int = 0  # GIF: readable only if the first frame's colour indices are below this

    def settled(self, first_max_index: int | None) -> _TfReading:
        """The reading once the first frame is decoded (``_decode`` returns its highest colour index)."""
        if not self.index_limit or self.channels is None:
            return self
        if first_max_index is None or first_max_index >= self.index_limit:
            return _TfReading(None, f"GIF: the first frame has colour indices past its table of {self.index_limit}")
        return _TfReading(self.channels)


def _tf_reading(img: Image.Image, data: bytes, gif: _GifLayout | None) -> _TfReading:
    """Whether TensorFlow provably decodes ``data`` at Pillow's size, and to how many channels."""
    fmt, mode = img.format, img.mode
    if fmt in ("JPEG", "MPO"):
        problem = _jpeg_problem(data)
        if problem:
            return _TfReading(None, problem)
        if mode == "L":
            return _TfReading(1)
        if mode in ("RGB", "YCbCr"):
            return _TfReading(3)
    elif fmt == "PNG":
        problem = png_problem(data)
        if problem:
            return _TfReading(None, f"PNG with {problem}")
        if mode == "P":
            return _TfReading(4 if "transparency" in img.info else 3)
        if data[25:26] == b"\x04":  # grey + alpha (IHDR's colour type): Pillow opens the 16-bit one as RGBA
            return _TfReading(2)
        if mode in _PNG_CHANNELS:
            return _TfReading(_PNG_CHANNELS[mode])
    elif fmt == "GIF":
        if gif is None or gif.tf_problem:
            return _TfReading(None, f"GIF: {gif.tf_problem if gif else 'no frame'}")
        return _TfReading(3, index_limit=gif.index_limit)
    elif fmt == "WEBP":
        # TensorFlow 2.21 corrupts its heap decoding an animated WebP (the process aborts), and it
        # takes the animation path from the header's flag, whatever the frame count.
        if data[12:16] == b"VP8X" and len(data) > 20 and data[20] & 0x02:
            return _TfReading(None, "animated WebP (TensorFlow aborts on one)")
        if mode in ("RGB", "RGBA") and getattr(img, "n_frames", 1) == 1:
            return _TfReading(len(mode))
    elif fmt == "BMP":
        return _bmp_reading(img, data)
    return _TfReading(None, f"{fmt} in mode {mode}")


def _bmp_reading(img: Image.Image, data: bytes) -> _TfReading:
    """TensorFlow's BMP decoder reads only the file header's pixel offset and the info header's width,
    height and bit count: it ignores compression and palette, and requires the file to end exactly
    where the last pixel row does. So only uncompressed 24/32-bit files, and 8-bit ones whose palette
    is the identity grey ramp (TF returns the indices), laid out that way, are stored as they are."""
    if len(data) < 34:
        return _TfReading(None, "BMP header cut short")
    offset, header = struct.unpack_from("<II", data, 10)
    width, height, _, bpp, compression = struct.unpack_from("<iiHHI", data, 18)
    if header not in (40, 108, 124):  # V3/V4/V5; an OS/2 header keeps its sizes elsewhere
        return _TfReading(None, f"BMP with a {header}-byte info header")
    if compression != 0:
        return _TfReading(None, "compressed BMP (RLE or bit fields)")
    if bpp not in (8, 24, 32) or (bpp == 8 and img.mode != "L"):
        return _TfReading(None, f"{bpp}-bit BMP in mode {img.mode} (TensorFlow reads 8-bit as grey indices)")
    row = (bpp // 8 * width + 3) // 4 * 4
    if width <= 0 or height == 0 or len(data) != offset + row * abs(height):
        return _TfReading(None, "BMP with bytes after its pixel rows (e.g. a colour profile)")
    if bpp == 32 and not _any_fourth_byte(data, offset, row * abs(height)):
        # BGRX as Windows writes it: Pillow reads RGB, TensorFlow takes X for alpha (a transparent image)
        return _TfReading(None, "32-bit BMP whose fourth bytes are all 0 (TensorFlow would read them as alpha)")
    return _TfReading(bpp // 8)


def _tf_reading_or_none(img: Image.Image, data: bytes, gif: _GifLayout | None) -> _TfReading:
    if img.format not in _TF_FORMATS:
        return _TfReading(None, f"{img.format} in mode {img.mode}")
    return _tf_reading(img, data, gif)


@contextlib.contextmanager
def _reasons() -> Iterator[None]:
    """Turns what Pillow raises on a bad file into a Rejected with its reason code."""
    try:
        yield
    except Rejected:
        raise
    except Image.DecompressionBombError as e:
        raise Rejected(TOO_MANY_PIXELS, str(e)) from None
    except UnidentifiedImageError:
        raise Rejected(NOT_AN_IMAGE, "not a recognised image format") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        text = str(e)
        low = text.lower()
        if "truncated" in low or isinstance(e, EOFError) or "broken data stream" in low:
            raise Rejected(TRUNCATED, text) from None
        raise Rejected(DECODE_ERROR, f"{type(e).__name__}: {text}") from None
    except MemoryError:
        # The machine, not the file: every size was checked from the headers
        # first, so this is memory pressure. Failing the bundle lets the runner
        # retry it; a reject would drop a good image for good.
        raise
    except Exception as e:  # Pillow plugins raise assorted types on hostile input
        raise Rejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None


def _pillow_open(data: bytes) -> ImageFile.ImageFile:
    """``Image.open(BytesIO(data))`` without its check against ``Image.MAX_IMAGE_PIXELS``.

    That check reads a process-wide setting (whose hard limit is 179 M
    pixels): changing it would change every other user of Pillow in the
    process. This tries Pillow's registered format plugins the way
    ``Image.open`` does; ``_check`` then applies the run's own limits to the
    same header, before anything is decoded.
    """
    prefix = data[:16]
    fp = io.BytesIO(data)
    tried: tuple[str, ...] = ()
    for loader in (Image.preinit, Image.init):  # common plugins first, then all (as Image.open does)
        loader()
        registered = tuple(Image.ID)
        for factory, accept in _plugin_order(registered, tried):
            verdict = accept(prefix) if accept else True
            if not verdict or isinstance(verdict, str):  # a str is Pillow's "looks like it, but unsupported"
                continue
            fp.seek(0)
            try:
                return factory(fp, "")
            except (SyntaxError, IndexError, TypeError, struct.error):
                continue
        tried = registered
    raise UnidentifiedImageError("cannot identify image file")


# (registered, tried) → (the fresh names, their plugins, the order to try them in)
_PLUGIN_ORDERS: dict[
    tuple[tuple[str, ...], tuple[str, ...]], tuple[tuple[str, ...], tuple[Any, ...], tuple[tuple[Any, Any], ...]]
] = {}


def _plugin_order(registered: tuple[str, ...], tried: tuple[str, ...]) -> tuple[tuple[Any, Any], ...]:
    """(factory, accept) of the ``registered`` formats not ``tried``: those with a signature check first, then
    those without one (IM, IMT, IPTC, PCD, SPIDER, TGA), each in Pillow's order.

    Image.open tries them in one list, where IM, IMT and IPTC come before JPEG: each JPEG would cost three
    failed parses (~17 µs of the GIL per image). Only a file built to be two formats at once, one of them
    among those, can open as another format than Image.open gives it. Kept per list of names, and made
    again when a plugin registered again under a known name changed Image.OPEN.
    """
    kept = _PLUGIN_ORDERS.get((registered, tried))
    # the plugins registered now under those names, looked up and compared in C (identity first): ~3 µs
    if kept is not None and tuple(map(Image.OPEN.get, kept[0])) == kept[1]:
        return kept[2]
    fresh = tuple(fmt for fmt in registered if fmt not in tried)
    plugins = tuple(Image.OPEN[fmt] for fmt in fresh)
    order = tuple(p for p in plugins if p[1] is not None) + tuple(p for p in plugins if p[1] is None)
    _PLUGIN_ORDERS[(registered, tried)] = (fresh, plugins, order)
    return order


def decoded_frames(img: Image.Image) -> int:
    """How many frames of ``img`` are decoded: every frame of a GIF (TensorFlow decodes them
    all), else the first only (TensorFlow reads an MPO's first image and an APNG's default
    image; a converted file, a TIFF or an animated WebP, keeps its first frame)."""
    return getattr(img, "n_frames", 1) if img.format == "GIF" else 1


def measure(img: Image.Image, options: ImageOptions) -> Cost:
    """Frames and pixels decoding ``img`` will take, from headers only (no pixel is decoded).

    ``frames`` counts every frame or page (the --max-frames limit); the pixel
    totals count only the frames ``decoded_frames`` says are decoded. APNG,
    WebP and MPO declare their frame count; multi-page TIFFs are walked page
    by page, stopping after ``max_frames`` + 1, though only the first page is
    decoded.
    """
    width, height = img.size
    canvas = width * height
    if img.format in ("PNG", "WEBP", "MPO"):
        frames = getattr(img, "n_frames", 1)
        return Cost(frames, canvas, decoded_frames(img) * canvas)
    if not getattr(img, "is_animated", False) and img.format != "TIFF":
        return Cost(1, canvas, canvas)
    if img.tell() != 0:
        # A layered PSD: Pillow opens it at its composite image (the one decoded) and numbers the layers from
        # 1; seeking to a layer would leave that layer's pixels in place of the composite.
        return Cost(getattr(img, "n_frames", 1), canvas, canvas)
    sizes = []
    limit = options.max_frames + 1 if options.max_frames else 1 << 31
    for i in range(limit):
        try:
            img.seek(i)
        except EOFError:
            break
        sizes.append(img.size[0] * img.size[1])
    img.seek(0)
    decoded = sizes[: decoded_frames(img)] or [canvas]
    return Cost(len(sizes), max(decoded), sum(decoded))


def _check(cost: Cost, options: ImageOptions, what: str) -> None:
    """Rejected if ``cost`` is over a limit of ``options``."""
    if options.max_frames and cost.frames > options.max_frames:
        more = "+" if cost.frames == options.max_frames + 1 else ""
        raise Rejected(TOO_MANY_FRAMES, f"{cost.frames}{more} frames is over --max-frames {options.max_frames}")
    if options.max_pixels and cost.frame_pixels > options.max_pixels:
        raise Rejected(
            TOO_MANY_PIXELS, f"{what} ({cost.frame_pixels} pixels) is over --max-pixels {options.max_pixels}"
        )
    if options.max_total_pixels and cost.total_pixels > options.max_total_pixels:
        raise Rejected(
            TOO_MANY_PIXELS,
            f"{cost.frames} frames of {cost.total_pixels} pixels in all is over "
            f"--max-total-pixels {options.max_total_pixels}",
        )


def _open(data: bytes, options: ImageOptions) -> tuple[Image.Image, _TfReading, Cost]:
    """Opens (headers only) and checks every limit; Rejected on failure.

    Also returns what TF makes of the file as it is (``_TfReading``: its
    channels, or why it is not on the allow-list), and the decode's Cost.
    """
    if not data:
        raise Rejected(EMPTY, "zero bytes")
    with _reasons():
        steps = _header_steps(data)
        if steps > MAX_HEADER_STEPS:
            raise Rejected(
                TOO_MANY_CHUNKS, f"over {MAX_HEADER_STEPS} chunks, segments or padding bytes around the pixel data"
            )
        gif = _gif_layout(data, options.max_frames)
        if gif is None and data[:6] in (b"GIF87a", b"GIF89a"):
            raise Rejected(TRUNCATED, "no complete frame in the GIF")
        if gif is not None:
            _check(gif.cost, options, "a frame's canvas")  # before Pillow allocates it
        img = _pillow_open(data)
        width, height = img.size
        if width <= 0 or height <= 0:
            raise Rejected(DECODE_ERROR, f"image has size {width}x{height}")
        if options.max_pixels and width * height > options.max_pixels:
            raise Rejected(TOO_MANY_PIXELS, f"{width}x{height} is over --max-pixels {options.max_pixels}")
        if img.format in ("JPEG", "MPO") and img.info.get("progressive"):
            # Only progressive scans each revisit the whole image: libjpeg
            # stops a sequential file at its first scan too many.
            scans = _jpeg_scans(data)
            if scans > MAX_JPEG_SCANS or scans * width * height > MAX_JPEG_SCAN_PIXELS:
                raise Rejected(
                    TOO_MANY_SCANS,
                    f"{scans} scans of {width}x{height} (at most {MAX_JPEG_SCANS}, "
                    f"and scans x pixels at most {MAX_JPEG_SCAN_PIXELS})",
                )
        cost = gif.cost if gif is not None else measure(img, options)
        _check(cost, options, "a frame")
        if options.min_size and min(width, height) < options.min_size:
            raise Rejected(TOO_SMALL, f"{width}x{height} is under --min-size {options.min_size}")
        return img, _tf_reading_or_none(img, data, gif), cost


def check_header(prefix: bytes, options: ImageOptions) -> Rejected | None:
    """A limit the first bytes of a file already prove it breaks, or None (also when they prove nothing).

    Lets the writer read a large file's head, refuse a 60,000 × 60,000 PNG
    from its 33-byte header, and only then read the rest. Only for formats
    whose size comes first (a TIFF's directories may sit at its end; Pillow
    warns about a cut one).
    """
    if not prefix.startswith((b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM", b"RIFF")):
        return None
    try:
        _quietly(lambda: _open(prefix, options))
    except Rejected as r:
        if r.reason in (TOO_MANY_PIXELS, TOO_MANY_FRAMES, TOO_MANY_SCANS, TOO_MANY_CHUNKS):
            return r
    except Exception:  # noqa: BLE001 - a cut-off header proves nothing either way
        return None
    return None


def _decode(img: Image.Image, *, pixels: bool = True) -> int | None:
    """Decodes the frames ``decoded_frames`` names (every frame TensorFlow decodes); Rejected on failure.

    Returns the first frame's highest colour index (palette images), for ``_TfReading.settled``.

    ``pixels=False`` (the file is stored as it is and only has to be proven
    sound): a JPEG is decoded at 1/8 scale (1/4 to 1 for an image under 256 pixels a side, so the
    perceptual hash still gets 32 x 32 pixels: ``options.check_scale``). libjpeg still entropy-decodes
    every coefficient of every scan, which is where a corrupt or truncated
    file fails, and skips the full-size inverse DCT, upsampling and colour
    conversion, which cannot fail on data. It rejects the same files as a
    full decode (tests/test_images.py checks ~2,500 damaged JPEGs)
    at ~60 % of the cost. Other formats are always decoded in full.
    """
    with _reasons():
        if not pixels and img.format == "JPEG":
            # the smallest scale libjpeg offers (1/8) that leaves the perceptual hash its input (check_scale)
            img.draft(None, (HASH_SIDE, HASH_SIDE))
        img.load()
        first_max_index = img.getextrema()[1] if img.mode == "P" else None  # type: ignore[index]
        frames = decoded_frames(img)
        for frame in range(1, frames):
            img.seek(frame)
            img.load()
        if frames > 1:
            img.seek(0)
    return first_max_index  # type: ignore[return-value]


def inspect_image(data: bytes, options: ImageOptions | None = None) -> ImageInfo:
    """Fully decodes ``data`` as it is; its ImageInfo, or Rejected (also for formats TF misreads)."""
    return _quietly(lambda: _inspect(data, options))


def _inspect(data: bytes, options: ImageOptions | None) -> ImageInfo:
    img, tf_reading, _ = _open(data, options or ImageOptions())
    tf_reading = tf_reading.settled(_decode(img))
    if tf_reading.channels is None:
        raise Rejected(UNSUPPORTED_FORMAT, f"{tf_reading.why}: not read back by TensorFlow as Pillow reads it")
    width, height = img.size
    return ImageInfo(_TF_FORMATS[img.format], height, width, tf_reading.channels)


_T = TypeVar("_T")


def _quietly(work: Callable[[], _T]) -> _T:
    """``work()`` with what decoders say caught (decoder_noise), not printed; added to a reject's detail."""
    with captured() as notes:
        try:
            return work()
        except Rejected as r:
            if not notes:
                raise
            said = "; ".join(notes)
            raise Rejected(r.reason, f"{r.detail} (decoder said: {said})" if r.detail else said) from None
