"""--masks DIR: semantic segmentation label maps paired by relative path, converted and read back with TensorFlow."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from beam_pipeline.annotations import masks
from beam_pipeline.images.options import Rejected
from beam_pipeline.vocab import reasons

from .conftest import convert, load_info, run_cli
from .imagegen import encode, image_bytes, pixels, write

pytestmark = pytest.mark.e2e

# A VOC-like palette: index k drawn in some colour; 255 (the "ignore" border) in cream.
PALETTE = [0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0, *([0, 0, 0] * 251), 224, 224, 192]


def label_array(height: int, width: int, seed: int) -> np.ndarray:
    """Class ids 0-3 in blocks, with a 255 "ignore" stripe: values a label map holds."""
    yy, xx = np.mgrid[0:height, 0:width]
    out = ((xx // 5 + yy // 4 + seed) % 4).astype(np.uint8)
    out[:, width // 2] = 255
    return out


def palette_png(values: np.ndarray) -> bytes:
    img = Image.fromarray(values, "P")
    img.putpalette(PALETTE)
    return encode(img, "PNG")


def grey_png(values: np.ndarray) -> bytes:
    return encode(Image.fromarray(values, "L"), "PNG")


def rotated_jpeg(height: int, width: int, orientation: int) -> bytes:
    """A dark JPEG of width x height stored pixels, white in its top-left 15 x 10 corner, whose EXIF says to turn
    it (``orientation``)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    dark = pixels(height, width, 3) // 4
    dark[:10, :15] = 255
    return encode(Image.fromarray(dark, "RGB"), "JPEG", quality=95, exif=exif.tobytes())


