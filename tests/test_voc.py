"""--voc: a generated Pascal VOC set converted with the CLI, read back with TensorFlow's OD API feature spec."""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from beam_pipeline.annotations import coco, join, objects, voc
from beam_pipeline.vocab import reasons

from .conftest import convert, load_info, run_cli
from .imagegen import image_bytes, write
from .test_coco import od_api_spec

pytestmark = pytest.mark.e2e

# name → (format, height, width); the XMLs below describe them
IMAGES = {
    "000001.jpg": ("jpeg", 48, 64),
    "000002.png": ("png", 40, 50),
    "000003.webp": ("webp", 30, 30),  # an XML without objects: a negative
    "000004.gif": ("gif", 24, 32),  # an XML without <size>: the image's own size is the frame
    "sub/000005.jpg": ("jpeg", 20, 20),  # its XML is Annotations/sub/000005.xml naming "000005.jpg"
    "000006.jpg": ("jpeg", 20, 20),  # the XML says 100 x 100: annotation_size_mismatch
    "000007.jpg": ("jpeg", 20, 20),  # named by two XMLs: duplicate_file_name
    "000009.bmp": ("bmp", 20, 20),  # every object rejected: still an image
    "000010.tiff": ("tiff", 20, 30),  # paired by <path>'s last part (no <filename>)
    "extra.jpg": ("jpeg", 20, 20),  # no XML: skipped
}

# The class ids of the run: 1…N by name (0 is the background)
IDS = {"cat": 1, "dog": 2, "horse": 3, "person": 4, "zebra": 5}

BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n<!ENTITY lol "lol">\n'
    + "".join(f'<!ENTITY lol{i} "{("&lol%s;" % (i - 1 or "")) * 10}">\n' for i in range(1, 10))
    + "]>\n<annotation><filename>000001.jpg</filename><object><name>&lol9;</name></object></annotation>\n"
)
EXTERNAL_ENTITY = (
    '<?xml version="1.0"?>\n<!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
    "<annotation><filename>000001.jpg</filename><object><name>&x;</name></object></annotation>\n"
)


def obj(
    name: str | None,
    box: tuple[Any, Any, Any, Any] | None,
    difficult: str | None = "0",
    truncated: str | None = "0",
    pose: str | None = "Unspecified",
) -> str:
    """One <object> as VOC writes it (a None field is left out)."""
    parts = [f"<name>{name}</name>" if name is not None else ""]
    parts += [f"<pose>{pose}</pose>" if pose is not None else ""]
    parts += [f"<truncated>{truncated}</truncated>" if truncated is not None else ""]
    parts += [f"<difficult>{difficult}</difficult>" if difficult is not None else ""]
    if box is not None:
        corners = "".join(f"<{k}>{v}</{k}>" for k, v in zip(("xmin", "ymin", "xmax", "ymax"), box, strict=True))
        parts.append(f"<bndbox>{corners}</bndbox>")
    return "<object>" + "".join(parts) + "</object>"


def xml(filename: str | None, size: tuple[int, int] | None, *objs: str, path: str | None = None) -> str:
    """A VOC annotation file; ``size`` is (width, height), None leaves <size> out."""
    head = "<folder>VOC2007</folder>"
    head += f"<filename>{filename}</filename>" if filename is not None else ""
    head += f"<path>{path}</path>" if path is not None else ""
    head += "<source><database>generated</database></source>"
    if size is not None:
        head += f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>"
    return f"<annotation>{head}<segmented>0</segmented>{''.join(objs)}</annotation>\n"


