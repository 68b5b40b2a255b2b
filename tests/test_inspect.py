"""inspect: summary, --verify and --contact-sheet on a converted dataset."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from beam_pipeline.vocab.dataset_info import DatasetInfo

from .conftest import convert, load_info, run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    base = tmp_path_factory.mktemp("inspect")
    for i in range(30):
        label = ["cat", "dog", "owl"][i % 3]
        kind = "jpeg" if i % 4 == 0 else "png"  # JPEGs: a flipped byte in their scan data still decodes
        write(str(base / "in" / label / f"{i}.{kind}"), image_bytes(kind, 30 + i, 40, seed=i))
    out = base / "out"
    convert("--input", str(base / "in"), "--output", str(out), "--split-ratios", "train=0.7,test=0.3",
            "--target-shard-mb", "0.02")  # fmt: skip
    return out


def test_summary_fits_80_columns(dataset):
    result = run_cli("inspect", str(dataset))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    text = result.stdout
    info = load_info(dataset)
    assert f"{info['examples']:,} examples" in text and "complete (_SUCCESS)" in text
    for split, s in info["splits"].items():
        assert any(line.startswith(split) and str(s["num_shards"]) in line for line in lines)
    assert "cat" in text and "owl" in text and "rejects: 0" in text


def test_verify_passes_on_a_good_output(dataset):
    result = run_cli("inspect", str(dataset), "--verify")
    assert result.returncode == 0, result.stderr
    assert "verified 30 records" in result.stdout
    assert "index.jsonl" in result.stdout and "sha256" in result.stdout


def _copy(dataset, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    return copy, load_info(copy)


def test_verify_finds_a_flipped_byte(dataset, tmp_path):
    copy, info = _copy(dataset, tmp_path)
    shard = info["splits"]["train"]["shards"][1]["file"]
    data = bytearray((copy / shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / shard).write_bytes(bytes(data))
    result = run_cli("inspect", str(copy), "--verify")
    assert result.returncode == 1
    assert shard in result.stderr and "record" in result.stderr and "Traceback" not in result.stderr


def test_verify_finds_a_wrong_record_count(dataset, tmp_path):
    copy, info = _copy(dataset, tmp_path)
    info["splits"]["test"]["shards"][0]["records"] += 1
    (copy / "dataset.json").write_text(json.dumps(info))
    result = run_cli("inspect", str(copy), "--verify")
    assert result.returncode == 1
    assert info["splits"]["test"]["shards"][0]["file"] in result.stderr and "dataset.json says" in result.stderr


@pytest.mark.parametrize("damage", ["line", "missing", "extra"])
def test_verify_checks_each_shards_idx(dataset, tmp_path, damage):
    copy, info = _copy(dataset, tmp_path)
    shard = info["splits"]["train"]["shards"][0]["file"]
    idx = copy / "idx" / f"{shard}.idx"
    lines = idx.read_text().splitlines()
    if damage == "line":
        offset, size = lines[1].split()
        lines[1] = f"{offset} {int(size) + 1}"
        idx.write_text("\n".join(lines) + "\n")
    elif damage == "missing":
        idx.unlink()
    else:
        idx.write_text("\n".join([*lines, "99999 16"]) + "\n")
    result = run_cli("inspect", str(copy), "--verify")
    assert result.returncode == 1 and f"idx/{shard}.idx" in result.stderr and "Traceback" not in result.stderr


def _frames(path):
    """The records of an uncompressed shard, CRCs checked."""
    from apache_beam.io.tfrecordio import _TFRecordUtil

    records = []
    with open(path, "rb") as fh:
        while (record := _TFRecordUtil.read_record(fh)) is not None:
            records.append(record)
    return records


def _reframe(path, records):
    """Writes records with fresh CRCs (as a tool that re-frames a damaged record would)."""
    from apache_beam.io.tfrecordio import _TFRecordUtil

    with open(path, "wb") as fh:
        for record in records:
            _TFRecordUtil.write_record(fh, record)


def _verify_fails(copy, *needles):
    result = run_cli("inspect", str(copy), "--verify")
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_verify_checks_the_image_bytes_against_their_sha256(dataset, tmp_path, tf):
    """A byte flipped inside a JPEG's scan data, the frame's CRCs made right again: the record parses and
    decodes at its recorded shape (so only the sha256 check can tell), and verify names shard and record."""
    from beam_pipeline.examples import parse_example

    copy, info = _copy(dataset, tmp_path)
    for shard in (s["file"] for split in info["splits"].values() for s in split["shards"]):
        records = _frames(copy / shard)
        k = next((k for k, r in enumerate(records) if parse_example(r)["image/format"] == [b"jpeg"]), None)
        if k is not None:
            break
    ex = parse_example(records[k])
    image = ex["image/encoded"][0]
    start = records[k].index(image)
    at = start + len(image) - 40  # inside the entropy-coded data, well before EOI
    assert image[len(image) - 40] not in (0x00, 0xFE, 0xFF)
    damaged = bytearray(records[k])
    damaged[at] ^= 0x01
    records[k] = bytes(damaged)
    _reframe(copy / shard, records)
    decoded = tf.io.decode_image(parse_example(records[k])["image/encoded"][0], expand_animations=False)
    assert tuple(decoded.shape) == (ex["image/height"][0], ex["image/width"][0], ex["image/channels"][0])
    _verify_fails(copy, f"{shard} record {k}", "sha256")


def _index_lines(copy):
    return [json.loads(line) for line in (copy / "index.jsonl").read_text().splitlines()]


def _write_index(copy, entries):
    (copy / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))


@pytest.mark.parametrize("damage", ["offset", "length", "sha256", "label_id", "dropped", "twice", "foreign", "order"])
def test_verify_checks_index_jsonl_against_the_shards(dataset, tmp_path, damage):
    """Each line must name its record exactly (offset, length, sha256, label id), one line per record."""
    copy, info = _copy(dataset, tmp_path)
    entries = _index_lines(copy)
    shard = info["splits"]["train"]["shards"][1]["file"]
    at = next(i for i, e in enumerate(entries) if e["shard"] == shard and e["record"] == 1)
    entry = entries[at]
    if damage == "offset":
        entry["offset"] += 1
    elif damage == "length":
        entry["length"] -= 1
    elif damage == "sha256":
        entry["sha256"] = ("0" if entry["sha256"][0] != "0" else "1") + entry["sha256"][1:]
    elif damage == "label_id":
        entry["label_id"] = (entry["label_id"] + 1) % 3
    elif damage == "dropped":
        del entries[at]
    elif damage == "twice":
        entries.insert(at, dict(entry))
    elif damage == "foreign":
        entries.append({**entry, "shard": "other-train.tfrecord-00000-of-00001"})
    else:  # the shard's lines moved behind the next shard's
        mine = [e for e in entries if e["shard"] == shard]
        rest = [e for e in entries if e["shard"] != shard]
        after = max(i for i, e in enumerate(rest) if e["shard"] == info["splits"]["train"]["shards"][2]["file"])
        entries = rest[: after + 1] + mine + rest[after + 1 :]
    _write_index(copy, entries)
    line = _verify_fails(copy, "index.jsonl")
    if damage == "foreign":
        assert "other-train.tfrecord-00000-of-00001" in line
    elif damage == "order":
        assert shard in line
    else:
        assert f"{shard} record 1" in line
        if damage not in ("dropped", "twice"):
            assert damage in line


def test_verify_finds_a_missing_index(dataset, tmp_path):
    copy, _ = _copy(dataset, tmp_path)
    (copy / "index.jsonl").unlink()
    _verify_fails(copy, "index.jsonl", "missing")


def test_verify_finds_a_shard_file_dataset_json_does_not_list(dataset, tmp_path):
    copy, _ = _copy(dataset, tmp_path)
    shard = next(copy.glob("*.tfrecord-00000-of-*"))
    stray = shard.name.replace("-00000-of-", "-00007-of-")
    shutil.copy(shard, copy / stray)
    _verify_fails(copy, stray, "does not list")


@pytest.mark.parametrize("n,cols,rows", [(10, 4, 3), (9, 3, 3), (64, 6, 5)])
def test_contact_sheet_has_one_tile_per_example(dataset, tmp_path, n, cols, rows):
    sheet = tmp_path / "sheet.png"
    result = run_cli("inspect", str(dataset), "--contact-sheet", str(sheet), "--n", str(n))
    assert result.returncode == 0, result.stderr
    shown = min(n, 30)
    img = Image.open(sheet)
    assert img.format == "PNG" and img.size == (cols * 128, rows * 144)
    pixels = np.asarray(img.convert("L"))
    tiles = [pixels[r * 144 : r * 144 + 128, c * 128 : (c + 1) * 128] for r in range(rows) for c in range(cols)]
    drawn = [t.min() < 250 for t in tiles]
    assert sum(drawn) == shown and drawn == [True] * shown + [False] * (len(tiles) - shown)


def test_inspect_of_a_folder_that_is_not_a_dataset(tmp_path):
    result = run_cli("inspect", str(tmp_path))
    assert result.returncode == 2 and "dataset.json" in result.stderr


def test_plan_lists_and_plans_without_writing(tmp_path):
    root = tmp_path / "in"
    for i in range(12):
        write(str(root / ["cat", "dog"][i % 2] / f"{i}.png"), image_bytes("png", 40, 40, seed=i))
    write(str(root / "loose.png"), image_bytes("png"))
    write(str(root / "cat" / "notes.txt"), b"x")
    out = tmp_path / "never"
    result = run_cli("plan", "--input", str(root), "--output", str(out), "--target-shard-mb", "0.01",
                     "--split-ratios", "train=0.5,test=0.5")  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "train" in text and "test" in text and "no pixels read" in text
    assert "never-train.tfrecord-00000-of-" in text
    assert "no_label 1" in text and "not_an_image_extension 1" in text
    import re

    counted = sum(int(n) for n in re.findall(r"(?:cat|dog) (\d+)", text))
    assert counted == 12  # every labelled image, over both splits
    assert not out.exists()


def test_verify_of_one_split_passes_over_the_others_index_lines(dataset):
    """index.jsonl holds every split's lines in shard order: verifying the second split passes over the first's."""
    info = load_info(dataset)
    second = list(info["splits"])[1]  # the first split's lines come before its own
    result = run_cli("inspect", str(dataset), "--verify", "--split", second)
    assert result.returncode == 0, result.stderr
    assert f"verified {info['splits'][second]['examples']} records" in result.stdout


def test_a_reader_that_goes_away_is_no_error(dataset):
    """``inspect OUT | head -1``: the pipe closes before the summary is written; no error line, exit 0."""
    import os
    import subprocess
    import sys

    from .conftest import REPO

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-m", "beam_pipeline", "inspect", str(dataset)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.unit
def test_a_contact_sheet_draws_its_records_without_a_list_of_every_record(monkeypatch):
    """sample() used to build one (shard, i) pair per record to draw 64: ~1 GB for 10 M records before
    anything was read. It draws numbers from the records' range and finds each one's shard (same picks)."""
    import random
    import tracemalloc

    from beam_pipeline import contact_sheet

    shards = [{"file": f"d-train.tfrecord-{i:05d}-of-00020", "records": 500_000} for i in range(20)]
    info = DatasetInfo.from_json({"splits": {"train": {"shards": shards}}})
    asked: dict[str, set[int]] = {}
    monkeypatch.setattr(contact_sheet, "_read_at", lambda path, wanted: asked.setdefault(path, set(wanted)) and {})
    tracemalloc.start()
    try:
        contact_sheet.sample("out", info, 64, 7, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, peak
    drawn = random.Random(7).sample(range(10_000_000), 64)
    want: dict[str, set[int]] = {}
    for number in drawn:
        want.setdefault(f"out/{shards[number // 500_000]['file']}", set()).add(number % 500_000)
    assert asked == want


def test_an_output_whose_every_image_was_rejected_says_so(tmp_path):
    """A run that converted no image leaves dataset.json without _SUCCESS; inspect says why, as for too many rejects."""
    (tmp_path / "in" / "cat").mkdir(parents=True)
    (tmp_path / "in" / "cat" / "a.jpg").write_bytes(b"not a JPEG")
    out = tmp_path / "out"
    result = run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(out), "--no-transform")
    assert result.returncode == 3, result.stderr
    shown = run_cli("inspect", str(out))
    assert "INCOMPLETE: no _SUCCESS (no image converted)" in shown.stdout, shown.stdout


def test_the_tile_size_enlarges_each_tile_and_is_bounded(dataset, tmp_path, capsys):
    from beam_pipeline.cli import main

    sheet = tmp_path / "big.png"
    assert main(["inspect", str(dataset), "--contact-sheet", str(sheet), "--n", "4", "--tile-size", "300"]) == 0
    assert Image.open(sheet).size == (2 * 300, 2 * (300 + 16))
    capsys.readouterr()
    for size in ("16", "5000"):
        assert main(["inspect", str(dataset), "--contact-sheet", str(sheet), "--tile-size", size]) == 2
        assert capsys.readouterr().err.strip() == "error: --tile-size must be 32 to 1024 pixels"


@pytest.mark.unit
def test_inspect_shows_a_nights_change_notes_as_the_summary_does(tmp_path):
    from beam_pipeline import inspection
    from beam_pipeline.run import changes as ch

    changes = {
        "share": 0.2,
        "classes_added": ["owls"],
        "classes_removed": ["bats"],
        "classes_moved": {"cats": {"before": 10, "now": 4}},
        "reject_rate": {"before": 0.0, "now": 0.1},
        "rejects_by_reason": {},
    }
    changes["notes"] = ch.notes(changes)
    info = DatasetInfo.from_json({"name": "x", "incremental": {"from": "/data/monday"}, "changes": changes})
    text = inspection.summary(str(tmp_path), info)
    block = text[text.index("since the previous night:") :].splitlines()
    assert block[1 : 1 + len(changes["notes"])] == [f"  {note}" for note in changes["notes"]]
    assert "  class cats: 10 -> 4 images (-60%)" in block
    quiet = inspection.summary(str(tmp_path), info.with_(changes={**changes, "notes": []}))
    assert "since the previous night:\n  nothing moved past --change-share 0.2" in quiet
    assert "since the previous night" not in inspection.summary(str(tmp_path), info.with_(changes=None))
