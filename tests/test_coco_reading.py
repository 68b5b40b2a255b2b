"""Reading and looking at a --coco dataset: TFDS, reader.load(objects=True), inspect --contact-sheet and --verify.

One generated COCO set (tests/test_coco.py's make_coco) converted once with default flags (TFT analysis and
TFDS metadata included); every test compares what it reads with what the JSON says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from beam_pipeline import tfds_metadata
from beam_pipeline.vocab.dataset_info import DatasetInfo

from .conftest import convert, load_info
from .test_coco import expected_objects, make_coco, mask_of

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    """(output folder, COCO dict): a conversion with default flags, rejects allowed (the set has every kind)."""
    base = tmp_path_factory.mktemp("coco-read")
    root = base / "images"
    doc = make_coco(root)
    path = base / "instances.json"
    path.write_text(json.dumps(doc))
    out = base / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out), "--max-reject-fraction", "1",
            transform=True, tfds=True)  # fmt: skip
    return out, doc


def _close(got: Any, want: Any) -> bool:
    return len(got) == len(want) and all(math.isclose(g, w, abs_tol=1e-6) for g, w in zip(got, want, strict=True))


def test_tfds_loads_the_objects_as_a_sequence(detection):
    """builder_from_directory: image/object is a Sequence whose boxes, class ids (a ClassLabel over labels.txt),
    crowd flags, areas and masks are the JSON's; a negative has empty lists."""
    import tensorflow_datasets as tfds

    out, doc = detection
    builder = tfds.builder_from_directory(str(out))
    assert "image/object" in builder.info.features
    assert tfds_metadata.OBJECT_LABEL_NAMES in load_info(out)["tfds"]["files"]
    label = builder.info.features["image/object"]["class"]["label"]
    lines = (out / "labels.txt").read_text().splitlines()
    assert label.names == lines and label.names[90] == "toothbrush"
    seen = set()
    for ex in builder.as_dataset(split="train"):
        name = ex["image/filename"].numpy().decode()
        want = expected_objects(doc, name)
        obj = ex["image/object"]
        image = next(i for i in doc["images"] if i["file_name"] == name)
        assert ex["image/source_id"].numpy().decode() == str(image["id"])
        for k, coord in enumerate(("xmin", "ymin", "xmax", "ymax")):
            assert _close(obj["bbox"][coord].numpy(), [w["box"][k] for w in want]), (name, coord)
        assert list(obj["class"]["label"].numpy()) == [w["label"] for w in want]
        assert [label.int2str(i) for i in obj["class"]["label"].numpy()] == [w["text"] for w in want]
        assert [t.decode() for t in obj["class"]["text"].numpy()] == [w["text"] for w in want]
        assert list(obj["is_crowd"].numpy()) == [w["crowd"] for w in want]
        assert _close(obj["area"].numpy(), [w["area"] for w in want])
        masks = obj["mask"].numpy()
        assert masks.shape[0] == len(want) and (not want or masks.shape[1:] == (image["height"], image["width"], 1))
        if name == "c.jpg":
            assert (masks[0, :, :, 0] == mask_of(60, 80)).all()  # the compressed RLE
        seen.add(name)
    assert seen == {"a.jpg", "c.jpg", "d.jpg", "sub/b.png"}


@pytest.mark.unit
def test_tfds_metadata_is_skipped_for_a_category_name_tfds_would_change():
    info = {"compression": "none", "labels": None, "categories": [{"id": 1, "name": " cat"}]}
    assert "leading or trailing spaces" in tfds_metadata.skip_reason(DatasetInfo.from_json(info))
    assert tfds_metadata.skip_reason(DatasetInfo.from_json({**info, "categories": [{"id": 1, "name": "cat"}]})) is None


def _by_name(ds: Any) -> dict[str, Any]:
    return {ex["image/filename"].numpy().decode(): ex for ex in ds}


def test_raw_load_reads_the_object_lists(detection):
    """reader.load without options: each object key a 1-D list (empty for a negative), ragged when batched."""
    from beam_pipeline import reader

    out, doc = detection
    rows = _by_name(reader.load(str(out), "train", shuffle=False))
    assert sorted(rows) == ["a.jpg", "c.jpg", "d.jpg", "sub/b.png"]
    for name, row in rows.items():
        want = expected_objects(doc, name)
        assert _close(row["image/object/bbox/ymax"].numpy(), [w["box"][3] for w in want])
        assert list(row["image/object/class/label"].numpy()) == [w["label"] for w in want]
    [batch] = list(reader.load(str(out), "train", shuffle=False, batch_size=4))
    assert [len(v) for v in batch["image/object/class/label"].to_list()] == [
        len(expected_objects(doc, n.decode())) for n in batch["image/filename"].numpy()
    ]


