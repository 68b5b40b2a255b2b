"""--manifest-objects: objects from a CSV/JSONL manifest, converted with the CLI and read back with TensorFlow."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from beam_pipeline.annotations import join, objects, table
from beam_pipeline.vocab import reasons

from .conftest import convert, load_info, read_records, run_cli
from .imagegen import image_bytes, write
from .test_coco import parsed_records

pytestmark = pytest.mark.e2e

COLUMNS = ["path", "split", "xmin", "ymin", "xmax", "ymax", "label", "width", "height", "weather"]
# (file, kind, width, height)
IMAGES = [
    ("a.jpg", "jpeg", 64, 48),
    ("sub/b.png", "png", 32, 24),
    ("neg.jpg", "jpeg", 40, 30),
    ("conflict.jpg", "jpeg", 40, 30),
    ("allbad.jpg", "jpeg", 40, 30),
    ("sized.jpg", "jpeg", 40, 30),
    ("wrong.jpg", "jpeg", 40, 30),
    ("badsize.jpg", "jpeg", 40, 30),
]
# One row per object (pixels). Each row's comment says what becomes of it.
ROWS = [
    ("a.jpg", "train", "10", "5", "30", "25", "dog", "", "", "sunny"),
    ("a.jpg", "train", "-0.5", "2", "20", "48.5", "zebra", "", "", "sunny"),  # clipped to 0..48 (within 1 px)
    ("a.jpg", "train", "0", "0", "64", "48", "cat", "", "", "sunny"),
    ("sub/b.png", "train", "1", "1", "10", "10", " cat ", "", "", "rain"),  # the name is stripped
    ("sub/b.png", "train", "1", "1", "10", "10", " cat ", "", "", "rain"),  # duplicate_object
    ("sub/b.png", "train", "8", "2", "4", "9", "dog", "", "", "rain"),  # bad_box: xmax < xmin
    ("sub/b.png", "train", "abc", "2", "4", "9", "dog", "", "", "rain"),  # bad_box: not a number
    ("sub/b.png", "train", "nan", "2", "4", "9", "dog", "", "", "rain"),  # bad_box: NaN
    ("sub/b.png", "train", "0", "0", "34", "24", "dog", "", "", "rain"),  # box_outside_image (2 px beyond)
    ("sub/b.png", "train", "1", "1", "5", "5", "", "", "", "rain"),  # unknown_category: no name
    ("sub/b.png", "train", "1", "1", "5", "5", "background", "", "", "rain"),  # unknown_category: id 0's name
    ("neg.jpg", "validation", "", "", "", "", "", "", "", ""),  # an image without objects
    ("conflict.jpg", "train", "1", "1", "5", "5", "cat", "", "", ""),
    ("conflict.jpg", "validation", "2", "2", "6", "6", "cat", "", "", ""),  # conflicting_rows (split)
    ("allbad.jpg", "train", "5", "5", "5", "9", "dog", "", "", ""),  # bad_box: zero width; the image stays
    ("sized.jpg", "train", "2", "3", "12", "13", "dog", "40", "30", ""),  # the frame given, and right
    ("wrong.jpg", "train", "2", "3", "12", "13", "dog", "50", "30", ""),  # annotation_size_mismatch
    ("badsize.jpg", "train", "2", "3", "12", "13", "dog", "abc", "30", ""),  # bad_image_size
    ("gone.jpg", "train", "1", "1", "2", "2", "cat", "", "", ""),  # missing, as in any manifest
    ("junk.jpg", "train", "1", "1", "2", "2", "cat", "", "", ""),  # unreadable: no size in its header
]
BOX_KEYS = [f"image/object/bbox/{k}" for k in ("xmin", "ymin", "xmax", "ymax")]


def make_images(root: Path) -> None:
    for seed, (name, kind, width, height) in enumerate(IMAGES):
        write(str(root / name), image_bytes(kind, height, width, seed))
    write(str(root / "junk.jpg"), b"not an image at all")


def write_csv(path: Path, rows: list[tuple[str, ...]], columns: list[str] = COLUMNS) -> Path:
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(columns)
        out.writerows(rows)
    return path


def objects_of(row: dict[str, Any]) -> list[tuple[str, int, tuple[float, ...], float]]:
    """(class text, class id, normalized box, area) of a parsed record's objects, sorted by text and box."""
    texts = [t.decode() for t in row["image/object/class/text"]]
    boxes = list(zip(*(row[k] for k in BOX_KEYS), strict=True))
    got = zip(texts, row["image/object/class/label"], boxes, row["image/object/area"], strict=True)
    return sorted((t, int(c), tuple(float(v) for v in b), float(a)) for t, c, b, a in got)


def assert_objects(got: list[Any], want: list[tuple[str, int, tuple[float, ...], float]]) -> None:
    assert [(t, c) for t, c, _, _ in got] == [(t, c) for t, c, _, _ in want]
    for (_, _, box, area), (_, _, want_box, want_area) in zip(got, want, strict=True):
        assert all(math.isclose(g, e, abs_tol=1e-6) for g, e in zip(box, want_box, strict=True)), (box, want_box)
        assert math.isclose(area, want_area, rel_tol=1e-6), (area, want_area)


