"""--coco: a generated COCO instances set converted with the CLI, read back with TensorFlow's OD API feature spec."""

from __future__ import annotations

import copy
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from beam_pipeline.annotations import coco, objects
from beam_pipeline.errors import UsageError
from beam_pipeline.vocab import reasons

from .conftest import convert, load_info, run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e

# Non-contiguous ids, as COCO's (80 categories with ids 1-90).
CATEGORIES = [
    {"id": 1, "name": "person"},
    {"id": 3, "name": "car"},
    {"id": 7, "name": "train"},
    {"id": 90, "name": "toothbrush"},
]
RLE = {"counts": [0, 100, 48 * 64 - 100], "size": [48, 64]}  # uncompressed: the first 100 pixels, column-major
POLYGON = [[10.0, 10.0, 30.0, 10.0, 30.0, 25.0]]


def mask_of(height: int, width: int) -> Any:
    """The mask compressed_rle encodes: a 15 x 20 block."""
    import numpy as np

    mask = np.zeros((height, width), np.uint8)
    mask[5:20, 10:30] = 1
    return mask


def compressed_rle(height: int, width: int) -> dict[str, Any]:
    """A compressed RLE as COCO files hold them (counts as a string), made with pycocotools."""
    import numpy as np
    from pycocotools import mask as coco_mask

    rle = coco_mask.encode(np.asfortranarray(mask_of(height, width)))
    return {"size": rle["size"], "counts": rle["counts"].decode("ascii")}


