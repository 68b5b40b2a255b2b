"""A folder of odd real-world files: every listed input ends as a record or a reject, nothing broken."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from .conftest import convert, load_info, read_records
from .imagegen import broken_bytes, encode, image_bytes, pixels, write
from .test_images import _png_claiming

pytestmark = pytest.mark.e2e


def make_messy(root):
    """Returns (expected record relpaths, {relpath: reject reason}, skipped count)."""
    rgb = Image.fromarray(pixels(30, 40, 7), "RGB")
    good = {
        "a/cmyk.jpg": encode(rgb.convert("CMYK"), "JPEG"),
        "a/sixteen.png": image_bytes("png_16bit"),
        "a/palette.png": image_bytes("png_palette_transparent"),
        "a/la.png": image_bytes("png_la"),
        "a/anim.gif": image_bytes("gif_animated"),
        "a/scan.tiff": image_bytes("tiff"),
        "a/progressive.jpeg": image_bytes("jpeg_progressive"),
        "a/really a png.jpg": image_bytes("png"),
        "a/ünïcödé, comma.JPG": image_bytes("jpeg"),
        "a/palette.bmp": image_bytes("bmp_palette"),
        "a/alpha.webp": image_bytes("webp_rgba"),
        "b/icon.png": encode(Image.new("L", (1, 1)), "PNG"),
    }
    for i in range(20):
        good[f"b/{i:02d}.jpg"] = image_bytes("jpeg", seed=i)
    for rel, data in good.items():
        write(str(root / rel), data)
    bad = {
        "a/zero.jpg": ("empty", broken_bytes("empty")),
        "a/cut.jpg": ("truncated", broken_bytes("truncated")),
        "a/notes.jpg": ("not_an_image", broken_bytes("text")),
        "a/bomb.png": ("too_many_pixels", _png_claiming(60_000, 60_000)),
    }
    for rel, (_, data) in bad.items():
        write(str(root / rel), data)
    (root / "b" / "dir.jpg").mkdir()
    os.symlink(str(root / "missing.jpg"), str(root / "b" / "dangling.jpg"))
    write(str(root / "a" / ".DS_Store"), b"\x00")
    write(str(root / "a" / "._cmyk.jpg"), b"\x00")
    write(str(root / "b" / "Thumbs.db"), b"\x00")
    write(str(root / "b" / "readme.txt"), b"hi")
    rejects = {rel: reason for rel, (reason, _) in bad.items()}
    rejects["b/dir.jpg"] = "unreadable"
    rejects["b/dangling.jpg"] = "unreadable"
    return sorted(good), rejects, 4


@pytest.mark.smoke
def test_every_listed_file_is_accounted_for_and_every_record_decodes(tmp_path, tf):
    root = tmp_path / "messy"
    expected, rejects, skipped = make_messy(root)
    out = tmp_path / "out"
    # 6 of 38 listed inputs are rejects: over the default budget of 0.05.
    result = convert("--input", str(root), "--output", str(out), "--max-reject-fraction", "0.2")
    records = read_records(out)
    assert sorted(r["image/filename"].decode() for r in records) == expected
    for r in records:
        image = tf.io.decode_image(r["image/encoded"], expand_animations=False)
        assert tuple(image.shape) == (r["image/height"], r["image/width"], r["image/channels"])
    lines = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert {os.path.relpath(x["source"], root): x["reason"] for x in lines} == rejects
    assert all(x["path"] == os.path.relpath(x["source"], root) for x in lines)
    info = load_info(out)
    assert info["examples"] == len(expected) and info["rejects"]["total"] == len(rejects)
    assert info["skipped"]["total"] == skipped
    assert info["converted"] == {"bmp": 1, "jpeg": 1, "tiff": 1}
    by_name = {r["image/filename"].decode(): r for r in records}
    assert by_name["a/really a png.jpg"]["image/format"] == b"png"
    cmyk = tf.io.decode_image(by_name["a/cmyk.jpg"]["image/encoded"]).numpy()
    source = np.asarray(Image.open(root / "a" / "cmyk.jpg").convert("RGB"))
    np.testing.assert_array_equal(cmyk, source)  # converted with Pillow's colours, losslessly
    assert "rejected" in result.stdout and "too_many_pixels" in result.stdout


@pytest.mark.smoke
def test_dedupe_keeps_the_first_path_across_splits(tmp_path):
    root = tmp_path / "dups"
    same = image_bytes("jpeg", seed=42)
    write(str(root / "train" / "cat" / "b.jpg"), same)
    write(str(root / "test" / "cat" / "a.jpg"), same)  # sorts first: kept, in test
    write(str(root / "train" / "cat" / "z.jpg"), same)
    write(str(root / "train" / "dog" / "c.jpg"), image_bytes("jpeg", seed=1))
    out = tmp_path / "out"
    convert("--input", str(root), "--output", str(out), "--dedupe", "--max-reject-fraction", "0.5")
    names = sorted(r["image/filename"].decode() for r in read_records(out))
    assert names == ["test/cat/a.jpg", "train/dog/c.jpg"]
    lines = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted((os.path.relpath(x["source"], root), x["reason"]) for x in lines) == [
        ("train/cat/b.jpg", "duplicate"),
        ("train/cat/z.jpg", "duplicate"),
    ]
    assert all("test/cat/a.jpg" in x["detail"] for x in lines)
    out2 = tmp_path / "out2"
    convert("--input", str(root), "--output", str(out2))  # without --dedupe every copy is a record
    assert len(read_records(out2)) == 4


def test_a_file_name_that_is_not_utf8_is_a_reject_not_a_crash(tmp_path):
    root = tmp_path / "names"
    for i in range(30):
        write(str(root / "cat" / f"{i}.jpg"), image_bytes("jpeg", seed=i))
    odd = os.fsdecode(str(root / "cat").encode() + b"/caf\xe9.jpg")  # Latin-1 bytes from an old archive
    write(odd, image_bytes("jpeg", seed=99))
    out = tmp_path / "out"
    convert("--input", str(root), "--output", str(out))
    assert len(read_records(out)) == 30
    [line] = [json.loads(x) for x in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    assert line["reason"] == "bad_filename" and line["path"].endswith("cat/caf\\xe9.jpg")


@pytest.mark.pipeline
def test_dedupe_transform_keeps_the_same_copy_whatever_the_order(tmp_path):
    """Hashing runs per ref wherever it lands; the kept copy depends on paths only, and a path listed twice
    (a manifest may) is kept once, its second row a duplicate."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from beam_pipeline.dedupe import DropDuplicates, split_duplicates
    from beam_pipeline.vocab.refs import Ref

    from .conftest import local_pipeline

    same = image_bytes("jpeg", seed=3)
    for name in ("m/b.jpg", "k/c.jpg", "z/a.jpg"):
        write(str(tmp_path / name), same)
    write(str(tmp_path / "other.jpg"), image_bytes("jpeg", seed=4))

    def ref(name: str) -> Ref:
        return Ref(str(tmp_path / name), name, 1, "train", None, 0)

    refs = [ref("m/b.jpg"), ref("z/a.jpg"), ref("k/c.jpg"), ref("other.jpg"), ref("k/c.jpg"), ref("gone.jpg")]
    for ordered in (refs, refs[::-1], refs[2:] + refs[:2]):
        with local_pipeline() as p:
            kept, rejects = p | beam.Create(ordered) | DropDuplicates()
            assert_that(kept | beam.Map(lambda r: r.relpath), equal_to(["k/c.jpg", "other.jpg", "gone.jpg"]))
            assert_that(
                rejects | "Why" >> beam.Map(lambda r: (os.path.relpath(r["path"], tmp_path), r["detail"])),
                equal_to([(n, "same bytes as k/c.jpg") for n in ("m/b.jpg", "z/a.jpg", "k/c.jpg")]),
                label="Duplicates",
            )
    # a group is read twice, never sorted: the kept ref is the minimum whatever the group's order
    group = [ref("m/b.jpg"), ref("k/c.jpg"), ref("z/a.jpg")]
    out = list(split_duplicates(("digest", group)))
    assert out[0].relpath == "k/c.jpg" and len(out) == 3