def test_load_objects_gives_images_boxes_and_classes_as_the_json_says(detection):
    """objects=True: uint8 image, [N, 4] boxes (ymin, xmin, ymax, xmax, normalized), ids, crowd, area, masks."""
    from beam_pipeline import reader

    out, doc = detection
    ids = {i["id"]: i for i in doc["images"]}
    seen = set()
    for ex in reader.load(str(out), "train", shuffle=False, objects=True, masks=True):
        image = ids[int(ex["source_id"].numpy())]
        want = expected_objects(doc, image["file_name"])
        assert ex["image"].dtype.name == "uint8" and ex["image"].shape == (image["height"], image["width"], 3)
        boxes = ex["boxes"].numpy()
        assert boxes.dtype.name == "float32" and boxes.shape == (len(want), 4)
        for got, w in zip(boxes, want, strict=True):
            xmin, ymin, xmax, ymax = w["box"]
            assert _close(got, [ymin, xmin, ymax, xmax])
        assert ex["classes"].dtype.name == "int64" and list(ex["classes"].numpy()) == [w["label"] for w in want]
        assert list(ex["is_crowd"].numpy()) == [bool(w["crowd"]) for w in want]
        assert _close(ex["area"].numpy(), [w["area"] for w in want])
        masks = ex["masks"].numpy()
        assert masks.dtype.name == "uint8" and masks.shape == (len(want), image["height"], image["width"])
        if image["file_name"] == "c.jpg":
            assert (masks[0] == mask_of(60, 80)).all()
        seen.add(image["file_name"])
    assert seen == {"a.jpg", "c.jpg", "d.jpg", "sub/b.png"}


def test_load_objects_batches_as_ragged_tensors(detection):
    """With batch_size, images and per-object values batch as RaggedTensors (sizes and object counts differ)."""
    import tensorflow as tf

    from beam_pipeline import reader

    out, doc = detection
    ids = {i["id"]: i for i in doc["images"]}
    [batch] = list(reader.load(str(out), "train", shuffle=False, objects=True, batch_size=4))
    assert "masks" not in batch
    assert isinstance(batch["boxes"], tf.RaggedTensor) and isinstance(batch["image"], tf.RaggedTensor)
    for k, source_id in enumerate(batch["source_id"].numpy()):
        image = ids[int(source_id)]
        want = expected_objects(doc, image["file_name"])
        assert batch["boxes"][k].shape == (len(want), 4) and list(batch["classes"][k].numpy()) == [
            w["label"] for w in want
        ]
        assert batch["image"][k].to_tensor().shape == (image["height"], image["width"], 3)


def test_load_objects_refuses_a_dataset_without_objects(tmp_path):
    from beam_pipeline import reader

    from .imagegen import image_bytes, write

    write(str(tmp_path / "in" / "cat" / "a.png"), image_bytes("png"))
    convert("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"))
    with pytest.raises(ValueError, match="no objects"):
        reader.load(str(tmp_path / "out"), "train", objects=True)


def _damage(out: Path, file_name: str, change: Callable[[dict[str, list[Any]]], None]) -> str:
    """Rewrites the shard holding ``file_name`` with that record's features changed (frames and CRCs valid,
    written by the project's own Example builder and framing); returns the shard's name."""
    from beam_pipeline.examples import build_example, parse_example
    from beam_pipeline.formats.tfrecord import frame_record
    from beam_pipeline.inspection import iter_records

    for split in load_info(out)["splits"].values():
        for shard in split["shards"]:
            path = out / shard["file"]
            records = list(iter_records(str(path)))
            for k, record in enumerate(records):
                ex = parse_example(record)
                if ex["image/filename"] == [file_name.encode()]:
                    change(ex)
                    records[k] = build_example(ex)
                    frames = (frame_record(r) for r in records)
                    path.write_bytes(b"".join(head + r + tail for r, (head, tail) in zip(records, frames, strict=True)))
                    return shard["file"]
    raise AssertionError(f"{file_name} not in {out}")