def jsonl_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def object_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("objects")
    make_images(root)
    return root


@pytest.fixture(scope="module")
def converted(object_set):
    """The rows form in pixels, default flags (TFDS metadata included), rejects allowed."""
    manifest = write_csv(object_set / "objects.csv", ROWS)
    out = object_set.parent / (object_set.name + "-out") / "det"
    result = convert(
        "--manifest", str(manifest), "--manifest-objects", "rows", "--output", str(out),
        "--max-reject-fraction", "1", tfds=True,
    )  # fmt: skip
    return out, result


def test_rows_in_pixels_read_back_with_ids_one_to_n_sorted_by_name(converted, tf):
    out, _ = converted
    rows = parsed_records(out, tf)
    assert sorted(rows) == ["a.jpg", "allbad.jpg", "neg.jpg", "sized.jpg", "sub/b.png"]
    cat, dog, zebra = 1, 2, 3  # background is 0
    w, h = 64, 48
    assert_objects(
        objects_of(rows["a.jpg"]),
        [
            ("cat", cat, (0.0, 0.0, 1.0, 1.0), 64 * 48),
            ("dog", dog, (10 / w, 5 / h, 30 / w, 25 / h), 20 * 20),
            ("zebra", zebra, (0.0, 2 / h, 20 / w, 1.0), 20 * 46),
        ],
    )
    assert_objects(objects_of(rows["sub/b.png"]), [("cat", cat, (1 / 32, 1 / 24, 10 / 32, 10 / 24), 81)])
    assert_objects(objects_of(rows["sized.jpg"]), [("dog", dog, (2 / 40, 3 / 30, 12 / 40, 13 / 30), 100)])
    assert objects_of(rows["neg.jpg"]) == []  # a negative
    assert objects_of(rows["allbad.jpg"]) == []  # every object rejected: still an image
    for name, row in rows.items():
        assert row["image/source_id"].decode() == name
    records = {r["image/filename"].decode(): r for r in read_records(out)}
    assert all(b"image/class/label" not in k.encode() for r in records.values() for k in r)  # a detection dataset
    assert records["a.jpg"]["weather"] == b"sunny"  # image columns stay extra features
    assert records["neg.jpg"]["_split"] == "validation"
    assert (out / "labels.txt").read_text().splitlines() == ["background", "cat", "dog", "zebra"]
    assert "id: 3\n  name: 'zebra'" in (out / objects.LABEL_MAP_PBTXT).read_text()
    assert load_info(out)["categories"] == [
        {"id": 1, "name": "cat"},
        {"id": 2, "name": "dog"},
        {"id": 3, "name": "zebra"},
    ]


@pytest.mark.smoke
def test_every_reason_with_its_path(converted):
    out, _ = converted
    rejects = sorted((r["path"], r["reason"]) for r in jsonl_lines(out / "rejects.jsonl"))
    assert rejects == [
        ("badsize.jpg", reasons.BAD_IMAGE_SIZE),
        ("conflict.jpg", reasons.CONFLICTING_ROWS),
        ("gone.jpg", "missing"),
        ("junk.jpg", "unreadable"),
        ("wrong.jpg", reasons.ANNOTATION_SIZE_MISMATCH),
    ]
    lines = jsonl_lines(out / objects.OBJECT_REJECTS_JSONL)
    assert sorted((r["path"], r["reason"]) for r in lines) == [
        ("allbad.jpg", reasons.BAD_BOX),
        *[("sub/b.png", reasons.BAD_BOX)] * 3,
        ("sub/b.png", reasons.BOX_OUTSIDE_IMAGE),
        ("sub/b.png", reasons.DUPLICATE_OBJECT),
        *[("sub/b.png", reasons.UNKNOWN_CATEGORY)] * 2,
    ]
    assert all(r["detail"] and isinstance(r["object"], int) for r in lines)
    details = " ".join(r["detail"] for r in lines)
    assert "not a number" in details and "zero or negative size" in details and "'background'" in details
    info = load_info(out)
    assert info["objects"] == {
        "kept": 3 + 1 + 1,  # a, b, sized (not wrong: the writer rejects its image, so its object is in no record)
        "rejects": {
            "total": 8,
            "by_reason": {
                reasons.BAD_BOX: 4,
                reasons.BOX_OUTSIDE_IMAGE: 1,
                reasons.DUPLICATE_OBJECT: 1,
                reasons.UNKNOWN_CATEGORY: 2,
            },
        },
        join.IMAGES_WITHOUT_OBJECTS: 1,
        join.IMAGES_ALL_REJECTED: 1,
        "polygons_dropped": 0,
    }