def make_voc(base: Path) -> tuple[Path, Path]:
    """JPEGImages/ and Annotations/ under ``base``, with every case of the validation list."""
    images, annotations = base / "JPEGImages", base / "Annotations"
    for i, (name, (kind, h, w)) in enumerate(IMAGES.items()):
        write(str(images / name), image_bytes(kind, height=h, width=w, seed=i))
    files = {
        "000001.xml": xml(
            "000001.jpg",
            (64, 48),
            obj("dog", (1, 1, 64, 48), difficult="1", pose="Left"),
            obj("cat", (10, 5, 30.5, 25), truncated="1", pose="Frontal"),
        ),
        "000002.xml": xml(
            "000002.png",
            (50, 40),
            obj("person", (5, 5, 20, 30), difficult=None, truncated=None, pose=None),
            obj("", (1, 1, 5, 5)),  # unknown_category: empty
            obj("dog", (20, 5, 10, 30)),  # bad_box: xmax < xmin
            obj("dog", ("nan", 5, 10, 30)),  # bad_box: NaN
            obj("dog", ("abc", 5, 10, 30)),  # bad_box: not a number
            obj("dog", None),  # bad_box: no bndbox
            obj("dog", (5, 5, 60, 30)),  # box_outside_image
            obj("horse", (30, 2, 51, 40)),  # one pixel over: clipped to 50
            obj("dog", (5, 5, 10, 10), difficult="2"),  # bad_annotation
            obj("background", (5, 5, 10, 10)),  # unknown_category: id 0 is the background's
        ),
        "000003.xml": xml("000003.webp", (30, 30)),
        "000004.xml": xml("000004.gif", None, obj("horse", (2, 3, 12, 13))),
        "sub/000005.xml": xml("000005.jpg", (20, 20), obj("zebra", (1, 1, 20, 20))),
        "000006.xml": xml("000006.jpg", (100, 100), obj("dog", (1, 1, 50, 50))),
        "000007a.xml": xml("000007.jpg", (20, 20), obj("dog", (1, 1, 5, 5))),
        "000007b.xml": xml("000007.jpg", (20, 20), obj("cat", (1, 1, 5, 5))),
        "000008.xml": xml("missing.jpg", (20, 20), obj("dog", (1, 1, 5, 5))),  # missing_image
        "000009.xml": xml("000009.bmp", (20, 20), obj("dog", (5, 5, 5, 9))),
        "000010.xml": xml(None, (30, 20), obj("cat", (3, 4, 10, 12)), path="C:\\Users\\me\\voc\\000010.tiff"),
        "broken.xml": "<annotation><filename>000001.jpg</filename>",
        "not_voc.xml": "<foo><filename>000001.jpg</filename></foo>",
        "bomb.xml": BILLION_LAUGHS,
        "external.xml": EXTERNAL_ENTITY,
        "notes.txt": "not an XML: not read",
    }
    for name, text in files.items():
        (annotations / name).parent.mkdir(parents=True, exist_ok=True)
        (annotations / name).write_text(text)
    return images, annotations


def parsed_records(out: Path, tf: Any) -> dict[str, dict[str, Any]]:
    """{image/filename: parsed features (dense numpy)} of every record, with the OD API spec plus its view key."""
    spec = {**od_api_spec(tf), objects.VIEW: tf.io.VarLenFeature(tf.string)}
    rows = {}
    for split in load_info(out)["splits"].values():
        for shard in split["shards"]:
            for raw in tf.data.TFRecordDataset(str(out / shard["file"])):
                parsed = tf.io.parse_single_example(raw, spec)
                row = {
                    k: (tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v).numpy()
                    for k, v in parsed.items()
                }
                rows[row["image/filename"].decode()] = row
    return rows


def boxes(row: dict[str, Any]) -> list[tuple[float, ...]]:
    return list(zip(*(row[f"image/object/bbox/{k}"] for k in ("xmin", "ymin", "xmax", "ymax")), strict=True))


def texts(row: dict[str, Any], key: str) -> list[str]:
    return [t.decode() for t in row[key]]


def assert_boxes(got: list[tuple[float, ...]], want: list[tuple[float, ...]]) -> None:
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want, strict=True):
        assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(g, w, strict=True)), (got, want)


@pytest.fixture(scope="module")
def voc_set(tmp_path_factory):
    return make_voc(tmp_path_factory.mktemp("voc"))


@pytest.fixture(scope="module")
def converted(voc_set, tmp_path_factory):
    """One conversion with default flags (TFT analysis and TFDS metadata included), rejects allowed."""
    images, annotations = voc_set
    out = tmp_path_factory.mktemp("voc-out") / "det"
    result = convert(
        "--input", str(images), "--voc", str(annotations), "--output", str(out), "--max-reject-fraction", "1",
        transform=True, tfds=True,
    )  # fmt: skip
    return out, result