def _png(height: int, width: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ones((height, width), np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _set(key: str, index: int, value: Any) -> Callable[[dict[str, list[Any]]], None]:
    def change(ex: dict[str, list[Any]]) -> None:
        ex[key][index] = value

    return change


def _drop(key: str) -> Callable[[dict[str, list[Any]]], None]:
    def change(ex: dict[str, list[Any]]) -> None:
        ex[key] = ex[key][:-1]

    return change


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_set("image/object/bbox/xmax", 1, 1.2), "image/object/bbox/xmax[1] is 1.2, outside [0, 1]"),
        (_set("image/object/bbox/ymin", 0, -0.5), "image/object/bbox/ymin[0] is -0.5, outside [0, 1]"),
        (_set("image/object/bbox/xmin", 0, 0.9), "object 0: xmin 0.9 > xmax"),
        (_set("image/object/bbox/ymax", 0, 0.1), "object 0: ymin 0.208333 > ymax 0.1"),
        (_drop("image/object/class/text"), "image/object/class/text has 1 values, the boxes 2"),
        (_drop("image/object/is_crowd"), "image/object/is_crowd has 1 values, the boxes 2"),
        (_drop("image/object/area"), "image/object/area has 1 values, the boxes 2"),
        (_drop("image/object/bbox/ymin"), "image/object/bbox/ymin has 1 values, the boxes 2"),
        (_set("image/object/class/label", 1, 2), "object 1: class id 2 is not a category of dataset.json"),
        (_set("image/object/class/text", 0, b"car"), "object 0: class text 'car', category 1 is 'person'"),
        (_drop("image/object/mask"), "1 masks for 2 objects"),
        (_set("image/object/mask", 1, _png(10, 64)), "mask 1 decodes to 10x64x1, the image is 48x64"),
        (_set("image/object/mask", 0, b"not a png"), "mask 0 is not a PNG"),
    ],
)
def test_verify_names_a_damaged_object(detection, tmp_path, change, words):
    import io
    import shutil

    from beam_pipeline import inspection

    out, _ = detection
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shard = _damage(copy, "a.jpg", change)
    with pytest.raises(inspection.VerifyError) as caught:
        inspection.verify(str(copy), DatasetInfo.from_json(load_info(copy)), stream=io.StringIO())
    assert shard in str(caught.value) and words in str(caught.value), str(caught.value)


def test_verify_fails_in_one_line_on_a_box_outside_the_image(detection, tmp_path):
    import shutil

    from .conftest import run_cli

    out, _ = detection
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shard = _damage(copy, "c.jpg", _set("image/object/bbox/xmax", 0, 1.2))
    result = run_cli("inspect", str(copy), "--verify")
    assert result.returncode == 1, result.stdout
    assert f"{shard} record" in result.stderr and "image/object/bbox/xmax[0] is 1.2, outside [0, 1]" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_verify_passes_a_good_detection_dataset_and_says_what_it_checked(detection):
    from .conftest import run_cli

    out, _ = detection
    result = run_cli("inspect", str(out), "--verify")
    assert result.returncode == 0, result.stderr
    assert "verified 4 records" in result.stdout and "object boxes, ids and masks" in result.stdout