def test_normalized_boxes_clip_within_one_pixels_worth(object_set, tmp_path, tf):
    manifest = write_csv(
        object_set / "norm.csv",
        [
            ("a.jpg", "train", "0.25", "0.5", "0.75", "1.0", "dog", "", "", ""),
            ("a.jpg", "train", "0.5", "0.25", "1.01", "0.75", "cat", "", "", ""),  # 0.64 px beyond: clipped
            ("a.jpg", "train", "0", "0", "1.05", "1", "cat", "", "", ""),  # 3.2 px beyond: box_outside_image
            ("sub/b.png", "train", "0.1", "0.1", "0.5", "0.5", "cat", "", "", ""),
        ],
    )
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--manifest-objects", "rows", "--box-units", "normalized",
            "--output", str(out), "--max-reject-fraction", "1")  # fmt: skip
    rows = parsed_records(out, tf)
    assert_objects(
        objects_of(rows["a.jpg"]),
        [("cat", 1, (0.5, 0.25, 1.0, 0.75), 32 * 24), ("dog", 2, (0.25, 0.5, 0.75, 1.0), 32 * 24)],
    )
    assert_objects(objects_of(rows["sub/b.png"]), [("cat", 1, (0.1, 0.1, 0.5, 0.5), 0.4 * 32 * 0.4 * 24)])
    assert [r["reason"] for r in jsonl_lines(out / objects.OBJECT_REJECTS_JSONL)] == [reasons.BOX_OUTSIDE_IMAGE]


def test_a_jsonl_objects_column_and_a_csv_one_with_json_text(object_set, tmp_path, tf):
    box = {"xmin": 10, "ymin": 5, "xmax": 30, "ymax": 25}
    ant = {"xmin": 0, "ymin": 0, "xmax": 8, "ymax": 8, "label": "ant"}
    manifest = object_set / "objects.jsonl"
    lines = [
        {"path": "a.jpg", "objects": [{**box, "label": "dog"}, ant]},
        {"path": "sub/b.png", "objects": []},  # no objects
        {"path": "neg.jpg"},  # no objects either
        {"path": "allbad.jpg", "objects": "a box"},  # bad_objects: its objects are unknown
        {"path": "sized.jpg", "objects": [{**box, "label": 7}, ["not", "an", "object"]]},  # object rejects
    ]  # fmt: skip
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--manifest-objects", "column", "--output", str(out),
            "--max-reject-fraction", "1")  # fmt: skip
    rows = parsed_records(out, tf)
    assert sorted(rows) == ["a.jpg", "neg.jpg", "sized.jpg", "sub/b.png"]
    assert_objects(
        objects_of(rows["a.jpg"]),
        [("ant", 1, (0, 0, 8 / 64, 8 / 48), 64), ("dog", 2, (10 / 64, 5 / 48, 30 / 64, 25 / 48), 400)],
    )
    # the list's order is kept
    assert [t.decode() for t in rows["a.jpg"]["image/object/class/text"]] == ["dog", "ant"]
    assert objects_of(rows["sub/b.png"]) == objects_of(rows["neg.jpg"]) == objects_of(rows["sized.jpg"]) == []
    assert [(r["path"], r["reason"]) for r in jsonl_lines(out / "rejects.jsonl")] == [
        ("allbad.jpg", reasons.BAD_OBJECTS)
    ]
    assert sorted(r["reason"] for r in jsonl_lines(out / objects.OBJECT_REJECTS_JSONL)) == [
        reasons.BAD_ANNOTATION,
        reasons.UNKNOWN_CATEGORY,
    ]

    cell = json.dumps([{**box, "label": "dog"}])
    csv_manifest = write_csv(object_set / "column.csv", [("a.jpg", cell), ("neg.jpg", "")], ["path", "objects"])
    csv_out = tmp_path / "csv-out"
    convert("--manifest", str(csv_manifest), "--manifest-objects", "column", "--output", str(csv_out))
    csv_rows = parsed_records(csv_out, tf)
    assert_objects(objects_of(csv_rows["a.jpg"]), [("dog", 1, (10 / 64, 5 / 48, 30 / 64, 25 / 48), 400)])
    assert objects_of(csv_rows["neg.jpg"]) == []


def test_the_rows_order_does_not_change_a_byte(converted, object_set, tmp_path):
    """The same rows in reverse order: every shard the same, byte for byte (objects are ordered by row)."""
    out, _ = converted
    manifest = write_csv(object_set / "reversed.csv", list(reversed(ROWS)))
    again = tmp_path / "again"
    convert("--manifest", str(manifest), "--manifest-objects", "rows", "--output", str(again),
            "--max-reject-fraction", "1", "--name", "det")  # fmt: skip
    shards = [s["file"] for split in load_info(out)["splits"].values() for s in split["shards"]]
    assert shards
    for name in [*shards, "labels.txt", objects.LABEL_MAP_PBTXT]:
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_an_incremental_run_keeps_ids_and_reconverts_an_image_whose_objects_changed(object_set, tmp_path, tf):
    first_rows = [
        ("a.jpg", "train", "10", "5", "30", "25", "dog", "", "", ""),
        ("sub/b.png", "train", "1", "1", "10", "10", "cat", "", "", ""),
        ("neg.jpg", "train", "", "", "", "", "", "", "", ""),
    ]
    first, second = tmp_path / "first", tmp_path / "second"
    convert("--manifest", str(write_csv(object_set / "v1.csv", first_rows)), "--manifest-objects", "rows",
            "--output", str(first))  # fmt: skip
    assert (first / "labels.txt").read_text().splitlines() == ["background", "cat", "dog"]
    second_rows = [
        first_rows[0],
        ("sub/b.png", "train", "2", "1", "10", "10", "cat", "", "", ""),  # the box moved; the file did not
        ("sub/b.png", "train", "0", "0", "4", "4", "ant", "", "", ""),  # a new class: sorts first, gets id 3
        first_rows[2],
    ]
    convert("--manifest", str(write_csv(object_set / "v2.csv", second_rows)), "--manifest-objects", "rows",
            "--output", str(second), "--incremental-from", str(first))  # fmt: skip
    assert (second / "labels.txt").read_text().splitlines() == ["background", "cat", "dog", "ant"]
    rows = parsed_records(second, tf)
    assert_objects(
        objects_of(rows["sub/b.png"]),
        [("ant", 3, (0, 0, 4 / 32, 4 / 24), 16), ("cat", 1, (2 / 32, 1 / 24, 10 / 32, 10 / 24), 72)],
    )
    assert_objects(objects_of(rows["a.jpg"]), [("dog", 2, (10 / 64, 5 / 48, 30 / 64, 25 / 48), 400)])
    inc = load_info(second)["incremental"]
    assert inc["converted"] == 1 and inc["reused"] == 2, inc