def test_boxes_classes_flags_and_poses_read_back_as_the_xml_says(converted, tf):
    """Boxes are xmin / width as written (the TF OD API's create_pascal_tf_record.py), classes 1…N by name."""
    out, _ = converted
    rows = parsed_records(out, tf)
    assert sorted(rows) == ["000001.jpg", "000002.png", "000003.webp", "000004.gif", "000009.bmp", "000010.tiff",
                            "sub/000005.jpg"]  # fmt: skip
    one = rows["000001.jpg"]
    assert_boxes(boxes(one), [(1 / 64, 1 / 48, 1.0, 1.0), (10 / 64, 5 / 48, 30.5 / 64, 25 / 48)])
    assert list(one["image/object/class/label"]) == [IDS["dog"], IDS["cat"]]
    assert texts(one, "image/object/class/text") == ["dog", "cat"]
    assert list(one["image/object/difficult"]) == [1, 0]
    assert list(one["image/object/truncated"]) == [0, 1]
    assert texts(one, objects.VIEW) == ["Left", "Frontal"]
    assert one["image/source_id"].decode() == "000001.jpg"  # <filename>, as the OD API's script writes it
    assert list(one["image/object/area"]) == pytest.approx([63 * 47, 20.5 * 20])

    two = rows["000002.png"]  # the valid objects only; the one a pixel over the edge is clipped
    assert_boxes(boxes(two), [(5 / 50, 5 / 40, 20 / 50, 30 / 40), (30 / 50, 2 / 40, 1.0, 1.0)])
    assert list(two["image/object/class/label"]) == [IDS["person"], IDS["horse"]]
    assert list(two["image/object/difficult"]) == [0, 0] and list(two["image/object/truncated"]) == [0, 0]
    assert texts(two, objects.VIEW) == ["Unspecified", "Unspecified"]  # no <pose>: VOC's own default

    assert len(rows["000003.webp"]["image/object/class/label"]) == 0  # a negative
    assert_boxes(boxes(rows["000004.gif"]), [(2 / 32, 3 / 24, 12 / 32, 13 / 24)])  # frame: the GIF's 32 x 24
    assert list(rows["sub/000005.jpg"]["image/object/class/label"]) == [IDS["zebra"]]
    assert len(rows["000009.bmp"]["image/object/class/label"]) == 0  # every object rejected: still an image
    ten = rows["000010.tiff"]
    assert_boxes(boxes(ten), [(3 / 30, 4 / 20, 10 / 30, 12 / 20)])
    assert ten["image/source_id"].decode() == "000010.tiff"