def make_coco(root: Path) -> dict[str, Any]:
    """Images under ``root`` and a COCO dict naming them, with every case of the issue's validation list."""
    files = {
        "a.jpg": ("jpeg", 48, 64),
        "sub/b.png": ("png", 40, 50),
        "c.jpg": ("jpeg", 60, 80),
        "d.jpg": ("jpeg", 30, 30),
        "dup.jpg": ("jpeg", 20, 20),
        "e.jpg": ("jpeg", 20, 20),
        "f.jpg": ("jpeg", 20, 20),
        "wrong.jpg": ("jpeg", 20, 20),
        "extra.jpg": ("jpeg", 20, 20),  # not in the JSON: skipped
    }
    for i, (name, (kind, h, w)) in enumerate(files.items()):
        write(str(root / name), image_bytes(kind, height=h, width=w, seed=i))
    images = [
        {"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
        {"id": 2, "file_name": "sub/b.png", "width": 50, "height": 40},  # no annotations: a negative
        {"id": 5, "file_name": "c.jpg", "width": 80, "height": 60},
        {"id": 6, "file_name": "d.jpg", "width": 30, "height": 30},  # every annotation rejected
        {"id": 7, "file_name": "missing.jpg", "width": 10, "height": 10},  # missing_image
        {"id": 8, "file_name": "dup.jpg", "width": 20, "height": 20},  # duplicate_file_name
        {"id": 9, "file_name": "dup.jpg", "width": 20, "height": 20},
        {"id": 10, "file_name": "e.jpg", "width": 20, "height": 20},  # duplicate_image_id
        {"id": 10, "file_name": "f.jpg", "width": 20, "height": 20},
        {"id": 12, "file_name": "wrong.jpg", "width": 100, "height": 100},  # annotation_size_mismatch
    ]
    annotations = [
        {
            "id": 101,
            "image_id": 1,
            "category_id": 1,
            "bbox": [10, 10, 20, 15],
            "area": 150.5,
            "iscrowd": 0,
            "segmentation": POLYGON,
        },
        {
            "id": 102,
            "image_id": 1,
            "category_id": 90,
            "bbox": [0, 0, 64, 48],
            "area": 20.0,
            "iscrowd": 1,
            "segmentation": RLE,
        },
        {
            "id": 201,
            "image_id": 5,
            "category_id": 7,
            "bbox": [-0.5, 2, 30, 40],
            "area": 900.0,
            "iscrowd": 0,
            "segmentation": compressed_rle(60, 80),
        },
        {"id": 202, "image_id": 5, "category_id": 3, "bbox": [60, 10, 22, 5], "area": 1.0, "iscrowd": 0},
        {"id": 203, "image_id": 5, "category_id": 3, "bbox": [5, 5, 0, 5], "area": 1.0, "iscrowd": 0},
        {"id": 204, "image_id": 5, "category_id": 2, "bbox": [5, 5, 5, 5], "area": 1.0, "iscrowd": 0},
        {
            "id": 205,
            "image_id": 5,
            "category_id": 3,
            "bbox": [1, 2, 3, 4],
            "iscrowd": 0,  # no area: the box's
            "segmentation": [[1.0, 2.0, 4.0, 2.0, 4.0, 6.0, 1.0, 6.0]],
        },
        {
            "id": 206,
            "image_id": 5,
            "category_id": 3,
            "bbox": [1, 2, 3, 4],
            "iscrowd": 1,
            "segmentation": {"counts": [0, 100], "size": [10, 10]},
        },  # mask_size_mismatch
        {
            "id": 207,
            "image_id": 5,
            "category_id": 3,
            "bbox": [1, 2, 3, 4],
            "iscrowd": 0,
            "segmentation": [[1, 2, 3]],
        },  # bad_mask
        {"id": 301, "image_id": 6, "category_id": 1, "bbox": [1, 1, -3, 4], "area": 1.0, "iscrowd": 0},
        {"id": 401, "image_id": 999, "category_id": 1, "bbox": [1, 1, 3, 4], "area": 1.0, "iscrowd": 0},
        {"id": 501, "image_id": 12, "category_id": 1, "bbox": [1, 1, 3, 4], "area": 12.0, "iscrowd": 0},
    ]
    return {"info": {}, "images": images, "annotations": annotations, "categories": CATEGORIES}


def od_api_spec(tf: Any) -> dict[str, Any]:
    """The feature spec Model Garden's TfExampleDecoder parses (plus the OD API's VOC keys)."""
    var = tf.io.VarLenFeature
    return {
        "image/encoded": tf.io.FixedLenFeature((), tf.string),
        "image/height": tf.io.FixedLenFeature((), tf.int64, -1),
        "image/width": tf.io.FixedLenFeature((), tf.int64, -1),
        "image/source_id": tf.io.FixedLenFeature((), tf.string),
        "image/filename": tf.io.FixedLenFeature((), tf.string),
        **{f"image/object/bbox/{k}": var(tf.float32) for k in ("xmin", "ymin", "xmax", "ymax")},
        "image/object/class/label": var(tf.int64),
        "image/object/class/text": var(tf.string),
        "image/object/area": var(tf.float32),
        "image/object/is_crowd": var(tf.int64),
        "image/object/difficult": var(tf.int64),
        "image/object/truncated": var(tf.int64),
        "image/object/mask": var(tf.string),
    }


def parsed_records(out: Path, tf: Any) -> dict[str, dict[str, Any]]:
    """{image/filename: parsed features (dense numpy)} of every record, parsed with the OD API spec."""
    info = load_info(out)
    spec = od_api_spec(tf)
    rows = {}
    for split in info["splits"].values():
        for shard in split["shards"]:
            for raw in tf.data.TFRecordDataset(str(out / shard["file"])):
                parsed = tf.io.parse_single_example(raw, spec)
                row = {
                    k: (tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v).numpy()
                    for k, v in parsed.items()
                }
                rows[row["image/filename"].decode()] = row
    return rows


def expected_objects(doc: dict[str, Any], file_name: str) -> list[dict[str, Any]]:
    """What the JSON says one image's written objects are: the valid annotations in file order, boxes clipped
    within a pixel and normalized, area as given (the box's when none is)."""
    image = next(i for i in doc["images"] if i["file_name"] == file_name)
    names = {c["id"]: c["name"] for c in doc["categories"]}
    w, h = image["width"], image["height"]
    out = []
    for ann in (a for a in doc["annotations"] if a["image_id"] == image["id"]):
        x, y, bw, bh = ann["bbox"]
        if ann["category_id"] not in names or bw <= 0 or bh <= 0 or x + bw > w + 1 or y + bh > h + 1:
            continue
        seg = ann.get("segmentation")
        if isinstance(seg, dict) and seg["size"] != [h, w] or isinstance(seg, list) and len(seg[0]) < 6:
            continue  # mask_size_mismatch, bad_mask
        box = (max(x, 0) / w, max(y, 0) / h, min(x + bw, w) / w, min(y + bh, h) / h)
        area = ann.get("area", (min(x + bw, w) - max(x, 0)) * (min(y + bh, h) - max(y, 0)))
        out.append(
            {
                "box": box,
                "label": ann["category_id"],
                "text": names[ann["category_id"]],
                "crowd": ann["iscrowd"],
                "area": area,
            }
        )
    return out


@pytest.fixture(scope="module")
def coco_set(tmp_path_factory):
    base = tmp_path_factory.mktemp("coco")
    root = base / "images"
    doc = make_coco(root)
    path = base / "instances.json"
    path.write_text(json.dumps(doc))
    return root, path, doc


@pytest.fixture(scope="module")
def converted(coco_set, tmp_path_factory):
    """One conversion with default flags (TFT analysis and TFDS metadata included), rejects allowed."""
    root, path, _ = coco_set
    out = tmp_path_factory.mktemp("coco-out") / "det"
    result = convert(
        "--input",
        str(root),
        "--coco",
        str(path),
        "--output",
        str(out),
        "--max-reject-fraction",
        "1",
        transform=True,
        tfds=True,
    )
    return out, result


def test_boxes_classes_crowd_areas_and_source_ids_read_back_as_the_json_says(converted, coco_set, tf):
    out, _ = converted
    _, _, doc = coco_set
    rows = parsed_records(out, tf)
    assert sorted(rows) == ["a.jpg", "c.jpg", "d.jpg", "sub/b.png"]
    ids = {i["file_name"]: i["id"] for i in doc["images"]}
    for name, row in rows.items():
        assert row["image/source_id"].decode() == str(ids[name])
        want = expected_objects(doc, name)
        got_boxes = list(zip(*(row[f"image/object/bbox/{k}"] for k in ("xmin", "ymin", "xmax", "ymax")), strict=True))
        assert len(got_boxes) == len(want)
        for box, w in zip(got_boxes, want, strict=True):
            assert all(math.isclose(g, e, abs_tol=1e-6) for g, e in zip(box, w["box"], strict=True)), (name, box, w)
        assert list(row["image/object/class/label"]) == [w["label"] for w in want]
        assert [t.decode() for t in row["image/object/class/text"]] == [w["text"] for w in want]
        assert list(row["image/object/is_crowd"]) == [w["crowd"] for w in want]
        assert all(
            math.isclose(g, w["area"], rel_tol=1e-6) for g, w in zip(row["image/object/area"], want, strict=True)
        )
        assert list(row["image/object/difficult"]) == [0] * len(want)
        assert list(row["image/object/truncated"]) == [0] * len(want)
    # the clipped box (x = -0.5) starts at 0; the crowd box is the whole image
    assert rows["c.jpg"]["image/object/bbox/xmin"][0] == 0.0
    assert list(rows["a.jpg"]["image/object/is_crowd"]) == [0, 1]
    assert len(rows["sub/b.png"]["image/object/class/label"]) == 0  # a negative
    assert len(rows["d.jpg"]["image/object/class/label"]) == 0  # every object rejected: still an image


def test_masks_from_polygons_and_both_rles_are_pngs_at_image_size(converted, coco_set, tf):
    """image/object/mask: one PNG per object, the image's size, 0/1 as pycocotools rasterizes the JSON."""
    import numpy as np
    from pycocotools import mask as coco_mask

    out, _ = converted
    rows = parsed_records(out, tf)

    def masks(name: str) -> list[Any]:
        return [tf.io.decode_png(png, channels=1).numpy()[:, :, 0] for png in rows[name]["image/object/mask"]]

    polygon, crowd = masks("a.jpg")  # 48 x 64: a polygon (101) and an uncompressed crowd RLE (102)
    want = np.amax(coco_mask.decode(coco_mask.frPyObjects(POLYGON, 48, 64)), axis=2)
    assert polygon.shape == (48, 64) and polygon.max() == 1 and (polygon == want).all()
    assert crowd.sum() == 100 and crowd[:, 0].all() and crowd[:, 1].all() and crowd[:4, 2].all()
    compressed, square = masks("c.jpg")  # 60 x 80: a compressed RLE (201) and a polygon (205)
    assert (compressed == mask_of(60, 80)).all()
    assert square.shape == (60, 80) and square[3, 2] == 1 and square[10, 10] == 0
    assert masks("sub/b.png") == []


@pytest.mark.smoke
def test_every_validation_reason_with_its_path(converted):
    out, _ = converted
    rejects = {(r["path"], r["reason"]) for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert rejects == {
        ("missing.jpg", reasons.MISSING_IMAGE),
        ("dup.jpg", reasons.DUPLICATE_FILE_NAME),
        ("e.jpg", reasons.DUPLICATE_IMAGE_ID),
        ("f.jpg", reasons.DUPLICATE_IMAGE_ID),
        ("wrong.jpg", reasons.ANNOTATION_SIZE_MISMATCH),
    }
    lines = [json.loads(line) for line in (out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines()]
    got = {(r["annotation_id"], r["reason"], r["path"], r.get("object")) for r in lines}
    assert got == {
        (202, reasons.BOX_OUTSIDE_IMAGE, "c.jpg", 1),
        (203, reasons.BAD_BOX, "c.jpg", 2),
        (204, reasons.UNKNOWN_CATEGORY, "c.jpg", 3),
        (206, reasons.MASK_SIZE_MISMATCH, "c.jpg", 5),
        (207, reasons.BAD_MASK, "c.jpg", 6),
        (301, reasons.BAD_BOX, "d.jpg", 0),
        (401, reasons.UNKNOWN_IMAGE_ID, str(Path(load_info(out)["config"]["coco"]).resolve()), None),
    }
    assert all(r["detail"] for r in lines)
    info = load_info(out)
    assert info["rejects"]["by_reason"] == {
        reasons.DUPLICATE_IMAGE_ID: 2,
        reasons.ANNOTATION_SIZE_MISMATCH: 1,
        reasons.DUPLICATE_FILE_NAME: 1,
        reasons.MISSING_IMAGE: 1,
    }
    assert info["skipped"]["by_reason"] == {coco.NOT_IN_COCO: 1}
    assert info["objects"] == {
        "kept": 2 + 2,  # a.jpg, c.jpg: the objects in the records (not wrong.jpg's, whose image the writer rejects)
        "rejects": {
            "total": 7,
            "by_reason": {
                reasons.BAD_BOX: 2,
                reasons.BAD_MASK: 1,
                reasons.BOX_OUTSIDE_IMAGE: 1,
                reasons.UNKNOWN_IMAGE_ID: 1,
                reasons.MASK_SIZE_MISMATCH: 1,
                reasons.UNKNOWN_CATEGORY: 1,
            },
        },
        coco.IMAGES_WITHOUT_OBJECTS: 1,
        coco.IMAGES_ALL_REJECTED: 1,
        "polygons_dropped": 0,
    }


def test_label_map_labels_txt_and_dataset_json(converted):
    out, result = converted
    assert (out / "_SUCCESS").exists()
    assert (out / "transform_fn").is_dir(), result.stdout  # the TFT analysis ran with default flags
    assert (out / objects.LABEL_MAP_PBTXT).read_text() == (
        "item {\n  id: 1\n  name: 'person'\n}\n"
        "item {\n  id: 3\n  name: 'car'\n}\n"
        "item {\n  id: 7\n  name: 'train'\n}\n"
        "item {\n  id: 90\n  name: 'toothbrush'\n}\n"
    )
    lines = (out / "labels.txt").read_text().splitlines()
    assert len(lines) == 91 and lines[0] == "background" and lines[2] == "unused_2"
    assert [lines[c["id"]] for c in CATEGORIES] == [c["name"] for c in CATEGORIES]
    info = load_info(out)
    assert info["categories"] == CATEGORIES
    assert info["labels"] is None and "image/class/label" not in info["features"]
    assert info["features"]["image/object/bbox/xmin"]["dtype"] == "float32"
    verify = run_cli("inspect", str(out), "--verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.unit
def test_label_map_quotes_names():
    assert objects.label_map_pbtxt([(2, "it's"), (1, "a\\b")]) == (
        "item {\n  id: 1\n  name: 'a\\\\b'\n}\nitem {\n  id: 2\n  name: 'it\\'s'\n}\n"
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    ("box", "want"),
    [
        ([1, 2, 3, 4], (1.0, 2.0, 4.0, 6.0)),
        ([-1, -1, 11, 11], (0.0, 0.0, 10.0, 10.0)),  # one pixel over each edge: clipped
        ([-1.01, 0, 5, 5], reasons.BOX_OUTSIDE_IMAGE),
        ([0, 0, 5, 11.5], reasons.BOX_OUTSIDE_IMAGE),
        ([0, 0, 0, 5], reasons.BAD_BOX),
        ([0, 0, 5, -1], reasons.BAD_BOX),
        ([0, float("nan"), 5, 5], reasons.BAD_BOX),
        ([0, 0, float("inf"), 5], reasons.BAD_BOX),
        ([0, 0, "5", 5], reasons.BAD_BOX),
        ([0, 0, 5], reasons.BAD_BOX),
        ([10.5, 0, 0.4, 5], reasons.BAD_BOX),  # nothing left inside once clipped
    ],
)
def test_check_box(box, want):
    got = objects.check_box(box, 10, 10)
    assert (got.reason if isinstance(got, objects.Invalid) else got) == want


@pytest.mark.unit
def test_read_categories_refuses_a_bad_file_in_one_line(tmp_path):
    def categories(cats: Any) -> Path:
        path = tmp_path / "c.json"
        path.write_text(json.dumps({"images": [], "categories": cats}))
        return path

    assert coco.read_categories(str(categories(CATEGORIES))).pairs == (
        (1, "person"),
        (3, "car"),
        (7, "train"),
        (90, "toothbrush"),
    )
    for bad, words in (
        ([], r"no categories \('categories' is an empty list"),  # not "no 'categories'": the key is there
        (None, "'categories' is not a list"),
        ({"1": "a"}, "'categories' is not a list"),
        ([{"id": 1, "name": "a"}, {"id": 1, "name": "b"}], "given twice"),
        ([{"id": "1", "name": "a"}], "integer 'id'"),
        ([{"id": 1, "name": "a\nb"}], "line break"),
        ([{"id": 1, "name": "a\x85b"}], r"'\\x85' \(next line\), a line break"),
    ):
        with pytest.raises(UsageError, match=words):
            coco.read_categories(str(categories(bad)))
    without = tmp_path / "without.json"
    without.write_text(json.dumps({"images": [], "annotations": []}))
    with pytest.raises(UsageError, match="no 'categories' "):
        coco.read_categories(str(without))
    broken = tmp_path / "broken.json"
    broken.write_text('{"categories": [{"id": 1,')
    with pytest.raises(UsageError, match="not valid JSON"):
        coco.read_categories(str(broken))


@pytest.mark.unit
def test_read_categories_gives_what_a_full_parse_gives(tmp_path):
    """The event-built items equal json.load's, whatever else the file holds around and inside them."""
    doc = {
        "info": {"categories": [{"id": 99, "name": "not the top level"}]},
        "images": [{"id": 1, "file_name": "a.jpg", "width": 4, "height": 4}],
        "categories": [
            {"id": 1, "name": "person", "supercategory": "human", "keypoints": ["nose", "eye"], "skeleton": [[1, 2]]},
            {"id": 2, "name": 'ba\u00efl \\ "x"', "extra": {"a": [1.5, None, True, {"b": []}]}},
        ],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": [[0, 0]]}],
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    assert coco.read_categories(str(path)).pairs == ((1, "person"), (2, doc["categories"][1]["name"]))


def test_a_file_nested_too_deep_is_refused_in_one_line_with_flat_memory(tmp_path):
    """40 KB of brackets cost the prefixed parse ~1 GB and seconds (memory grows with depth squared);
    the launcher's scan refuses it at depth 65 with a few MB."""
    import tracemalloc

    path = tmp_path / "deep.json"
    path.write_text('{"junk": ' + "[" * 20_000 + "]" * 20_000 + ', "categories": [{"id": 1, "name": "a"}]}')
    tracemalloc.start()
    try:
        with pytest.raises(UsageError, match=f"nested deeper than {coco.MAX_JSON_DEPTH} levels"):
            coco.read_categories(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, peak
    fine = tmp_path / "fine.json"  # exactly the limit is fine
    nest = coco.MAX_JSON_DEPTH - 1
    fine.write_text('{"junk": ' + "[" * nest + "]" * nest + ', "categories": [{"id": 1, "name": "a"}]}')
    assert coco.read_categories(str(fine)).pairs == ((1, "a"),)
    (tmp_path / "img").mkdir()
    write(str(tmp_path / "img" / "a.jpg"), image_bytes("jpeg"))
    result = run_cli("convert", "--input", str(tmp_path / "img"), "--coco", str(path), "--output", str(tmp_path / "o"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --coco {path}: JSON nested deeper than {coco.MAX_JSON_DEPTH} levels (COCO needs 5)"
    ]


def test_cli_errors_name_the_flag(tmp_path, coco_set):
    root, path, _ = coco_set
    cases = [
        (["--coco", str(tmp_path / "nope.json")], "--coco"),
        (["--coco", str(path), "--dedupe"], "--dedupe"),
        (["--coco", str(path), "--labels-from", "folder"], "--labels-from"),
    ]
    for extra, word in cases:
        result = run_cli("convert", "--input", str(root), "--output", str(tmp_path / "o"), *extra)
        assert result.returncode == 2, result.stderr
        assert word in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"categories": [{"id": 1, "name": "x"},, ]}', "unallowed token"),
        ('{"categories": [{"id": 1, "name": "x"}], "annotations": [{"id": 1,, }]}', "invalid object key"),
    ],
    ids=["in-categories", "in-annotations"],
)
def test_a_coco_file_that_is_not_json_is_a_one_line_error_pointing_near_the_fault(coco_set, tmp_path, text, words):
    """yajl's message spans three lines (the message, a snippet, an arrow): the error is still one line."""
    root, _, _ = coco_set
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    result = run_cli("convert", "--input", str(root), "--coco", str(bad), "--output", str(tmp_path / "o"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --coco {bad}: not valid JSON (parse error: {words}") and ", near '" in line
    assert not (tmp_path / "o").exists()


def test_a_changed_annotation_never_reuses_the_old_record(coco_set, tmp_path):
    """--incremental-from after one image's box changed in the JSON (its file did not): that record is
    converted again with the new box, the others are copied."""
    root, path, doc = coco_set
    first, second = tmp_path / "first", tmp_path / "second"
    convert("--input", str(root), "--coco", str(path), "--output", str(first), "--max-reject-fraction", "1")
    changed = copy.deepcopy(doc)
    ann = next(a for a in changed["annotations"] if a["id"] == 101)
    ann["bbox"] = [12, 11, 20, 15]
    new_path = tmp_path / "instances-v2.json"
    new_path.write_text(json.dumps(changed))
    convert(
        "--input",
        str(root),
        "--coco",
        str(new_path),
        "--output",
        str(second),
        "--max-reject-fraction",
        "1",
        "--incremental-from",
        str(first),
    )
    import tensorflow as tf

    rows = parsed_records(second, tf)
    assert rows["a.jpg"]["image/object/bbox/xmin"][0] == pytest.approx(12 / 64, abs=1e-6)
    inc = load_info(second)["incremental"]
    assert inc["converted"] == 1 and inc["reused"] == 3, inc


def test_a_gs_coco_file_and_images_make_the_same_shards_as_local_files(converted, coco_set, gcs):
    """--input, --coco and --output on the GCS emulator: the same shards, byte for byte, as the local run."""
    from .conftest import BUCKET

    out, _ = converted
    root, path, _ = coco_set
    bucket = gcs.bucket(BUCKET)
    for file in root.rglob("*"):
        if file.is_file():
            bucket.blob(f"coco-in/{file.relative_to(root)}").upload_from_filename(str(file))
    bucket.blob("coco/instances.json").upload_from_filename(str(path))
    convert("--input", f"gs://{BUCKET}/coco-in", "--coco", f"gs://{BUCKET}/coco/instances.json",
            "--output", f"gs://{BUCKET}/coco-out/det", "--max-reject-fraction", "1", "--no_auth")  # fmt: skip
    remote = {b.name[len("coco-out/det/") :]: b for b in gcs.list_blobs(BUCKET, prefix="coco-out/det/")}
    shards = [s["file"] for split in load_info(out)["splits"].values() for s in split["shards"]]
    for name in [*shards, objects.LABEL_MAP_PBTXT, "labels.txt"]:
        assert remote[name].download_as_bytes() == (out / name).read_bytes(), name
    reasons = [
        json.loads(line)["reason"] for line in remote[objects.OBJECT_REJECTS_JSONL].download_as_text().splitlines()
    ]
    assert len(reasons) == 7


@pytest.mark.unit
def test_the_shard_digest_covers_annotations():
    """Resume takes a finished shard only when its images' annotations are the same."""
    from beam_pipeline import resume
    from beam_pipeline.images.options import ImageOptions
    from beam_pipeline.vocab.refs import Ref

    obj = objects.Obj(bbox=(1.0, 2.0, 3.0, 4.0), label=3, text="car")
    ref = Ref("/in/a.jpg", "a.jpg", 10, "train", None, 1, annotations=objects.Annotations("1", 8, 8, (obj,)))
    moved = Ref("/in/a.jpg", "a.jpg", 10, "train", None, 1, annotations=objects.Annotations("1", 8, 8, ()))

    def digest(r: Ref) -> str:
        return resume.shard_digest("train", 0, [r], [], {}, ImageOptions(), "none")

    assert digest(ref) != digest(moved)
    assert digest(ref) == digest(Ref("/in/a.jpg", "a.jpg", 10, "train", None, 1, annotations=ref.annotations))
    # the source's object count is not in the record, but in the shard's image counters (its marker keeps them):
    # an image's rejected annotations deleted from the file change the shard, not the record's digest
    none_left = objects.Annotations("1", 8, 8, (), given=0)
    all_rejected = objects.Annotations("1", 8, 8, (), given=2)
    assert none_left.digest == all_rejected.digest
    assert digest(Ref("/in/a.jpg", "a.jpg", 10, "train", None, 1, annotations=none_left)) != digest(
        Ref("/in/a.jpg", "a.jpg", 10, "train", None, 1, annotations=all_rejected)
    )


@pytest.mark.unit
def test_the_code_digest_covers_subpackages(tmp_path, monkeypatch):
    """A change in writer/ or annotations/ (which build records) is a change of the code that reused records
    and resumed shards must come from."""
    import shutil

    from beam_pipeline import metadata

    copy_dir = tmp_path / "beam_pipeline"
    shutil.copytree(Path(metadata.__file__).parent, copy_dir, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(metadata, "__file__", str(copy_dir / "metadata.py"))
    before = metadata.code_digest.__wrapped__()
    with open(copy_dir / "annotations" / "objects.py", "a") as fh:
        fh.write("\n# changed\n")
    assert metadata.code_digest.__wrapped__() != before


def test_the_summary_counts_objects(converted):
    _, result = converted
    assert "objects             4 kept, 2 images without any" in result.stdout
    assert "objects out         7 (bad_box 2, " in result.stdout and "-> object_rejects.jsonl" in result.stdout
    assert "categories          4 -> label_map.pbtxt, labels.txt" in result.stdout


def test_objects_keep_the_files_order_as_model_garden_writes_them(tmp_path, tf):
    """create_coco_tf_record.py writes an image's objects in the order the file lists them (COCO's own files
    are not in annotation-id order): so do we, whatever order the pipeline's join delivers them in."""
    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=40, width=50, seed=1))
    write(str(root / "b.jpg"), image_bytes("jpeg", height=40, width=50, seed=2))
    listed = [(9, 1, 7), (3, 1, 1), (12, 2, 90), (5, 1, 3), (4, 2, 1), (1, 1, 90)]  # (annotation id, image, class)
    doc = {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 50, "height": 40},
            {"id": 2, "file_name": "b.jpg", "width": 50, "height": 40},
        ],
        "annotations": [
            {"id": aid, "image_id": img, "category_id": cid, "bbox": [aid, 2, 10, 10], "area": float(aid), "iscrowd": 0}
            for aid, img, cid in listed
        ],
        "categories": CATEGORIES,
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out))
    rows = parsed_records(out, tf)
    assert list(rows["a.jpg"]["image/object/area"]) == [9.0, 3.0, 5.0, 1.0]
    assert list(rows["a.jpg"]["image/object/class/label"]) == [7, 1, 3, 90]
    assert list(rows["b.jpg"]["image/object/area"]) == [12.0, 4.0]
    assert [round(x * 50) for x in rows["b.jpg"]["image/object/bbox/xmin"]] == [12, 4]


@pytest.mark.unit
@pytest.mark.parametrize(
    "counts",
    [
        "zzzzzzzz",  # runs far past the image's pixels
        "1",  # one run: far fewer pixels than the image
        "é0",  # not the ASCII alphabet of COCO's compressed counts
        "0\x7f",  # a character outside it
        "P",  # the last character says more follows
    ],
)
def test_a_corrupt_compressed_rle_is_a_bad_mask_not_a_crash_in_the_writer(counts):
    """pycocotools raises (or, in older versions, writes past its buffer) on compressed counts that do not cover
    the image: the check turns them into the object's bad_mask, before the writer rasterizes them."""
    invalid = objects.check_segmentation({"size": [48, 64], "counts": counts}, 64, 48)
    assert isinstance(invalid, objects.Invalid) and invalid.reason == reasons.BAD_MASK, invalid
    assert objects.check_segmentation(compressed_rle(48, 64), 64, 48) is None


@pytest.mark.unit
@pytest.mark.parametrize("far", [1e8, -1e8, 1e300])
def test_a_polygon_point_far_outside_the_image_is_a_bad_mask(far):
    """pycocotools rasterizes a polygon edge pixel by pixel, wherever it goes: one point at 1e8 made the worker
    allocate gigabytes and die (a segfault under a memory limit). A point beyond the image by more than the
    image's own size is refused; nearer ones are clipped by the rasterizer, as before."""
    invalid = objects.check_segmentation([[0.0, 0.0, far, 0.0, 0.0, 10.0]], 20, 20)
    assert isinstance(invalid, objects.Invalid) and invalid.reason == reasons.BAD_MASK, invalid
    assert objects.check_segmentation([[-19.0, 0.0, 39.0, 0.0, 0.0, 39.0]], 20, 20) is None


def test_a_corrupt_compressed_rle_rejects_its_object_and_the_job_finishes(tmp_path, tf):
    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    good = compressed_rle(48, 64)
    long_runs = {**good, "counts": "z" * 400}
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 5, 20, 15], "segmentation": good},
            # runs of 10 pixels: 20 of the image's 3,072 (pycocotools leaves the rest as it finds it), 4,000 (it raises)
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "segmentation": {**good, "counts": "zz"}},
            {"id": 3, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "segmentation": long_runs},
        ],
        "categories": CATEGORIES,
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out))
    rows = parsed_records(out, tf)
    assert len(rows["a.jpg"]["image/object/mask"]) == 1
    rejects = [json.loads(line) for line in (out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines()]
    assert sorted((r["annotation_id"], r["reason"]) for r in rejects) == [(2, reasons.BAD_MASK), (3, reasons.BAD_MASK)]


def test_a_polygon_under_3_points_is_left_out_of_its_objects_mask_and_the_object_kept(tmp_path, tf):
    """A stray 2-point polygon beside good ones (user-made COCO files) used to reject the whole object, box
    included; Model Garden keeps it. Only the polygon goes (a line of object_rejects.jsonl, counted apart from
    the rejects); an object with no polygon of 3 points left is still a bad_mask reject."""
    import numpy as np
    from PIL import Image

    from beam_pipeline.images.options import Geometry

    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    good = [10.0, 10.0, 30.0, 10.0, 30.0, 30.0, 10.0, 30.0]
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "segmentation": [good, [4, 4, 5, 5]]},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "segmentation": [[1, 1, 5, 5]]},
        ],
        "categories": CATEGORIES,
    }  # fmt: skip
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    result = convert("--input", str(root), "--coco", str(path), "--output", str(out))
    assert "polygons out        1" in result.stdout
    row = parsed_records(out, tf)["a.jpg"]
    assert list(row["image/object/class/label"]) == [1]
    [png] = row["image/object/mask"]
    alone = objects.mask_pngs([objects.Obj(bbox=(10, 10, 30, 30), label=1, text="x", segmentation=[good])],
                              Geometry(64, 48, 64, 48))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), np.asarray(Image.open(io.BytesIO(alone[0]))))
    lines = [json.loads(line) for line in (out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines()]
    assert sorted((r["annotation_id"], r["reason"], r.get("polygon")) for r in lines) == [
        (1, objects.POLYGON_DROPPED, 1),
        (2, reasons.BAD_MASK, None),
    ]
    objs = load_info(out)["objects"]
    assert objs["polygons_dropped"] == 1 and objs["kept"] == 1
    assert objs["rejects"] == {"total": 1, "by_reason": {reasons.BAD_MASK: 1}}


@pytest.mark.smoke
def test_a_file_named_by_several_bad_entries_is_one_reject(tmp_path):
    """Merged COCO files repeat entries: an image id given twice for the same file, or two broken entries naming
    it, still make one reject of the listed file, so records + rejects + skipped add up to the files listed."""
    root = tmp_path / "images"
    for name in ("a.jpg", "b.jpg", "c.jpg", "ok.jpg"):
        write(str(root / name), image_bytes("jpeg", height=20, width=20, seed=len(name)))
    entry = {"width": 20, "height": 20}
    doc = {
        "images": [
            {"id": 1, "file_name": "a.jpg", **entry},
            {"id": 1, "file_name": "a.jpg", **entry},  # the same entry twice: duplicate_image_id
            {"id": 2, "file_name": "b.jpg", "width": "20", "height": 20},  # two broken entries
            {"id": 3, "file_name": "b.jpg", "width": 20},
            {"id": 4, "file_name": "c.jpg", **entry},  # a good entry and a broken one
            {"id": 5, "file_name": "c.jpg", "height": 20},
            {"id": 6, "file_name": "ok.jpg", **entry},
            # another store than GCS: its own reason (s3:// was taken for a gs:// path)
            {"id": 7, "file_name": "s3://bucket/d.jpg", **entry},
            {"id": 8, "file_name": "https://example.com/e.jpg", **entry},
        ],
        "annotations": [],
        "categories": CATEGORIES,
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out), "--max-reject-fraction", "1")
    rows = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["path"] for r in rows if r["reason"] != reasons.UNSUPPORTED_LOCATION) == ["a.jpg", "b.jpg", "c.jpg"]
    other = sorted(r["path"] for r in rows if r["reason"] == reasons.UNSUPPORTED_LOCATION)
    assert other == ["https://example.com/e.jpg", "s3://bucket/d.jpg"], rows
    info = load_info(out)
    assert info["rejects"]["total"] == 5 and info["examples"] == 1, info["rejects"]