def test_a_classification_manifest_with_box_named_columns_is_unchanged(object_set, tmp_path):
    """Without --manifest-objects, 'xmin' is an extra column and 'label' the image's class, as before."""
    manifest = write_csv(
        object_set / "cls.csv", [("a.jpg", "cat", "3"), ("sub/b.png", "dog", "4")], ["path", "label", "xmin"]
    )
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--output", str(out))
    records = {r["image/filename"].decode(): r for r in read_records(out)}
    assert records["a.jpg"]["image/class/label"] == 0 and records["a.jpg"]["xmin"] == 3
    assert records["sub/b.png"]["image/class/text"] == b"dog" and records["sub/b.png"]["xmin"] == 4
    assert not any(k.startswith("image/object/") or k == objects.SOURCE_ID for r in records.values() for k in r)
    assert (out / "labels.txt").read_text().splitlines() == ["cat", "dog"]
    assert not (out / objects.LABEL_MAP_PBTXT).exists()
    assert "categories" not in load_info(out)


def test_cli_errors_name_the_flag(object_set, tmp_path):
    manifest = write_csv(tmp_path / "m.csv", ROWS[:1])
    no_boxes = write_csv(tmp_path / "nb.csv", [("a.jpg", "cat")], ["path", "label"])
    cases = [
        (["--input", str(object_set), "--manifest-objects", "rows"], "--manifest-objects needs --manifest"),
        (["--manifest", str(no_boxes), "--manifest-objects", "rows"], "'xmin', 'ymin', 'xmax', 'ymax'"),
        (["--manifest", str(no_boxes), "--manifest-objects", "column"], "no 'objects' column"),
        (["--manifest", str(manifest), "--manifest-objects", "rows", "--label-regex", "x"], "--label-regex"),
        (["--manifest", str(manifest), "--box-units", "normalized"], "--box-units needs --manifest-objects"),
        (["--manifest", str(manifest), "--manifest-objects", "rows", "--dedupe"], "--dedupe"),
    ]
    for extra, words in cases:
        result = run_cli("convert", "--output", str(tmp_path / "o"), *extra)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.unit
def test_a_transient_error_reading_the_size_is_retried_not_a_reject(monkeypatch):
    """A busy server while reading a header fails the bundle (the runner retries it); a file that is not an
    image is the image's reject."""
    from beam_pipeline.vocab.refs import Ref

    ref = Ref("/data/a.jpg", "a.jpg", 10, "train", None, 1, annotations=table.RawObjects(None, ()))
    check = table._CheckObjects("pixels")  # noqa: SLF001 - the DoFn's own step

    def busy(path: str) -> tuple[int, int]:
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(table, "image_size", busy)
    with pytest.raises(ConnectionResetError):
        list(check.process(ref))

    def not_an_image(path: str) -> tuple[int, int]:
        raise OSError("cannot identify image file")

    monkeypatch.setattr(table, "image_size", not_an_image)
    [out] = list(check.process(ref))
    assert out.tag == "rejects" and out.value["reason"] == "unreadable"