@pytest.mark.smoke
def test_every_validation_reason_with_its_path(converted):
    out, _ = converted
    rows = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    got = {(Path(r["path"]).name, r["reason"]) for r in rows}
    assert got == {
        ("broken.xml", reasons.BAD_ANNOTATION),
        ("not_voc.xml", reasons.BAD_ANNOTATION),
        ("bomb.xml", reasons.BAD_ANNOTATION),  # billion laughs: refused before any entity is expanded
        ("external.xml", reasons.BAD_ANNOTATION),  # an external entity is never read
        ("missing.jpg", reasons.MISSING_IMAGE),
        ("000007.jpg", reasons.DUPLICATE_FILE_NAME),
        ("000006.jpg", reasons.ANNOTATION_SIZE_MISMATCH),
    }
    bomb = next(r for r in rows if r["path"].endswith("bomb.xml"))
    assert "DOCTYPE" in bomb["detail"]
    duplicate = next(r for r in rows if r["reason"] == reasons.DUPLICATE_FILE_NAME)
    assert "000007a.xml" in duplicate["detail"] and "000007b.xml" in duplicate["detail"]
    assert "000008.xml" in next(r for r in rows if r["reason"] == reasons.MISSING_IMAGE)["detail"]

    lines = [json.loads(line) for line in (out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines()]
    got_objects = {(r["path"], r["object"], r["reason"]) for r in lines}
    assert got_objects == {
        ("000002.png", 1, reasons.UNKNOWN_CATEGORY),
        ("000002.png", 2, reasons.BAD_BOX),
        ("000002.png", 3, reasons.BAD_BOX),
        ("000002.png", 4, reasons.BAD_BOX),
        ("000002.png", 5, reasons.BAD_BOX),
        ("000002.png", 6, reasons.BOX_OUTSIDE_IMAGE),
        ("000002.png", 8, reasons.BAD_ANNOTATION),
        ("000002.png", 9, reasons.UNKNOWN_CATEGORY),
        ("000009.bmp", 0, reasons.BAD_BOX),
    }
    assert all(r["annotation_id"].endswith(".xml") and r["detail"] for r in lines)

    info = load_info(out)
    assert info["rejects"]["by_reason"] == {
        reasons.BAD_ANNOTATION: 4,
        reasons.ANNOTATION_SIZE_MISMATCH: 1,
        reasons.DUPLICATE_FILE_NAME: 1,
        reasons.MISSING_IMAGE: 1,
    }
    assert info["skipped"]["by_reason"] == {voc.NOT_IN_VOC: 1}
    assert info["objects"] == {
        "kept": 2 + 2 + 1 + 1 + 1,  # 000001, 000002, 000004, 000005, 000010 (not 000006: the writer rejects it)
        "rejects": {
            "total": 9,
            "by_reason": {
                reasons.BAD_ANNOTATION: 1,
                reasons.BAD_BOX: 5,
                reasons.BOX_OUTSIDE_IMAGE: 1,
                reasons.UNKNOWN_CATEGORY: 2,
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
    assert (out / "labels.txt").read_text().splitlines() == ["background", "cat", "dog", "horse", "person", "zebra"]
    assert (out / objects.LABEL_MAP_PBTXT).read_text() == "".join(
        f"item {{\n  id: {i}\n  name: '{name}'\n}}\n" for name, i in IDS.items()
    )
    info = load_info(out)
    assert info["categories"] == [{"id": i, "name": name} for name, i in IDS.items()]
    assert info["config"]["voc"]
    verify = run_cli("inspect", str(out), "--verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_an_incremental_run_keeps_ids_and_reconverts_a_changed_xml(voc_set, tmp_path, tf):
    """--incremental-from: a new class follows the earlier ids; an XML changed while its image did not is
    converted again, the unchanged images are copied."""
    src_images, src_annotations = voc_set
    images, annotations = tmp_path / "JPEGImages", tmp_path / "Annotations"
    shutil.copytree(src_images, images)
    shutil.copytree(src_annotations, annotations)
    first, second = tmp_path / "first", tmp_path / "second"
    args = ("--input", str(images), "--voc", str(annotations), "--max-reject-fraction", "1")
    convert(*args, "--output", str(first))
    (annotations / "000001.xml").write_text(
        xml("000001.jpg", (64, 48), obj("dog", (11, 2, 40, 30)), obj("cat", (10, 5, 30.5, 25)))
    )
    write(str(images / "new.jpg"), image_bytes("jpeg", height=20, width=20, seed=99))
    (annotations / "new.xml").write_text(xml("new.jpg", (20, 20), obj("ant", (1, 1, 10, 10)), obj("cat", (2, 2, 4, 4))))
    convert(*args, "--output", str(second), "--incremental-from", str(first))

    assert (second / "labels.txt").read_text().splitlines() == [
        "background", "cat", "dog", "horse", "person", "zebra", "ant",
    ]  # fmt: skip
    rows = parsed_records(second, tf)
    assert list(rows["new.jpg"]["image/object/class/label"]) == [6, IDS["cat"]]
    assert rows["000001.jpg"]["image/object/bbox/xmin"][0] == pytest.approx(11 / 64, abs=1e-6)
    assert list(rows["sub/000005.jpg"]["image/object/class/label"]) == [IDS["zebra"]]  # a reused record: same id
    inc = load_info(second)["incremental"]
    assert inc["converted"] == 2 and inc["reused"] == 6, inc
    assert load_info(second)["categories"][-1] == {"id": 6, "name": "ant"}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("filename", "path", "xml_relpath", "want"),
    [
        ("a.jpg", None, "a.xml", "a.jpg"),
        ("a.jpg", None, "cats/a.xml", "cats/a.jpg"),  # a bare name is in the XML's folder
        ("dogs/a.jpg", None, "cats/a.xml", "dogs/a.jpg"),  # a relative path is from --input
        ("./x/../a.jpg", None, "a.xml", "a.jpg"),
        (None, "/home/someone/VOC/JPEGImages/a.png", "a.xml", "a.png"),  # only <path>'s name is used
        ("", "C:\\data\\a.png", "b/a.xml", "b/a.png"),
        (None, None, "a.xml", None),
    ],
)
def test_the_pairing_rule(filename, path, xml_relpath, want):
    root = voc.parse_xml(xml(filename, (10, 10), path=path).encode())
    assert voc.image_key(root, xml_relpath) == want


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({"name": "dog", "bndbox": ("1", "2", "10", "10")}, (1.0, 2.0, 10.0, 10.0)),
        ({"name": "dog", "bndbox": ("0", "0", "11", "10")}, (0.0, 0.0, 10.0, 10.0)),  # a pixel over: clipped
        ({"name": "dog", "bndbox": ("1", "2", "11.5", "10")}, reasons.BOX_OUTSIDE_IMAGE),
        ({"name": "dog", "bndbox": ("5", "2", "5", "10")}, reasons.BAD_BOX),
        ({"name": "dog", "bndbox": ("5", "2", "inf", "10")}, reasons.BAD_BOX),
        ({"name": "dog", "bndbox": ("5", None, "6", "10")}, reasons.BAD_BOX),
        ({"name": "dog\ncat", "bndbox": ("1", "2", "10", "10")}, reasons.UNKNOWN_CATEGORY),
        ({"name": None, "bndbox": ("1", "2", "10", "10")}, reasons.UNKNOWN_CATEGORY),
        ({"name": "dog", "bndbox": ("1", "2", "10", "10"), "truncated": "yes"}, reasons.BAD_ANNOTATION),
    ],
)
def test_check_object(fields, want):
    got = voc.check_object(fields, 10, 10)
    assert (got.reason if isinstance(got, objects.Invalid) else got.bbox) == want


@pytest.mark.unit
def test_a_billion_laughs_is_refused_at_once():
    """The DOCTYPE is refused before its entities are declared, let alone expanded (no memory, no time)."""
    for text in (BILLION_LAUGHS, EXTERNAL_ENTITY):
        with pytest.raises(ValueError, match="DOCTYPE"):
            voc.parse_xml(text.encode())


def test_cli_errors_name_the_flag(tmp_path, voc_set):
    images, annotations = voc_set
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "bg.txt").write_text("cat\nbackground\n")
    (tmp_path / "spaced.txt").write_text("dog \ncat\n")
    (tmp_path / "onlybg.txt").write_text("background\n")
    cases = [
        (["--voc", str(tmp_path / "nope")], "--voc"),
        (["--voc", str(empty)], "no .xml files"),
        (["--voc", str(annotations), "--labels-file", str(tmp_path / "bg.txt")], "'background' is id 0"),
        # a line no stripped class name can match would take an id and drop every object of that class
        (["--voc", str(annotations), "--labels-file", str(tmp_path / "spaced.txt")], "'dog ' has spaces around it"),
        (["--voc", str(annotations), "--labels-file", str(tmp_path / "onlybg.txt")], "no class names in it"),
        (["--voc", str(annotations), "--coco", str(tmp_path / "i.json")], "--coco"),
        (["--voc", str(annotations), "--dedupe"], "--dedupe"),
    ]
    for extra, word in cases:
        result = run_cli("convert", "--input", str(images), "--output", str(tmp_path / "o"), *extra)
        assert result.returncode == 2, result.stderr
        assert word in result.stderr and "Traceback" not in result.stderr


def test_the_summary_counts_objects(converted):
    _, result = converted
    assert "objects             7 kept, 2 images without any" in result.stdout
    assert "objects out         9 (bad_box 5, " in result.stdout
    assert "categories          5 -> label_map.pbtxt, labels.txt" in result.stdout


@pytest.mark.unit
def test_an_oversized_xml_is_a_reject_and_is_not_read(tmp_path, monkeypatch):
    """A file far bigger than any VOC annotation is refused by its listed size (never read into memory)."""
    from apache_beam.io.filesystem import FileMetadata

    big = tmp_path / "big.xml"
    big.write_text(xml("a.jpg", (10, 10), obj("dog", (1, 1, 5, 5))))
    monkeypatch.setattr(voc, "MAX_XML_BYTES", 64)
    [out] = list(voc._ParseXml(str(tmp_path)).process(FileMetadata(str(big), 63)))  # noqa: SLF001
    assert out.tag == "rejects" and "larger than" in out.value["detail"]  # it grew past the cap since listed
    [out] = list(voc._ParseXml(str(tmp_path)).process(FileMetadata(str(tmp_path / "absent.xml"), 10**9)))  # noqa: SLF001
    assert out.value["reason"] == reasons.BAD_ANNOTATION and "larger than" in out.value["detail"]
    monkeypatch.setattr(voc, "MAX_XML_BYTES", 10**6)
    [(key, (tag, parsed))] = list(voc._ParseXml(str(tmp_path)).process(FileMetadata(str(big), big.stat().st_size)))  # noqa: SLF001
    assert key == "a.jpg" and tag == voc.VOC and parsed.objects[0]["name"] == "dog"


@pytest.mark.unit
def test_an_image_without_size_or_readable_header_gets_no_frame(tmp_path):
    """<size> missing: the header's size is the frame; a file that is not an image gets none (0 x 0) and no
    object rejects (its boxes were not wrong): the writer rejects the image with why."""
    from beam_pipeline.vocab.refs import Ref

    from .imagegen import broken_bytes

    good, bad = tmp_path / "a.png", tmp_path / "b.jpg"
    write(str(good), image_bytes("png", height=7, width=9))
    write(str(bad), broken_bytes("text"))
    raw = {"name": "dog", "bndbox": ("1", "1", "9", "7")}

    def attach(path: Path) -> list[Any]:
        ref = Ref(str(path), path.name, path.stat().st_size, "train", None, 1)
        parsed = voc.VocFile(str(path) + ".xml", path.name, 0, 0, (raw,))
        return list(voc._Attach(str(tmp_path)).process((path.name, [(join.REFS, ref), (voc.VOC, parsed)])))  # noqa: SLF001

    [ref] = attach(good)
    assert (ref.annotations.width, ref.annotations.height) == (9, 7) and len(ref.annotations.objects) == 1
    [ref] = attach(bad)
    assert (ref.annotations.width, ref.annotations.height, ref.annotations.objects) == (0, 0, ())


def test_gs_annotations_and_images_make_the_same_shards_as_local_files(converted, voc_set, gcs):
    """--input, --voc and --output on the GCS emulator: the same shards, byte for byte, as the local run."""
    from .conftest import BUCKET

    out, _ = converted
    bucket = gcs.bucket(BUCKET)
    for name, folder in zip(("voc-in", "voc-xml"), voc_set, strict=True):
        for file in folder.rglob("*"):
            if file.is_file():
                bucket.blob(f"{name}/{file.relative_to(folder)}").upload_from_filename(str(file))
    convert("--input", f"gs://{BUCKET}/voc-in", "--voc", f"gs://{BUCKET}/voc-xml",
            "--output", f"gs://{BUCKET}/voc-out/det", "--max-reject-fraction", "1", "--no_auth")  # fmt: skip
    remote = {b.name[len("voc-out/det/") :]: b for b in gcs.list_blobs(BUCKET, prefix="voc-out/det/")}
    shards = [s["file"] for split in load_info(out)["splits"].values() for s in split["shards"]]
    for name in [*shards, objects.LABEL_MAP_PBTXT, "labels.txt"]:
        assert remote[name].download_as_bytes() == (out / name).read_bytes(), name
    reasons = [
        json.loads(line)["reason"] for line in remote[objects.OBJECT_REJECTS_JSONL].download_as_text().splitlines()
    ]
    assert len(reasons) == 9


def small_voc(base: Path, n: int = 24) -> tuple[Path, Path]:
    """n JPEGs with an XML each (dog or cat), for runs with many small shards."""
    images, annotations = base / "JPEGImages", base / "Annotations"
    annotations.mkdir(parents=True)
    for i in range(n):
        write(str(images / f"{i:03d}.jpg"), image_bytes("jpeg", height=32, width=32, seed=i))
        name = ("dog", "cat")[i % 2]
        (annotations / f"{i:03d}.xml").write_text(xml(f"{i:03d}.jpg", (32, 32), obj(name, (1, 1, 10 + i, 12))))
    return images, annotations


def test_a_killed_run_resumes_and_a_class_added_meanwhile_resumes_nothing(tmp_path, monkeypatch, tf):
    """Killed after 2 shards, the same command takes them (same output as a run never killed). If an XML
    gained a class that sorts first meanwhile, every id moves: no finished shard is taken, records get new ids."""
    from .test_resume import ARGS, QUICK, finished, killed_run, same_output

    images, annotations = small_voc(tmp_path / "voc")
    voc_args = ("--voc", str(annotations), *QUICK)
    ref, out = tmp_path / "ref", tmp_path / "out"
    convert("--input", str(images), "--output", str(ref), *ARGS, *voc_args)
    assert sum(s["num_shards"] for s in load_info(ref)["splits"].values()) > 2
    scratch = killed_run(images, out, monkeypatch, "writer.result:2:kill", *voc_args)
    assert len(finished(scratch)) == 2
    convert("--input", str(images), "--output", str(out), *ARGS, *voc_args)
    same_output(out, ref)
    assert load_info(out)["resumed"]["shards"] == 2

    again = tmp_path / "again"
    scratch = killed_run(images, again, monkeypatch, "writer.result:2:kill", *voc_args)
    (annotations / "000.xml").write_text(xml("000.jpg", (32, 32), obj("ant", (1, 1, 10, 12))))
    convert("--input", str(images), "--output", str(again), *ARGS, *voc_args)
    assert load_info(again).get("resumed") is None  # no shard taken: the ids they hold are not this run's
    assert (again / "labels.txt").read_text().splitlines() == ["background", "ant", "cat", "dog"]
    rows = parsed_records(again, tf)
    assert {texts(r, "image/object/class/text")[0]: int(r["image/object/class/label"][0]) for r in rows.values()} == {
        "ant": 1,
        "cat": 2,
        "dog": 3,
    }


def test_boxes_follow_exif_orientation_and_resize(tmp_path, tf):
    """VOC boxes are in the stored pixels; --apply-exif-orientation turns them with the pixels (orientation 6:
    the axes swap) and --resize-max-side keeps normalized boxes, the area scaled to the recorded pixels."""
    from .test_geometry import PAINTED, STORED_H, STORED_W, painted_jpeg

    images, annotations = tmp_path / "JPEGImages", tmp_path / "Annotations"
    images.mkdir()
    annotations.mkdir()
    corners = [(x, y, x + w, y + h) for _, (x, y, w, h) in PAINTED]
    for o in (1, 6):
        (images / f"o{o}.jpg").write_bytes(painted_jpeg(o))
        objs = [obj(name, box) for name, box in zip(("red", "blue"), corners, strict=True)]
        (annotations / f"o{o}.xml").write_text(xml(f"o{o}.jpg", (STORED_W, STORED_H), *objs))
    out = tmp_path / "out"
    convert("--input", str(images), "--voc", str(annotations), "--output", str(out),
            "--apply-exif-orientation", "--resize-max-side", "100")  # fmt: skip
    rows = parsed_records(out, tf)
    scale = 100 * 75 / (STORED_W * STORED_H)  # 160 x 120 recorded at 100 x 75 (o1) or 75 x 100 (o6)
    for o, (w, h) in ((1, (100, 75)), (6, (75, 100))):
        row = rows[f"o{o}.jpg"]
        assert (int(row["image/width"]), int(row["image/height"])) == (w, h)
        if o == 1:
            want = [(x0 / STORED_W, y0 / STORED_H, x1 / STORED_W, y1 / STORED_H) for x0, y0, x1, y1 in corners]
        else:  # turned 90 degrees clockwise: x' = H - y, y' = x, in a H x W frame
            want = [((STORED_H - y1) / STORED_H, x0 / STORED_W, (STORED_H - y0) / STORED_H, x1 / STORED_W)
                    for x0, y0, x1, y1 in corners]  # fmt: skip
        assert_boxes(boxes(row), want)
        areas = [(x1 - x0) * (y1 - y0) * scale for x0, y0, x1, y1 in corners]
        assert list(row["image/object/area"]) == pytest.approx(areas, rel=1e-5)


@pytest.mark.unit
def test_a_transient_error_reading_an_image_header_is_retried_not_a_reject(monkeypatch, tmp_path):
    """An XML without <size> sends the job to the image's header: a busy server there fails the bundle (the
    runner retries it); a file that is not an image gets (0, 0), and the writer rejects it with why."""
    not_an_image = tmp_path / "a.jpg"
    not_an_image.write_bytes(b"not an image")
    assert voc._header_size(str(not_an_image)) == (0, 0)  # noqa: SLF001 - the join's own step

    class Busy(io.BytesIO):
        def read(self, *_: object) -> bytes:  # the server drops the connection mid-read
            raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(voc.FileSystems, "open", lambda path, **_: Busy())
    with pytest.raises(ConnectionResetError):
        voc._header_size(str(not_an_image))  # noqa: SLF001


def test_a_voc_run_from_a_coco_dataset_keeps_its_ids_and_lists_no_unused_class(tmp_path, tf):
    """--incremental-from a COCO dataset: its labels.txt fills the gaps in its ids with ``unused_<k>`` lines. The
    VOC run keeps the ids, but those lines are no classes: not in label_map.pbtxt or dataset.json's categories."""
    images, annotations = tmp_path / "JPEGImages", tmp_path / "Annotations"
    write(str(images / "a.jpg"), image_bytes("jpeg", height=48, width=64, seed=1))
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 10, 10]}],
        "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}],
    }
    (tmp_path / "instances.json").write_text(json.dumps(doc))
    first, second = tmp_path / "first", tmp_path / "second"
    convert("--input", str(images), "--coco", str(tmp_path / "instances.json"), "--output", str(first))
    assert (first / "labels.txt").read_text().splitlines() == ["background", "person", "unused_2", "car"]
    annotations.mkdir()
    (annotations / "a.xml").write_text(xml("a.jpg", (64, 48), obj("car", (1, 1, 11, 11)), obj("dog", (2, 2, 20, 20))))
    convert(
        "--input", str(images), "--voc", str(annotations), "--output", str(second), "--incremental-from", str(first)
    )
    assert list(parsed_records(second, tf)["a.jpg"]["image/object/class/label"]) == [3, 4]
    assert load_info(second)["categories"] == [
        {"id": 1, "name": "person"},
        {"id": 3, "name": "car"},
        {"id": 4, "name": "dog"},
    ]
    assert "unused" not in (second / "label_map.pbtxt").read_text()


