"""The TF-readable guarantee, tested differentially: a corpus of format variants (tests/variants.py) goes
through a real ``convert``, and TensorFlow must decode every record at exactly its recorded shape, to the
pixels a full Pillow decode gives its source; and
decoders stay quiet while they work."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from beam_pipeline.images.convert import prepare_image
from beam_pipeline.images.options import Rejected

from . import variants
from .conftest import REPO, convert, read_records
from .imagegen import encode, pixels, write

pytestmark = pytest.mark.e2e


def _convert_corpus(tmp_path: Path, files: dict[str, bytes], *flags: str) -> tuple[list[dict], dict[str, dict]]:
    """A real ``convert`` of ``files``, listed in a manifest (so formats without an image extension count too)."""
    root, out = tmp_path / "in", tmp_path / "out"
    for name, data in files.items():
        write(str(root / name), data)
    manifest = root / "list.jsonl"
    manifest.write_text("".join(json.dumps({"path": name}) + "\n" for name in files))
    convert("--manifest", str(manifest), "--output", str(out), "--labels-from", "none", "--max-reject-fraction", "1",
            *flags)  # fmt: skip
    lines = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    return read_records(out), {x["path"]: x for x in lines}


def _is_animated_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[12:16] == b"VP8X" and bool(data[20] & 0x02)


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory) -> tuple[dict[str, bytes], list[dict], dict[str, dict]]:
    """(the variant corpus, its records, its rejects by path): one convert for the tests that read them."""
    files = variants.corpus()
    records, rejects = _convert_corpus(tmp_path_factory.mktemp("corpus"), files)
    return files, records, rejects


def test_every_record_of_every_variant_decodes_in_tensorflow_at_its_recorded_shape(corpus_run, tf):
    files, records, rejects = corpus_run
    by_name = {r["image/filename"].decode(): r for r in records}
    assert set(by_name) | set(rejects) == set(files), "an input is neither a record nor a reject"
    assert not set(by_name) & set(rejects)
    assert all(x["reason"] and x["detail"] for x in rejects.values())
    wrong = {}
    for name, r in by_name.items():
        data, fmt = r["image/encoded"], r["image/format"].decode()
        if _is_animated_webp(data):  # TensorFlow 2.21 aborts the process on one: never decoded here
            wrong[name] = "an animated WebP stored as it is"
            continue
        try:
            shape = tuple(tf.io.decode_image(data, expand_animations=False).shape)
        except Exception as e:  # noqa: BLE001 - every failure is reported below
            wrong[name] = f"TF fails: {str(e).splitlines()[0][-120:]}"
            continue
        recorded = (r["image/height"], r["image/width"], r["image/channels"])
        if shape != recorded:
            wrong[name] = f"recorded {recorded}, TF {shape}"
        with Image.open(io.BytesIO(data)) as img:  # image/format names the bytes
            actual = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp"}
            assert actual[img.format] == fmt, name
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))
    # The cases the real-world corpus found are converted, not stored as they were.
    for name in ["gif/comment_empty", "gif/first_frame_smaller", "gif/first_frame_offset", "gif/later_frame_larger",
                 "bmp/v124_24_embedded_profile", "bmp/v124_24_linked_profile", "webp/animated_one_frame"]:  # fmt: skip
        assert by_name[name]["image/encoded"] != files[name], name
        assert by_name[name]["image/format"] == b"png", name
    # …while files TensorFlow reads as Pillow does keep their bytes.
    kept = ["gif/plain", "gif/interlaced_animated", "gif/pillow_animated_optimised", "gif/transparent_later",
            "bmp/v124_24", "bmp/v124_24_profile_before_pixels", "bmp/v40_8bit_grey", "png/apng",
            "webp/lossy_alpha"]  # fmt: skip
    for name in kept:
        assert by_name[name]["image/encoded"] == files[name], name


# Where TensorFlow's pixels are not Pillow's, as documented (docs/bad-input.md): a GIF's transparent pixels
# are black, a later frame larger than the screen grows TF's canvas (converted at that size).
_TRANSPARENT_GIFS = {"gif/transparent_first"}
_GROWN_CANVAS = {"gif/later_frame_larger", "gif/later_frame_overhangs"}
# Pillow opens these only without their text chunks (its limit on them)
_OVER_PILLOWS_TEXT_LIMIT = {"png/ztxt_over_pillows_limit", "png/ztxt_after_pixels_over_pillows_limit"}


def test_every_record_decodes_in_tensorflow_to_the_pixels_pillow_gives_its_source(corpus_run, tf):
    """Not only the shape: TF's pixels of each record equal a full Pillow decode of the source file (first frame
    or default image), in the recorded channels; a JPEG with TF's accurate inverse DCT (its default one differs
    by a few levels), 16-bit sources scaled to 8 bits as TF does. A 32-bit BMP stored with its fourth bytes as
    TF's alpha is compared in RGB (Pillow ignores them)."""
    import numpy as np

    from beam_pipeline.images.headers import strip_metadata

    files, records, _ = corpus_run
    modes = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
    wrong = {}
    for r in records:
        name, data, channels = r["image/filename"].decode(), r["image/encoded"], r["image/channels"]
        if _is_animated_webp(data) or name in _GROWN_CANVAS:
            continue
        if r["image/format"] == b"jpeg":
            got = tf.io.decode_jpeg(data, dct_method="INTEGER_ACCURATE").numpy()
        else:
            got = tf.io.decode_image(data, expand_animations=False).numpy()
        original = strip_metadata(files[name]) if name in _OVER_PILLOWS_TEXT_LIMIT else files[name]
        with Image.open(io.BytesIO(original)) as source:
            if source.mode in ("I", "I;16", "I;16B"):
                want = np.round(np.asarray(source).astype(np.float64) / 257)[..., None]
            elif source.format == "BMP" and source.mode == "RGB" and channels == 4:
                want, got = np.asarray(source), got[..., :3]
            else:
                want = np.asarray(source.convert(modes[channels]))
                want = want[..., None] if want.ndim == 2 else want
                if name in _TRANSPARENT_GIFS:
                    opaque = np.asarray(source.convert("RGBA"))[..., 3] > 0
                    want, got = want[opaque], got[opaque]
        if want.shape != got.shape:
            wrong[name] = f"Pillow {want.shape}, TF {got.shape}"
        elif not np.array_equal(want, got):
            wrong[name] = f"differs by up to {np.abs(want.astype(int) - got.astype(int)).max()}"
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))