@pytest.mark.unit
def test_a_mask_of_many_polygons_is_rasterized_in_one_layer():
    """An annotation of 2,000 polygons (a crowd outlined piece by piece) must not cost an image-size layer per
    polygon: pycocotools decodes a list of RLEs to height x width x n, so they are merged first. The peak is
    what numpy allocates (tracemalloc sees it), an image's worth of bytes, not 2,000 of them."""
    import tracemalloc

    import numpy as np
    from PIL import Image

    from beam_pipeline.images.options import Geometry

    polygons = [[float(x), 1.0, x + 5.0, 1.0, x + 5.0, 8.0] for x in range(0, 190, 1)] * 10 + [POLYGON[0]] * 100
    obj = objects.Obj(bbox=(0, 0, 200, 30), label=1, text="person", segmentation=polygons)
    # the modules the first mask imports (PIL's plugins, pycocotools: ~0.7 MB) are not what is measured
    objects.mask_pngs(
        [objects.Obj(bbox=(0, 0, 9, 9), label=1, text="person", segmentation=POLYGON)], Geometry(9, 9, 9, 9)
    )
    tracemalloc.start()
    try:
        [png] = objects.mask_pngs([obj], Geometry(200, 200, 200, 200))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 200 * 200, peak
    mask = np.asarray(Image.open(io.BytesIO(png)))
    assert mask.shape == (200, 200) and set(np.unique(mask)) == {0, 1}
    assert mask[4, 100] == 1 and mask[12, 25] == 1 and mask[100, 100] == 0


