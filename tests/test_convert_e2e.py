"""End to end: the CLI on folders and manifests the tests make, read back with TensorFlow."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from beam_pipeline import hashing

from .conftest import convert, load_info, read_records, run_cli
from .imagegen import broken_bytes, image_bytes, write

pytestmark = pytest.mark.e2e

GOOD_KINDS = ["jpeg", "jpeg", "jpeg_gray", "png", "png_rgba", "png_palette", "gif", "bmp", "webp", "jpeg_progressive"]
LABELS = ["bird", "cat", "dog"]
BROKEN = {"zero.jpg": "empty", "cut.jpg": "truncated", "text.jpg": "not_an_image", "noise.png": "not_an_image"}
SHARD_RE = re.compile(r"^(?P<name>[A-Za-z]\w*)-(?P<split>\w+)\.tfrecord-(?P<i>\d{5})-of-(?P<n>\d{5})(\.gz)?$")


def make_folder(root: Path) -> dict[str, bytes]:
    """A labelled folder; returns {relpath: bytes} of the good images.

    81 good images and 4 broken ones: 4.7 % rejected, inside the default
    --max-reject-fraction of 0.05.
    """
    good = {}
    for li, label in enumerate(LABELS):
        for i in range(27):
            kind = GOOD_KINDS[i % len(GOOD_KINDS)]
            ext = {"jpeg_gray": "jpg", "jpeg_progressive": "jpeg", "png_rgba": "png", "png_palette": "png"}.get(
                kind, kind
            )
            ext = "jpg" if ext == "jpeg" else ext
            name = f"{label} photo {i:02d}.{ext}" if i % 3 == 0 else f"{label}_{i:02d}.{ext}"
            data = image_bytes(kind, height=60 + i, width=80, seed=li * 100 + i)
            write(str(root / label / name), data)
            good[f"{label}/{name}"] = data
    for name, kind in zip(BROKEN, ["empty", "truncated", "text", "random"], strict=False):
        write(str(root / "cat" / name), broken_bytes(kind))
    write(str(root / "dog" / "notes.txt"), b"not listed")
    write(str(root / "dog" / ".DS_Store"), b"\x00\x01")
    return good


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e") / "photos"
    return root, make_folder(root)


# For tests about one kind of reject, not about the reject budget (--max-reject-fraction).
NO_BUDGET = ("--max-reject-fraction", "1")
ARGS = ["--split-ratios", "train=0.6,validation=0.2,test=0.2", "--seed", "1", "--target-shard-mb", "0.1"]


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory):
    root, good = folder
    out = tmp_path_factory.mktemp("e2e-out") / "photos-tfrecords"
    result = convert("--input", str(root), "--output", str(out), *ARGS)
    return out, good, result


@pytest.mark.smoke
def test_every_good_image_is_one_record_and_every_bad_one_a_reject(converted, folder):
    out, good, result = converted
    root, _ = folder
    records = read_records(out)
    assert sorted(r["image/filename"].decode() for r in records) == sorted(good)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert {Path(r["path"]).name: r["reason"] for r in rejects} == BROKEN
    # path relative to the input root like image/filename; source is where the file is
    assert all(r["path"] == f"cat/{Path(r['path']).name}" and r["detail"] for r in rejects)
    assert all(r["source"] == str(root / r["path"]) for r in rejects)
    assert (out / "_SUCCESS").exists()
    info = load_info(out)
    assert info["examples"] == len(good)
    assert info["rejects"]["total"] == len(BROKEN)
    assert info["skipped"]["total"] == 2
    assert "rejected" in result.stdout and "skipped" in result.stdout


def test_records_carry_the_source_bytes_labels_and_decodable_shapes(converted, tf):
    out, good, _ = converted
    labels = (out / "labels.txt").read_text().splitlines()
    assert labels == LABELS
    for r in read_records(out):
        rel = r["image/filename"].decode()
        assert r["image/encoded"] == good[rel]
        assert r["image/key/sha256"].decode() == hashlib.sha256(good[rel]).hexdigest()
        assert r["image/class/text"].decode() == rel.split("/")[0]
        assert labels[r["image/class/label"]] == rel.split("/")[0]
        image = tf.io.decode_image(r["image/encoded"], expand_animations=False)
        assert tuple(image.shape) == (r["image/height"], r["image/width"], r["image/channels"])
        assert r["image/format"].decode() in {"jpeg", "png", "gif", "bmp", "webp"}


def test_dataset_json_describes_the_shards(converted):
    out, good, _ = converted
    info = load_info(out)
    assert set(info["splits"]) == {"train", "validation", "test"}
    files = sorted(p.name for p in out.iterdir() if ".tfrecord-" in p.name)
    listed = sorted(s["file"] for split in info["splits"].values() for s in split["shards"])
    assert files == listed
    for split, s in info["splits"].items():
        assert s["num_shards"] == len(s["shards"])
        for shard in s["shards"]:
            m = SHARD_RE.match(shard["file"])
            assert m and m["name"] == "photos_tfrecords" and m["split"] == split
            assert int(m["n"]) == s["num_shards"]
            assert len(read_records(out, split)) == s["examples"]
            assert (out / shard["file"]).stat().st_size == shard["bytes"]
        assert sum(x["records"] for x in s["shards"]) == s["examples"]
        assert sum(s["labels"].values()) == s["examples"]
    assert info["splits"]["train"]["num_shards"] > 1
    assert info["labels"] == LABELS and info["seed"] == 1
    assert info["features"]["image/class/label"]["dtype"] == "int64"
    assert "apache-beam" in info["versions"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # temp folder gone


def test_shards_concatenate_to_one_global_order(converted):
    out, _, _ = converted
    info = load_info(out)
    for split in info["splits"]:
        names = [r["image/filename"].decode() for r in read_records(out, split)]
        keys = [hashing.shuffle_key(n, 1) for n in names]
        assert keys == sorted(keys)


def test_same_seed_is_byte_identical_other_seed_reorders_but_keeps_splits(converted, folder, tmp_path):
    out, _, _ = converted
    root, _ = folder
    again = tmp_path / "again"
    convert("--input", str(root), "--output", str(again), "--name", "photos_tfrecords", *ARGS)
    shard_files = sorted(p.name for p in out.iterdir() if ".tfrecord-" in p.name)
    assert shard_files == sorted(p.name for p in again.iterdir() if ".tfrecord-" in p.name)
    for name in shard_files:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name

    other = tmp_path / "other"
    args = [a if a != "1" else "2" for a in ARGS]
    convert("--input", str(root), "--output", str(other), "--name", "photos_tfrecords", *args)
    for split in ("train", "validation", "test"):
        a = [r["image/filename"] for r in read_records(out, split)]
        b = [r["image/filename"] for r in read_records(other, split)]
        assert sorted(a) == sorted(b)
        if split == "train":
            assert a != b


def test_gzip_output(folder, tmp_path):
    root, good = folder
    out = tmp_path / "gz"
    convert("--input", str(root), "--output", str(out), "--compression", "gzip", "--target-shard-mb", "0.2")
    shards = [p.name for p in out.iterdir() if ".tfrecord-" in p.name]
    assert shards and all(SHARD_RE.match(s) and s.endswith(".gz") for s in shards)
    assert all((out / s).read_bytes()[:2] == b"\x1f\x8b" for s in shards)
    assert len(read_records(out)) == len(good)


def test_write_to_tfrecord_sink_gives_the_same_dataset(converted, folder, tmp_path):
    out, good, _ = converted
    root, _ = folder
    wtt = tmp_path / "wtt"
    convert(
        "--input", str(root), "--output", str(wtt), "--name", "photos_tfrecords", "--sink", "write_to_tfrecord", *ARGS
    )
    info, ref_info = load_info(wtt), load_info(out)
    for split in ref_info["splits"]:
        assert info["splits"][split]["examples"] == ref_info["splits"][split]["examples"]
        assert info["splits"][split]["labels"] == ref_info["splits"][split]["labels"]
        mine = sorted(r["image/key/sha256"] for r in read_records(wtt, split))
        assert mine == sorted(r["image/key/sha256"] for r in read_records(out, split))
        for shard in info["splits"][split]["shards"]:
            assert SHARD_RE.match(shard["file"]) and shard["records"] > 0
    assert (wtt / "rejects.jsonl").read_text() == (out / "rejects.jsonl").read_text()
    assert (wtt / "_SUCCESS").exists() and info["sink"] == "write_to_tfrecord"


def _sizes_ok(out: Path, target: float):
    info = load_info(out)
    for split in info["splits"].values():
        sizes = [s["bytes"] for s in split["shards"]]
        if split["bytes"] > target * 2 / 3:
            assert all(target * 2 / 3 <= b <= target * 4 / 3 for b in sizes), (sizes, target)
    return info


def test_shard_sizes_hold_for_many_small_and_few_large_images(tmp_path):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    small, large = tmp_path / "small", tmp_path / "large"
    for i in range(400):  # ~4 KB JPEGs
        write(str(small / "a" / f"{i}.jpg"), image_bytes("jpeg", 50, 60, seed=i))
    for i in range(120):  # incompressible PNGs of 40-160 KB: "large photos" for a 1 MB target
        side = int(rng.integers(120, 230))
        data = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        Image.fromarray(data).save(write(str(large / "a" / f"{i}.png"), b""), "PNG")
    out_small, out_large = tmp_path / "o_small", tmp_path / "o_large"
    convert("--input", str(small), "--output", str(out_small), "--target-shard-mb", "0.3")
    convert("--input", str(large), "--output", str(out_large), "--target-shard-mb", "1")
    assert _sizes_ok(out_small, 0.3e6)["splits"]["train"]["num_shards"] >= 3
    assert _sizes_ok(out_large, 1e6)["splits"]["train"]["num_shards"] >= 8


@pytest.mark.smoke
def test_manifest_with_labels_splits_and_extra_columns(folder, tmp_path):
    root, good = folder
    rel = sorted(good)[:12]
    lines = ["path,label,split,weight,score,photographer"]
    for i, r in enumerate(rel):
        path = str(root / r) if i == 0 else f"photos/{r}"
        lines.append(f'"{path}",{r.split("/")[0]},{["train", "val", "test"][i % 3]},{i},{i / 4},"Doe, J{i}"')
    lines.append("photos/cat/does-not-exist.jpg,cat,train,1,1.0,x")
    manifest = root.parent / "manifest.csv"
    manifest.write_text("\ufeff" + "\n".join(lines) + "\n\n")
    out = tmp_path / "m"
    convert("--manifest", str(manifest), "--output", str(out), *NO_BUDGET)
    records = read_records(out)
    assert len(records) == 12
    by_name = {r["image/filename"].decode(): r for r in records}
    assert set(by_name) == {f"photos/{r}" for r in rel}
    for i, r in enumerate(rel):
        rec = by_name[f"photos/{r}"]
        assert rec["weight"] == i and rec["score"] == pytest.approx(i / 4)
        assert rec["photographer"].decode() == f"Doe, J{i}"
        assert rec["_split"] == ["train", "validation", "test"][i % 3]
    info = load_info(out)
    assert info["features"]["weight"]["dtype"] == "int64"
    assert info["features"]["score"]["dtype"] == "float32"
    assert info["features"]["photographer"]["dtype"] == "string"
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["path"]).name, r["reason"]) for r in rejects] == [("does-not-exist.jpg", "missing")]


def test_jsonl_manifest_unlabelled(folder, tmp_path):
    root, good = folder
    manifest = root.parent / "list.jsonl"
    manifest.write_text(
        "".join(json.dumps({"path": f"photos/{r}", "id": n}) + "\n" for n, r in enumerate(sorted(good)[:5]))
    )
    out = tmp_path / "j"
    convert("--manifest", str(manifest), "--output", str(out))
    records = read_records(out)
    assert len(records) == 5 and all("image/class/label" not in r for r in records)
    assert sorted(r["id"] for r in records) == list(range(5))
    assert not (out / "labels.txt").exists() and load_info(out)["labels"] is None


def test_labels_file_order_and_unknown_labels(folder, tmp_path):
    root, good = folder
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("dog\ncat\n")
    out = tmp_path / "lf"
    convert("--input", str(root), "--output", str(out), "--labels-file", str(labels_file), *NO_BUDGET)
    assert (out / "labels.txt").read_text() == "dog\ncat\n"
    records = read_records(out)
    assert {r["image/class/text"].decode(): r["image/class/label"] for r in records} == {"dog": 0, "cat": 1}
    reasons = [json.loads(x)["reason"] for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert reasons.count("unknown_label") == sum(1 for r in good if r.startswith("bird/"))


def test_labels_from_none_and_label_regex(tmp_path):
    root = tmp_path / "flat"
    for i, label in enumerate(["cat", "dog", "cat", "owl"]):
        write(str(root / f"{i}_{label}.png"), image_bytes("png", seed=i))
    write(str(root / "5.png"), image_bytes("png", seed=5))
    out = tmp_path / "rx"
    convert("--input", str(root), "--output", str(out), "--label-regex", r"_([a-z]+)\.png$", *NO_BUDGET)
    assert (out / "labels.txt").read_text().split() == ["cat", "dog", "owl"]
    assert [json.loads(x)["reason"] for x in (out / "rejects.jsonl").read_text().splitlines()] == ["no_label"]
    out2 = tmp_path / "none"
    convert("--input", str(root), "--output", str(out2), "--labels-from", "none")
    assert len(read_records(out2)) == 5 and (out2 / "rejects.jsonl").read_text() == ""


def test_split_folders_layout(tmp_path):
    root = tmp_path / "split"
    for split in ("train", "val", "test"):
        for label in ("a", "b"):
            write(str(root / split / label / "x.jpg"), image_bytes("jpeg", seed=len(split) + len(label)))
    out = tmp_path / "so"
    convert("--input", str(root), "--output", str(out))
    info = load_info(out)
    assert {k: v["examples"] for k, v in info["splits"].items()} == {"train": 2, "validation": 2, "test": 2}
    assert info["labels"] == ["a", "b"]


def test_a_class_folder_named_train_needs_no_split_folders_and_the_rejects_say_so(tmp_path):
    """Pascal VOC and COCO have a class "train": beside bus/ and car/ it made the input a split layout (every
    bus/car image a no_split reject, exit 3). The rejects name the flag; with --no-split-folders the three
    folders are three classes. A Roboflow-style valid/ beside train/ gets a hint too."""
    root = tmp_path / "classes"
    for label in ("bus", "car", "train"):
        for i in range(2):
            write(str(root / label / f"{i}.jpg"), image_bytes("jpeg", seed=len(label) + i))
    failed = run_cli("convert", "--input", str(root), "--output", str(tmp_path / "split"), "--no-transform")
    assert failed.returncode == 3, failed.stderr
    assert "no_split 4" in failed.stderr
    rejects = [json.loads(x) for x in (tmp_path / "split" / "rejects.jsonl").read_text().splitlines()]
    assert {r["path"] for r in rejects if r["reason"] == "no_split"} == {
        "bus/0.jpg",
        "bus/1.jpg",
        "car/0.jpg",
        "car/1.jpg",
    }
    assert all("in bus/" in r["detail"] or "in car/" in r["detail"] for r in rejects if r["reason"] == "no_split")
    assert all("--no-split-folders" in r["detail"] for r in rejects if r["reason"] == "no_split")
    out = tmp_path / "classes-out"
    convert("--input", str(root), "--output", str(out), "--no-split-folders")
    info = load_info(out)
    assert info["labels"] == ["bus", "car", "train"]
    assert {k: v["examples"] for k, v in info["splits"].items()} == {"train": 6}
    roboflow = tmp_path / "roboflow"
    write(str(roboflow / "train" / "a" / "0.jpg"), image_bytes("jpeg", seed=1))
    write(str(roboflow / "valid" / "a" / "0.jpg"), image_bytes("jpeg", seed=2))
    convert("--input", str(roboflow), "--output", str(tmp_path / "rf"), "--max-reject-fraction", "1")
    [reject] = [json.loads(x) for x in (tmp_path / "rf" / "rejects.jsonl").read_text().splitlines()]
    assert reject["reason"] == "no_split" and "in valid/, did you mean validation/?" in reject["detail"]


def test_complete_output_is_kept_unless_overwrite(folder, tmp_path):
    root, good = folder
    out = tmp_path / "ow"
    convert("--input", str(root), "--output", str(out), "--target-shard-mb", "0.1")
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert len([p for p in before if p.startswith("idx/")]) > 1
    result = run_cli("convert", "--input", str(root), "--output", str(out))
    assert result.returncode == 2 and "--overwrite" in result.stderr
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    convert("--input", str(root), "--output", str(out), "--overwrite")
    info = load_info(out)
    assert info["splits"]["train"]["num_shards"] == 1
    assert sorted(p.name for p in out.iterdir() if ".tfrecord-" in p.name) == ["ow-train.tfrecord-00000-of-00001"]
    assert [p.name for p in (out / "idx").iterdir()] == ["ow-train.tfrecord-00000-of-00001.idx"]  # stale ones gone
    assert (out / "_SUCCESS").exists()


def test_foreign_files_in_idx_or_a_pattern_in_the_output_path_are_refused(folder, tmp_path):
    root, _ = folder
    out = tmp_path / "with-idx"
    write(str(out / "idx" / "notes.txt"), b"mine")  # idx/ is the tool's folder for shard indexes only
    result = run_cli("convert", "--input", str(root), "--output", str(out))
    assert result.returncode == 2 and "idx/notes.txt" in result.stderr, result.stderr
    assert (out / "idx" / "notes.txt").read_bytes() == b"mine"
    result = run_cli("convert", "--input", str(root), "--output", str(tmp_path / "out[1]"))
    assert result.returncode == 2 and "may not hold" in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("folder_name", ["metadata", "transform_fn"])
def test_a_tft_folder_name_alone_in_the_output_is_someone_elses(folder, tmp_path, folder_name):
    """metadata/ (a common name) or transform_fn/ with no dataset of this tool beside it: a run would write its
    TFT files into it and replace a user's schema.pbtxt. Refused, nothing touched."""
    root, _ = folder
    out = tmp_path / "theirs"
    write(str(out / folder_name / "schema.pbtxt"), b"my schema")
    result = run_cli("convert", "--input", str(root), "--output", str(out))
    assert result.returncode == 2 and folder_name in result.stderr and "did not write" in result.stderr
    assert [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()] == [f"{folder_name}/schema.pbtxt"]


