"""inspect: summary, --verify and --contact-sheet on a converted dataset."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from .conftest import convert, load_info, run_cli
from .imagegen import image_bytes, write


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    base = tmp_path_factory.mktemp("inspect")
    for i in range(30):
        label = ["cat", "dog", "owl"][i % 3]
        write(str(base / "in" / label / f"{i}.png"), image_bytes("png", 30 + i, 40, seed=i))
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