# ---- manifests: column detection over every row, duplicate rows ----------------


def _jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _same_output(a, b) -> None:
    """Every file of two outputs byte for byte; dataset.json apart from its run id."""
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    for name in names:
        if name == "dataset.json":
            ia, ib = load_info(a), load_info(b)
            for info in (ia, ib):
                info.pop("run_id")
                info["config"].pop("output")
            assert ia == ib
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_jsonl_labels_are_detected_over_every_row_whatever_their_order(tmp_path):
    """110 unlabelled rows then 10 labelled ones (and the reverse) make one labelled dataset: the
    unlabelled rows are no_label rejects, never a silent drop of the 10 labels."""
    root = tmp_path / "in"
    for i in range(120):
        write(str(root / f"{i:03d}.jpg"), image_bytes("jpeg", height=8, width=8, seed=i))
    bare = [{"path": f"{i:03d}.jpg"} for i in range(110)]
    labelled = [{"path": f"{i:03d}.jpg", "label": "cat" if i % 2 else "dog"} for i in range(110, 120)]
    manifest = root / "list.jsonl"
    outs = []
    for n, rows in enumerate((bare + labelled, labelled + bare)):
        _jsonl(manifest, rows)
        out = tmp_path / f"out{n}"
        convert("--manifest", str(manifest), "--output", str(out), "--name", "d", "--max-reject-fraction", "0.95")
        records = read_records(out)
        assert sorted(r["image/filename"].decode() for r in records) == [f"{i:03d}.jpg" for i in range(110, 120)]
        assert {r["image/class/text"].decode() for r in records} == {"cat", "dog"}
        assert (out / "labels.txt").read_text() == "cat\ndog\n"
        reasons = [json.loads(x)["reason"] for x in (out / "rejects.jsonl").read_text().splitlines()]
        assert reasons == ["no_label"] * 110
        outs.append(out)
    _same_output(*outs)
    # --labels-from none: every row is a record, whatever a few rows say
    out = tmp_path / "none"
    convert("--manifest", str(manifest), "--output", str(out), "--labels-from", "none")
    assert len(read_records(out)) == 120 and not (out / "labels.txt").exists()