def test_a_png_whose_text_chunk_is_over_pillows_limit_is_stored_without_its_text_not_rejected(corpus_run):
    """Pillow refuses a compressed text chunk that inflates past 1 MB (a process-wide setting), TensorFlow reads
    the file: the PNG is checked and stored without that chunk (these files have no other text chunk; every
    other chunk kept), not a decode_error reject."""
    files, records, rejects = corpus_run
    for name in sorted(_OVER_PILLOWS_TEXT_LIMIT):
        assert name not in rejects, rejects.get(name)
        [record] = [r for r in records if r["image/filename"].decode() == name]
        without_text = variants._png_edit(
            files[name], lambda k, b: [] if k in (b"tEXt", b"zTXt", b"iTXt") else [(k, b, None)]
        )
        assert record["image/encoded"] == without_text != files[name]
        assert record["image/format"] == b"png"
    # libpng wants IHDR first and 13 bytes long: those are converted, not stored as they are
    for name in ("png/text_before_ihdr", "png/ihdr_14_bytes"):
        [record] = [r for r in records if r["image/filename"].decode() == name]
        assert record["image/encoded"] != files[name], name


@pytest.mark.unit
def test_only_text_chunks_over_pillows_limit_are_dropped_and_only_once():
    """The retry without text chunks keeps everything else: a PNG's EXIF orientation still turns it; an iCCP
    profile over the same limit (not a text chunk) stays a decode_error reject, at once, not a retry loop."""

    from beam_pipeline.images.options import ImageOptions

    rgb = Image.fromarray(pixels(10, 20, 5), "RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90°: 20×10 stored, 10×20 upright
    oriented = variants._png_edit(
        encode(rgb, "PNG", exif=exif.tobytes()),
        lambda k, b: [(k, b, None)] + variants._after(k, b"IHDR", b"zTXt", variants._BIG_ZTXT),
    )
    prepared = prepare_image(oriented, ImageOptions(apply_exif_orientation=True))
    assert (prepared.info.width, prepared.info.height) == (10, 20)
    big_profile = b"prof\0\0" + zlib.compress(b"C" * 1_100_000)
    profile = variants._png_edit(
        encode(rgb, "PNG"), lambda k, b: [(k, b, None)] + variants._after(k, b"IHDR", b"iCCP", big_profile)
    )
    with pytest.raises(Rejected) as rejected:
        prepare_image(profile, ImageOptions())
    # Pillow's own refusal, not a RecursionError of one retry after another
    assert rejected.value.reason == "decode_error" and "MAX_TEXT_CHUNK" in rejected.value.detail


@pytest.mark.unit
@pytest.mark.parametrize("where", ["raw profile zTXt", "XMP iTXt"])
def test_a_text_chunk_holding_the_orientation_stays_when_another_is_over_pillows_limit(where):
    """Pillow also reads the EXIF orientation from text chunks (ImageMagick's "Raw profile type exif" zTXt, XMP
    in iTXt): the retry drops only the compressed text chunk over the limit, so --apply-exif-orientation turns
    the image as it does without that chunk; the stored PNG keeps its other chunks."""
    from beam_pipeline.images.options import ImageOptions

    rgb = Image.fromarray(pixels(20, 40, 5), "RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90°: 40×20 stored, 20×40 upright
    hexed = exif.tobytes().hex()
    profile = f"\nexif\n{len(hexed) // 2:8d}\n" + "\n".join(hexed[i : i + 72] for i in range(0, len(hexed), 72)) + "\n"
    kind, body = (
        (b"zTXt", b"Raw profile type exif\0\0" + zlib.compress(profile.encode()))
        if where == "raw profile zTXt"
        else (b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF>'
              b'<rdf:Description tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>')
    )  # fmt: skip
    oriented = variants._png_edit(
        encode(rgb, "PNG"), lambda k, b: [(k, b, None)] + variants._after(k, b"IHDR", kind, body)
    )
    both = variants._png_edit(
        oriented, lambda k, b: [(k, b, None)] + variants._after(k, b"IHDR", b"zTXt", variants._BIG_ZTXT)
    )
    options = ImageOptions(apply_exif_orientation=True)
    alone, with_big = prepare_image(oriented, options), prepare_image(both, options)
    assert (alone.info.width, alone.info.height) == (with_big.info.width, with_big.info.height) == (20, 40)
    stored = prepare_image(both, ImageOptions())
    assert stored.data == oriented  # only the chunk over the limit is gone


def test_a_32_bit_bmp_whose_fourth_bytes_are_all_zero_is_converted_not_stored_transparent(tmp_path, tf):
    """Windows writes 32-bit BMPs as BGRX with X = 0: Pillow reads RGB, TensorFlow takes X for alpha, so the
    stored file would decode as a fully transparent image. It is converted (PNG, Pillow's RGB pixels); one whose
    fourth bytes hold values keeps its bytes (TensorFlow's RGBA, the alpha Pillow's own RGBA BMPs write)."""
    import numpy as np

    corpus = variants.corpus()
    files = {name: corpus[name] for name in ("bmp/v40_32_x_zero", "bmp/v40_32", "bmp/pillow_rgba")}
    records, _ = _convert_corpus(tmp_path, files)
    by_name = {r["image/filename"].decode(): r for r in records}
    assert set(by_name) == set(files)
    zero = by_name["bmp/v40_32_x_zero"]
    assert zero["image/format"] == b"png" and zero["image/channels"] == 3
    decoded = tf.io.decode_image(zero["image/encoded"], expand_animations=False).numpy()
    with Image.open(io.BytesIO(files["bmp/v40_32_x_zero"])) as source:
        assert np.array_equal(decoded, np.asarray(source.convert("RGB")))
    for name in ("bmp/v40_32", "bmp/pillow_rgba"):
        assert by_name[name]["image/encoded"] == files[name] and by_name[name]["image/channels"] == 4, name


def test_a_photoshop_file_with_layers_is_converted_to_its_composite_image(tmp_path, tf):
    """Pillow opens a PSD at its composite image and numbers the layers from 1: a layered one was a `truncated`
    reject (the frame walk sought frame 0). Both are converted to PNG with the composite's pixels."""
    import numpy as np

    corpus = variants.corpus()
    files = {name: corpus[name] for name in ("other/psd_one_layer", "other/psd_two_layers")}
    records, rejects = _convert_corpus(tmp_path, files)
    assert rejects == {}
    for record in records:
        name = record["image/filename"].decode()
        assert record["image/format"] == b"png", name
        with Image.open(io.BytesIO(files[name])) as source:
            expected = np.asarray(source.convert("RGB"))
        assert np.array_equal(tf.io.decode_image(record["image/encoded"]).numpy(), expected), name


@pytest.mark.unit
def test_gif_colour_indices_past_the_first_frames_table_are_converted(tf):
    """TF refuses a first frame whose indices run past its colour table; a table smaller than the LZW
    code size allows is only a risk, so the indices are checked after decoding."""
    inside = variants.gif((24, 20), [variants.GifFrame(variants.indices(20, 24, 2))], variants.rainbow(2, 8))
    past = variants.gif((24, 20), [variants.GifFrame(variants.indices(20, 24, 4))], variants.rainbow(2, 8))
    with pytest.raises(Exception, match="outside of color map"):
        tf.io.decode_image(past, expand_animations=False)
    assert prepare_image(inside).data == inside
    converted = prepare_image(past)
    assert converted.info.format == "png" and converted.converted_from == "gif"
    with pytest.raises(Rejected) as err:
        prepare_image(past, variants_reject())
    assert err.value.reason == "unsupported_format" and "colour indices past its table" in err.value.detail


@pytest.mark.unit
def test_a_lossless_jpeg_is_converted_whatever_the_pixel_options(tf):
    """TensorFlow cannot decode a lossless JPEG; Pillow can (but not at 1/8 scale): with a full decode
    asked for (--apply-exif-orientation, no orientation tag) it was stored as it is."""
    from beam_pipeline.images.options import ImageOptions

    lossless = variants.lossless_jpeg(pixels(12, 17, 3)[..., 0])
    with pytest.raises(Exception, match="Invalid JPEG data"):
        tf.io.decode_image(lossless, expand_animations=False)
    for options in (ImageOptions(), ImageOptions(apply_exif_orientation=True)):
        prepared = prepare_image(lossless, options)
        assert prepared.converted_from == "jpeg" and prepared.info.format == "png", options
        shape = tuple(tf.io.decode_image(prepared.data, expand_animations=False).shape)
        assert shape == (12, 17, 1) == (prepared.info.height, prepared.info.width, prepared.info.channels)


def variants_reject():
    from beam_pipeline.images.options import ImageOptions

    return ImageOptions(on_unsupported="reject")


@pytest.mark.unit
def test_on_unsupported_reject_names_why_a_variant_is_not_stored():
    files = variants.corpus()
    expected = {
        "gif/first_frame_offset": "is not the logical screen",
        "gif/comment_empty": "an extension without data",
        "gif/later_frame_larger": "reaches outside the logical screen",
        "bmp/v124_24_embedded_profile": "bytes after its pixel rows",
        "bmp/os2_core_24": "12-byte info header",
        "bmp/v40_rle8": "compressed BMP",
        "webp/animated_one_frame": "animated WebP",
        "png/idat_bad_crc": "a bad CRC in its IDAT chunk",
        "png/iend_bad_crc": "a bad CRC in its IEND chunk",
        "png/no_iend": "no IEND chunk",
        "png/zeros_for_iend": "a malformed chunk",
        "png/unknown_critical_chunk": "unknown critical chunk ABCD",
        "png/unknown_critical_after_idat": "unknown critical chunk ABCD",
        "png/bad_chunk_name_after_idat": "malformed chunk",
        "png/palette_trns_empty": "tRNS chunk that does not fit its palette",
        "png/palette_trns_too_long": "tRNS chunk that does not fit its palette",
        "other/jpeg_zeros_for_eoi": "no end-of-image marker",
        "other/jpeg_lossless": "lossless JPEG",
    }
    for name, why in expected.items():
        with pytest.raises(Rejected) as err:
            prepare_image(files[name], variants_reject())
        assert err.value.reason == "unsupported_format" and why in err.value.detail, (name, err.value.detail)


# ---- quiet decoders ------------------------------------------------------------------------------------


def _tiff_tag(data: bytes, tag: int, value: int) -> bytes:
    """``data`` (a little-endian TIFF) with the SHORT value of ``tag`` replaced."""
    out = bytearray(data)
    at = out.find(struct.pack("<HH", tag, 3))
    assert at > 0
    out[at + 8 : at + 10] = struct.pack("<H", value)
    return bytes(out)


def _jpeg_with_segment(marker: int, body: bytes) -> bytes:
    jpg = encode(Image.fromarray(pixels(12, 17, 11), "RGB"), "JPEG")
    return jpg[:2] + bytes((0xFF, marker)) + struct.pack(">H", len(body) + 2) + body + jpg[2:]


def noisy_files() -> dict[str, bytes]:
    """Files on which Pillow, its loggers or libtiff speak up (each checked to do so by the test below)."""
    rgb = Image.fromarray(pixels(12, 17, 11), "RGB")
    apng = bytearray(variants.apng((17, 12), 2))
    at = apng.find(b"acTL")
    apng[at + 4 : at + 8] = b"\0\0\0\0"  # zero frames: "Invalid APNG"
    apng[at + 12 : at + 16] = struct.pack(">I", zlib.crc32(bytes(apng[at : at + 12])))
    # An MP header with no MP entry: "malformed MPO file".
    mp = b"MPF\0II*\0" + struct.pack("<IHHHIIHHII", 8, 2, 0xB000, 7, 4, 0x30303130, 0xB001, 4, 1, 1)
    # An EXIF tag whose data lies past the segment: "Corrupt EXIF data" (read for --apply-exif-orientation).
    exif = b"Exif\0\0II*\0" + struct.pack("<IHHHIII", 8, 1, 0x010E, 2, 5000, 26, 0)
    return {
        "webp_compressed.tif": _tiff_tag(encode(rgb, "TIFF", compression="tiff_lzw"), 259, 50001),
        "many_samples.tif": _tiff_tag(encode(rgb, "TIFF"), 277, 100),
        "malformed_mpo.jpg": _jpeg_with_segment(0xE2, mp),
        "corrupt_exif.jpg": _jpeg_with_segment(0xE1, exif),
        "invalid_apng.png": bytes(apng),
        "ok.jpg": encode(rgb, "JPEG"),
    }


NOISE = [
    "WEBP compression support is not configured",
    "More samples per pixel",
    "malformed MPO",
    "Corrupt EXIF",
    "Invalid APNG",
    "UserWarning",
    "warnings.warn",
]


def test_conversions_are_quiet_and_messages_that_explain_a_reject_are_kept(tmp_path):
    files = noisy_files()
    root, out = tmp_path / "in", tmp_path / "out"
    for name, data in files.items():
        write(str(root / name), data)
    result = convert(
        "--input", str(root), "--output", str(out), "--labels-from", "none", "--max-reject-fraction", "1",
        "--apply-exif-orientation", "--decode-threads", "3",
    )  # fmt: skip
    printed = result.stderr + result.stdout
    assert [n for n in NOISE if n in printed] == [], printed
    assert "4 examples" in printed and "rejected            2" in printed  # the summary still prints
    rejects = {x["path"]: x for x in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert "WEBP compression support is not configured" in rejects["webp_compressed.tif"]["detail"]
    assert "More samples per pixel" in rejects["many_samples.tif"]["detail"]


def test_the_noisy_files_are_noisy_without_the_capture(tmp_path):
    """Guards the test above: each file does make its decoder speak when nothing catches it."""
    import subprocess
    import sys
    import textwrap

    folder = tmp_path / "noisy"
    for name, data in noisy_files().items():
        write(str(folder / name), data)
    script = textwrap.dedent(
        f"""
        import logging, pathlib
        from PIL import Image, ImageOps
        logging.basicConfig()
        for path in sorted(pathlib.Path({str(folder)!r}).iterdir()):
            try:
                with Image.open(path) as img:
                    img.load()
                    img.getexif().get(0x0112)
            except Exception:
                pass
        """
    )
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stderr
    assert [n for n in NOISE[:5] if n not in err] == [], err


def test_capture_is_per_thread():
    """While one thread decodes (captures), another thread's warnings still print: nothing process-wide.
    (In a subprocess: pytest catches warnings itself.)"""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import threading, warnings
        from beam_pipeline.decoder_noise import captured
        seen, started, release = [], threading.Event(), threading.Event()
        def decoding():
            with captured() as notes:
                started.set()
                release.wait(30)
                warnings.warn("said while decoding", UserWarning)
            seen.extend(notes)
        worker = threading.Thread(target=decoding)
        worker.start()
        started.wait(30)
        warnings.warn("said elsewhere", UserWarning)
        release.set()
        worker.join(30)
        print(seen)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "said elsewhere" in out.stderr and "said while decoding" not in out.stderr, out.stderr
    assert out.stdout.strip() == "['UserWarning: said while decoding']", out.stdout + out.stderr


def _tiff_cut_before_its_bits_per_sample(seed: int) -> bytes:
    """A TIFF cut off where its BitsPerSample values start: Pillow warns "Truncated File Read", then refuses it."""
    data = encode(Image.fromarray(pixels(12, 17, seed), "RGB"), "TIFF")
    first = struct.unpack_from("<I", data, 4)[0]
    for k in range(struct.unpack_from("<H", data, first)[0]):
        tag, _, _, value = struct.unpack_from("<HHII", data, first + 2 + 12 * k)
        if tag == 258:
            return data[:value]
    raise AssertionError("no BitsPerSample tag")


def test_a_decoder_warning_is_in_the_detail_of_every_reject_it_explains(tmp_path):
    """Python shows a warning once per place and text: the second file (or decode thread) that met the same
    one lost it, so a reject's detail depended on which file a process happened to decode first.
    (In a fresh process, as a worker is: pytest handles warnings itself.)"""
    import subprocess
    import sys
    import textwrap

    paths = []
    for seed in (1, 2):
        paths.append(tmp_path / f"cut{seed}.tif")
        paths[-1].write_bytes(_tiff_cut_before_its_bits_per_sample(seed))
    script = textwrap.dedent(
        f"""
        import json
        from beam_pipeline.images.convert import prepare_image
        from beam_pipeline.images.options import Rejected
        for path in {[str(p) for p in paths]!r} * 2:
            try:
                prepare_image(open(path, "rb").read())
            except Rejected as r:
                print(json.dumps(r.detail))
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    details = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(details) == 4, out.stdout + out.stderr
    assert all("decoder said: UserWarning: Truncated File Read" in d for d in details), details
    assert len(set(details)) == 1, details
    assert "Truncated File Read" not in out.stderr, out.stderr


@pytest.mark.unit
def test_a_transparent_gif_is_stored_as_it_is_and_decodes_black_where_transparent(tf):
    """docs/bad-input.md#transparent-gifs: a transparent GIF Pillow writes (left half transparent, index 2 = blue)
    is stored byte for byte, 3 channels; TF's decode_image and decode_gif give its transparent pixels as (0, 0, 0),
    not blue. Shrunk (converted) it is an RGBA PNG, alpha 0 there; re-encoded as JPEG, white there."""
    import numpy as np

    from beam_pipeline.images.options import ImageOptions

    indices = np.zeros((8, 8), np.uint8)
    indices[:, :4] = 2
    img = Image.fromarray(indices, "P")
    img.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255])
    data = encode(img, "GIF", transparency=2)

    stored = prepare_image(data)
    assert stored.data == data and stored.converted_from is None
    assert (stored.info.format, stored.info.channels) == ("gif", 3)
    for got in (tf.io.decode_image(data, expand_animations=False).numpy(), tf.io.decode_gif(data).numpy()[0]):
        assert got.shape == (8, 8, 3)
        assert (got[:, :4] == 0).all() and (got[:, 4:] == [255, 0, 0]).all()

    shrunk = prepare_image(data, ImageOptions(resize_max_side=4))
    assert (shrunk.info.format, shrunk.info.channels, shrunk.converted_from) == ("png", 4, "gif")
    assert (tf.io.decode_image(shrunk.data).numpy()[:, 0] == [0, 0, 0, 0]).all()

    flattened = prepare_image(data, ImageOptions(reencode_quality=90))
    assert (flattened.info.format, flattened.info.channels) == ("jpeg", 3)
    assert (tf.io.decode_image(flattened.data).numpy()[:, 0] >= 245).all()