@pytest.mark.pipeline
def test_counters_summed_per_bundle_are_exact_over_several_bundles():
    """The object reject counters leave each bundle as a few sums (join.Counts), not one element per object: on a
    runner that splits the images over two workers there are several partial sums, and they add up exactly."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that

    from beam_pipeline.annotations import join

    def joined(i: int) -> tuple[str, list[Any]]:
        entry = {"id": i, "file_name": f"{i}.jpg", "width": 10, "height": 10}
        good = [{"id": k, "image_id": i, "category_id": 1, "bbox": [0, 0, 1, 1]} for k in range(i % 4)]
        bad = [{"id": 9, "image_id": i, "category_id": 999, "bbox": [0, 0, 1, 1]}] * (i % 3)
        return (str(i), [(coco.IMAGES, entry), (coco.ANNOTATIONS, list(enumerate(good + bad)))])

    n = 200
    want = {reasons.UNKNOWN_CATEGORY: sum(i % 3 for i in range(n))}

    def check(partial: list[tuple[str, int]]) -> None:
        assert len(partial) >= 2, partial  # several bundles
        assert len(partial) < n / 10, partial  # sums, not one element per object
        total: dict[str, int] = {}
        for name, value in partial:
            total[name] = total.get(name, 0) + value
        assert total == want

    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    options = PipelineOptions([], direct_running_mode="multi_threading", direct_num_workers=2)
    join_fn = coco._JoinImageObjects("/d/instances.json", "/d", [(1, "person")])  # noqa: SLF001
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        out = (
            p
            | beam.Create([joined(i) for i in range(n)])
            | beam.Reshuffle()
            | beam.ParDo(join_fn).with_outputs(join.OBJECT_REJECTS, join.COUNTS, main="images")
        )
        assert_that(out[join.COUNTS] | beam.combiners.ToList(), lambda lists: check(lists[0]))
        summed = join.sum_counts(out[join.COUNTS]) | beam.combiners.ToDict()
        assert_that(summed, lambda dicts: dicts[0] == want or pytest.fail(f"{dicts[0]} != {want}"))


def test_a_multi_worker_convert_counts_every_object_exactly(coco_set, converted, tmp_path):
    """dataset.json's objects block of a run whose joins are split over two workers (several bundles per step)
    is the one-worker run's, to the count."""
    root, path, _ = coco_set
    out = tmp_path / "out"
    flags = ("--direct_running_mode", "multi_threading", "--direct_num_workers", "2", "--max-reject-fraction", "1")
    convert("--input", str(root), "--coco", str(path), "--output", str(out), *flags)
    assert load_info(out)["objects"] == load_info(converted[0])["objects"]
    # 5 objects pass the checks; wrong.jpg's is not written (its size is not its entry's): 4 in the records
    assert load_info(out)["objects"]["kept"] == 4 and load_info(out)["objects"]["rejects"]["total"] == 7