def test_foreign_files_in_output_are_refused(folder, tmp_path):
    root, _ = folder
    out = tmp_path / "busy"
    write(str(out / "thesis.pdf"), b"%PDF")
    result = run_cli("convert", "--input", str(root), "--output", str(out))
    assert result.returncode == 2 and "thesis.pdf" in result.stderr
    assert (out / "thesis.pdf").read_bytes() == b"%PDF"


def test_overwrite_never_writes_into_a_folder_of_foreign_files(folder, tmp_path):
    root, _ = folder
    out = tmp_path / "mixed"
    convert("--input", str(root), "--output", str(out))
    write(str(out / "notes" / "todo.txt"), b"mine")  # someone's files beside a dataset of this tool
    write(str(out / "thesis.pdf"), b"%PDF")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = run_cli("convert", "--input", str(root), "--output", str(out), "--overwrite", "--seed", "5")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "notes, thesis.pdf" in line and "did not write" in line
    assert "remove those files" in line and "empty" in line  # says what to do, and not "pass --overwrite"
    assert "pass --overwrite" not in line
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing touched
    empty = tmp_path / "only-foreign"
    write(str(empty / "readme.md"), b"x")
    result = run_cli("convert", "--input", str(root), "--output", str(empty), "--overwrite")
    assert result.returncode == 2 and "readme.md" in result.stderr
    assert sorted(p.name for p in empty.iterdir()) == ["readme.md"]