def test_a_labels_file_gives_split_by_split_runs_the_same_ids(tmp_path, tf):
    """A Roboflow-style export converted one split folder at a time numbered each run's names 1…N by themselves:
    zebra was 3 in train and 2 in valid. A --labels-file fixes the ids (line 0 background or not); a name not in
    it is an unknown_category object reject, and ids that disagree with the run built on reuse nothing."""

    def split_set(name: str, classes: list[str]) -> Path:
        base = tmp_path / name
        for i, cls in enumerate(classes):
            write(str(base / f"{cls}{i}.jpg"), image_bytes("jpeg", height=40, width=50, seed=i))
            (base / f"{cls}{i}.xml").write_text(xml(f"{cls}{i}.jpg", (50, 40), obj(cls, (2, 3, 20, 30))))
        return base

    train = split_set("train", ["ant", "bee", "zebra"])
    valid = split_set("valid", ["ant", "zebra", "yak"])
    plain, with_bg = tmp_path / "plain.txt", tmp_path / "bg.txt"
    plain.write_text("zebra\nant\nbee\n")
    with_bg.write_text("__background__\nzebra\nant\nbee\n")  # torchvision's and detectron2's line 0
    ids = {}
    for name, folder, labels in (("train", train, plain), ("valid", valid, with_bg)):
        out = tmp_path / f"out-{name}"
        convert("--input", str(folder), "--voc", str(folder), "--output", str(out), "--labels-file", str(labels),
                "--max-reject-fraction", "1")  # fmt: skip
        assert (out / "labels.txt").read_text().splitlines() == ["background", "zebra", "ant", "bee"]
        for row in parsed_records(out, tf).values():
            for text, label in zip(texts(row, "image/object/class/text"), row["image/object/class/label"], strict=True):
                ids.setdefault(text, set()).add(int(label))
        rows = [json.loads(line) for line in (out / objects.OBJECT_REJECTS_JSONL).read_text().splitlines()]
        assert [(r["reason"], "not in --labels-file" in r["detail"]) for r in rows] == (
            [(reasons.UNKNOWN_CATEGORY, True)] if name == "valid" else []
        )  # yak
    assert ids == {"zebra": {1}, "ant": {2}, "bee": {3}}
    # built on a run whose ids were sorted names: no record of it may be copied with its ids
    sorted_run, fixed_run = tmp_path / "sorted", tmp_path / "fixed"
    convert("--input", str(train), "--voc", str(train), "--output", str(sorted_run))
    result = convert("--input", str(train), "--voc", str(train), "--output", str(fixed_run), "--labels-file",
                     str(plain), "--incremental-from", str(sorted_run))  # fmt: skip
    assert "other ids than" in result.stderr
    assert "incremental" not in load_info(fixed_run)
    assert {int(v) for row in parsed_records(fixed_run, tf).values() for v in row["image/object/class/label"]} == {
        1, 2, 3
    }  # fmt: skip