def make_mask_set(base: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """Images under ``base/in/``, label maps under ``base/masks/``, with every validation case; the expected
    label maps."""
    root, mdir = base / "in", base / "masks"
    expected = {"a.jpg": label_array(24, 32, 0), "sub/b.png": label_array(20, 30, 1)}
    write(str(root / "a.jpg"), image_bytes("jpeg", 24, 32, 0))
    write(str(mdir / "a.png"), grey_png(expected["a.jpg"]))  # 8-bit grey: kept byte for byte
    write(str(root / "sub" / "b.png"), image_bytes("png", 20, 30, 1))
    write(str(mdir / "sub" / "b.png"), palette_png(expected["sub/b.png"]))  # palette: indices are the ids
    write(str(root / "nomask.jpg"), image_bytes("jpeg", 24, 32, 2))
    write(str(root / "rgb.jpg"), image_bytes("jpeg", 24, 32, 3))
    write(str(mdir / "rgb.png"), image_bytes("png", 24, 32, 3))  # colours, not class ids
    write(str(root / "small.jpg"), image_bytes("jpeg", 24, 32, 4))
    write(str(mdir / "small.png"), grey_png(label_array(12, 16, 4)))
    write(str(root / "broken.jpg"), image_bytes("jpeg", 24, 32, 5))
    write(str(mdir / "broken.png"), grey_png(label_array(24, 32, 5))[:60])  # truncated
    write(str(root / "lossy.jpg"), image_bytes("jpeg", 24, 32, 6))
    write(str(mdir / "lossy.png"), image_bytes("jpeg", 24, 32, 6))  # a JPEG named .png
    write(str(root / "two.jpg"), image_bytes("jpeg", 24, 32, 7))
    write(str(mdir / "two.png"), grey_png(label_array(24, 32, 7)))
    write(str(mdir / "two.PNG"), grey_png(label_array(24, 32, 7)))
    write(str(mdir / "orphan.png"), grey_png(label_array(8, 8, 0)))  # no image
    write(str(mdir / "README.txt"), b"class 1 = road\n")
    return root, mdir, expected


@pytest.fixture(scope="module")
def mask_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    return make_mask_set(tmp_path_factory.mktemp("masks"))


@pytest.fixture(scope="module")
def converted(mask_set, tmp_path_factory):
    root, mdir, _ = mask_set
    out = tmp_path_factory.mktemp("masks_out") / "seg"
    result = convert("--input", str(root), "--masks", str(mdir), "--output", str(out), "--max-reject-fraction", "1")
    return out, result


def records_by_name(out: Path) -> dict[str, Any]:
    import tensorflow as tf

    rows = {}
    for split in load_info(out)["splits"].values():
        for shard in split["shards"]:
            for raw in tf.data.TFRecordDataset(str(out / shard["file"])):
                ex = tf.train.Example.FromString(raw.numpy())
                rows[ex.features.feature["image/filename"].bytes_list.value[0].decode()] = ex
    return rows


def decoded_mask(example: Any) -> np.ndarray:
    import tensorflow as tf

    data = example.features.feature[masks.SEGMENTATION_ENCODED].bytes_list.value[0]
    return tf.io.decode_png(data).numpy()


def test_label_maps_read_back_exactly_with_tensorflow(converted, mask_set):
    """tf.io.decode_png of image/segmentation/class/encoded is the label map, palette indices and 255 included;
    Model Garden's decoding (decode_image, channels=1) reads the same."""
    import tensorflow as tf

    out, _ = converted
    _, mdir, expected = mask_set
    rows = records_by_name(out)
    assert sorted(rows) == ["a.jpg", "sub/b.png"]
    for name, values in expected.items():
        feature = rows[name].features.feature
        got = decoded_mask(rows[name])
        assert got.shape == (*values.shape, 1)
        np.testing.assert_array_equal(got[..., 0], values)
        assert 255 in got
        assert feature[masks.SEGMENTATION_FORMAT].bytes_list.value == [b"png"]
        data = feature[masks.SEGMENTATION_ENCODED].bytes_list.value[0]
        mg = tf.io.decode_image(data, channels=1).numpy()  # segmentation_input.Decoder's call
        np.testing.assert_array_equal(mg[..., 0], values)
        height = feature["image/height"].int64_list.value[0]
        width = feature["image/width"].int64_list.value[0]
        assert (height, width) == values.shape
    # a grey 8-bit PNG is stored as it is; a palette PNG is not (TF would decode its colours)
    assert (
        rows["a.jpg"].features.feature[masks.SEGMENTATION_ENCODED].bytes_list.value[0] == (mdir / "a.png").read_bytes()
    )
    assert tf.io.decode_png((mdir / "sub" / "b.png").read_bytes()).shape[-1] == 3


@pytest.mark.smoke
def test_each_bad_mask_is_a_reject_with_its_reason(converted):
    out, _ = converted
    rows = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    found = {r["path"]: r["reason"] for r in rows}
    assert found == {
        "nomask.jpg": reasons.MISSING_MASK,
        "rgb.jpg": reasons.MASK_NOT_SINGLE_CHANNEL,
        "small.jpg": reasons.MASK_SIZE_MISMATCH,
        "broken.jpg": reasons.BAD_MASK,
        "lossy.jpg": reasons.BAD_MASK,
        "two.jpg": reasons.DUPLICATE_MASK,
    }
    info = load_info(out)
    assert info["rejects"]["by_reason"][reasons.BAD_MASK] == 2
    # the mask without an image and the file that is no PNG are counted, not fatal
    assert info["skipped"]["by_reason"] == {masks.MASK_WITHOUT_IMAGE: 1, masks.NOT_A_MASK: 1}
    assert info["features"][masks.SEGMENTATION_ENCODED]["dtype"] == "string"
    assert "image/class/label" not in info["features"]  # the classes are in the pixels


@pytest.mark.unit
@pytest.mark.parametrize(
    "mode,values",
    [
        ("1", np.array([[0, 1], [1, 0]], np.uint8)),
        ("I;16", np.array([[0, 7], [255, 3]], np.uint16)),
    ],
)
def test_one_bit_and_16_bit_label_maps_become_8_bit_ids(mode, values):
    img = Image.fromarray(values.astype(bool) if mode == "1" else values)
    assert img.mode == mode
    out = masks.label_map_png(encode(img, "PNG"), (2, 2), 1, (2, 2))
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(out))), values)
    assert Image.open(io.BytesIO(out)).mode == "L"