def test_manifest_rows_naming_one_file_twice_are_duplicate_rows_whatever_their_order(tmp_path):
    """The kept row is the first by its canonical JSON, so permuted manifests give byte-identical outputs;
    --dedupe (same bytes) still works beside it."""
    root = tmp_path / "in"
    for i in range(8):
        write(str(root / f"{i}.jpg"), image_bytes("jpeg", height=8, width=8, seed=i))
    write(str(root / "copy.jpg"), image_bytes("jpeg", height=8, width=8, seed=7))  # same bytes as 7.jpg
    rows = [
        {"path": "0.jpg", "label": "dog", "split": "train"},
        {"path": "0.jpg", "label": "cat", "split": "train"},  # kept: "cat" < "dog"
        {"path": "1.jpg", "label": "cat", "split": "train"},
        {"path": "1.jpg", "label": "cat", "split": "test"},  # kept: "test" < "train"
        {"path": "2.jpg", "label": "cat", "split": "train", "w": 2},
        {"path": "2.jpg", "label": "cat", "split": "train", "w": 1},  # kept
        {"path": "3.jpg", "label": "cat", "split": "train"},
        {"path": "3.jpg", "label": "cat", "split": "train"},  # the same row twice
        *({"path": f"{i}.jpg", "label": "dog", "split": "train"} for i in range(4, 8)),
        {"path": "copy.jpg", "label": "dog", "split": "train"},
    ]
    manifest = root / "list.jsonl"
    args = ("--name", "d", "--max-reject-fraction", "0.5", "--dedupe")
    outs = []
    for n, ordered in enumerate((rows, rows[::-1], rows[1::2] + rows[::2])):
        _jsonl(manifest, ordered)
        out = tmp_path / f"out{n}"
        convert("--manifest", str(manifest), "--output", str(out), *args)
        records = {r["image/filename"].decode(): r for r in read_records(out)}
        assert sorted(records) == [f"{i}.jpg" for i in range(8)]
        assert records["0.jpg"]["image/class/text"] == b"cat"
        assert records["1.jpg"]["_split"] == "test"
        assert records["2.jpg"]["w"] == 1
        rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
        assert sorted((r["path"], r["reason"]) for r in rejects) == [
            ("0.jpg", "duplicate_row"),
            ("1.jpg", "duplicate_row"),
            ("2.jpg", "duplicate_row"),
            ("3.jpg", "duplicate_row"),
            ("copy.jpg", "duplicate"),
        ]
        outs.append(out)
    _same_output(outs[0], outs[1])
    _same_output(outs[0], outs[2])


def test_jsonl_flags_against_a_column_only_later_rows_have(tmp_path):
    """A flag that conflicts with a column the first 100 rows lack stops the run in one line (exit 2, no
    _SUCCESS); --labels-from manifest with labels only in later rows is a labelled run."""
    from .conftest import run_cli

    root = tmp_path / "in"
    for i in range(105):
        write(str(root / f"{i:03d}.jpg"), image_bytes("jpeg", height=8, width=8, seed=i))
    manifest = root / "list.jsonl"
    bare = [{"path": f"{i:03d}.jpg"} for i in range(104)]
    _jsonl(manifest, [*bare, {"path": "104.jpg", "split": "test"}])
    common = ("--manifest", str(manifest), "--no-transform", "--no-tfds-metadata")
    out = tmp_path / "ratios"
    result = run_cli("convert", *common, "--output", str(out), "--split-ratios", "train=0.5,test=0.5")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --split-ratios conflicts with the input: the manifest has a split column"
    )
    assert not (out / "_SUCCESS").exists()
    result = run_cli("convert", *common, "--output", str(tmp_path / "nolabel"), "--labels-from", "manifest")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: --labels-from manifest: {manifest} has no 'label' column"

    _jsonl(manifest, [*bare, {"path": "104.jpg", "label": "cat"}])
    out = tmp_path / "late"
    convert(*common, "--output", str(out), "--labels-from", "manifest", "--max-reject-fraction", "1")
    assert (out / "labels.txt").read_text() == "cat\n"
    assert [r["image/filename"] for r in read_records(out)] == [b"104.jpg"]


