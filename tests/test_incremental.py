"""The per-file index (index.jsonl) and incremental runs (--incremental-from), end to end through the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from beam_pipeline.formats.tfrecord import read_record_at
from beam_pipeline.vocab.dataset_info import DatasetInfo

from .conftest import CliResult, convert, load_info, read_records, run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e

ARGS = ["--name", "ds", "--split-ratios", "train=0.7,test=0.3", "--seed", "3", "--target-shard-mb", "0.004"]


def make_images(root: Path, labels: dict[str, int], start: int = 0) -> None:
    for li, (label, n) in enumerate(sorted(labels.items())):
        for i in range(start, start + n):
            write(
                str(root / label / f"{label}_{i:03d}.png"),
                image_bytes("png", height=20 + i, width=24, seed=li * 97 + i),
            )


def _notes(result: CliResult) -> list[str]:
    """The ``note:`` lines a run printed on stderr."""
    return [line for line in result.stderr.splitlines() if line.startswith("note:")]


def index_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def test_index_offsets_read_each_record_back(tmp_path, tf):
    src, out = tmp_path / "src", tmp_path / "out"
    make_images(src, {"cat": 9, "dog": 8})
    write(str(src / "dog" / "broken.png"), b"not an image")
    convert("--input", str(src), "--output", str(out), *ARGS, "--max-reject-fraction", "1")
    info, entries = load_info(out), index_of(out)
    records = read_records(out)
    assert len(entries) == len(records) == info["examples"] == 17
    assert "dog/broken.png" not in {e["path"] for e in entries}  # rejects are not indexed
    # shard order, then record order: the same order as the records
    assert [(e["shard"], e["path"]) for e in entries] == [(r["_shard"], r["image/filename"].decode()) for r in records]
    labels = (out / "labels.txt").read_text().split()
    for entry, row in zip(entries, records, strict=True):
        src_file = src / entry["path"]
        assert entry["size"] == src_file.stat().st_size
        assert entry["mtime"] == pytest.approx(src_file.stat().st_mtime)
        assert entry["split"] == row["_split"]
        assert entry["label"] == row["image/class/text"].decode() == labels[entry["label_id"]]
        assert entry["label_id"] == row["image/class/label"]
        assert entry["sha256"] == row["image/key/sha256"].decode() == hashlib.sha256(row["image/encoded"]).hexdigest()
        with open(out / entry["shard"], "rb") as fh:
            raw = read_record_at(fh, entry["offset"])
        assert len(raw) == entry["length"]
        example = tf.train.Example.FromString(raw)
        assert example.features.feature["image/filename"].bytes_list.value[0].decode() == entry["path"]
    per_shard: dict[str, list[int]] = {}
    for e in entries:
        per_shard.setdefault(e["shard"], []).append(e["record"])
    assert all(v == list(range(len(v))) for v in per_shard.values())
    assert {s["file"]: s["records"] for split in info["splits"].values() for s in split["shards"]} == {
        k: len(v) for k, v in per_shard.items()
    }


def test_idx_files_hold_each_records_frame_and_other_readers_use_them(tmp_path):
    """idx/<shard>.idx: "offset frame_size" per record (DALI's and the tfrecord package's index format)."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_images(src, {"cat": 9, "dog": 8})
    convert("--input", str(src), "--output", str(out), *ARGS)
    info, entries = load_info(out), index_of(out)
    assert info["idx_files"] == "idx/{file}.idx"
    shards = [s["file"] for split in info["splits"].values() for s in split["shards"]]
    assert sorted(p.name for p in (out / "idx").iterdir()) == sorted(f"{f}.idx" for f in shards)
    for shard in shards:
        lines = (out / "idx" / f"{shard}.idx").read_text().splitlines()
        frames = [(e["offset"], e["length"] + 16) for e in entries if e["shard"] == shard]
        assert [tuple(map(int, line.split())) for line in lines] == frames
        assert sum(size for _, size in frames) == (out / shard).stat().st_size

    # The tfrecord package (in its own process: its Example proto would clash with TensorFlow's) reads
    # each shard split in two by the index, as a data-loader worker does; together: every record once.
    code = """
import json, sys
from tfrecord.reader import tfrecord_loader
out, shards = sys.argv[1], json.loads(sys.argv[2])
names = []
for shard in shards:
    for part in (0, 1):
        for row in tfrecord_loader(f"{out}/{shard}", f"{out}/idx/{shard}.idx", {"image/filename": "byte"}, (part, 2)):
            names.append(bytes(row["image/filename"]).decode())
print(json.dumps(names))
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, str(out), json.dumps(shards)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [e["path"] for e in entries]


def test_label_ids_stay_and_new_labels_follow(tmp_path):
    src, first, second = tmp_path / "src", tmp_path / "first", tmp_path / "second"
    make_images(src, {"dog": 3, "emu": 3})
    convert("--input", str(src), "--output", str(first), *ARGS)
    assert (first / "labels.txt").read_text() == "dog\nemu\n"
    make_images(src, {"ant": 2, "cat": 2})  # sort before the old labels
    convert("--input", str(src), "--output", str(second), *ARGS, "--incremental-from", str(first))
    assert (second / "labels.txt").read_text() == "dog\nemu\nant\ncat\n"
    ids = {r["image/class/text"].decode(): r["image/class/label"] for r in read_records(second)}
    assert ids == {"dog": 0, "emu": 1, "ant": 2, "cat": 3}
    assert load_info(second)["labels"] == ["dog", "emu", "ant", "cat"]


def test_incremental_from_must_be_a_complete_dataset(tmp_path):
    src, first = tmp_path / "src", tmp_path / "first"
    make_images(src, {"dog": 2})
    convert("--input", str(src), "--output", str(first), *ARGS)

    def usage(previous: Path) -> str:
        result = run_cli(
            "convert", "--input", str(src), "--output", str(tmp_path / "o"), "--incremental-from", str(previous)
        )
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        return result.stderr

    assert "no _SUCCESS" in usage(tmp_path / "nothing")
    (first / "labels.txt").unlink()
    assert "no labels.txt" in usage(first)
    (first / "_SUCCESS").unlink()
    assert "no _SUCCESS" in usage(first)


def shard_bytes(out: Path) -> dict[str, bytes]:
    info = load_info(out)
    return {s["file"]: (out / s["file"]).read_bytes() for split in info["splits"].values() for s in split["shards"]}


@pytest.mark.smoke
def test_incremental_run_equals_a_full_run_and_decodes_only_new_files(tmp_path):
    src, first, inc, full = tmp_path / "src", tmp_path / "first", tmp_path / "inc", tmp_path / "full"
    make_images(src, {"cat": 12, "dog": 12})
    write(str(src / "dog" / "broken.png"), b"not an image")
    opts = (*ARGS, "--max-reject-fraction", "1")
    convert("--input", str(src), "--output", str(first), *opts)
    assert load_info(first)["examples"] == 24

    make_images(src, {"cat": 3, "eel": 2}, start=50)  # added: 3 in an old label, 2 in a new one
    write(str(src / "cat" / "cat_000.png"), image_bytes("png", height=41, width=17, seed=999))  # changed
    (src / "dog" / "dog_001.png").unlink()  # deleted
    (src / "dog" / "dog_002.png").rename(src / "dog" / "renamed.png")  # renamed: dropped + added
    convert("--input", str(src), "--output", str(inc), *opts, "--incremental-from", str(first))
    assert (inc / "labels.txt").read_text() == "cat\ndog\neel\n"
    convert("--input", str(src), "--output", str(full), *opts, "--labels-file", str(inc / "labels.txt"))

    assert shard_bytes(inc) == shard_bytes(full)  # same records, same order, same shards
    assert (inc / "index.jsonl").read_text() == (full / "index.jsonl").read_text()
    idx = {p.name: p.read_bytes() for p in (full / "idx").iterdir()}
    assert {p.name: p.read_bytes() for p in (inc / "idx").iterdir()} == idx and len(idx) == len(shard_bytes(full))
    assert (inc / "rejects.jsonl").read_text() == (full / "rejects.jsonl").read_text()
    info = load_info(inc)
    # the broken file is unchanged: its reject is kept, not read again
    assert info["incremental"] == {
        "from": str(first),
        "reused": 21,  # 24 - changed - deleted - renamed
        "converted": 7,  # 5 added + 1 changed + 1 renamed
        "reconverted": 0,
        "rejects_kept": 1,
        "added": 6,  # 5 new files, the renamed one
        "changed": 1,
        "unchanged": 22,  # 21 records and the broken file
        "dropped": 2,
        "dropped_first": ["dog/dog_001.png", "dog/dog_002.png"],  # named (the first ten by path)
    }
    assert info["rejects"]["total"] == 1
    assert "incremental" not in load_info(full)


def test_unchanged_files_are_not_read_again(tmp_path):
    """Same size and mtime: the previous record is copied, whatever the file holds now (the documented contract)."""
    src, first, second = tmp_path / "src", tmp_path / "first", tmp_path / "second"
    make_images(src, {"cat": 4})
    convert("--input", str(src), "--output", str(first), *ARGS)
    target = src / "cat" / "cat_001.png"
    stat = target.stat()
    target.write_bytes(b"x" * stat.st_size)  # not an image any more, same size ...
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... and mtime
    convert("--input", str(src), "--output", str(second), *ARGS, "--incremental-from", str(first))
    assert shard_bytes(second) == shard_bytes(first)
    assert load_info(second)["incremental"]["reused"] == 4
    assert load_info(second)["rejects"]["total"] == 0


def test_previous_rejects_are_kept_unread_unless_the_file_changed(tmp_path):
    """A file rejected for its bytes keeps its reject while path, size and mtime stay; a changed one is retried."""
    src, first, second, full = tmp_path / "src", tmp_path / "first", tmp_path / "second", tmp_path / "full"
    make_images(src, {"cat": 4})
    kept, fixed = src / "cat" / "kept.png", src / "cat" / "fixed.png"
    write(str(kept), b"not an image" * 5)
    write(str(fixed), b"not an image" * 5)
    opts = (*ARGS, "--max-reject-fraction", "1")
    convert("--input", str(src), "--output", str(first), *opts)
    rejects = [json.loads(line) for line in (first / "rejects.jsonl").read_text().splitlines()]
    assert [(r["path"], r["reason"], r["size"]) for r in rejects] == [
        ("cat/fixed.png", "not_an_image", 60),
        ("cat/kept.png", "not_an_image", 60),
    ]
    assert rejects[1]["mtime"] == pytest.approx(kept.stat().st_mtime)

    stat = kept.stat()  # same size and mtime, other bytes: a read would reject it as truncated now
    kept.write_bytes(image_bytes("png", height=30, width=30, seed=6)[:60])
    os.utime(kept, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    write(str(fixed), image_bytes("png", height=30, width=30, seed=5))  # changed: read again, a record now
    convert("--input", str(src), "--output", str(second), *opts, "--incremental-from", str(first))
    got = [json.loads(line) for line in (second / "rejects.jsonl").read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in got] == [("cat/kept.png", "not_an_image")]  # kept as it was
    inc = load_info(second)["incremental"]
    assert (inc["rejects_kept"], inc["unchanged"], inc["changed"], inc["converted"]) == (1, 5, 1, 1)
    assert "cat/fixed.png" in {e["path"] for e in index_of(second)}
    shown = run_cli("inspect", str(second)).stdout
    assert "  rejects kept: 1 (unchanged files, not read again)" in shown.splitlines()

    # a full run reads the file: the same records, and the reject it finds now
    convert("--input", str(src), "--output", str(full), *opts, "--labels-file", str(second / "labels.txt"))
    assert shard_bytes(second) == shard_bytes(full)
    assert [(r["path"], r["reason"]) for r in map(json.loads, (full / "rejects.jsonl").read_text().splitlines())] == [
        ("cat/kept.png", "truncated")
    ]


@pytest.mark.unit
def test_which_previous_rejects_are_kept():
    from beam_pipeline.index import kept_reject, reject_key
    from beam_pipeline.vocab.refs import Ref

    ref = Ref("/in/a.png", "a.png", 12, "train", None, 1, mtime=5.0)
    entry = {"path": "a.png", "reason": "not_an_image", "detail": "", "source": "/in/a.png", "size": 12, "mtime": 5.0}
    assert kept_reject(entry, ref) and reject_key(entry, "/in") == ref.relpath
    assert not kept_reject({**entry, "mtime": 6.0}, ref)  # changed
    assert not kept_reject({**entry, "size": 13}, ref)
    for retried in ("missing", "unreadable"):  # said nothing of the bytes: tried again
        assert not kept_reject({**entry, "reason": retried}, ref)
    assert not kept_reject({k: v for k, v in entry.items() if k != "mtime"}, ref)  # an older rejects.jsonl
    # a manifest row's extra columns: kept only while they are the same
    from beam_pipeline.index import extras_digest

    with_row = Ref("/in/a.png", "a.png", 12, "train", None, 1, extras=(("n", 2**70),), mtime=5.0)
    assert kept_reject({**entry, "extras": extras_digest(with_row)}, with_row)
    assert not kept_reject(entry, with_row)  # the reject was of a row without extras
    assert not kept_reject({**entry, "extras": extras_digest(with_row)}, ref)
    # a manifest row outside the manifest's folder: rejects.jsonl keeps its full path, the ref a relative one
    outside = {**entry, "path": "/elsewhere/b.png", "source": "/elsewhere/b.png"}
    assert reject_key(outside, "/in") == "elsewhere/b.png"


def test_a_manifest_rows_reject_outside_its_folder_is_kept_too(tmp_path):
    src, first, second = tmp_path / "lists", tmp_path / "first", tmp_path / "second"
    make_images(src / "imgs", {"cat": 3})
    bad = tmp_path / "elsewhere" / "bad.png"
    write(str(bad), b"not an image" * 5)
    rows = [str(p) for p in sorted((src / "imgs").rglob("*.png"))] + [str(bad)]
    (src / "list.csv").write_text("path,label\n" + "".join(f"{p},cat\n" for p in rows))
    opts = ("--manifest", str(src / "list.csv"), *ARGS, "--max-reject-fraction", "1")
    convert(*opts, "--output", str(first))
    stat = bad.stat()
    bad.write_bytes(image_bytes("png", height=30, width=30, seed=6)[:60])  # a read would say truncated
    os.utime(bad, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    convert(*opts, "--output", str(second), "--incremental-from", str(first))
    [kept] = [json.loads(line) for line in (second / "rejects.jsonl").read_text().splitlines()]
    assert (kept["path"], kept["reason"]) == (str(bad), "not_an_image")
    inc = load_info(second)["incremental"]
    assert (inc["rejects_kept"], inc["unchanged"], inc["added"]) == (1, 4, 0)


def test_inspect_shows_what_an_incremental_run_reused(tmp_path):
    src, first, second = tmp_path / "src", tmp_path / "first", tmp_path / "second"
    make_images(src, {"cat": 5})
    convert("--input", str(src), "--output", str(first), *ARGS)
    make_images(src, {"cat": 2}, start=20)
    (src / "cat" / "cat_000.png").unlink()
    convert("--input", str(src), "--output", str(second), *ARGS, "--incremental-from", str(first))
    shown = run_cli("inspect", str(second))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    at = lines.index("incremental: reused 4 records, converted 2")
    assert lines[at + 1] == "  files: unchanged 4, added 2, changed 0, dropped 1"
    assert lines[at + 2] == f"  from: {first}"[:80]  # inspect keeps to 80 columns
    assert "incremental" not in run_cli("inspect", str(first)).stdout


def test_a_previous_shard_gone_is_converted_again(tmp_path):
    src, first, second = tmp_path / "src", tmp_path / "first", tmp_path / "second"
    make_images(src, {"cat": 6, "dog": 6})
    convert("--input", str(src), "--output", str(first), *ARGS)
    expected = shard_bytes(first)
    [gone, *_] = load_info(first)["splits"]["train"]["shards"]
    (first / gone["file"]).unlink()
    convert("--input", str(src), "--output", str(second), *ARGS, "--incremental-from", str(first))
    assert shard_bytes(second) == expected
    assert load_info(second)["incremental"]["reused"] == 12 - gone["records"]
    assert load_info(second)["incremental"]["converted"] == gone["records"]
    assert load_info(second)["incremental"]["reconverted"] == gone["records"]


def test_gzip_offsets_are_in_the_uncompressed_stream_and_gzip_shards_are_not_reused(tmp_path, tf):
    import gzip

    src, first, second = tmp_path / "src", tmp_path / "first", tmp_path / "second"
    make_images(src, {"cat": 4})
    convert("--input", str(src), "--output", str(first), *ARGS, "--compression", "gzip")
    for entry in index_of(first):
        with gzip.open(first / entry["shard"], "rb") as fh:
            example = tf.train.Example.FromString(read_record_at(fh, entry["offset"]))
        assert example.features.feature["image/filename"].bytes_list.value[0].decode() == entry["path"]
    assert not (first / "idx").exists()  # a gzip shard has no file offsets to index
    convert(
        "--input", str(src), "--output", str(second), *ARGS, "--compression", "gzip", "--incremental-from", str(first)
    )
    assert load_info(second)["incremental"]["reused"] == 0  # a gzip shard is not read at an offset
    assert [r["image/encoded"] for r in read_records(second)] == [r["image/encoded"] for r in read_records(first)]
    result = run_cli(
        "convert", "--input", str(src), "--output", str(tmp_path / "o"), "--sink", "write_to_tfrecord",
        "--incremental-from", str(first),
    )  # fmt: skip
    assert result.returncode == 2 and "needs the planned sink" in result.stderr


@pytest.mark.unit
def test_earlier_dated_folders_takes_real_dates_before_the_run_newest_first():
    from beam_pipeline.run.previous import earlier_dated_folders

    def files(*folders: str) -> list[str]:
        return [f"{folder}/_SUCCESS" for folder in folders]

    found = files("gs://b/ds/2026-03-01", "gs://b/ds/2026-03-04", "gs://b/ds/2026-03-05", "gs://b/ds/2026-03-09",
                  "gs://b/ds/2026-02-30", "gs://b/ds/notes", "gs://b/ds/2026-03-03.old", "gs://b/ds/x/2026-03-02",
                  "gs://b/ds/2026-03-02/x")  # fmt: skip
    assert earlier_dated_folders("gs://b/ds/{date}", found, "2026-03-05") == [
        "gs://b/ds/2026-03-04",
        "gs://b/ds/2026-03-01",
    ]
    # {date} inside a name, in an inner folder, twice (the same date both times)
    assert earlier_dated_folders("/d/p-{date}/tf", files("/d/p-2026-01-02/tf", "/d/p-2026-01-03/x"), "2027-01-01") == [
        "/d/p-2026-01-02/tf"
    ]
    twice = files("/d/2026-01-02/run-2026-01-02", "/d/2026-01-03/run-2026-01-01")
    assert earlier_dated_folders("/d/{date}/run-{date}", twice, "2027-01-01") == ["/d/2026-01-02/run-2026-01-02"]


def test_incremental_from_latest_without_date_in_output_is_a_usage_error(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"dog": 2})
    result = run_cli("convert", "--input", str(src), "--output", str(tmp_path / "o"), "--incremental-from", "latest")
    assert result.returncode == 2, result
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --incremental-from latest needs {date} in --output"), line
    assert not (tmp_path / "o").exists()


def test_nightly_runs_build_on_the_newest_complete_earlier_date(tmp_path):
    """Three dated nights with --incremental-from latest (the second's from a config file); folders not to take."""
    src, ds, explicit = tmp_path / "src", tmp_path / "ds", tmp_path / "explicit"
    nightly = ("--input", str(src), "--output", str(ds / "{date}"), *ARGS)
    make_images(src, {"cat": 8, "dog": 8})

    first = convert(*nightly, "--incremental-from", "latest", "--run-date", "2026-03-01")
    [note] = first.stderr.strip().splitlines()
    template = ds / "{date}"
    assert note == f"note: --incremental-from latest: no earlier complete dataset for {template}; converting everything"
    assert "incremental" not in load_info(ds / "2026-03-01")

    make_images(src, {"cat": 2, "eel": 2}, start=40)
    config = tmp_path / "nightly.yaml"
    config.write_text("incremental_from: latest\n")
    second = convert(*nightly, "--config", str(config), "--run-date", "2026-03-02")
    assert "note:" not in second.stderr
    assert load_info(ds / "2026-03-02")["incremental"]["from"] == str(ds / "2026-03-01")
    assert load_info(ds / "2026-03-02")["incremental"]["reused"] == 16

    # Around the third night (2026-04-01): folders newer than 2026-03-02 that are no candidates.
    def copy(name: str, *drop: str) -> None:
        shutil.copytree(ds / "2026-03-01", ds / name)
        for file in drop:
            (ds / name / file).unlink()

    copy("2026-03-20", "_SUCCESS")  # a killed night
    copy("2026-03-32")  # no date
    copy("notes")
    copy("2026-04-02")  # later than the run
    copy("2026-04-01")  # the run's own date: an earlier run of it, replaced with --overwrite
    make_images(src, {"dog": 2, "fox": 1}, start=60)
    (src / "cat" / "cat_003.png").unlink()
    third = convert(*nightly, "--incremental-from", "latest", "--run-date", "2026-04-01", "--overwrite")
    assert "note:" not in third.stderr
    info = load_info(ds / "2026-04-01")
    assert info["incremental"]["from"] == str(ds / "2026-03-02")
    assert (info["incremental"]["reused"], info["incremental"]["added"]) == (19, 3)
    assert (ds / "2026-04-01" / "labels.txt").read_text() == "cat\ndog\neel\nfox\n"

    # the same shards as naming the folder
    convert("--input", str(src), "--output", str(explicit), *ARGS, "--incremental-from", str(ds / "2026-03-02"))
    assert shard_bytes(ds / "2026-04-01") == shard_bytes(explicit)
    assert (ds / "2026-04-01" / "index.jsonl").read_text() == (explicit / "index.jsonl").read_text()
    assert info["incremental"] == load_info(explicit)["incremental"]


def _damage_record(out: Path, path: str, src_bytes: bytes, keep_frame_valid: bool) -> None:
    """Alters one byte of ``path``'s image inside its record of ``out``: the frame's data CRC breaks, or (with
    ``keep_frame_valid``) the frame is rewritten with fresh CRCs, so only ``image/key/sha256`` tells."""
    import io

    from apache_beam.io.tfrecordio import _TFRecordUtil

    [entry] = [e for e in index_of(out) if e["path"] == path]
    shard = out / entry["shard"]
    raw = bytearray(shard.read_bytes())
    start = entry["offset"] + 12  # the Example, after length and its CRC
    data = bytearray(raw[start : start + entry["length"]])
    at = data.find(src_bytes) + len(src_bytes) // 2  # a byte in the middle of the image bytes
    data[at] ^= 0x01
    if keep_frame_valid:
        frame = io.BytesIO()
        _TFRecordUtil.write_record(frame, bytes(data))
        raw[entry["offset"] : entry["offset"] + entry["length"] + 16] = frame.getvalue()
    else:
        raw[start : start + entry["length"]] = data
    shard.write_bytes(bytes(raw))


@pytest.mark.parametrize("keep_frame_valid", [False, True], ids=["data-crc", "sha256"])
def test_a_damaged_previous_record_is_converted_afresh_not_copied(tmp_path, keep_frame_valid):
    """A reused record's frame CRCs and image/key/sha256 are checked; one that fails is converted like a new file."""
    src, first, prev, inc = tmp_path / "src", tmp_path / "first", tmp_path / "prev", tmp_path / "inc"
    make_images(src, {"cat": 6, "dog": 6})
    convert("--input", str(src), "--output", str(first), *ARGS)
    shutil.copytree(first, prev)
    victim = "dog/dog_003.png"
    _damage_record(prev, victim, (src / victim).read_bytes(), keep_frame_valid)
    assert shard_bytes(prev) != shard_bytes(first)

    convert("--input", str(src), "--output", str(inc), *ARGS, "--incremental-from", str(prev))
    # the same files, unchanged: byte for byte the full run's output (first), the damage not carried over
    assert shard_bytes(inc) == shard_bytes(first)
    assert (inc / "index.jsonl").read_text() == (first / "index.jsonl").read_text()
    summary = load_info(inc)["incremental"]
    assert (summary["reused"], summary["converted"], summary["reconverted"]) == (11, 1, 1)
    shown = run_cli("inspect", str(inc)).stdout.splitlines()
    assert "  reconverted: 1 (previous record damaged or gone)" in shown
    assert run_cli("inspect", "--verify", str(inc)).returncode == 0


def test_a_reject_caused_by_the_manifest_row_is_retried_when_the_row_changes(tmp_path):
    """A JSONL value beyond int64 rejects its file (bad_value); kept while file and row stay, converted once fixed."""
    src, first, second, third, full = (tmp_path / n for n in ("src", "first", "second", "third", "full"))
    make_images(src / "imgs", {"cat": 5})
    manifest = src / "list.jsonl"

    def rows(big: int) -> None:
        files = sorted((src / "imgs").rglob("*.png"))
        manifest.write_text(
            "".join(json.dumps({"path": str(p), "n": big if i == 2 else i}) + "\n" for i, p in enumerate(files))
        )

    opts = ("--manifest", str(manifest), *ARGS, "--max-reject-fraction", "1")
    rows(2**70)
    convert(*opts, "--output", str(first))
    [reject] = [json.loads(line) for line in (first / "rejects.jsonl").read_text().splitlines()]
    assert (reject["path"], reject["reason"]) == ("imgs/cat/cat_002.png", "bad_value")
    assert "'n'" in reject["detail"] and "int64" in reject["detail"]

    convert(*opts, "--output", str(second), "--incremental-from", str(first))  # nothing changed: the reject stays
    assert (second / "rejects.jsonl").read_text() == (first / "rejects.jsonl").read_text()
    assert load_info(second)["incremental"]["rejects_kept"] == 1

    stat = manifest.stat()
    rows(7)  # the row is fixed; the image file is untouched
    os.utime(manifest, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    convert(*opts, "--output", str(third), "--incremental-from", str(second))
    assert not (third / "rejects.jsonl").exists() or not (third / "rejects.jsonl").read_text()
    assert load_info(third)["incremental"]["rejects_kept"] == 0
    assert "imgs/cat/cat_002.png" in {e["path"] for e in index_of(third)}
    convert(*opts, "--output", str(full))
    assert shard_bytes(third) == shard_bytes(full)
    assert (third / "index.jsonl").read_text() == (full / "index.jsonl").read_text()


def test_latest_builds_on_the_newest_complete_date_even_one_without_an_index(tmp_path):
    """A newer complete night without index.jsonl (--sink write_to_tfrecord) gives its label ids, not an older
    night's: ids never swap between nights. Nothing is reused from it, and a note says so."""
    src, ds, full = tmp_path / "src", tmp_path / "ds", tmp_path / "full"
    nightly = ("--input", str(src), "--output", str(ds / "{date}"), *ARGS)
    make_images(src, {"dog": 3, "emu": 3})
    convert(*nightly, "--run-date", "2026-03-01")  # dog 0, emu 1
    make_images(src, {"ant": 2}, start=10)
    convert(*nightly, "--run-date", "2026-03-02", "--sink", "write_to_tfrecord")  # ant 0, dog 1, emu 2
    night2 = ds / "2026-03-02"
    assert (night2 / "labels.txt").read_text() == "ant\ndog\nemu\n" and not (night2 / "index.jsonl").exists()

    make_images(src, {"fox": 1}, start=20)
    third = convert(*nightly, "--incremental-from", "latest", "--run-date", "2026-03-03")
    notes = _notes(third)
    assert notes == [
        f"note: --incremental-from latest: no record of {night2} can be reused: it has no index.jsonl (written by "
        "--sink write_to_tfrecord or an older version); its label ids are kept, every file is converted"
    ]
    out = ds / "2026-03-03"
    assert (out / "labels.txt").read_text() == "ant\ndog\nemu\nfox\n"
    ids = {r["image/class/text"].decode(): r["image/class/label"] for r in read_records(out)}
    assert ids == {"ant": 0, "dog": 1, "emu": 2, "fox": 3}
    inc = load_info(out)["incremental"]
    assert (inc["from"], inc["reused"], inc["converted"], inc["added"]) == (str(night2), 0, 9, 9)
    convert("--input", str(src), "--output", str(full), *ARGS, "--labels-file", str(out / "labels.txt"))
    assert shard_bytes(out) == shard_bytes(full)


def test_records_of_other_code_are_not_reused_but_their_label_ids_are(tmp_path):
    src, first, second = tmp_path / "src", tmp_path / "first", tmp_path / "second"
    make_images(src, {"dog": 2, "emu": 2})
    convert("--input", str(src), "--output", str(first), *ARGS)
    info = load_info(first)
    info["versions"]["beam_pipeline_code"] = "0" * 16  # as if an older version of this tool wrote it
    (first / "dataset.json").write_text(json.dumps(info))
    make_images(src, {"ant": 1}, start=5)
    result = convert("--input", str(src), "--output", str(second), *ARGS, "--incremental-from", str(first))
    assert _notes(result) == [
        f"note: --incremental-from {first}: no record of {first} can be reused: it was written by other "
        "beam_pipeline code or another Pillow; its label ids are kept, every file is converted"
    ]
    assert (second / "labels.txt").read_text() == "dog\nemu\nant\n"
    assert load_info(second)["incremental"]["reused"] == 0


def test_label_names_keep_their_ids_exactly_whitespace_included(tmp_path):
    """Folder labels ' ' and 'cat ' keep their ids in the next incremental run (labels.txt is read exactly, and
    so is a --labels-file); a label with a line break cannot be a line of labels.txt: bad_label."""
    src, first, second, full = tmp_path / "src", tmp_path / "first", tmp_path / "second", tmp_path / "full"
    make_images(src, {" ": 2, "cat ": 2, "dog": 2})
    write(str(src / "two\nlines" / "a.png"), image_bytes("png", height=20, width=20, seed=1))
    opts = (*ARGS, "--max-reject-fraction", "1")
    convert("--input", str(src), "--output", str(first), *opts)
    assert (first / "labels.txt").read_text() == " \ncat \ndog\n"
    [reject] = [json.loads(line) for line in (first / "rejects.jsonl").read_text().splitlines()]
    assert (reject["path"], reject["reason"]) == ("two\nlines/a.png", "bad_label")

    make_images(src, {"ant": 1}, start=5)
    convert("--input", str(src), "--output", str(second), *opts, "--incremental-from", str(first))
    assert (second / "labels.txt").read_text() == " \ncat \ndog\nant\n"
    ids = {r["image/class/text"].decode(): r["image/class/label"] for r in read_records(second)}
    assert ids == {" ": 0, "cat ": 1, "dog": 2, "ant": 3}
    assert load_info(second)["incremental"]["reused"] == 6
    # a --labels-file is read the same way: a full run with the new labels.txt writes the same shards
    result = convert("--input", str(src), "--output", str(full), *opts, "--labels-file", str(second / "labels.txt"))
    assert "label ' ' (and 1 more) has leading or trailing spaces, kept as they are" in result.stderr
    assert shard_bytes(full) == shard_bytes(second)


@pytest.mark.unit
def test_tfds_metadata_is_skipped_when_tfds_would_read_a_label_back_otherwise():
    from beam_pipeline.tfds_metadata import skip_reason

    assert skip_reason(DatasetInfo.from_json({"compression": "none", "labels": ["cat", "dog"]})) is None
    assert "leading or trailing spaces" in skip_reason(
        DatasetInfo.from_json({"compression": "none", "labels": ["cat", " "]})
    )


def test_damaged_lines_of_the_previous_index_and_rejects_are_left_out_not_a_crashed_run(tmp_path):
    """A nightly --incremental-from on a damaged previous dataset: lines that are not JSON, cut short, nested
    deeper than Python's reader goes, or lack what the join reads are counted and left out; their files are
    converted afresh and the output is byte for byte a full run's."""
    src, first, prev, inc = tmp_path / "src", tmp_path / "first", tmp_path / "prev", tmp_path / "inc"
    make_images(src, {"cat": 6, "dog": 6})
    write(str(src / "dog" / "broken.png"), b"not an image")
    opts = ("--input", str(src), *ARGS, "--max-reject-fraction", "1")
    convert(*opts, "--output", str(first))
    shutil.copytree(first, prev)
    lines = (prev / "index.jsonl").read_text().splitlines()
    victims = {json.loads(lines[i])["path"] for i in (0, 1, 2, 3)}
    lines[0] = lines[0][: len(lines[0]) // 2]  # cut short
    lines[1] = "not json at all"
    lines[2] = json.dumps({**json.loads(lines[2]), "offset": "12"})  # a wrong type
    del lines[3]
    lines.append("[" * 100_000 + "]" * 100_000)  # deeper than json.loads goes (RecursionError)
    lines.append(json.dumps({"path": "cat/cat_000.png"}))  # no shard, offset, ...
    (prev / "index.jsonl").write_text("\n".join(lines) + "\n")
    rejects = (prev / "rejects.jsonl").read_text()
    (prev / "rejects.jsonl").write_text(rejects + "{" * 50_000 + "\n" + '{"path": 3}\n')

    result = convert(*opts, "--output", str(inc), "--incremental-from", str(prev))
    assert shard_bytes(inc) == shard_bytes(first)
    assert (inc / "index.jsonl").read_text() == (first / "index.jsonl").read_text()
    assert (inc / "rejects.jsonl").read_text() == (first / "rejects.jsonl").read_text()
    summary = load_info(inc)["incremental"]
    assert summary["unreadable_previous_lines"] == 7
    assert summary["reused"] == 12 - len(victims) and summary["converted"] == len(victims)
    assert summary["rejects_kept"] == 1  # the intact reject line still serves
    assert "damaged lines left out of its index.jsonl/rejects.jsonl: 7" in result.stdout
    shown = run_cli("inspect", str(inc)).stdout
    assert "unreadable previous lines: 7" in shown
    # an intact previous dataset: no such key, dataset.json as before
    again = tmp_path / "again"
    convert(*opts, "--output", str(again), "--incremental-from", str(first))
    assert "unreadable_previous_lines" not in load_info(again)["incremental"]


@pytest.fixture(scope="module")
def three_cats(tmp_path_factory) -> tuple[Path, Path]:
    """3 images and their dataset (ARGS), converted once for the tests that damage a copy of it."""
    root = tmp_path_factory.mktemp("three_cats")
    make_images(root / "src", {"cat": 3})
    convert("--input", str(root / "src"), "--output", str(root / "prev"), *ARGS)
    return root / "src", root / "prev"


def _copy_of(dataset: Path, to: Path) -> Path:
    shutil.copytree(dataset, to)
    return to


@pytest.mark.parametrize("damage", [b"[1, 2]\n", b"[" * 100_000 + b"]" * 100_000], ids=["not-an-object", "too-deep"])
def test_incremental_from_a_dataset_whose_dataset_json_is_damaged_is_a_one_line_error(tmp_path, damage, three_cats):
    src, prev = three_cats[0], _copy_of(three_cats[1], tmp_path / "prev")
    (prev / "dataset.json").write_bytes(damage)
    result = run_cli("convert", "--input", str(src), "--output", str(tmp_path / "inc"), "--incremental-from", str(prev))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: --incremental-from {prev}: {prev}: no readable dataset.json"]


@pytest.mark.parametrize(
    "damage, words",
    [(b"\xff\xfe\x00cat\n", "its labels.txt is not UTF-8 text (damaged)"), (b"cat\ncat\n", "lists 'cat' twice")],
    ids=["not-utf8", "a-label-twice"],
)
def test_incremental_from_a_dataset_whose_labels_txt_is_damaged_is_a_one_line_error(
    tmp_path, damage, words, three_cats
):
    """Line k of labels.txt is id k: bytes that are no text, or a label on two lines, give no ids to keep."""
    src, prev = three_cats[0], _copy_of(three_cats[1], tmp_path / "prev")
    (prev / "labels.txt").write_bytes(damage)
    result = run_cli("convert", "--input", str(src), "--output", str(tmp_path / "inc"), "--incremental-from", str(prev))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --incremental-from {prev}: ") and words in line
    labels = tmp_path / "labels.txt"
    labels.write_bytes(damage)
    result = run_cli("convert", "--input", str(src), "--output", str(tmp_path / "o"), "--labels-file", str(labels))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[0].startswith(f"error: --labels-file {labels}: ")


def test_a_previous_index_or_rejects_line_that_is_not_utf8_is_left_out_not_a_crashed_run(tmp_path):
    """Damage is bytes: a line of the previous index.jsonl / rejects.jsonl that is not UTF-8 (a flipped bit, a
    non-ASCII path cut in the middle of a character) is one more damaged line, not a UnicodeDecodeError."""
    src, first, prev, inc = tmp_path / "src", tmp_path / "first", tmp_path / "prev", tmp_path / "inc"
    make_images(src, {"cat": 4, "dog": 4})
    write(str(src / "dog" / "broken.png"), b"not an image")
    opts = ("--input", str(src), *ARGS, "--max-reject-fraction", "1")
    convert(*opts, "--output", str(first))
    shutil.copytree(first, prev)
    lines = (prev / "index.jsonl").read_bytes().splitlines()
    victim = json.loads(lines[0])["path"]
    lines[0] = lines[0].replace(b'"path"', b'"p\xffth"')
    (prev / "index.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (prev / "rejects.jsonl").write_bytes((prev / "rejects.jsonl").read_bytes() + b'{"path": "\xe7\x8c"}\n')

    convert(*opts, "--output", str(inc), "--incremental-from", str(prev))
    assert shard_bytes(inc) == shard_bytes(first)
    assert (inc / "index.jsonl").read_text() == (first / "index.jsonl").read_text()
    summary = load_info(inc)["incremental"]
    assert summary["unreadable_previous_lines"] == 2
    assert summary["converted"] == 1 and victim


@pytest.mark.parametrize(
    "damage",
    [b"{cut short", None, {"config": 5}, {"versions": "x"}, {"features": []}, {"features": {"image/encoded": 1}}],
    ids=["damaged", "missing", "config-not-object", "versions-not-object", "features-a-list", "feature-not-object"],
)
def test_latest_over_a_night_whose_dataset_json_is_damaged_keeps_its_ids_and_converts_everything(tmp_path, damage):
    """A nightly job must not be stuck: the newest complete night with a damaged or missing dataset.json gives its
    label ids (labels.txt is sound) and a note, nothing is reused from it, and the night after it is written."""
    src, ds = tmp_path / "src", tmp_path / "ds"
    nightly = ("--input", str(src), "--output", str(ds / "{date}"), *ARGS)
    make_images(src, {"emu": 2, "dog": 2})
    convert(*nightly, "--run-date", "2026-03-01")  # dog 0, emu 1
    night1 = ds / "2026-03-01"
    if damage is None:
        (night1 / "dataset.json").unlink()
    elif isinstance(damage, dict):  # JSON, but of another shape than this tool writes
        (night1 / "dataset.json").write_text(json.dumps({**load_info(night1), **damage}))
    else:
        (night1 / "dataset.json").write_bytes(damage)
    make_images(src, {"ant": 1}, start=10)
    second = convert(*nightly, "--incremental-from", "latest", "--run-date", "2026-03-02")
    notes = _notes(second)
    assert notes == [
        f"note: --incremental-from latest: the newest earlier dataset, {night1}: no readable dataset.json; "
        "its label ids are kept, every file is converted"
    ]
    out = ds / "2026-03-02"
    assert (out / "labels.txt").read_text() == "dog\nemu\nant\n"
    assert "incremental" not in load_info(out) or load_info(out)["incremental"].get("reused", 0) == 0
    assert sorted(r["image/class/text"].decode() for r in read_records(out)) == ["ant", "dog", "dog", "emu", "emu"]
    # given by name, the same folder stays a one-line error: the user asked for that very dataset
    named = run_cli("convert", *nightly, "--incremental-from", str(night1), "--run-date", "2026-03-03")
    assert named.returncode == 2 and named.stderr.strip().splitlines() == [
        f"error: --incremental-from {night1}: {night1}: no readable dataset.json"
    ]


def test_a_failed_read_of_the_previous_dataset_json_is_one_line_exit_1_not_damage(tmp_path, monkeypatch):
    """Transient is not damage: a read of the previous dataset.json that fails (failpoint launcher.previous, as a
    busy store would) ends the run in one line, exit 1 (run again), by path and under latest alike; it is not
    taken for a damaged dataset (everything converted afresh) nor for a usage mistake (exit 2). The same command
    then reuses the previous night."""
    src, ds = tmp_path / "src", tmp_path / "ds"
    nightly = ("--input", str(src), "--output", str(ds / "{date}"), *ARGS)
    make_images(src, {"emu": 2, "dog": 2})
    convert(*nightly, "--run-date", "2026-03-01")
    night1 = ds / "2026-03-01"
    make_images(src, {"ant": 1}, start=10)
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "launcher.previous:1")
    for previous in ("latest", str(night1)):
        failed = run_cli("convert", *nightly, "--incremental-from", previous, "--run-date", "2026-03-02")
        assert failed.returncode == 1, failed.stderr
        assert failed.stderr.strip().splitlines() == [
            "error: FailpointError: failpoint launcher.previous at operation 1 (-v shows the traceback)"
        ]
        assert not (ds / "2026-03-02" / "_SUCCESS").exists()
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    convert(*nightly, "--incremental-from", "latest", "--run-date", "2026-03-02")
    summary = load_info(ds / "2026-03-02")["incremental"]
    assert (summary["reused"], summary["converted"]) == (4, 1)


def test_a_night_that_reuses_every_record_keeps_the_conversion_counts(tmp_path, capsys):
    """Records stored as PNG from two TIFFs, reused the next night: dataset.json and the summary
    count them as the night that converted them did (before: "converted": {} and no summary line)."""
    from beam_pipeline.cli import main

    root = tmp_path / "in"
    write(str(root / "cat" / "a.tiff"), image_bytes("tiff", seed=1))
    write(str(root / "cat" / "b.tif"), image_bytes("tiff", seed=2))
    write(str(root / "dog" / "c.png"), image_bytes("png", seed=3))
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--input", str(root), "--no-transform", "--no-tfds-metadata", *ARGS]
    assert main(["convert", *common, "--output", str(first)]) == 0
    capsys.readouterr()
    assert main(["convert", *common, "--output", str(second), "--incremental-from", str(first)]) == 0
    summary = capsys.readouterr().out
    info = load_info(second)
    assert info["incremental"]["reused"] == 3 and info["incremental"]["converted"] == 0
    assert info["converted"] == load_info(first)["converted"] == {"tiff": 2}
    assert "converted" in summary and "2 stored as PNG" in summary, summary
    converted = {e["path"]: e.get("converted") for e in index_of(second)}
    assert converted == {"cat/a.tiff": "tiff", "cat/b.tif": "tiff", "dog/c.png": None}