def test_a_gs_manifest_and_images_make_the_same_shards_as_local_files(converted, object_set, gcs):
    """The manifest, its images and the output on the GCS emulator (sizes read from gs:// headers): the same
    shards, byte for byte, as the local run."""
    from .conftest import BUCKET

    out, _ = converted
    bucket = gcs.bucket(BUCKET)
    for file in object_set.rglob("*"):
        if file.is_file() and file.suffix != ".csv" and file.suffix != ".jsonl":
            bucket.blob(f"objects-in/{file.relative_to(object_set)}").upload_from_filename(str(file))
    bucket.blob("objects-in/objects.csv").upload_from_filename(str(object_set / "objects.csv"))
    convert("--manifest", f"gs://{BUCKET}/objects-in/objects.csv", "--manifest-objects", "rows",
            "--output", f"gs://{BUCKET}/objects-out/det", "--max-reject-fraction", "1", "--no_auth")  # fmt: skip
    remote = {b.name[len("objects-out/det/") :]: b for b in gcs.list_blobs(BUCKET, prefix="objects-out/det/")}
    shards = [s["file"] for split in load_info(out)["splits"].values() for s in split["shards"]]
    for name in [*shards, objects.LABEL_MAP_PBTXT, "labels.txt"]:
        assert remote[name].download_as_bytes() == (out / name).read_bytes(), name
    lines = remote[objects.OBJECT_REJECTS_JSONL].download_as_text().splitlines()
    assert len(lines) == len((out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines())


def test_a_killed_run_resumes_only_shards_whose_objects_did_not_change(tmp_path, monkeypatch, tf):
    """Killed after its 3rd finished shard, then run again after one object of a finished shard moved in the
    manifest: the other finished shards are taken, that one is written again with the new box."""
    from .test_resume import TMP, finished

    src, out = tmp_path / "src", tmp_path / "out"
    names = [f"img_{i:02d}.jpg" for i in range(24)]
    for seed, name in enumerate(names):
        write(str(src / name), image_bytes("jpeg", 48, 64, seed))
    rows = [(n, "train", "4", "4", "20", "20", ["cat", "dog"][i % 2], "", "", "") for i, n in enumerate(names)]
    manifest = write_csv(src / "objects.csv", rows)
    args = ["--manifest", str(manifest), "--manifest-objects", "rows", "--output", str(out),
            "--target-shard-mb", "0.004", "--no-transform", "--no-tfds-metadata"]  # fmt: skip
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.result:3:kill")
    assert run_cli("convert", *args).returncode != 0
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    [scratch] = [p for p in out.iterdir() if p.name.startswith(TMP)]
    taken = finished(scratch)
    assert len(taken) == 3
    moved = json.loads(Path(taken[0]["index_path"]).read_text().splitlines()[0])["path"]
    rows = [(r[0], "train", "6", "4", "20", "20", *r[6:]) if r[0] == moved else r for r in rows]
    write_csv(manifest, rows)

    convert(*args)
    info = load_info(out)
    assert info["resumed"]["shards"] == 2, info["resumed"]
    got = parsed_records(out, tf)
    assert sorted(got) == names
    assert got[moved]["image/object/bbox/xmin"][0] == pytest.approx(6 / 64, abs=1e-6)
    assert all(got[n]["image/object/bbox/xmin"][0] == pytest.approx(4 / 64, abs=1e-6) for n in names if n != moved)


@pytest.mark.unit
def test_rows_of_one_file_group_the_same_whatever_their_order():
    def row(path: str, box: str, label: str) -> tuple[str, dict[str, str]]:
        return "/m/a.jpg", {
            "path": path,
            "split": "train",
            **dict(zip(table.BOX_COLUMNS, box.split(","), strict=True)),
            "label": label,
        }

    rows = [row("a.jpg", "1,1,5,5", "b"), row("./a.jpg", "0,0,2,2", "a"), row("a.jpg", ",,,", "")]
    group = table.GroupObjectRows("rows").group
    [one] = list(group(("/m/a.jpg", rows)))
    assert list(group(("/m/a.jpg", rows[::-1]))) == [one]
    path, image, raw = one
    assert image == {"split": "train"} and raw.frame is None
    assert [o["label"] for o in raw.objects] == ["a", "b"]  # the empty row is no object
    rows[1][1]["split"] = "test"
    [out] = list(group(("/m/a.jpg", rows)))
    assert out.value["reason"] == reasons.CONFLICTING_ROWS and "split" in out.value["detail"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"xmin": "1", "ymin": "1", "xmax": "5", "ymax": "5", "label": "cat"}, None),
        ({"xmin": "1_000", "ymin": "1", "xmax": "5", "ymax": "5", "label": "cat"}, reasons.BAD_BOX),
        ({"xmin": "inf", "ymin": "1", "xmax": "5", "ymax": "5", "label": "cat"}, reasons.BAD_BOX),
        ({"xmin": float("nan"), "ymin": 1, "xmax": 5, "ymax": 5, "label": "cat"}, reasons.BAD_BOX),
        ({"xmin": True, "ymin": 1, "xmax": 5, "ymax": 5, "label": "cat"}, reasons.BAD_BOX),
        ({"xmin": 1, "ymin": 1, "xmax": 5, "label": "cat"}, reasons.BAD_BOX),
        ({"xmin": 1, "ymin": 1, "xmax": 11, "ymax": 5, "label": "cat"}, None),  # 1 px beyond: clipped
        ({"xmin": 1, "ymin": 1, "xmax": 11.5, "ymax": 5, "label": "cat"}, reasons.BOX_OUTSIDE_IMAGE),
        ({"xmin": 1, "ymin": 1, "xmax": 5, "ymax": 5, "label": "a\nb"}, reasons.UNKNOWN_CATEGORY),
        ("cat", reasons.BAD_ANNOTATION),
    ],
)
def test_check_object(raw, reason):
    got = table.check_object(raw, 10, 8, "pixels")
    assert (got.reason if isinstance(got, objects.Invalid) else None) == reason
    if reason is None:
        assert got.label == objects.UNASSIGNED and got.text == "cat" and got.bbox[2] <= 10