def test_incremental_keeps_label_ids_when_only_later_jsonl_rows_are_labelled(tmp_path):
    """The launcher cannot know such a run is labelled: it reads the previous run's labels in case, and the
    job keeps their ids (new labels follow) once the rows say it is."""
    root = tmp_path / "in"
    for i in range(104):
        write(str(root / f"{i:03d}.jpg"), image_bytes("jpeg", height=8, width=8, seed=i))
    manifest = root / "list.jsonl"
    _jsonl(manifest, [{"path": "000.jpg", "label": "dog"}, {"path": "001.jpg", "label": "owl"}])
    first = tmp_path / "first"
    convert("--manifest", str(manifest), "--output", str(first))
    assert (first / "labels.txt").read_text() == "dog\nowl\n"
    rows = [{"path": f"{i:03d}.jpg"} for i in range(2, 103)]
    rows += [{"path": f"{i:03d}.jpg", "label": label} for i, label in ((0, "dog"), (1, "owl"), (103, "ant"))]
    _jsonl(manifest, rows)
    second = tmp_path / "second"
    convert(
        "--manifest", str(manifest), "--output", str(second), "--incremental-from", str(first),
        "--max-reject-fraction", "1",
    )  # fmt: skip
    assert (second / "labels.txt").read_text() == "dog\nowl\nant\n"
    ids = {r["image/class/text"].decode(): r["image/class/label"] for r in read_records(second)}
    assert ids == {"dog": 0, "owl": 1, "ant": 2}


def test_a_csv_header_naming_a_column_twice_is_a_one_line_error(tmp_path):
    """csv.DictReader keeps the last of two same-named columns: 'path,label,label' silently took the second."""
    from .conftest import run_cli

    write(str(tmp_path / "a.jpg"), image_bytes("jpeg"))
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label, label\na.jpg,cat,dog\n")
    result = run_cli("convert", "--manifest", str(manifest), "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --manifest {manifest}: column 'label' appears twice in the header"
    ]
    assert not (tmp_path / "out").exists()


def test_a_manifest_separated_by_semicolons_says_so(tmp_path):
    from .conftest import run_cli

    write(str(tmp_path / "a.jpg"), image_bytes("jpeg"))
    manifest = tmp_path / "list.csv"
    manifest.write_text("path;label\na.jpg;cat\n")  # a spreadsheet's CSV export in a comma-decimal locale
    result = run_cli("convert", "--manifest", str(manifest), "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "no 'path' column" in line and "separated by ';'" in line


def test_a_jsonl_label_that_is_not_text_is_a_bad_label_not_its_python_text(tmp_path):
    """{"label": {"x": 1}} became the class "{'x': 1}" in labels.txt, true and NaN the classes True and nan."""
    values = {"a": {"x": 1}, "b": "cat", "c": 7, "d": True, "e": float("nan"), "f": 2.5, "g": 7.0}
    for name in values:
        write(str(tmp_path / f"{name}.jpg"), image_bytes("jpeg"))
    manifest = tmp_path / "list.jsonl"
    manifest.write_text("".join(json.dumps({"path": f"{n}.jpg", "label": v}) + "\n" for n, v in values.items()))
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--output", str(out), "--max-reject-fraction", "1")
    assert (out / "labels.txt").read_text().splitlines() == ["7", "cat"]  # a whole number is its digits
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    details = {r["path"]: r["detail"] for r in rejects if r["reason"] == "bad_label"}
    assert sorted(details) == ["a.jpg", "d.jpg", "e.jpg", "f.jpg"] and len(rejects) == 4
    assert "JSON object" in details["a.jpg"]
    assert details["d.jpg"].startswith("the label is true, a JSON true/false, not text")
    assert details["e.jpg"].startswith("the label is NaN, a JSON number that is not a whole number, not text")


@pytest.mark.parametrize("labels_from", ["none", "folder"])
def test_a_jsonl_label_object_is_ignored_when_labels_do_not_come_from_the_manifest(tmp_path, labels_from):
    """--labels-from none/folder ignores the manifest's label key, a list or an object alike: the rows are
    written (unlabelled, or labelled by their folder) as before objects were told apart, not bad_label rejects."""
    for name in ("a", "b"):
        write(str(tmp_path / "cat" / f"{name}.jpg"), image_bytes("jpeg"))
    manifest = tmp_path / "list.jsonl"
    rows = [{"path": "cat/a.jpg", "label": {"x": 1}}, {"path": "cat/b.jpg", "label": "dog"}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--output", str(out), "--labels-from", labels_from)
    assert load_info(out)["examples"] == 2
    assert not (out / "rejects.jsonl").read_text().strip()