def test_a_coco_runs_labels_txt_as_labels_file_keeps_its_gaps_out_of_the_categories(tmp_path):
    """The labels.txt of a --coco run (ids 1 and 3: line 2 is unused_2) as a --labels-file: unused_2 stays a gap,
    as it does when the same list comes from --incremental-from, never a class of label_map.pbtxt."""
    write(str(tmp_path / "in" / "a.jpg"), image_bytes("jpeg", height=40, width=50, seed=1))
    (tmp_path / "in" / "a.xml").write_text(
        xml("a.jpg", (50, 40), obj("dog", (2, 3, 20, 30)), obj("unused_2", (1, 1, 9, 9)))
    )
    labels = tmp_path / "labels.txt"
    labels.write_text("background\ncat\nunused_2\ndog\n")
    out = tmp_path / "out"
    convert("--input", str(tmp_path / "in"), "--voc", str(tmp_path / "in"), "--output", str(out), "--labels-file",
            str(labels))  # fmt: skip
    assert load_info(out)["categories"] == [{"id": 1, "name": "cat"}, {"id": 3, "name": "dog"}]
    assert "unused_2" not in (out / objects.LABEL_MAP_PBTXT).read_text()
    assert load_info(out)["objects"]["rejects"]["by_reason"] == {reasons.UNKNOWN_CATEGORY: 1}