def test_no_good_image_fails_and_explains(tmp_path):
    root = tmp_path / "bad"
    write(str(root / "cat" / "a.jpg"), broken_bytes("text"))
    write(str(root / "cat" / "b.jpg"), broken_bytes("empty"))
    out = tmp_path / "bo"
    result = run_cli("convert", "--input", str(root), "--output", str(out))
    assert result.returncode == 3
    assert "no image was converted" in result.stderr and "Traceback" not in result.stderr
    assert not (out / "_SUCCESS").exists()
    assert len((out / "rejects.jsonl").read_text().splitlines()) == 2


def test_incomplete_run_is_taken_over_and_its_scratch_removed(folder, tmp_path):
    root, good = folder
    out = tmp_path / "killed"
    # What a killed run leaves: a scratch folder with a partial shard, no _SUCCESS.
    write(str(out / ".beam_pipeline-tmp-20260101-000000-deadbeef" / "train-00000-x.tfrecord"), b"partial")
    convert("--input", str(root), "--output", str(out))
    assert (out / "_SUCCESS").exists()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert len(read_records(out)) == len(good)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_over_the_reject_budget_exit_3_without_success_and_keep_the_old_dataset(tmp_path):
    root = tmp_path / "in"
    for i in range(18):
        write(str(root / "cat" / f"{i}.png"), image_bytes("png", seed=i))
    write(str(root / "cat" / "bad.jpg"), broken_bytes("text"))  # 1 of 19: 5.3 % > the default 0.05
    out = tmp_path / "budget"
    no_allowance = ("--reject-allowance", "0")  # the fraction from the first reject
    result = run_cli("convert", "--input", str(root), "--output", str(out), "--no-transform", "--no-tfds-metadata",
                     *no_allowance)  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert (
        "1 of 19 inputs rejected (not_an_image 1): more than --max-reject-fraction 0.05 of them and more than "
        "--reject-allowance 0;" in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1
    assert [json.loads(line)["reason"] for line in (out / "rejects.jsonl").read_text().splitlines()] == ["not_an_image"]
    # Into an empty folder the run's files are there to look at, but nothing marks them complete.
    assert not (out / "_SUCCESS").exists()
    assert load_info(out)["status"] == "too_many_rejects"
    assert len(read_records(out)) == 18
    shown = run_cli("inspect", str(out))
    assert "INCOMPLETE: no _SUCCESS (more rejects than --max-reject-fraction 0.05)" in shown.stdout
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]

    # A larger budget takes the incomplete run over.
    convert("--input", str(root), "--output", str(out), "--max-reject-fraction", "0.1")
    assert (out / "_SUCCESS").exists() and load_info(out)["status"] == "ok"
    before = _snapshot(out)
    result = run_cli("convert", "--input", str(root), "--output", str(out), "--overwrite", "--seed", "9",
                     "--no-transform", "--no-tfds-metadata", *no_allowance)  # fmt: skip
    assert result.returncode == 3 and "is untouched" in result.stderr
    after = _snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith(".")} == before  # yesterday's dataset, intact