def _orders(doc: dict[str, Any], seed: int) -> tuple[list[Any], list[Any]]:
    """The annotations sorted by image id (each image's run together), and the same interleaved at random
    (each image's annotations keep their relative order, so each image's objects are the same list)."""
    import random

    by_image: dict[str, list[Any]] = {}
    for ann in doc["annotations"]:
        by_image.setdefault(json.dumps(ann["image_id"]), []).append(ann)
    grouped = [ann for key in sorted(by_image) for ann in by_image[key]]
    rng, queues, mixed = random.Random(seed), [list(anns) for anns in by_image.values()], []
    while queues:
        queue = rng.choice(queues)
        mixed.append(queue.pop(0))
        if not queue:
            queues.remove(queue)
    return grouped, mixed


def test_annotations_grouped_or_interleaved_give_the_same_shards(tmp_path):
    """The reader sends an image's consecutive annotations as one element (at most coco.MAX_RUN): a file that
    lists them together and one that interleaves images give the same shards, rejects and counts, including
    an image with more annotations than one run holds."""
    root = tmp_path / "images"
    doc = make_coco(root)
    many = coco.MAX_RUN + 44
    doc["annotations"] += [
        {"id": 1000 + k, "image_id": 2, "category_id": 3, "bbox": [k % 40, k % 30, 5, 5], "area": 1.0, "iscrowd": 0}
        for k in range(many)
    ]
    grouped, mixed = _orders(doc, seed=7)
    assert grouped != mixed
    outs = []
    for name, anns in (("grouped", grouped), ("mixed", mixed)):
        path = tmp_path / name / "instances.json"  # one COCO path: object rejects name it
        path.parent.mkdir()
        path.write_text(json.dumps({**doc, "annotations": anns}))
        out = tmp_path / name / "det"  # one output name: shard file names start with it
        convert("--input", str(root), "--coco", str(path), "--output", str(out), "--max-reject-fraction", "1")
        outs.append(out)
    infos = [load_info(out) for out in outs]
    assert infos[0]["objects"] == infos[1]["objects"] and infos[0]["objects"]["kept"] == 4 + many
    shards = [sorted(s["file"] for split in info["splits"].values() for s in split["shards"]) for info in infos]
    assert shards[0] == shards[1] and shards[0]
    for shard in shards[0]:
        assert (outs[0] / shard).read_bytes() == (outs[1] / shard).read_bytes(), shard
    for rejects in ("rejects.jsonl", "object_rejects.jsonl"):
        lines = [sorted((out / rejects).read_text().replace(str(out.parent), "").splitlines()) for out in outs]
        assert lines[0] == lines[1] and lines[0], rejects