@pytest.mark.unit
@pytest.mark.parametrize("bits", [2, 4])
def test_two_and_four_bit_grey_label_maps_keep_their_ids_not_pillows_scaled_grey(bits):
    """Pillow opens a 2- or 4-bit grey PNG as 8-bit grey scaled up (×85, ×17): id 15 would become 255, the
    ignore value. The ids are the samples as written (what pypng and hand-written writers store)."""
    from .hostile import _png

    ids = np.array([[0, 1, 2, 3], [3, 2, 1, 0]], np.uint8) * (1 if bits == 2 else 5)
    packed = b"".join(
        b"\x00" + bytes(int("".join(format(v, f"0{bits}b") for v in row[i : i + 8 // bits]), 2)
                     for i in range(0, 4, 8 // bits))
        for row in ids
    )  # fmt: skip
    data = _png(struct.pack(">IIBBBBB", 4, 2, bits, 0, 0, 0, 0), zlib.compress(packed))
    out = masks.label_map_png(data, (4, 2), 1, (4, 2))
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(out))), ids)


@pytest.mark.unit
def test_a_class_id_beyond_255_is_a_bad_mask():
    data = encode(Image.fromarray(np.array([[0, 300]], np.uint16)), "PNG")
    with pytest.raises(Rejected) as e:
        masks.label_map_png(data, (2, 1), 1, (2, 1))
    assert e.value.reason == reasons.BAD_MASK and "300" in e.value.detail


@pytest.mark.unit
def test_grey_with_alpha_is_not_a_label_map():
    data = encode(Image.fromarray(np.zeros((2, 2, 2), np.uint8), "LA"), "PNG")
    with pytest.raises(Rejected) as e:
        masks.label_map_png(data, (2, 2), 1, (2, 2))
    assert e.value.reason == reasons.MASK_NOT_SINGLE_CHANNEL


def test_masks_follow_resize_and_exif_orientation(tmp_path):
    """--apply-exif-orientation turns the mask as the image (orientation 6: 90° clockwise); --resize-max-side
    shrinks it with nearest neighbour: no class id that was not in the label map."""
    import tensorflow as tf

    root, mdir, out = tmp_path / "in", tmp_path / "masks", tmp_path / "out"
    values = label_array(40, 60, 0)  # stored pixels: 60 wide, 40 high
    values[:10, :15] = 9  # a block in the stored top-left corner: top-right once upright
    write(str(root / "r.jpg"), rotated_jpeg(40, 60, 6))
    write(str(mdir / "r.png"), palette_png(values))
    convert("--input", str(root), "--masks", str(mdir), "--output", str(out),
            "--apply-exif-orientation", "--resize-max-side", "30")  # fmt: skip
    ex = records_by_name(out)["r.jpg"]
    feature = ex.features.feature
    height, width = feature["image/height"].int64_list.value[0], feature["image/width"].int64_list.value[0]
    assert (width, height) == (20, 30)  # upright: 40 wide, 60 high, then at most 30
    image = tf.io.decode_image(feature["image/encoded"].bytes_list.value[0]).numpy()
    got = decoded_mask(ex)[..., 0]
    assert got.shape == image.shape[:2] == (30, 20)
    upright = np.rot90(values, k=-1)  # what exif_transpose does to the pixels for orientation 6
    expected = np.asarray(Image.fromarray(upright, "L").resize((20, 30), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(got, expected)
    assert set(np.unique(got)) <= set(np.unique(values))
    assert (got[:7, -5:] == 9).all() and not (got[:7, :5] == 9).any()
    # the mask's block lies where the image's white corner went
    white = image.mean(axis=-1) > 200
    assert (white == (got == 9)).mean() > 0.97


def test_a_changed_mask_never_reuses_the_old_record(mask_set, tmp_path):
    """--incremental-from after masks changed while their images did not: a changed label map converts its image
    again; a fixed broken mask and an added missing one too (those rejects are not kept); the unchanged pair and
    an unchanged bad mask's reject are kept."""
    root, mdir, expected = mask_set
    import shutil

    mdir2 = tmp_path / "masks2"
    shutil.copytree(mdir, mdir2)
    first, second = tmp_path / "first", tmp_path / "second"
    common = ("--input", str(root), "--max-reject-fraction", "1", "--masks", str(mdir2))
    convert(*common, "--output", str(first))
    changed = expected["a.jpg"].copy()
    changed[0, 0] = 3 if changed[0, 0] != 3 else 2
    (mdir2 / "a.png").write_bytes(grey_png(changed))
    stat = (mdir2 / "a.png").stat()
    os.utime(mdir2 / "a.png", (stat.st_atime, stat.st_mtime + 10))  # same size is possible: mtime moves
    fixed, added = label_array(24, 32, 5), label_array(24, 32, 2)
    (mdir2 / "broken.png").write_bytes(grey_png(fixed))
    (mdir2 / "nomask.png").write_bytes(grey_png(added))
    convert(*common, "--output", str(second), "--incremental-from", str(first))
    rows = records_by_name(second)
    np.testing.assert_array_equal(decoded_mask(rows["a.jpg"])[..., 0], changed)
    np.testing.assert_array_equal(decoded_mask(rows["sub/b.png"])[..., 0], expected["sub/b.png"])
    np.testing.assert_array_equal(decoded_mask(rows["broken.jpg"])[..., 0], fixed)
    np.testing.assert_array_equal(decoded_mask(rows["nomask.jpg"])[..., 0], added)
    inc = load_info(second)["incremental"]
    assert inc["reused"] == 1 and inc["converted"] == 3, inc
    assert load_info(second)["rejects"]["by_reason"] == {
        reasons.MASK_NOT_SINGLE_CHANNEL: 1,
        reasons.MASK_SIZE_MISMATCH: 1,
        reasons.BAD_MASK: 1,
        reasons.DUPLICATE_MASK: 1,
    }


@pytest.mark.unit
def test_the_shard_digest_covers_the_mask_file():
    """Resume takes a finished shard only when its images' mask files are the same (size, mtime)."""
    from beam_pipeline import resume
    from beam_pipeline.images.options import ImageOptions
    from beam_pipeline.vocab.refs import Ref

    def digest(label_map: masks.LabelMap) -> str:
        ref = Ref("/in/a.jpg", "a.jpg", 10, "train", None, 1, annotations=label_map)
        return resume.shard_digest("train", 0, [ref], [], {}, ImageOptions(), "none")

    before = digest(masks.LabelMap("/m/a.png", 100, 1.0))
    assert before != digest(masks.LabelMap("/m/a.png", 100, 2.0))
    assert before != digest(masks.LabelMap("/m/a.png", 101, 1.0))
    assert before == digest(masks.LabelMap("/m/a.png", 100, 1.0))


def test_mask_usage_errors_are_one_line(mask_set, tmp_path):
    root, mdir, _ = mask_set
    (tmp_path / "instances.json").write_text(json.dumps({"categories": [{"id": 1, "name": "a"}]}))
    cases = [
        (["--masks", str(tmp_path / "nope")], "--masks"),
        (["--masks", str(mdir), "--coco", str(tmp_path / "instances.json")], "--coco"),
        (["--masks", str(mdir), "--dedupe"], "--dedupe"),  # copies of an image may carry different label maps
    ]
    for extra, word in cases:
        result = run_cli("convert", "--input", str(root), "--output", str(tmp_path / "o"), *extra)
        assert result.returncode == 2, result.stderr
        assert word in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_default_flags_succeed_and_tfds_loads_the_label_maps(tmp_path):
    """A --masks conversion with default flags (TFT analysis, TFDS metadata) publishes, and
    tfds.builder_from_directory yields each label map as a one-channel uint8 image of its class ids."""
    import tensorflow_datasets as tfds

    root, mdir, out = tmp_path / "in", tmp_path / "masks", tmp_path / "out"
    expected = {}
    for i in range(3):
        expected[f"x{i}.jpg"] = label_array(24, 32, i)
        write(str(root / f"x{i}.jpg"), image_bytes("jpeg", 24, 32, i))
        write(str(mdir / f"x{i}.png"), palette_png(expected[f"x{i}.jpg"]))
    convert("--input", str(root), "--masks", str(mdir), "--output", str(out), transform=True, tfds=True)
    assert (out / "_SUCCESS").exists() and (out / "transform_fn").is_dir()
    seen = {}
    for ex in tfds.builder_from_directory(str(out)).as_dataset(split="train"):
        seen[ex["image/filename"].numpy().decode()] = ex[masks.SEGMENTATION_ENCODED].numpy()
    assert sorted(seen) == sorted(expected)
    for name, values in expected.items():
        assert seen[name].dtype == np.uint8
        np.testing.assert_array_equal(seen[name][..., 0], values)


def test_a_gs_mask_folder_and_images_make_the_same_shards_as_local_files(converted, mask_set, gcs):
    """--input, --masks and --output on the GCS emulator: the same shards, byte for byte, and the same rejects."""
    from .conftest import BUCKET

    out, _ = converted
    root, mdir, _ = mask_set
    bucket = gcs.bucket(BUCKET)
    for folder, prefix in ((root, "seg-in"), (mdir, "seg-masks")):
        for file in folder.rglob("*"):
            if file.is_file():
                bucket.blob(f"{prefix}/{file.relative_to(folder)}").upload_from_filename(str(file))
    convert("--input", f"gs://{BUCKET}/seg-in", "--masks", f"gs://{BUCKET}/seg-masks",
            "--output", f"gs://{BUCKET}/seg-out/seg", "--max-reject-fraction", "1", "--no_auth")  # fmt: skip
    remote = {b.name[len("seg-out/seg/") :]: b for b in gcs.list_blobs(BUCKET, prefix="seg-out/seg/")}
    info = load_info(out)
    shards = [s["file"] for split in info["splits"].values() for s in split["shards"]]
    for name in shards:
        assert remote[name].download_as_bytes() == (out / name).read_bytes(), name
    remote_info = json.loads(remote["dataset.json"].download_as_text())
    assert remote_info["rejects"]["by_reason"] == info["rejects"]["by_reason"]
    assert remote_info["skipped"]["by_reason"] == info["skipped"]["by_reason"]


def test_a_mask_folder_inside_the_input_is_not_listed_as_images(tmp_path):
    """--input DATA --masks DATA/masks: the label maps are not images of the dataset (skipped, not rejected)."""
    base, out = tmp_path / "data", tmp_path / "out"
    values = label_array(24, 32, 0)
    write(str(base / "img" / "a.jpg"), image_bytes("jpeg", 24, 32, 0))
    write(str(base / "masks" / "img" / "a.png"), grey_png(values))
    convert("--input", str(base), "--masks", str(base / "masks"), "--output", str(out))
    info = load_info(out)
    assert info["examples"] == 1 and info["rejects"]["total"] == 0
    assert info["skipped"]["by_reason"] == {masks.IN_MASK_FOLDER: 1}
    np.testing.assert_array_equal(decoded_mask(records_by_name(out)["img/a.jpg"])[..., 0], values)


def test_a_mask_changed_after_a_kill_rewrites_its_shard_only(tmp_path, monkeypatch):
    """A run killed after finishing shards, run again after one image's mask changed (its image did not): that
    image's shard is written again with the new label map; the other finished shards are taken."""
    from .test_resume import finished, killed_run

    root, mdir, out = tmp_path / "in", tmp_path / "masks", tmp_path / "out"
    for i in range(12):
        write(str(root / f"x{i:02d}.jpg"), image_bytes("jpeg", 24, 32, i))
        write(str(mdir / f"x{i:02d}.png"), grey_png(label_array(24, 32, i)))
    extra = ("--masks", str(mdir), "--no-transform", "--no-tfds-metadata")
    scratch = killed_run(root, out, monkeypatch, "writer.result:3:kill", *extra)
    taken = finished(scratch)
    assert len(taken) == 3
    changed = json.loads(Path(taken[0]["index_path"]).read_text().splitlines()[0])["path"]
    new_values = np.full((24, 32), 7, np.uint8)
    mask = mdir / changed.replace(".jpg", ".png")
    stat = mask.stat()
    mask.write_bytes(grey_png(new_values))
    os.utime(mask, (stat.st_atime, stat.st_mtime + 10))
    from .test_resume import ARGS

    convert("--input", str(root), "--output", str(out), *ARGS, *extra)
    np.testing.assert_array_equal(decoded_mask(records_by_name(out)[changed])[..., 0], new_values)
    resumed = load_info(out)["resumed"]
    assert resumed["shards"] == 2 and resumed["records"] == sum(r["records"] for r in taken[1:]), resumed


@pytest.mark.unit
def test_a_transient_error_reading_a_mask_fails_the_bundle_not_the_image(tmp_path, monkeypatch):
    """A reset connection while reading the label map is not bad input: the error is raised (the runner retries
    the bundle), never turned into a reject. A mask gone since the listing is a missing_mask reject."""
    from beam_pipeline import storage
    from beam_pipeline.vocab.refs import Ref
    from beam_pipeline.writer.records import decode_one

    image = image_bytes("jpeg", 24, 32, 0)
    mask_path = write(str(tmp_path / "a.png"), grey_png(label_array(24, 32, 0)))
    label_map = masks.LabelMap(mask_path, os.path.getsize(mask_path), 1.0)
    ref = Ref(str(tmp_path / "a.jpg"), "a.jpg", len(image), "train", None, 1, annotations=label_map)
    assert not isinstance(decode_one(ref, image, {}, {}), Rejected)

    real = storage.read_bytes

    def reset(path: str, *args: Any, **kwargs: Any) -> bytes:
        if path == mask_path:
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(storage, "read_bytes", reset)
    with pytest.raises(ConnectionResetError):
        decode_one(ref, image, {}, {})
    monkeypatch.setattr(storage, "read_bytes", real)
    os.remove(mask_path)
    gone = decode_one(ref, image, {}, {})
    assert isinstance(gone, Rejected) and gone.reason == reasons.MISSING_MASK


def test_the_write_to_tfrecord_sink_writes_the_label_maps_too(mask_set, tmp_path):
    root, mdir, expected = mask_set
    out = tmp_path / "wtt"
    convert("--input", str(root), "--masks", str(mdir), "--output", str(out), "--max-reject-fraction", "1",
            "--sink", "write_to_tfrecord")  # fmt: skip
    rows = records_by_name(out)
    for name, values in expected.items():
        np.testing.assert_array_equal(decoded_mask(rows[name])[..., 0], values)
    assert load_info(out)["rejects"]["by_reason"][reasons.MISSING_MASK] == 1


def test_the_same_masks_read_from_another_folder_leave_every_record_reusable(mask_set, tmp_path):
    """A night whose inputs lie under a new path (a per-night copy, a remount) reused every COCO or VOC record but
    no --masks one: the mask file's absolute path was in the annotation digest."""
    import shutil

    root, mdir, _ = mask_set
    first, second = tmp_path / "first", tmp_path / "second"
    convert("--input", str(root), "--masks", str(mdir), "--output", str(first), "--max-reject-fraction", "1")
    moved = tmp_path / "moved"
    shutil.copytree(root, moved / "in", copy_function=shutil.copy2)  # sizes and mtimes kept
    shutil.copytree(mdir, moved / "masks", copy_function=shutil.copy2)
    convert("--input", str(moved / "in"), "--masks", str(moved / "masks"), "--output", str(second),
            "--incremental-from", str(first), "--max-reject-fraction", "1")  # fmt: skip
    inc = load_info(second)["incremental"]
    assert inc["reused"] == load_info(first)["examples"] > 0 and inc["converted"] == 0, inc
    assert masks.LabelMap("/m/a.png", 100, 1.0, "a.png").digest == masks.LabelMap("/n/a.png", 100, 1.0, "a.png").digest
    assert masks.LabelMap("/m/a.png", 100, 1.0, "a.png").digest != masks.LabelMap("/m/b.png", 100, 1.0, "b.png").digest


def test_a_labels_file_with_masks_over_a_flat_folder_says_what_it_is_for(tmp_path):
    """The flat-folder hint said "pass --labels-from none", which then conflicts with --labels-file."""
    write(str(tmp_path / "in" / "a.jpg"), image_bytes("jpeg", 24, 32, 0))
    write(str(tmp_path / "masks" / "a.png"), grey_png(label_array(24, 32, 0)))
    (tmp_path / "labels.txt").write_text("road\ncar\n")
    result = run_cli("convert", "--input", str(tmp_path / "in"), "--masks", str(tmp_path / "masks"),
                     "--labels-file", str(tmp_path / "labels.txt"), "--output", str(tmp_path / "o"))  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "drop --labels-file" in result.stderr and "--labels-from none" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.unit
@pytest.mark.parametrize("damage", ["idat-crc", "unknown-critical-chunk"])
def test_an_8_bit_grey_mask_tensorflow_cannot_read_as_stored_is_re_encoded(damage, tf):
    """An 8-bit grey label map was stored byte for byte once Pillow read it; with a bad IDAT CRC or an unknown
    critical chunk (which Pillow passes and libpng refuses) TensorFlow could not decode the record's mask, and
    inspect --verify did not see it. Such a mask is re-encoded: TF reads the same class ids."""
    from .hostile import _png

    ids = np.array([[0, 1, 2, 3], [3, 2, 1, 255]], np.uint8)
    raw = zlib.compress(b"".join(b"\x00" + row.tobytes() for row in ids))
    header = struct.pack(">IIBBBBB", 4, 2, 8, 0, 0, 0, 0)
    data = _png(header, raw)
    if damage == "idat-crc":
        at = data.index(b"IDAT") + 4 + len(raw)
        data = data[:at] + bytes(4) + data[at + 4 :]
    else:
        chunk = b"ABCD" + b"x"
        extra = struct.pack(">I", 1) + chunk + struct.pack(">I", zlib.crc32(chunk))
        at = data.index(b"IDAT") - 4
        data = data[:at] + extra + data[at:]
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), ids)  # Pillow reads it
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_png(data, channels=1)  # libpng does not
    out = masks.label_map_png(data, (4, 2), 1, (4, 2))
    np.testing.assert_array_equal(tf.io.decode_png(out, channels=1).numpy()[:, :, 0], ids)
    plain = _png(header, raw)
    assert masks.label_map_png(plain, (4, 2), 1, (4, 2)) == plain  # a sound one is still kept byte for byte


@pytest.mark.unit
def test_verify_decodes_each_label_map_as_tensorflow_reads_it(tf):
    """inspect --verify decoded the instance masks of a detection record but not a --masks record's label map:
    one TensorFlow cannot read, or of another size than its image, passed."""
    from beam_pipeline import inspection
    from beam_pipeline.examples import HEIGHT, WIDTH

    from .hostile import _png

    header = struct.pack(">IIBBBBB", 4, 2, 8, 0, 0, 0, 0)
    raw = zlib.compress(b"".join(b"\x00" + bytes(4) for _ in range(2)))
    good = _png(header, raw)
    bad_crc = good.replace(raw + struct.pack(">I", zlib.crc32(b"IDAT" + raw)), raw + bytes(4))
    record = {HEIGHT: [2], WIDTH: [4]}
    assert inspection.check_label_map({**record, masks.SEGMENTATION_ENCODED: [good]}, tf) is None
    assert inspection.check_label_map(record, tf) is None  # no label map: nothing to check
    problem = inspection.check_label_map({**record, masks.SEGMENTATION_ENCODED: [bad_crc]}, tf)
    assert problem.startswith("label map: InvalidArgumentError: ") and "function_node" not in problem, problem
    jpeg = encode(Image.fromarray(np.zeros((2, 4), np.uint8), "L"), "JPEG")  # decode_png reads it: no PNG all the same
    assert inspection.check_label_map({**record, masks.SEGMENTATION_ENCODED: [jpeg]}, tf) == "label map is not a PNG"
    other = {HEIGHT: [4], WIDTH: [4], masks.SEGMENTATION_ENCODED: [good]}
    assert "decodes to 2x4x1, the image is 4x4" in inspection.check_label_map(other, tf)