def test_contact_sheet_draws_the_box_the_mask_outline_and_nothing_else(tmp_path):
    """One plain grey 248 x 186 image with one box and a triangle mask: on its 124 x 93 thumbnail the class's
    colour lies on the box's edges and along the triangle's edges, and nowhere in the plain regions."""
    import numpy as np
    from PIL import Image

    from beam_pipeline import contact_sheet

    from .conftest import run_cli

    root = tmp_path / "in"
    root.mkdir()
    Image.new("RGB", (248, 186), (128, 128, 128)).save(root / "plain.png")
    doc = {
        "images": [{"id": 1, "file_name": "plain.png", "width": 248, "height": 186}],
        "annotations": [
            {
                "id": 1,
                "image_id": 1,
                "category_id": 3,
                "bbox": [40, 40, 160, 120],
                "area": 4800.0,
                "iscrowd": 0,
                "segmentation": [[60, 60, 180, 60, 60, 140]],
            },  # fmt: skip
        ],
        "categories": [{"id": 3, "name": "car"}],
    }
    (tmp_path / "instances.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(tmp_path / "instances.json"), "--output", str(out))
    sheet = tmp_path / "sheet.png"
    result = run_cli("inspect", str(out), "--contact-sheet", str(sheet))
    assert result.returncode == 0, result.stderr
    pixels = np.asarray(Image.open(sheet).convert("RGB")).astype(int)
    # the thumbnail is 124 x 93 (scale 0.5), centred in the 128 x 128 tile: its corner is at (2, 17)
    left, top = 2, 17
    colour = pixels[top + 60, left + 20]  # on the box's left edge (x = 40, y = 120 in the image)
    assert tuple(colour) != (128, 128, 128), "no box drawn"
    assert tuple(colour) == contact_sheet.object_colour(3)

    def coloured_near(x: float, y: float) -> bool:  # (x, y) in image pixels; within a pixel on the thumbnail
        cx, cy = left + round(x / 2), top + round(y / 2)
        patch = pixels[cy - 1 : cy + 2, cx - 1 : cx + 2]
        return bool((np.abs(patch - colour).sum(axis=-1) == 0).any())

    def plain(x0: int, y0: int, x1: int, y1: int) -> bool:  # image pixels; every thumbnail pixel grey
        region = pixels[top + y0 // 2 : top + y1 // 2, left + x0 // 2 : left + x1 // 2]
        return region.size > 0 and bool((region == 128).all())

    # the box [40, 40] - [200, 160]: all four edges
    assert all(coloured_near(40, y) for y in range(100, 150, 6)), "left edge"
    assert all(coloured_near(199, y) for y in range(60, 150, 6)), "right edge"
    assert all(coloured_near(x, 40) for x in range(120, 190, 6)), "top edge"
    assert all(coloured_near(x, 159) for x in range(60, 190, 6)), "bottom edge"
    # the triangle (60, 60), (180, 60), (60, 140): its top side and its hypotenuse (x = 180 - 1.5 (y - 60))
    assert all(coloured_near(x, 61) for x in range(90, 170, 6)), "mask top side"
    assert all(coloured_near(180 - 1.5 * (y - 60), y) for y in range(70, 130, 6)), "mask hypotenuse"
    assert plain(66, 70, 84, 96), "inside the mask"
    assert plain(150, 140, 190, 154), "inside the box, outside the mask"
    assert plain(206, 40, 240, 180), "outside the box"
    assert not coloured_near(10, 10) and not coloured_near(220, 100)


def test_the_tft_analysis_of_a_default_coco_run_reads_back(detection):
    """Default flags ran the TFT analysis on the detection set: transform_fn exists and reader.load(transformed=
    True) gives every record's image, resized and padded, the same pixels as the raw image through the graph."""
    from beam_pipeline import reader

    out, _ = detection
    info = load_info(out)
    assert (out / "transform_fn").is_dir() and (out / "transformed_metadata").is_dir()
    size = info["transform"]["image_size"]
    import numpy as np
    import tensorflow as tf

    from beam_pipeline.analysis import decode_resized

    # traced like the TFT graph (image size unknown until run time: resize_with_pad rounds as it does there)
    graph = tf.function(lambda encoded: decode_resized(encoded, size), input_signature=[tf.TensorSpec([], tf.string)])
    rows = list(reader.load(str(out), "train", transformed=True, shuffle=False))
    raw = list(reader.load(str(out), "train", shuffle=False))
    assert len(rows) == len(raw) == info["splits"]["train"]["examples"] == 4
    for row, ex in zip(rows, raw, strict=True):
        assert row["image"].shape == (size, size, 3) and row["image"].dtype.name == "float32"
        want = graph(ex["image/encoded"]).numpy()
        assert want.max() > 0 and not np.allclose(want, want.mean())  # a real picture, not padding
        np.testing.assert_allclose(row["image"].numpy(), want, atol=1e-5)


def test_a_classification_run_over_a_detection_output_leaves_no_object_class_names(tmp_path):
    """The TFDS object class-names file is one of the tool's published files: a later run into the same
    folder that has no objects removes it (a stale one would sit beside features.json without a feature)."""
    from .imagegen import image_bytes, write

    root = tmp_path / "images"
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(make_coco(root)))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out), "--max-reject-fraction", "1", tfds=True)
    assert (out / tfds_metadata.OBJECT_LABEL_NAMES).exists()
    write(str(tmp_path / "cls" / "cat" / "a.png"), image_bytes("png"))
    convert("--input", str(tmp_path / "cls"), "--output", str(out), "--overwrite", tfds=True)
    assert not (out / tfds_metadata.OBJECT_LABEL_NAMES).exists()
    assert "image/object" not in (out / "features.json").read_text()


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("label_map.pbtxt", "item {\n  id: 1\n  name: 'person'\n}\n"),  # three categories missing
        ("labels.txt", "background\nperson\n"),  # ids 2-90 gone: class ids would not index it
    ],
)
def test_verify_checks_the_category_files_against_dataset_json(detection, tmp_path, name, text):
    import io
    import shutil

    from beam_pipeline import inspection

    out, _ = detection
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / name).write_text(text)
    with pytest.raises(inspection.VerifyError, match=f"{name}: does not name dataset.json's categories"):
        inspection.verify(str(copy), DatasetInfo.from_json(load_info(copy)), stream=io.StringIO())