def test_class_names_that_differ_only_in_case_get_a_note(tmp_path):
    """VOC names Dog and dog are two classes (kept exactly); the summary says so, as a person reading it may not."""
    for i, name in enumerate(("Dog", "dog")):
        write(str(tmp_path / "in" / f"{i}.jpg"), image_bytes("jpeg", height=40, width=50, seed=i))
        (tmp_path / "in" / f"{i}.xml").write_text(xml(f"{i}.jpg", (50, 40), obj(name, (2, 3, 20, 30))))
    result = convert("--input", str(tmp_path / "in"), "--voc", str(tmp_path / "in"), "--output", str(tmp_path / "o"))
    assert "classes 'Dog' and 'dog' differ only in case" in result.stdout
    assert load_info(tmp_path / "o")["categories"] == [{"id": 1, "name": "Dog"}, {"id": 2, "name": "dog"}]


def test_a_size_beyond_a_float_or_an_unknown_encoding_is_one_files_problem_not_a_failed_job(tmp_path):
    """A <width> of 10**400 made the box check overflow a float, and a prolog naming an encoding Python does not
    know raised LookupError: either failed the whole job (exit 1). Now the image's own size is the frame (as for
    any unusable <size>), and the XML is a bad_annotation reject."""
    images, annotations = small_voc(tmp_path, n=3)
    huge = "1" + "0" * 400
    (annotations / "000.xml").write_text(xml("000.jpg", (huge, 32), obj("dog", (1, 1, 10, 12))))  # type: ignore[arg-type]
    (annotations / "001.xml").write_text('<?xml version="1.0" encoding="x-bogus"?>\n' + xml("001.jpg", (32, 32)))
    out = tmp_path / "out"
    convert("--input", str(images), "--voc", str(annotations), "--output", str(out), "--max-reject-fraction", "1")
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["path"]).name, r["reason"]) for r in rejects] == [("001.xml", reasons.BAD_ANNOTATION)]
    assert "x-bogus" in rejects[0]["detail"]
    assert load_info(out)["objects"]["kept"] == 2  # 000's box kept in its image's own 32x32 frame, and 002's