def test_the_reader_sends_runs_of_one_image_bounded_by_max_run(tmp_path, monkeypatch):
    """Consecutive annotations of one image leave as one element, cut at MAX_RUN; every annotation once, with
    its place in the file."""
    monkeypatch.setattr(coco, "MAX_RUN", 3)
    image_ids = [1, 1, 1, 1, 1, 2, 1, "1", True, None, 2, 2]
    anns: list[Any] = [{"id": k, "image_id": i} for k, i in enumerate(image_ids)] + ["not an object"]
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": [], "annotations": anns, "categories": CATEGORIES}))
    out = list(coco._ReadSection().process((coco.ANNOTATIONS, str(path))))  # noqa: SLF001
    runs = [(key, [place for place, _ in run]) for key, (tag, run) in out if tag == coco.ANNOTATIONS]
    assert len(runs) == len(out)
    assert runs == [
        ("1", [0, 1, 2]),
        ("1", [3, 4]),
        ("2", [5]),
        ("1", [6]),
        ('"1"', [7]),
        ("true", [8]),
        ("null", [9]),
        ("2", [10, 11]),
        ("null", [12]),
    ]


def test_every_annotation_of_a_run_is_keyed_by_its_own_image_id(tmp_path):
    """A run joins on the JSON text of its image_id (coco._id_key), as a lone annotation would: ids that Python
    calls equal but whose JSON differs (0.0 and -0.0, {"k": 1} and {"k": true}, [1] and [1.0]) are other
    images, whatever order the file lists them in."""
    image_ids = [0.0, -0.0, {"k": 1}, {"k": True}, {"k": 1.0}, [1], [1.0], 1, 1]
    anns: list[Any] = [{"id": k, "image_id": i} for k, i in enumerate(image_ids)]
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": [], "annotations": anns, "categories": CATEGORIES}))
    out = list(coco._ReadSection().process((coco.ANNOTATIONS, str(path))))  # noqa: SLF001
    keyed = [(key, ann["id"]) for key, (_, run) in out for _, ann in run]
    assert keyed == [(coco._id_key(ann["image_id"]), ann["id"]) for ann in anns]  # noqa: SLF001
    assert [len(run) for _, (_, run) in out] == [1] * 7 + [2]


def test_masks_over_max_mask_pixels_reject_their_image_before_any_is_drawn(tmp_path, tf, monkeypatch):
    """An image whose masks x pixels pass --max-mask-pixels is a masks_too_large reject (not an hour of drawing or
    a record of gigabytes); an image under it, and one with boxes only however many, are written as usual."""
    root = tmp_path / "images"
    for i, name in enumerate(("many.jpg", "one.jpg", "boxes.jpg")):
        write(str(root / name), image_bytes("jpeg", height=48, width=64, seed=i))
    images = [
        {"id": i + 1, "file_name": n, "width": 64, "height": 48}
        for i, n in enumerate(("many.jpg", "one.jpg", "boxes.jpg"))
    ]
    polygon = {"bbox": [10, 10, 20, 15], "segmentation": POLYGON}
    annotations = [{"id": 10 + k, "image_id": 1, "category_id": 1, **polygon} for k in range(3)]  # 3 x 3,072 pixels
    annotations.append({"id": 20, "image_id": 2, "category_id": 3, **polygon})  # 3,072
    annotations += [{"id": 30 + k, "image_id": 3, "category_id": 7, "bbox": [k, k, 5, 5]} for k in range(8)]
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": CATEGORIES}))
    out = tmp_path / "out"
    result = convert("--input", str(root), "--coco", str(path), "--output", str(out), "--max-mask-pixels", "9000",
                     "--max-reject-fraction", "1")  # fmt: skip
    rows = parsed_records(out, tf)
    assert sorted(rows) == ["boxes.jpg", "one.jpg"]
    assert len(rows["one.jpg"]["image/object/mask"]) == 1
    assert len(rows["boxes.jpg"]["image/object/bbox/xmin"]) == 8
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["path"]).name, r["reason"]) for r in rejects] == [("many.jpg", reasons.MASKS_TOO_LARGE)]
    assert "9,216 mask pixels, over --max-mask-pixels 9000" in rejects[0]["detail"]
    assert load_info(out)["rejects"]["by_reason"] == {reasons.MASKS_TOO_LARGE: 1}
    assert "masks_too_large" in result.stdout
    # the default limit writes all three (3 x 64 x 48 is far under it)
    convert("--input", str(root), "--coco", str(path), "--output", str(tmp_path / "default"))
    assert len(parsed_records(tmp_path / "default", tf)["many.jpg"]["image/object/mask"]) == 3


def test_labeling_tool_exports_convert_as_their_images_say(tmp_path, tf):
    """Shapes labeling tools write: a UTF-8 byte order mark, sizes as 64.0, absolute file names under --input
    (labelme2coco, FiftyOne), and Roboflow's dataset-wide category 0 that names no object. Each used to stop
    the run or reject every image; category 0 went to line 0 of labels.txt, where the background belongs."""
    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    write(str(root / "sub" / "b.jpg"), image_bytes("jpeg", height=40, width=50, seed=2))
    (tmp_path / "link").symlink_to(root)  # --input through a link, file_names under the folder it leads to
    doc = {
        "images": [
            {"id": 1, "file_name": str(root / "a.jpg"), "width": 64.0, "height": 48.0},
            {"id": 2, "file_name": "sub/b.jpg", "width": 50, "height": 40},
            {"id": 3, "file_name": "C:\\Users\\me\\c.jpg", "width": 50, "height": 40},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 4, 16, 12], "segmentation": []},
            {"id": 2, "image_id": 2, "category_id": 2, "bbox": [5, 10, 20, 10], "segmentation": []},
        ],
        "categories": [{"id": 0, "name": "pets-xyz"}, {"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}],
    }
    path = tmp_path / "_annotations.coco.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    out = tmp_path / "out"
    result = convert("--input", str(tmp_path / "link"), "--coco", str(path), "--output", str(out), *NO_BUDGET)
    assert "category 0 ('pets-xyz') names no object" in result.stderr
    assert "share the name" not in result.stderr
    rows = parsed_records(out, tf)
    assert sorted(rows) == ["a.jpg", "sub/b.jpg"]
    a = rows["a.jpg"]
    assert list(a["image/object/class/label"]) == [1]
    assert [list(a[f"image/object/bbox/{k}"]) for k in ("xmin", "ymin", "xmax", "ymax")] == [
        [pytest.approx(8 / 64)], [pytest.approx(4 / 48)], [pytest.approx(24 / 64)], [pytest.approx(16 / 48)]
    ]  # fmt: skip
    assert (out / "labels.txt").read_text().splitlines() == ["background", "cat", "dog"]
    assert "pets-xyz" not in (out / objects.LABEL_MAP_PBTXT).read_text()
    assert load_info(out)["categories"] == [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    [missing] = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert "'C:\\\\Users\\\\me\\\\c.jpg' is absolute and not under --input" in missing["detail"]


def label_studio_export(tmp_path: Path) -> tuple[Path, Path]:
    """Images and their COCO file as Label Studio exports them: categories (and image ids) numbered from 0."""
    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    write(str(root / "b.jpg"), image_bytes("jpeg", height=48, width=64, seed=2))
    doc = {
        "images": [
            {"id": 0, "file_name": "a.jpg", "width": 64, "height": 48},
            {"id": 1, "file_name": "b.jpg", "width": 64, "height": 48},
        ],
        "annotations": [
            {"id": 0, "image_id": 0, "category_id": 0, "bbox": [8, 4, 16, 12]},
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 3, 20, 10]},
        ],
        "categories": [{"id": 0, "name": "Cat"}, {"id": 1, "name": "Dog"}],
    }
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    return root, path