def test_boxes_turn_and_scale_with_exif_orientation_and_resize(tmp_path, tf):
    """Pixel boxes in the stored frame of EXIF-tagged JPEGs (all 8 orientations), converted with
    --apply-exif-orientation --resize-max-side: each box lies on the colour painted under it, in the recorded
    (turned, resized) image."""
    from .test_geometry import PAINTED, STORED_H, STORED_W, near, painted_jpeg, turned

    rows = []
    for o in range(1, 9):
        write(str(tmp_path / f"o{o}.jpg"), painted_jpeg(o))
        for colour, (x, y, w, h) in PAINTED:
            name = "red" if colour == PAINTED[0][0] else "blue"
            rows.append((f"o{o}.jpg", "train", str(x), str(y), str(x + w), str(y + h), name, "", "", ""))
    manifest = write_csv(tmp_path / "painted.csv", rows)
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--manifest-objects", "rows", "--output", str(out),
            "--apply-exif-orientation", "--resize-max-side", "100")  # fmt: skip
    records = parsed_records(out, tf)
    colours = {"red": PAINTED[0][0], "blue": PAINTED[1][0]}
    for o in range(1, 9):
        row = records[f"o{o}.jpg"]
        width, height = turned(o, STORED_W, STORED_H)
        width, height = round(width * 100 / STORED_W), round(height * 100 / STORED_W)
        image = tf.io.decode_image(row["image/encoded"], channels=3, expand_animations=False).numpy()
        assert image.shape[:2] == (height, width), o
        for text, box in zip(
            row["image/object/class/text"], zip(*(row[k] for k in BOX_KEYS), strict=True), strict=True
        ):
            x0, y0, x1, y1 = np.array(box) * [width, height, width, height]
            painted = near(image, colours[text.decode()])
            ys, xs = np.nonzero(painted)
            assert abs(xs.min() - x0) <= 1.5 and abs(xs.max() + 1 - x1) <= 1.5, (o, text, box)
            assert abs(ys.min() - y0) <= 1.5 and abs(ys.max() + 1 - y1) <= 1.5, (o, text, box)


@pytest.mark.parametrize("depth", [5_000, 900], ids=["deeper-than-json-loads", "json-loads-reads-it"])
def test_a_csv_objects_cell_nested_too_deep_is_that_images_bad_objects(object_set, tmp_path, depth):
    """A CSV cell of nested brackets rejects its image, not the run: 5,000 levels are deeper than json.loads goes;
    900 it reads, but Beam pickles the row's objects recursively, and the job failed "while pickling an object"."""
    deep = "[" * depth + "]" * depth
    fine = json.dumps([{"xmin": 10, "ymin": 5, "xmax": 30, "ymax": 25, "label": "dog"}])
    manifest = write_csv(object_set / "deep.csv", [("a.jpg", fine), ("neg.jpg", deep)], ["path", "objects"])
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--manifest-objects", "column", "--output", str(out),
            "--max-reject-fraction", "1")  # fmt: skip
    [row] = jsonl_lines(out / "rejects.jsonl")
    assert (row["path"], row["reason"]) == ("neg.jpg", reasons.BAD_OBJECTS)
    assert "nested deeper" in row["detail"]
    assert load_info(out)["examples"] == 1


@pytest.mark.parametrize(
    "damage",
    [b"background\ncat\ncat\ndog\n", b"background\ncat\nd\xffg\n", None],
    ids=["a-label-twice", "not-utf8", "missing"],
)
def test_incremental_from_a_names_only_dataset_whose_labels_txt_is_damaged_is_a_one_line_error(
    object_set, tmp_path, damage
):
    """Objects named, not numbered: the previous labels.txt gives their ids. Damaged, it was taken for none: the
    run started fresh ids (a new class sorted before the old ones) yet copied the unchanged records, which hold
    the old ids, so labels.txt and the records disagreed."""
    first_rows = [
        ("a.jpg", "train", "10", "5", "30", "25", "dog", "", "", ""),
        ("sub/b.png", "train", "1", "1", "10", "10", "cat", "", "", ""),
    ]
    first, second = tmp_path / "first", tmp_path / "second"
    convert("--manifest", str(write_csv(object_set / "v1.csv", first_rows)), "--manifest-objects", "rows",
            "--output", str(first))  # fmt: skip
    if damage is None:  # deleted: the records still hold the ids it gave
        (first / "labels.txt").unlink()
    else:
        (first / "labels.txt").write_bytes(damage)
    second_rows = [*first_rows, ("sub/b.png", "train", "0", "0", "4", "4", "ant", "", "", "")]
    result = run_cli("convert", "--manifest", str(write_csv(object_set / "v2.csv", second_rows)),
                     "--manifest-objects", "rows", "--output", str(second), "--incremental-from", str(first),
                     "--no-transform", "--no-tfds-metadata")  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, (result.stderr, result.stdout)
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --incremental-from {first}: ") and "labels.txt" in line


