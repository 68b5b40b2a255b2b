"""Boxes and instance masks follow the pixels through --apply-exif-orientation and --resize-max-side.

Real conversions of a generated COCO set, read back with TensorFlow: JPEGs painted with solid coloured
objects in their stored frame and tagged with each of the 8 EXIF orientations, and larger images whose
masks are checked against an independent downscale after a resize.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_pipeline.annotations import objects
from beam_pipeline.images.convert import prepare_image
from beam_pipeline.images.options import ORIENTATION_TRANSPOSE, Geometry, ImageOptions
from beam_pipeline.vocab import reasons

from .conftest import convert, load_info, run_cli
from .test_coco import parsed_records

pytestmark = pytest.mark.e2e

STORED_W, STORED_H = 160, 120  # the painted JPEGs' stored frame (landscape, so turning them swaps the axes)
RED, BLUE, GREY = (220, 30, 30), (30, 30, 220), (128, 128, 128)
# (colour, [x, y, w, h] in the stored frame): asymmetric, so every orientation moves them somewhere else
PAINTED = [(RED, [16, 12, 60, 40]), (BLUE, [100, 70, 48, 36])]
RESIZE = 100  # --resize-max-side: every image of the set is larger
BIG = (400, 300)  # big.png: a polygon and an uncompressed crowd RLE, no EXIF
PENTAGON = [[60.0, 40.0, 300.0, 30.0, 340.0, 200.0, 180.0, 280.0, 40.0, 220.0]]
CATEGORIES = [{"id": 3, "name": "red"}, {"id": 8, "name": "blue"}]


def block_rle(height: int, width: int, x: int, y: int, w: int, h: int) -> dict[str, Any]:
    """A compressed RLE (counts as a string) of a solid block, made with pycocotools."""
    from pycocotools import mask as coco_mask

    mask = np.zeros((height, width), np.uint8)
    mask[y : y + h, x : x + w] = 1
    rle = coco_mask.encode(np.asfortranarray(mask))
    return {"size": rle["size"], "counts": rle["counts"].decode("ascii")}


def painted_jpeg(orientation: int) -> bytes:
    """A JPEG whose stored pixels hold PAINTED on grey, tagged with EXIF ``orientation``."""
    pixels = np.full((STORED_H, STORED_W, 3), GREY, np.uint8)
    for colour, (x, y, w, h) in PAINTED:
        pixels[y : y + h, x : x + w] = colour
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    return buffer.getvalue()


def disk_rle(height: int, width: int) -> dict[str, Any]:
    """An uncompressed RLE (column-major run lengths) of a disk: a mask with curved edges."""
    yy, xx = np.mgrid[0:height, 0:width]
    mask = ((xx - 250) ** 2 + (yy - 120) ** 2 < 70**2).astype(np.uint8)
    flat = mask.flatten(order="F")
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    return {"counts": ([0] if flat[0] else []) + runs, "size": [height, width]}


def make_set(root: Path) -> dict[str, Any]:
    """o1.jpg … o8.jpg (one per EXIF orientation), big.png, and wrong6.jpg (its JSON entry gives the turned size)."""
    images, annotations = [], []
    for o in range(1, 9):
        (root / f"o{o}.jpg").write_bytes(painted_jpeg(o))
        images.append({"id": o, "file_name": f"o{o}.jpg", "width": STORED_W, "height": STORED_H})
        for k, ((_, (x, y, w, h)), cat) in enumerate(zip(PAINTED, CATEGORIES, strict=True)):
            seg = (
                [[x, y, x + w, y, x + w, y + h, x, y + h]]
                if k == 0
                else block_rle(STORED_H, STORED_W, x, y, w, h)  # a compressed RLE
            )
            annotations.append(
                {
                    "id": 100 * o + k,
                    "image_id": o,
                    "category_id": cat["id"],
                    "bbox": [x, y, w, h],
                    "area": float(w * h),
                    "iscrowd": k,
                    "segmentation": seg,
                }  # fmt: skip
            )
    width, height = BIG
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (height, width, 3), np.uint8), "RGB").save(root / "big.png")
    images.append({"id": 20, "file_name": "big.png", "width": width, "height": height})
    annotations += [
        {"id": 2001, "image_id": 20, "category_id": 3, "bbox": [40, 30, 300, 250], "area": 45000.0,
         "iscrowd": 0, "segmentation": PENTAGON},
        {"id": 2002, "image_id": 20, "category_id": 8, "bbox": [180, 50, 140, 140], "area": 15386.0,
         "iscrowd": 1, "segmentation": disk_rle(height, width)},
    ]  # fmt: skip
    (root / "wrong6.jpg").write_bytes(painted_jpeg(6))
    images.append({"id": 30, "file_name": "wrong6.jpg", "width": STORED_H, "height": STORED_W})
    annotations.append({"id": 3001, "image_id": 30, "category_id": 3, "bbox": [1, 1, 5, 5], "iscrowd": 0})
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The set converted as stored, with EXIF orientation applied, and twice with both EXIF and resize."""
    base = tmp_path_factory.mktemp("geometry")
    root = base / "images"
    root.mkdir()
    (base / "instances.json").write_text(json.dumps(make_set(root)))
    flags = {
        "stored": [],
        "exif": ["--apply-exif-orientation"],
        "exif_resized": ["--apply-exif-orientation", "--resize-max-side", str(RESIZE)],
        "exif_resized_again": ["--apply-exif-orientation", "--resize-max-side", str(RESIZE)],
    }
    out = {}
    for name, extra in flags.items():
        out[name] = base / name / "det"  # one dataset name, so two runs name their shards alike
        convert("--input", str(root), "--coco", str(base / "instances.json"), "--output", str(out[name]),
                "--max-reject-fraction", "1", *extra)  # fmt: skip
    return out