@pytest.mark.parametrize("post_steps", ["launcher", "job"])
def test_a_failed_overwrite_keeps_the_old_dataset(tmp_path, post_steps):
    root = tmp_path / "in"
    for i in range(4):
        write(str(root / "test" / "cat" / f"{i}.png"), image_bytes("png", seed=i))
    out = tmp_path / "out"
    convert("--input", str(root), "--output", str(out))
    before = _snapshot(out)
    # --image-stats needs a train split: the analysis step (in the launcher, or the
    # job's own last step) fails after the shards are written.
    result = run_cli("convert", "--input", str(root), "--output", str(out), "--overwrite", "--seed", "3",
                     "--image-stats", "--no-tfds-metadata", "--post-steps", post_steps)  # fmt: skip
    assert result.returncode == 1 and "train split" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert {k: v for k, v in _snapshot(out).items() if not k.startswith(".")} == before


def test_no_image_files_at_all_is_a_usage_error(tmp_path):
    write(str(tmp_path / "in" / "notes.txt"), b"hello")
    write(str(tmp_path / "in" / ".DS_Store"), b"x")
    result = run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"), "--no-transform")
    assert result.returncode == 2 and "no images to convert" in result.stderr
    assert not (tmp_path / "o" / "_SUCCESS").exists()