def test_a_category_0_that_names_objects_is_refused_in_one_line(tmp_path):
    """Label Studio numbers categories from 0: its objects would be written as class 0, the background a model
    learns to ignore, and the OD API refuses such a label map. The refusal names the flag that converts it."""
    root, path = label_studio_export(tmp_path)
    result = run_cli("convert", "--input", str(root), "--coco", str(path), "--output", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert "category 0 ('Cat') names objects" in result.stderr and "Traceback" not in result.stderr
    assert "pass --coco-category-offset 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_ids_beyond_64_bits_are_refused_saying_so_and_convert_as_text(tmp_path, tf):
    """A uint64 id (a hash some tools use) is valid JSON that the C parser cannot read: it said "not valid JSON".
    It says what is wrong and what to do, and the same ids written as text convert."""
    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    big = 18446744073709551615
    doc = {
        "images": [{"id": big, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [{"id": 1, "image_id": big, "category_id": 1, "bbox": [8, 4, 16, 12]}],
        "categories": [{"id": 1, "name": "cat"}],
    }
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    result = run_cli("convert", "--input", str(root), "--coco", str(path), "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "integer beyond 64 bits" in result.stderr and "not valid JSON" not in result.stderr
    assert not (tmp_path / "out").exists()
    doc["images"][0]["id"] = doc["annotations"][0]["image_id"] = str(big)
    path.write_text(json.dumps(doc))
    out = tmp_path / "text"
    convert("--input", str(root), "--coco", str(path), "--output", str(out))
    [row] = parsed_records(out, tf).values()
    assert row["image/source_id"] == str(big).encode() and list(row["image/object/class/label"]) == [1]


@pytest.mark.unit
def test_categories_sharing_a_name_are_kept_apart_with_a_note(tmp_path):
    """Merged label sets repeat a name under two ids: the OD API's name-to-id map would fold them, silently."""
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps({"categories": [{"id": 1, "name": "car"}, {"id": 2, "name": "bus"}, {"id": 5, "name": "car"}]})
    )
    found = coco.read_categories(str(path))
    assert found.pairs == ((1, "car"), (2, "bus"), (5, "car")) and found.shared_name() == ("car", [1, 5])
    path.write_text(json.dumps({"categories": CATEGORIES}))
    assert coco.read_categories(str(path)).shared_name() is None


def test_a_run_whose_every_annotation_is_rejected_is_not_published_as_complete(tmp_path):
    """Annotations whose image_id is "1" where images says 1 (files built with pandas) all miss their images:
    the run used to exit 0 with a detection dataset of negatives only."""
    root = tmp_path / "images"
    for i in range(3):
        write(str(root / f"{i}.jpg"), image_bytes("jpeg", height=48, width=64, seed=i))
    doc = {
        "images": [{"id": i, "file_name": f"{i}.jpg", "width": 64, "height": 48} for i in range(3)],
        "annotations": [{"id": i, "image_id": str(i), "category_id": 1, "bbox": [8, 4, 16, 12]} for i in range(3)],
        "categories": CATEGORIES,
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    result = run_cli("convert", "--input", str(root), "--coco", str(path), "--output", str(out), "--no-transform")
    assert result.returncode == 3, result.stderr
    assert "no object was kept: 3 annotations rejected (unknown_image_id 3" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (out / "_SUCCESS").exists()
    assert load_info(out)["status"] == "no_object_kept"
    [row, *_] = [json.loads(line) for line in (out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines()]
    assert 'image_id "0"' in row["detail"] and "the number 0" in row["detail"]
    shown = run_cli("inspect", str(out))
    assert "INCOMPLETE: no _SUCCESS (no object kept: 3 rejected)" in shown.stdout, shown.stdout


NO_BUDGET = ("--max-reject-fraction", "1")


@pytest.mark.parametrize("sink", ["planned", "write_to_tfrecord"])
def test_objects_kept_count_only_the_records_written(tmp_path, tf, sink):
    """dataset.json's objects.kept and image counters are the records': an image the writer rejects (its size
    is not the entry's, its bytes do not decode) used to count its objects as kept, a negative among them."""
    root = tmp_path / "images"
    for i, name in enumerate(("a.jpg", "b.jpg", "wrong.jpg", "neg.jpg")):
        write(str(root / name), image_bytes("jpeg", height=48, width=64, seed=i))
    write(str(root / "negbad.jpg"), b"\xff\xd8 not a JPEG")
    names = ["a.jpg", "b.jpg", "wrong.jpg", "neg.jpg", "negbad.jpg"]
    doc = {
        "images": [
            {"id": i, "file_name": name, "width": 80 if name == "wrong.jpg" else 64, "height": 48}
            for i, name in enumerate(names)
        ],
        "annotations": [
            {"id": 10 * i + k, "image_id": i, "category_id": 1, "bbox": [4, 4, 10, 10]}
            for i in range(3)
            for k in (0, 1)
        ]
        + [{"id": 99, "image_id": 0, "category_id": 5, "bbox": [4, 4, 10, 10]}],  # unknown_category: a reject
        "categories": CATEGORIES,
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out), "--sink", sink, *NO_BUDGET)
    written = sum(len(row["image/object/class/label"]) for row in parsed_records(out, tf).values())
    info = load_info(out)
    assert info["rejects"]["by_reason"] == {"annotation_size_mismatch": 1, "not_an_image": 1}
    assert written == 4
    assert info["objects"]["kept"] == written
    assert info["objects"]["images_without_annotations"] == 1  # neg.jpg; negbad.jpg is no record
    assert info["objects"]["rejects"] == {"total": 1, "by_reason": {reasons.UNKNOWN_CATEGORY: 1}}


def test_an_absolute_file_name_through_a_link_to_the_input_folder_is_found(tmp_path):
    """--input the real folder, file_names written through a link to it (a mount seen under two names)."""
    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    (tmp_path / "link").symlink_to(root)
    doc = {
        "images": [{"id": 1, "file_name": str(tmp_path / "link" / "a.jpg"), "width": 64, "height": 48}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 4, 16, 12]}],
        "categories": CATEGORIES,
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out))
    assert load_info(out)["examples"] == 1 and load_info(out)["objects"]["kept"] == 1


def test_odd_image_id_text_and_an_area_beyond_float32_are_object_rejects_not_a_failed_job(tmp_path, tf):
    """An image_id "²" (a digit to str.isdigit, not to int()) or of 5,000 digits naming no image failed the whole
    job while its reject's hint was written; an area of 1e39 was written as inf (image/object/area is float32)."""
    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    good = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 4, 16, 12]}
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [good, {**good, "id": 2, "image_id": "²"}, {**good, "id": 3, "image_id": "1" * 5000},
                        {**good, "id": 4, "area": 1e39}],
        "categories": [{"id": 1, "name": "cat"}],
    }  # fmt: skip
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert("--input", str(root), "--coco", str(path), "--output", str(out))
    rows = [json.loads(line) for line in (out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines()]
    assert sorted((r["annotation_id"], r["reason"]) for r in rows) == [
        (2, reasons.UNKNOWN_IMAGE_ID), (3, reasons.UNKNOWN_IMAGE_ID), (4, reasons.BAD_ANNOTATION)
    ]  # fmt: skip
    [record] = parsed_records(out, tf).values()
    assert list(record["image/object/area"]) == [pytest.approx(16 * 12)]


@pytest.mark.unit
def test_an_images_entry_side_of_2_to_the_31_or_more_is_a_bad_image_entry():
    """The frame sizes a source may give stop below 2**31 (as for VOC and manifests): a width of 1e300 gave an
    annotation_size_mismatch whose detail held a 301-digit number."""
    entry = {"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}
    assert coco._entry_problem(entry) is None  # noqa: SLF001
    for width in (2**31, 1e300, 0, -64, 64.5, True):
        problem = coco._entry_problem({**entry, "width": width})  # noqa: SLF001
        assert problem is not None and "below 2**31" in problem, (width, problem)
    assert coco._entry_problem({**entry, "width": 2**31 - 1, "height": 64.0}) is None  # noqa: SLF001


@pytest.mark.unit
def test_coco_category_offset_adds_to_every_category_id(tmp_path):
    """--coco-category-offset N: categories and annotations alike; the bound on ids holds after it."""
    _, path = label_studio_export(tmp_path)
    found = coco.read_categories(str(path), 1)
    assert found.pairs == ((1, "Cat"), (2, "Dog")) and found.left_out is None
    names = dict(found.pairs)
    obj = coco.check_annotation({"category_id": 0, "bbox": [8, 4, 16, 12]}, names, 64, 48, offset=1)
    assert isinstance(obj, objects.Obj) and (obj.label, obj.text) == (1, "Cat")
    unknown = coco.check_annotation({"category_id": 2, "bbox": [8, 4, 16, 12]}, names, 64, 48, offset=1)
    assert unknown == objects.Invalid(reasons.UNKNOWN_CATEGORY, "category_id 2 is not in the file's categories")
    with pytest.raises(UsageError, match=r"category id 1 \(\+ --coco-category-offset 100000: 100001\) is outside"):
        coco.read_categories(str(path), coco.MAX_CATEGORY_ID)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--coco-category-offset", "1"], "--coco-category-offset needs --coco"),
        (["--coco", "c.json", "--coco-category-offset", "-1"], "--coco-category-offset must be 0-100000"),
        (["--coco", "c.json", "--coco-category-offset", "1.5"], "--coco-category-offset: invalid int value"),
    ],
)
def test_coco_category_offset_is_a_whole_number_from_0_for_a_coco_run(flags, words):
    from beam_pipeline.cli import parse_convert

    with pytest.raises(UsageError, match=words):
        parse_convert(["--input", "in", "--output", "out", *flags])