def boxes(row: dict[str, Any]) -> np.ndarray:
    return np.stack([row[f"image/object/bbox/{k}"] for k in ("xmin", "ymin", "xmax", "ymax")], axis=1)


def masks(row: dict[str, Any], tf: Any) -> list[np.ndarray]:
    return [tf.io.decode_png(png, channels=1).numpy()[:, :, 0] for png in row["image/object/mask"]]


def iou(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(bool), b.astype(bool)
    return float((a & b).sum() / (a | b).sum())


def near(pixels: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    """Where ``pixels`` are ``colour`` give or take JPEG and resampling noise."""
    return (np.abs(pixels.astype(int) - np.array(colour)).max(axis=-1) < 60).astype(np.uint8)


def check_painted_objects_under_boxes_and_masks(row: dict[str, Any], tf: Any, size: tuple[int, int]) -> None:
    """The recorded image is ``size`` (width, height); at each box's centre it shows the colour painted there,
    the box hugs the painted pixels, and the object's mask is those pixels."""
    image = tf.io.decode_image(row["image/encoded"], channels=3, expand_animations=False).numpy()
    width, height = size
    assert image.shape[:2] == (height, width)
    assert (int(row["image/width"]), int(row["image/height"])) == (width, height)
    got_masks = masks(row, tf)
    assert len(got_masks) == len(PAINTED)
    for (colour, _), box, mask in zip(PAINTED, boxes(row), got_masks, strict=True):
        x0, y0, x1, y1 = box * [width, height, width, height]
        centre = image[int((y0 + y1) / 2), int((x0 + x1) / 2)]
        assert near(centre[None], colour)[0], (colour, centre)
        painted = near(image, colour)
        ys, xs = np.nonzero(painted)
        assert abs(xs.min() - x0) <= 1.5 and abs(xs.max() + 1 - x1) <= 1.5, (box, xs.min(), xs.max())
        assert abs(ys.min() - y0) <= 1.5 and abs(ys.max() + 1 - y1) <= 1.5, (box, ys.min(), ys.max())
        assert mask.shape == (height, width) and set(np.unique(mask)) == {0, 1}
        assert iou(mask, painted) >= 0.9


def turned(orientation: int, width: int, height: int) -> tuple[int, int]:
    return (height, width) if orientation >= 5 else (width, height)


def test_without_exif_orientation_boxes_refer_to_the_stored_frame(runs, tf):
    rows = parsed_records(runs["stored"], tf)
    for o in range(1, 9):
        check_painted_objects_under_boxes_and_masks(rows[f"o{o}.jpg"], tf, (STORED_W, STORED_H))


def test_exif_orientation_turns_boxes_and_masks_with_the_pixels(runs, tf):
    """All 8 orientations (2, 4, 5, 7 mirror): the painted objects are under their boxes and masks."""
    rows = parsed_records(runs["exif"], tf)
    for o in range(1, 9):
        check_painted_objects_under_boxes_and_masks(rows[f"o{o}.jpg"], tf, turned(o, STORED_W, STORED_H))
    assert not np.allclose(boxes(rows["o6.jpg"]), boxes(rows["o1.jpg"]))  # the boxes did move


def test_resize_keeps_normalized_boxes_and_scales_areas(runs, tf):
    exif, resized = parsed_records(runs["exif"], tf), parsed_records(runs["exif_resized"], tf)
    assert sorted(resized) == sorted(exif)
    for name, row in resized.items():
        assert np.allclose(boxes(row), boxes(exif[name]), rtol=0, atol=1e-6), name
        before = int(exif[name]["image/width"]) * int(exif[name]["image/height"])
        after = int(row["image/width"]) * int(row["image/height"])
        assert max(int(row["image/width"]), int(row["image/height"])) == RESIZE
        want = exif[name]["image/object/area"] * after / before
        assert np.allclose(row["image/object/area"], want, rtol=1e-6), name
    for o in range(1, 9):
        w, h = turned(o, STORED_W, STORED_H)
        size = (RESIZE, round(h * RESIZE / w)) if w > h else (round(w * RESIZE / h), RESIZE)
        check_painted_objects_under_boxes_and_masks(resized[f"o{o}.jpg"], tf, size)


def test_resized_masks_are_nearest_neighbour_at_the_recorded_size(runs, tf):
    """big.png's masks after the resize: 0/1 only, at the recorded size, and the same as an independent
    downscale (the polygon rasterized at the recorded size; the disk box-filtered and thresholded)."""
    from pycocotools import mask as coco_mask

    row = parsed_records(runs["exif_resized"], tf)["big.png"]
    width, height = int(row["image/width"]), int(row["image/height"])
    assert (width, height) == (RESIZE, RESIZE * BIG[1] // BIG[0])
    pentagon, disk = masks(row, tf)
    for mask in (pentagon, disk):
        assert mask.shape == (height, width) and set(np.unique(mask)) == {0, 1}
    sx, sy = width / BIG[0], height / BIG[1]
    scaled = [[v * (sx if i % 2 == 0 else sy) for i, v in enumerate(PENTAGON[0])]]
    want = np.amax(coco_mask.decode(coco_mask.frPyObjects(scaled, height, width)), axis=2)
    assert iou(pentagon, want) >= 0.97
    full = coco_mask.decode(coco_mask.frPyObjects(disk_rle(BIG[1], BIG[0]), BIG[1], BIG[0]))
    smooth = Image.fromarray(full.astype(np.float32), "F").resize((width, height), Image.Resampling.BOX)
    assert iou(disk, np.asarray(smooth) > 0.5) >= 0.97


def test_a_second_run_writes_the_same_bytes(runs):
    """Turned and resized boxes, masks and pixels are deterministic: the same flags give the same shards."""
    first, second = load_info(runs["exif_resized"]), load_info(runs["exif_resized_again"])
    files = [shard["file"] for split in first["splits"].values() for shard in split["shards"]]
    assert files and files == [shard["file"] for split in second["splits"].values() for shard in split["shards"]]
    for name in files:
        assert (runs["exif_resized"] / name).read_bytes() == (runs["exif_resized_again"] / name).read_bytes()


def test_the_size_check_is_against_the_stored_frame(runs):
    """wrong6.jpg (stored 160x120, EXIF 6) whose JSON gives the upright 120x160: rejected with or without
    --apply-exif-orientation; the o6.jpg entry (the stored size) is not."""
    for name in ("stored", "exif", "exif_resized"):
        rejects = [json.loads(line) for line in (runs[name] / "rejects.jsonl").read_text().splitlines()]
        assert [(r["path"], r["reason"]) for r in rejects] == [("wrong6.jpg", reasons.ANNOTATION_SIZE_MISMATCH)]
        assert "160x120" in rejects[0]["detail"]


@pytest.mark.unit
@pytest.mark.parametrize("orientation", range(1, 9))
def test_oriented_box_is_where_exif_transpose_puts_the_pixels(orientation):
    """oriented_box against Pillow: a block painted at the box, turned by exif_transpose, has the turned box
    as its bounding box."""
    width, height, (x0, y0, x1, y1) = 13, 7, (2, 1, 6, 3)
    block = np.zeros((height, width), np.uint8)
    block[y0:y1, x0:x1] = 1
    image = Image.fromarray(block, "L")
    exif = Image.Exif()
    exif[0x0112] = orientation
    image.info["exif"] = exif.tobytes()
    upright = np.asarray(ImageOps.exif_transpose(image))
    ys, xs = np.nonzero(upright)
    want = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    assert objects.oriented_box((x0, y0, x1, y1), width, height, orientation) == want
    assert upright.shape == ((height, width) if orientation < 5 else (width, height))


@pytest.mark.unit
def test_prepare_image_reports_the_transform_it_applied():
    data = painted_jpeg(6)
    kept = prepare_image(data, ImageOptions())
    assert kept.data == data and kept.geometry == Geometry(STORED_W, STORED_H, STORED_W, STORED_H, 1)
    turned_only = prepare_image(data, ImageOptions(apply_exif_orientation=True))
    assert turned_only.geometry == Geometry(STORED_W, STORED_H, STORED_H, STORED_W, 6)
    both = prepare_image(data, ImageOptions(apply_exif_orientation=True, resize_max_side=RESIZE))
    assert both.geometry == Geometry(STORED_W, STORED_H, 75, 100, 6)
    assert (both.info.width, both.info.height) == (75, 100)
    # an orientation Pillow does not apply: re-encoded (as before), but no turn recorded
    assert ORIENTATION_TRANSPOSE.get(9) is None
    odd = prepare_image(painted_jpeg(9), ImageOptions(apply_exif_orientation=True))
    assert odd.geometry == Geometry(STORED_W, STORED_H, STORED_W, STORED_H, 1)


def test_dedupe_with_coco_stays_a_usage_error(tmp_path):
    (tmp_path / "in").mkdir()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"images": [], "annotations": [], "categories": CATEGORIES}))
    result = run_cli("convert", "--input", str(tmp_path / "in"), "--coco", str(path), "--output",
                     str(tmp_path / "o"), "--dedupe")  # fmt: skip
    assert result.returncode == 2 and "--dedupe" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.unit
def test_a_size_mismatch_of_swapped_sides_names_the_likely_exif_turn():
    """An annotation tool that showed an EXIF-rotated photo upright records its upright size: the reject says so."""
    stored = Geometry(64, 48, 64, 48)
    assert objects.size_mismatch(objects.Annotations("1", 64, 48), stored) is None
    turned = objects.size_mismatch(objects.Annotations("1", 48, 64), stored)
    assert turned is not None and "48x64" in turned and "EXIF orientation" in turned
    other = objects.size_mismatch(objects.Annotations("1", 100, 100), stored)
    assert other is not None and "EXIF" not in other