def test_a_split_whose_every_file_is_rejected_is_named_not_silently_missing(tmp_path):
    """A split with listed files, all rejected, has no shard and so no entry under "splits": dataset.json names it
    under "empty_splits" and the summary says so, so an eval job that finds no such split has the reason."""
    rows = ["path,label,split"]
    for i in range(3):
        write(str(tmp_path / f"good{i}.jpg"), image_bytes("jpeg", seed=i))
        rows.append(f"good{i}.jpg,cat,train")
    for i in range(2):
        write(str(tmp_path / f"bad{i}.jpg"), b"not an image")
        rows.append(f"bad{i}.jpg,cat,test")
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    result = convert("--manifest", str(tmp_path / "m.csv"), "--output", str(out), "--max-reject-fraction", "1")
    info = load_info(out)
    assert set(info["splits"]) == {"train"} and info["empty_splits"] == ["test"]
    assert "test                0 examples: every listed file of this split was rejected" in result.stdout
    shown = run_cli("inspect", str(out)).stdout
    assert "test                 0  every listed file rejected (rejects.jsonl)" in shown
    from beam_pipeline import reader

    with pytest.raises(ValueError, match="split 'test' of .* has no records: every listed file of it was rejected"):
        reader.load(str(out), "test")
    # every split has records: no such key
    (tmp_path / "good.csv").write_text("\n".join(rows[:4]) + "\n")
    convert("--manifest", str(tmp_path / "good.csv"), "--output", str(tmp_path / "o2"))
    assert "empty_splits" not in load_info(tmp_path / "o2")