def test_a_label_studio_export_converts_with_coco_category_offset_1(tmp_path, tf, capsys):
    """Ids from 1 in the records, labels.txt, label_map.pbtxt and dataset.json. A night with another offset
    copies no record of a dataset with other ids (a note says so, as for --labels-file); the same offset reuses."""
    from beam_pipeline import cli

    root, path = label_studio_export(tmp_path)

    def run(name: str, offset: int, *extra: str) -> str:
        argv = ["convert", "--input", str(root), "--coco", str(path), "--output", str(tmp_path / name)]
        code = cli.main([*argv, "--coco-category-offset", str(offset), "--no-transform", "--no-tfds-metadata", *extra])
        err = capsys.readouterr().err
        assert code == 0, err
        return err

    first = tmp_path / "first"
    run("first", 1)
    labels = {name: list(row["image/object/class/label"]) for name, row in parsed_records(first, tf).items()}
    assert labels == {"a.jpg": [1], "b.jpg": [2]}
    assert (first / "labels.txt").read_text().splitlines() == ["background", "Cat", "Dog"]
    assert "id: 1\n  name: 'Cat'" in (first / objects.LABEL_MAP_PBTXT).read_text()
    assert load_info(first)["categories"] == [{"id": 1, "name": "Cat"}, {"id": 2, "name": "Dog"}]

    err = run("other", 2, "--incremental-from", str(first))
    assert (
        f"note: --coco-category-offset 2: {first} was converted with --coco-category-offset 1 (other category ids); "
        "converting everything"
    ) in err
    other = tmp_path / "other"
    assert "incremental" not in load_info(other)
    assert (other / "labels.txt").read_text().splitlines() == ["background", "unused_1", "Cat", "Dog"]
    labels = {name: list(row["image/object/class/label"]) for name, row in parsed_records(other, tf).items()}
    assert labels == {"a.jpg": [2], "b.jpg": [3]}

    err = run("same", 1, "--incremental-from", str(first))
    assert "other category ids" not in err
    assert load_info(tmp_path / "same")["incremental"]["reused"] == 2


def test_a_panoptic_file_is_refused_at_the_start_naming_segments_info(tmp_path, capsys):
    """A COCO panoptic file (segments_info per image, no bbox per annotation) ran the whole job and exited 3,
    blaming unknown_category."""
    from beam_pipeline import cli

    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    segment = {"id": 3, "category_id": 1, "iscrowd": 0, "bbox": [8, 4, 16, 12], "area": 120}
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [{"image_id": 1, "file_name": "a.png", "segments_info": [segment]}],
        "categories": [
            {"id": 1, "name": "person", "isthing": 1, "color": [220, 20, 60]},
            {"id": 2, "name": "sky", "isthing": 0, "color": [70, 130, 180]},
        ],
    }
    path = tmp_path / "panoptic_train2017.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    code = cli.main(["convert", "--input", str(root), "--coco", str(path), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "Traceback" not in err, err
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: --coco {path}: its annotations carry 'segments_info': a COCO panoptic file, ")
    assert "does not convert" in line and "instances" in line
    assert not out.exists()


@pytest.mark.unit
def test_a_keypoints_file_converts_its_objects_with_a_note_that_keypoints_are_not_written(tmp_path, capsys):
    """A person_keypoints file: its boxes and masks convert, its keypoints were dropped without a word."""
    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run.preflight import prepare

    root = tmp_path / "images"
    write(str(root / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    person = {"id": 1, "name": "person", "keypoints": ["nose", "left_eye"], "skeleton": [[1, 2]]}
    annotations = [
        {"id": i, "image_id": 1, "category_id": 1, "bbox": [8, 4, 16, 12], "segmentation": POLYGON,
         "keypoints": [10, 6, 2, 14, 6, 2], "num_keypoints": 2}
        for i in (1, 2)
    ]  # fmt: skip
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}], "annotations": annotations}
    path = tmp_path / "person_keypoints_val2017.json"
    path.write_text(json.dumps({**doc, "categories": [person]}))
    _, layout = prepare(ConvertConfig(output=str(tmp_path / "out"), name="d", input=str(root), coco=str(path)))
    assert capsys.readouterr().err == (
        f"note: --coco {path}: keypoints are not written (2 annotations with keypoints: their boxes, classes and "
        "masks are; this tool writes no keypoint keys)\n"
    )
    obj = coco.check_annotation(annotations[0], dict(layout.categories or ()), 64, 48)
    assert isinstance(obj, objects.Obj) and obj.segmentation == POLYGON
    plain = tmp_path / "instances.json"
    plain.write_text(
        json.dumps({"annotations": [{"id": 1, "category_id": 1, "bbox": [1, 1, 2, 2]}], "categories": CATEGORIES})
    )
    assert coco.read_categories(str(plain)).keypoints == 0


@pytest.mark.unit
def test_a_coco_run_builds_on_no_dataset_whose_labels_txt_gives_other_ids(tmp_path):
    """--incremental-from with a previous labels.txt that is not the first lines of this run's: why, for the
    note that says every image is converted (new categories after its last id keep its ids: built on)."""
    import dataclasses

    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run.previous import other_coco_ids as _other_coco_ids
    from beam_pipeline.vocab.dataset_info import DatasetInfo

    prev = tmp_path / "prev"
    prev.mkdir()
    (prev / "_SUCCESS").write_text("")
    cfg = ConvertConfig(output="o", name="o", input="i", coco="c.json")
    info = DatasetInfo.from_json({"config": {"coco_category_offset": 0}})
    assert _other_coco_ids(cfg, str(prev), info, [(1, "cat"), (2, "dog")]) is None  # no labels.txt: not compared
    (prev / "labels.txt").write_text("background\ncat\ndog\n")
    assert _other_coco_ids(cfg, str(prev), info, [(1, "cat"), (2, "dog"), (3, "yak")]) is None
    assert _other_coco_ids(cfg, str(prev), info, [(1, "cat"), (2, "cow")]) == (
        f"--coco c.json: other category ids than {prev}'s labels.txt"
    )
    shifted = dataclasses.replace(cfg, coco_category_offset=1)
    assert _other_coco_ids(shifted, str(prev), info, [(2, "cat"), (3, "dog")]) == (
        f"--coco-category-offset 1: {prev} was converted with --coco-category-offset 0 (other category ids)"
    )
    assert _other_coco_ids(shifted, str(prev), DatasetInfo.from_json({}), [(2, "cat"), (3, "dog")]).startswith(
        "--coco-category-offset 1"
    )