def test_boxes_all_within_0_and_1_read_as_pixels_get_a_note_naming_box_units(object_set, tmp_path, converted):
    """YOLO- or Vertex-style normalized boxes under the default --box-units pixels became boxes of under a pixel
    in every image's corner, silently."""
    rows = [
        ("a.jpg", "train", "0.25", "0.5", "0.75", "1.0", "dog", "", "", ""),
        ("sub/b.png", "train", "0", "0.1", "0.5", "0.5", "cat", "", "", ""),
        ("neg.jpg", "train", "", "", "", "", "", "", "", ""),
    ]
    manifest = write_csv(object_set / "looks-normalized.csv", rows)
    args = ("--manifest", str(manifest), "--manifest-objects", "rows", "--max-reject-fraction", "1")
    pixels = convert(*args, "--output", str(tmp_path / "px"))
    assert "--box-units normalized" in pixels.stderr
    normalized = convert(*args, "--box-units", "normalized", "--output", str(tmp_path / "norm"))
    assert "--box-units" not in normalized.stderr
    assert "--box-units" not in converted[1].stderr  # pixel boxes, one of them within [0, 1]: no note


@pytest.mark.unit
def test_an_object_of_other_keys_or_a_label_list_is_rejected_saying_so():
    """A JSON object in x/y/width/height (COCO's box) said its box 'holds a value that is not a number' and a
    label given as a list said the name 'is empty': neither said what was wrong."""
    other = table.check_object({"x": 1, "y": 1, "width": 4, "height": 4, "label": "cat"}, 10, 8, "pixels")
    assert isinstance(other, objects.Invalid) and other.reason == reasons.BAD_BOX
    assert "no xmin, ymin, xmax, ymax" in other.detail and "'width'" in other.detail
    listed = table.check_object({"xmin": 1, "ymin": 1, "xmax": 5, "ymax": 5, "label": ["cat"]}, 10, 8, "pixels")
    assert isinstance(listed, objects.Invalid) and listed.reason == reasons.UNKNOWN_CATEGORY
    assert "not text" in listed.detail


def test_a_labels_file_fixes_the_ids_of_manifest_objects(object_set, tmp_path, tf):
    """--labels-file with --manifest-objects: ids in the file's order, a name not in it an unknown_category."""
    manifest = write_csv(
        object_set / "fixed.csv",
        [
            ("a.jpg", "train", "10", "5", "30", "25", "dog", "", "", ""),
            ("a.jpg", "train", "1", "1", "9", "9", "cat", "", "", ""),
            ("sub/b.png", "train", "1", "1", "10", "10", "emu", "", "", ""),  # not in the file
        ],
    )
    labels = tmp_path / "labels.txt"
    labels.write_text("dog\ncat\n")
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--manifest-objects", "rows", "--labels-file", str(labels),
            "--output", str(out), "--max-reject-fraction", "1")  # fmt: skip
    assert [(t, c) for t, c, _, _ in objects_of(parsed_records(out, tf)["a.jpg"])] == [("cat", 2), ("dog", 1)]
    assert (out / "labels.txt").read_text().splitlines() == ["background", "dog", "cat"]
    [row] = jsonl_lines(out / objects.OBJECT_REJECTS_JSONL)
    assert row["reason"] == reasons.UNKNOWN_CATEGORY and "not in --labels-file" in row["detail"]


@pytest.mark.parametrize("form", ["rows", "column"])
def test_an_integer_coordinate_beyond_a_floats_range_is_a_bad_box_not_a_failed_job(object_set, tmp_path, form):
    """JSON reads 1 followed by 400 zeros as an exact integer, and float() of it raised OverflowError in the
    object check: the whole job failed (exit 1) for one coordinate. It is a bad_box, the image and the other
    objects stay."""
    huge = int("1" + "0" * 400)
    good = {"xmin": 10, "ymin": 5, "xmax": 30, "ymax": 25, "label": "dog"}
    bad = {**good, "xmin": huge}
    if form == "rows":
        lines = [{"path": "a.jpg", **bad}, {"path": "a.jpg", **good}]
    else:
        lines = [{"path": "a.jpg", "objects": [bad, good]}]
    manifest = object_set / f"huge-{form}.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    result = convert("--manifest", str(manifest), "--manifest-objects", form, "--output", str(out))
    assert result.returncode == 0, result.stderr
    [row] = jsonl_lines(out / objects.OBJECT_REJECTS_JSONL)
    assert row["reason"] == reasons.BAD_BOX and "not a finite number" in row["detail"]
    assert load_info(out)["objects"]["kept"] == 1