def test_tfds_and_reader_load_a_voc_dataset_with_names_only_ids(tmp_path):
    """--voc: TFDS's image/object carries the poses as view and the 1…N ids as a ClassLabel over labels.txt;
    reader.load(objects=True) gives the same ids; --verify passes."""
    import tensorflow_datasets as tfds

    from beam_pipeline import reader

    from .conftest import run_cli
    from .test_voc import IDS, make_voc

    images, annotations = make_voc(tmp_path / "voc")
    # TFDS's Image feature decodes a GIF or WebP record to [1, H, W, 3] and fails (docs/output.md): not this
    # test's subject
    for name in ("000003.webp", "000004.gif"):
        (images / name).unlink()
        (annotations / name.replace(name.split(".")[1], "xml")).unlink()
    out = tmp_path / "out"
    convert("--input", str(images), "--voc", str(annotations), "--output", str(out), "--max-reject-fraction", "1",
            tfds=True)  # fmt: skip
    builder = tfds.builder_from_directory(str(out))
    label = builder.info.features["image/object"]["class"]["label"]
    assert label.names == (out / "labels.txt").read_text().splitlines() and label.names[IDS["dog"]] == "dog"
    rows = {ex["image/filename"].numpy().decode(): ex["image/object"] for ex in builder.as_dataset(split="train")}
    one = rows["000001.jpg"]
    assert list(one["class"]["label"].numpy()) == [IDS["dog"], IDS["cat"]]
    assert [v.decode() for v in one["view"].numpy()] == ["Left", "Frontal"]
    assert list(one["difficult"].numpy()) == [1, 0] and list(one["truncated"].numpy()) == [0, 1]
    assert _close(one["bbox"]["xmax"].numpy(), [1.0, 30.5 / 64])
    loaded = {
        ex["source_id"].numpy().decode(): ex for ex in reader.load(str(out), "train", objects=True, shuffle=False)
    }
    assert list(loaded["000001.jpg"]["classes"].numpy()) == [IDS["dog"], IDS["cat"]]
    assert list(loaded["000001.jpg"]["difficult"].numpy()) == [True, False]
    verify = run_cli("inspect", str(out), "--verify")
    assert verify.returncode == 0, verify.stderr


def test_an_array_record_detection_output_decodes_to_what_load_objects_gives(detection, tmp_path):
    """--format array_record with the TFT analysis and TFDS metadata: reader.decode(objects=True, masks=True),
    numpy without TensorFlow, gives load(objects=True, masks=True)'s values for every record (JPEG pixels: as
    TensorFlow's accurate DCT decodes them, which Pillow's libjpeg uses; its default fast one differs a little)."""
    import tensorflow as tf

    from beam_pipeline import reader
    from beam_pipeline.examples import parse_example

    out, doc = detection
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    arr = tmp_path / "arr"
    convert("--input", str(out.parent / "images"), "--coco", str(path), "--output", str(arr), "--max-reject-fraction",
            "1", "--format", "array_record", transform=True, tfds=True)  # fmt: skip
    assert load_info(arr)["transform"] == load_info(out)["transform"]  # the statistics read the same records
    want = {
        ex["source_id"].numpy(): ex for ex in reader.load(str(out), "train", shuffle=False, objects=True, masks=True)
    }
    source = reader.source(str(arr), "train")
    assert len(source) == len(want) == 4
    for i in range(len(source)):
        got = reader.decode(source[i], objects=True, masks=True)
        ex = want[got["source_id"]]
        for key in ("boxes", "classes", "is_crowd", "area", "difficult", "masks", "height", "width"):
            value = ex[key].numpy()
            assert got[key].dtype == value.dtype and got[key].shape == value.shape and (got[key] == value).all(), key
        encoded = parse_example(source[i])["image/encoded"][0]
        if encoded[:2] == b"\xff\xd8":
            image = tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        else:
            image = ex["image"].numpy()
        assert got["image"].dtype == image.dtype and (got["image"] == image).all()