@pytest.mark.parametrize(
    ("converted", "rejected", "allowance", "stops"),
    [
        (28, 2, 10, False),  # a first folder with two broken files: 6.7 %, within the allowance
        (20, 10, 10, False),  # the allowance, not past it
        (19, 11, 10, True),  # past the allowance and over 5 %
        (10, 11, 100, True),  # within a large allowance, but more rejects than images: a wrong input
        (11, 11, 100, False),  # half, not more
        (300, 15, 10, False),  # 4.8 %: within the fraction whatever the count
        (300, 16, 10, True),  # 5.06 %
        (1, 1, 0, True),  # allowance 0: the fraction from the first reject
    ],
)
def test_the_reject_limit_at_its_boundaries(converted, rejected, allowance, stops):
    from beam_pipeline.run.outcome import TOO_MANY_REJECTS, outcome

    assert (outcome(converted, rejected, 0.05, allowance) == TOO_MANY_REJECTS) is stops


def test_two_broken_files_of_30_publish_at_the_defaults_and_25_of_30_do_not(tmp_path, capsys):
    from beam_pipeline.cli import main

    def run(bad: int) -> tuple[int, Path]:
        root, out = tmp_path / f"in{bad}", tmp_path / f"out{bad}"
        for i in range(30):
            data = broken_bytes("truncated" if i % 2 else "text") if i < bad else image_bytes("png", seed=i)
            write(str(root / "cat" / f"{i}.{'jpg' if i < bad else 'png'}"), data)
        code = main(["convert", "--input", str(root), "--output", str(out), "--no-transform", "--no-tfds-metadata"])
        return code, out

    code, out = run(2)
    assert code == 0 and (out / "_SUCCESS").exists(), capsys.readouterr().err
    assert len((out / "rejects.jsonl").read_text().splitlines()) == 2 and load_info(out)["examples"] == 28
    capsys.readouterr()
    code, out = run(25)
    err = capsys.readouterr().err.strip()
    assert code == 3 and not (out / "_SUCCESS").exists()
    assert err.startswith("error: 25 of 30 inputs rejected (") and "more than --reject-allowance 10;" in err, err