@pytest.mark.parametrize(
    "width",
    [int("1" + "0" * 400), "1" + "0" * 400, "²", "1" * 5000],
    ids=["json-int-beyond-float", "text-beyond-float", "superscript-two", "5000-digits"],
)
def test_a_frame_size_no_image_can_have_is_the_images_bad_image_size_not_a_failed_job(object_set, tmp_path, width):
    """A width of 10**400 made the box check overflow a float; "²" passed str.isdigit() and int() refused it;
    5,000 digits are beyond what int() reads: each failed the whole job (exit 1). Now the image's reject."""
    box = {"xmin": 1, "ymin": 2, "xmax": 20, "ymax": 10, "label": "cat"}
    lines = [{"path": "a.jpg", **box, "width": width, "height": 48}, {"path": "neg.jpg", **box}]
    manifest = object_set / f"frame-{abs(hash(str(width))) % 10**8}.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--manifest-objects", "rows", "--output", str(out),
            "--max-reject-fraction", "1")  # fmt: skip
    [row] = jsonl_lines(out / "rejects.jsonl")
    assert row["path"] == "a.jpg" and row["reason"] == reasons.BAD_IMAGE_SIZE
    assert load_info(out)["objects"]["kept"] == 1


def test_over_4300_digit_numbers_and_half_surrogates_in_csv_cells_are_rejects_not_a_failed_job(object_set, tmp_path):
    """Python's int() refuses text of over 4,300 digits, and a CSV cell's JSON may escape half a surrogate
    pair: a 5,000-digit coordinate (in the launcher's first look and in the job), a 5,000-digit number in
    an objects cell and a class named "\\ud800" each failed the whole job. Now: a bad_box, the image's
    bad_objects, an unknown_category."""
    digits = "1" * 5000
    rows = [
        ("a.jpg", "train", digits, "5", "30", "25", "dog", "", "", ""),
        ("a.jpg", "train", "10", "5", "30", "25", "dog", "", "", ""),
    ]
    out = tmp_path / "rows"
    convert("--manifest", str(write_csv(object_set / "digits.csv", rows)), "--manifest-objects", "rows",
            "--output", str(out), "--max-reject-fraction", "1")  # fmt: skip
    [row] = jsonl_lines(out / objects.OBJECT_REJECTS_JSONL)
    assert row["reason"] == reasons.BAD_BOX and "not a finite number" in row["detail"]
    big = '[{"xmin": ' + digits + ', "ymin": 1, "xmax": 5, "ymax": 5, "label": "dog"}]'
    half = '[{"xmin": 1, "ymin": 1, "xmax": 5, "ymax": 5, "label": "\\ud800"}, ' \
        '{"xmin": 1, "ymin": 1, "xmax": 6, "ymax": 6, "label": "cat"}]'  # fmt: skip
    cells = write_csv(object_set / "cells.csv", [("a.jpg", big), ("neg.jpg", half)], ["path", "objects"])
    out = tmp_path / "cells"
    convert("--manifest", str(cells), "--manifest-objects", "column", "--output", str(out),
            "--max-reject-fraction", "1")  # fmt: skip
    assert [(r["path"], r["reason"]) for r in jsonl_lines(out / "rejects.jsonl")] == [("a.jpg", reasons.BAD_OBJECTS)]
    [row] = jsonl_lines(out / objects.OBJECT_REJECTS_JSONL)
    assert row["reason"] == reasons.UNKNOWN_CATEGORY and "surrogate" in row["detail"]
    assert (out / "labels.txt").read_text().splitlines() == ["background", "cat"]


def test_a_csv_cell_longer_than_csvs_default_limit_converts(object_set, tmp_path):
    """csv's default field limit (128 KB) failed a run on one long label, which a JSONL line holds; an extra
    column of 5,000 digits failed the column-type inference (int() refuses it): it is a float column now."""
    rows = [("a.jpg", "x" * 200_000, "1" * 5000), ("neg.jpg", "short", "3")]
    manifest = write_csv(object_set / "long.csv", rows, ["path", "label", "score"])
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--output", str(out), "--max-reject-fraction", "1")
    assert sorted(len(line) for line in (out / "labels.txt").read_text().splitlines()) == [5, 200_000]
    assert load_info(out)["features"]["score"]["dtype"] == "float32"


def test_a_csv_width_written_as_64_point_0_is_the_frame_as_in_json(object_set, tmp_path):
    """A JSONL width 64.0 (and COCO's) is read as 64, as some tools write it; the same text in a CSV cell was a
    bad_image_size reject."""
    rows = [("a.jpg", "train", "10", "5", "30", "25", "dog", "64.0", "48.0", "")]
    out = tmp_path / "out"
    convert("--manifest", str(write_csv(object_set / "point-zero.csv", rows)), "--manifest-objects", "rows",
            "--output", str(out))  # fmt: skip
    assert not jsonl_lines(out / "rejects.jsonl") and load_info(out)["objects"]["kept"] == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "want"),
    [("64", 64), (" 64.0 ", 64), ("0000000000000000032", 32), ("３２", 32), ("١٢", 12), ("²", None), ("1" * 19, None),
     ("1" * 5000, None), ("64.5", None), ("0", None), ("-3", None)],
)  # fmt: skip
def test_frame_size_text(text, want):
    """A width/height cell as int() reads it (any script's digits, leading zeros), "64.0" too; never int()'s
    errors ("²" is a digit to str.isdigit, 5,000 digits are beyond int()), nor a side of 2**31 or more."""
    assert table._whole(text) == want  # noqa: SLF001
