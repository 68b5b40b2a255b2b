"""The perceptual hash (images/phash.py) and the near-duplicate join (near_duplicates.py), without the CLI.

Hash: a copy of an image made by re-encoding, resizing, a small crop, a brightness shift, PNG<->JPEG or an
EXIF rotation stays within the default distance; unrelated images stay far outside it. Join: what it
reports equals a brute-force comparison for every pair the bands guarantee, never holds a pair farther
than the threshold, and writes the same bytes whatever the input order.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import shutil

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from PIL import Image, ImageEnhance

from beam_pipeline import near_duplicates as nd
from beam_pipeline.images.convert import prepare_image
from beam_pipeline.images.options import ImageOptions, check_scale
from beam_pipeline.images.phash import distance
from beam_pipeline.summary import _near_duplicate_lines
from beam_pipeline.vocab.dataset_info import DatasetInfo
from beam_pipeline.vocab.records import ShardResult

from .imagegen import encode, photo_like

pytestmark = pytest.mark.unit

LIMIT = nd.DEFAULT_DISTANCE


def phash(data: bytes, **options: object) -> str:
    hashed = prepare_image(data, ImageOptions(**options)).phash
    assert hashed is not None and len(hashed) == 16
    return hashed


def copies(img: Image.Image) -> dict[str, bytes]:
    """Near-duplicates of ``img`` as a dataset meets them."""
    w, h = img.size
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned a quarter left: a viewer turns it back upright
    dx, dy = w // 40, h // 40  # 2.5 % off each side: 5 % of each dimension
    return {
        "jpeg q60": encode(img, "JPEG", quality=60),
        "png": encode(img, "PNG"),
        "webp": encode(img, "WEBP", quality=80),
        "half size": encode(img.resize((w // 2, h // 2), Image.Resampling.LANCZOS), "JPEG", quality=90),
        "double size png": encode(img.resize((w * 2, h * 2), Image.Resampling.BICUBIC), "PNG"),
        "cropped 5 %": encode(img.crop((dx, dy, w - dx, h - dy)), "JPEG", quality=90),
        "brighter 10 %": encode(ImageEnhance.Brightness(img).enhance(1.1), "JPEG", quality=90),
        "darker 10 %": encode(ImageEnhance.Brightness(img).enhance(0.9), "JPEG", quality=90),
        "exif rotated": encode(img.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=90, exif=exif.tobytes()),
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_copies_of_an_image_hash_within_the_default_distance(seed):
    img = photo_like(seed)
    original = phash(encode(img, "JPEG", quality=90))
    far = {name: distance(original, phash(data)) for name, data in copies(img).items()}
    assert all(d <= LIMIT for d in far.values()), far
    # not by chance: the same picture through a different decode path is almost the same hash
    assert far["png"] <= 2 and far["jpeg q60"] <= 2 and far["exif rotated"] <= 2, far


def test_unrelated_images_hash_far_apart():
    hashes = [phash(encode(photo_like(100 + i), "JPEG", quality=90)) for i in range(12)]
    closest = min(distance(a, b) for a, b in itertools.combinations(hashes, 2))
    assert closest > LIMIT + 4


def test_the_hash_does_not_depend_on_the_runs_pixel_options():
    """Rotating, resizing or re-encoding the record changes what is stored, not the source's hash."""
    data = copies(photo_like(5))["exif rotated"]
    plain = phash(data)
    assert phash(data, apply_exif_orientation=True) == plain
    assert phash(data, resize_max_side=64, reencode_quality=70) == plain


@pytest.mark.parametrize(
    "mode",
    ["L", "LA", "RGBA", "P", "I;16"],
)
def test_every_mode_hashes_like_its_rgb_picture(mode):
    img = photo_like(7, 128, 96)
    if mode == "I;16":
        grey = img.convert("L")
        import numpy as np

        other = Image.fromarray(np.asarray(grey).astype(np.uint16) * 257)
        reference = grey
    else:
        other = img.convert(mode)
        reference = img.convert("L") if mode in ("L", "LA") else img
    assert distance(phash(encode(reference, "PNG")), phash(encode(other, "PNG"))) <= 4


def test_a_small_jpeg_is_checked_at_a_scale_that_leaves_the_hash_its_pixels():
    assert check_scale(640, 480) == 8
    assert check_scale(255, 480) == 4
    assert check_scale(100, 100) == 2
    assert check_scale(40, 400) == 1
    small = photo_like(9, 120, 90)
    assert distance(phash(encode(small, "JPEG", quality=92)), phash(encode(small, "PNG"))) <= 2


def test_off_makes_no_hash():
    assert prepare_image(encode(photo_like(1, 64, 64), "PNG"), ImageOptions(perceptual_hash=False)).phash is None


# ---- the join ------------------------------------------------------------------------------------------


def test_the_bands_are_fixed():
    assert nd.MASKS == nd.band_masks()
    assert len(nd.MASKS) == nd.BANDS and all(m.bit_count() == nd.BAND_BITS for m in nd.MASKS)
    assert len(set(nd.MASKS)) == nd.BANDS


def test_split_keys_put_train_first():
    assert nd.split_key("test", "train") == "train/test"
    assert nd.split_key("validation", "train") == "train/validation"
    assert nd.split_key("test", "validation") == "validation/test"
    assert nd.split_key("extra", "train") == "train/extra"
    assert nd.split_key("test", "test") == "test"


def chunk(values) -> bytes:
    return np.array(values, dtype=np.uint64).tobytes()


def test_a_crowded_bucket_is_counted_not_compared(monkeypatch):
    monkeypatch.setattr(nd, "BUCKET_CAP", 5)
    mask = nd.MASKS[0]
    crowd = [(i << 40 | i) & ~mask for i in range(1, 7)]  # 6 hashes, all 0 in band 0's bits
    out = list(nd.CompareBucket(64).process(((0, 0), [chunk(crowd[:4]), chunk(crowd[4:])])))
    assert [o.tag for o in out] == ["crowded"]
    # a and b share band 0's value and are 1 bit apart; c differs in a bit of the band
    free = next(b for b in range(64) if not mask >> b & 1)
    inside = next(b for b in range(64) if mask >> b & 1)
    a, b, c = 0, 1 << free, 1 << inside
    assert sorted(nd.CompareBucket(2).process(((0, 0), [chunk([a, c]), chunk([b])]))) == [(a, b, 1)]


def test_band_batches_put_every_hash_under_each_band_once():
    fn = nd.BandBatches()
    fn.start_bundle()
    values = [random.Random(i).getrandbits(64) for i in range(50)]
    out = [kv for v in values for kv in fn.process((f"{v:016x}", []))]
    out += [w.value for w in fn.finish_bundle()]
    for band, mask in enumerate(nd.MASKS):
        mine = [(coarse, v) for (b, coarse), data in out if b == band for v in np.frombuffer(data, np.uint64).tolist()]
        assert sorted(v for _, v in mine) == sorted(values)
        assert all(int(nd.coarse_of(np.uint64(v & mask))) == coarse for coarse, v in mine)
    every = {(b, coarse) for (b, coarse), _ in out}
    assert len({c for _, c in every}) == 2**nd.COARSE_BITS  # the groups are used whichever bits a band holds


def test_the_numpy_and_the_python_comparisons_agree():
    rng = random.Random(4)
    values = sorted({rng.getrandbits(64) & 0xFFFF_0000_0000_00FF for _ in range(200)})
    assert len(values) >= 64  # the numpy path
    brute = [(a, b, (a ^ b).bit_count()) for a, b in itertools.combinations(values, 2) if (a ^ b).bit_count() <= 5]
    assert list(nd._close_pairs(values, 5)) == brute


def test_parts_merge_into_one_sorted_file(tmp_path):
    parts = []
    lines = [
        {"a": "b.jpg", "b": "c.jpg", "split_a": "train", "split_b": "test", "distance": 3},
        {"group": ["a0.png", "a1.png"], "images": 101, "splits": {"train": 101}, "distance": 0},
        {"a": "a0.png", "b": "z.png", "split_a": "train", "split_b": "train", "distance": 1},
        {"a": "c.jpg", "b": "d.jpg", "split_a": "test", "split_b": "test", "distance": 0},
    ]
    for i, chunk in enumerate((lines[:2], lines[2:])):
        part = tmp_path / f"part-{i}.jsonl"
        part.write_text("".join(json.dumps(x) + "\n" for x in sorted(chunk, key=nd.line_key)))
        parts.append(str(part))
    nd.merge_parts(parts, str(tmp_path / "out.jsonl"))
    got = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [nd.line_key(x) for x in got] == sorted(nd.line_key(x) for x in lines)


def test_the_summary_line_names_the_leaks_first():
    block = nd.summary_block(
        10,
        {"pairs": {"train": 5, "train/test": 2, "train/validation": 1}, "groups": {"train": 1}},
        hashed=100,
        unhashed=0,
        crowded=0,
    )
    info = DatasetInfo.from_json({"name": "x", "near_duplicates": block})
    (line,) = _near_duplicate_lines(info)
    assert "8 pairs, 3 across splits (train/test 2, train/validation 1), 1 crowds" in line
    assert line.endswith("-> near_duplicates.jsonl")


# ---- the join as a pipeline ---------------------------------------------------------------------------


def planted_hashes(seed: int) -> list[tuple[str, str, str]]:
    """(path, split, hash): 300 unrelated hashes, copies of some at 0-12 bits, 120 copies of one hash."""
    rng = random.Random(seed)
    splits = ("train", "validation", "test")
    rows = []
    for i in range(300):
        base = rng.getrandbits(64)
        rows.append((f"img{i:04d}.jpg", splits[i % 3], base))
        if i % 10 == 0:
            flipped = base
            for bit in rng.sample(range(64), i // 10 % 13):  # 0 to 12 bits off
                flipped ^= 1 << bit
            rows.append((f"img{i:04d}_copy.jpg", splits[(i + 1) % 3], flipped))
    blank = rng.getrandbits(64)
    rows += [(f"blank/{i:03d}.png", splits[i % 2], blank) for i in range(120)]
    return [(path, split, f"{value:016x}") for path, split, value in rows]


def write_index_parts(folder, rows, shards: int) -> list[ShardResult]:
    results = []
    for shard in range(shards):
        part = folder / f"part-{shard}.jsonl"
        mine = rows[shard::shards]
        part.write_text("".join(json.dumps({"path": p, "split": s, "phash": h}) + "\n" for p, s, h in mine))
        results.append(ShardResult("train", shard, f"/x/{shard}", len(mine), 1, index_path=str(part)))
    return results


def run_join(tmp_path, rows, shards: int, name: str) -> tuple[list[dict], dict]:
    folder = tmp_path / name
    folder.mkdir()
    results = write_index_parts(folder, rows, shards)
    summary_path = folder / "summary.json"
    with beam.Pipeline(runner=FnApiRunner()) as p:
        found = p | beam.Create(results) | nd.FindNearDuplicates(str(folder / "staging"), LIMIT)
        _ = found["summary"] | beam.Map(lambda s: summary_path.write_text(json.dumps(s)))
        parts = found["parts"] | beam.combiners.ToList()
        _ = parts | beam.Map(lambda ps: nd.merge_parts(ps, str(folder / "near.jsonl")))
    text = (folder / "near.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()], json.loads(summary_path.read_text())


@pytest.mark.pipeline
def test_the_join_finds_what_brute_force_finds_and_is_the_same_in_any_order(tmp_path):
    rows = planted_hashes(1)
    got, summary = run_join(tmp_path, rows, 4, "first")
    shuffled = list(rows)
    random.Random(2).shuffle(shuffled)
    again, summary_again = run_join(tmp_path, shuffled, 7, "second")
    assert (tmp_path / "first" / "near.jsonl").read_bytes() == (tmp_path / "second" / "near.jsonl").read_bytes()
    assert summary == summary_again

    (group,) = [line for line in got if "group" in line]
    assert group["images"] == 120 and group["splits"] == {"train": 60, "validation": 60}
    assert group["group"] == [f"blank/{i:03d}.png" for i in range(nd.GROUP_SIZE)]
    pairs = {(line["a"], line["b"]): line["distance"] for line in got if "a" in line}
    assert not any(a.startswith("blank/") for a, _ in pairs)

    singles = [r for r in rows if not r[0].startswith("blank/")]
    brute = {}
    for (pa, _, ha), (pb, _, hb) in itertools.combinations(singles, 2):
        d = distance(ha, hb)
        if d <= LIMIT:
            brute[tuple(sorted((pa, pb)))] = d
    assert set(pairs) <= set(brute) and all(pairs[k] == brute[k] for k in pairs)
    assert {k for k, d in brute.items() if d <= 6} <= set(pairs)  # found with probability > 0.9999
    assert len(pairs) >= 0.85 * len(brute)
    assert [nd.line_key(x) for x in got] == sorted(nd.line_key(x) for x in got)
    assert summary["pairs"] == dict(
        sorted(
            {
                key: sum(1 for line in got if "a" in line and nd.split_key(line["split_a"], line["split_b"]) == key)
                for key in {nd.split_key(line["split_a"], line["split_b"]) for line in got if "a" in line}
            }.items(),
            key=lambda kv: nd._key_rank(kv[0]),
        )
    )
    assert summary["groups"] == {"train+validation": 1}
    assert summary["images_hashed"] == len(rows) and summary["images_unhashed"] == 0


# ---- through convert ----------------------------------------------------------------------------------


def leaky_folder(root) -> dict[str, str]:
    """Two classes of photo-like images, copies of some beside them; returns {copy: original}."""
    copied = {}
    for i in range(24):
        label = ("cats", "dogs")[i % 2]
        img = photo_like(200 + i, 160, 120)
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / f"p{i:02d}.jpg").write_bytes(encode(img, "JPEG", quality=90))
        if i % 4 == 0:
            kind = ("png", "half size", "brighter 10 %", "exif rotated")[i // 4 % 4]
            suffix = "png" if kind == "png" else "jpg"
            (root / label / f"p{i:02d}_copy.{suffix}").write_bytes(copies(img)[kind])
            copied[f"{label}/p{i:02d}_copy.{suffix}"] = f"{label}/p{i:02d}.jpg"
    return copied


QUICK = ("--no-transform", "--no-tfds-metadata", "--split-ratios", "train=0.5,validation=0.25,test=0.25")


@pytest.mark.e2e
def test_convert_lists_every_copy_and_counts_the_leaks(tmp_path):
    from .conftest import run_cli

    copied = leaky_folder(tmp_path / "in")
    out = tmp_path / "out"
    r = run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(out), *QUICK)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (out / "near_duplicates.jsonl").read_text().splitlines()]
    pairs = {(x["a"], x["b"]) for x in lines}
    assert {tuple(sorted(kv)) for kv in copied.items()} == pairs  # every copy, nothing else
    index = {e["path"]: e for e in map(json.loads, (out / "index.jsonl").read_text().splitlines())}
    assert all(len(e["phash"]) == 16 for e in index.values())
    for x in lines:
        assert (x["split_a"], x["split_b"]) == (index[x["a"]]["split"], index[x["b"]]["split"])
        assert x["distance"] == distance(index[x["a"]]["phash"], index[x["b"]]["phash"]) <= LIMIT
    info = json.loads((out / "dataset.json").read_text())
    block = info["near_duplicates"]
    assert block["hash"] == "phash-64" and block["max_distance"] == LIMIT and block["images_hashed"] == len(index)
    across = [x for x in lines if x["split_a"] != x["split_b"]]
    assert block["across_splits"] == len(across) == sum(n for k, n in block["pairs"].items() if "/" in k)
    assert sum(block["pairs"].values()) == len(lines)
    sizes = info["image_sizes"]["shorter_side"]
    assert sum(sizes.values()) == len(index) and set(sizes) <= {"<64", "64-127", "128-255"}
    assert all(isinstance(e["width"], int) and isinstance(e["height"], int) for e in index.values())
    assert "near-dups" in r.stdout and f"{len(lines)} pairs" in r.stdout
    shown = run_cli("inspect", str(out)).stdout
    assert f"near-duplicates: {len(lines)} pairs, {len(across)} across splits" in shown

    # the same bytes from another runner mode (other bundles, other orders)
    again = tmp_path / "again"
    r = run_cli(
        "convert", "--input", str(tmp_path / "in"), "--output", str(again), *QUICK,
        "--direct_running_mode", "multi_threading", "--direct_num_workers", "3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (again / "near_duplicates.jsonl").read_bytes() == (out / "near_duplicates.jsonl").read_bytes()


@pytest.mark.e2e
def test_off_hashes_nothing_and_writes_no_file(tmp_path):
    from .conftest import run_cli

    leaky_folder(tmp_path / "in")
    out = tmp_path / "out"
    r = run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(out), *QUICK, "--near-duplicates", "off")
    assert r.returncode == 0, r.stderr
    assert not (out / "near_duplicates.jsonl").exists()
    assert "near_duplicates" not in json.loads((out / "dataset.json").read_text())
    assert all("phash" not in json.loads(x) for x in (out / "index.jsonl").read_text().splitlines())
    assert "near-dups" not in r.stdout


@pytest.mark.e2e
def test_a_night_finds_a_new_copy_of_an_earlier_image_without_decoding_it_again(tmp_path):
    from .conftest import run_cli

    leaky_folder(tmp_path / "in")
    first = tmp_path / "night1"
    assert run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(first), *QUICK).returncode == 0
    # tonight: one new file, a copy of an image the first night converted
    original = photo_like(200 + 5, 160, 120)
    (tmp_path / "in" / "dogs" / "p05_tonight.png").write_bytes(encode(original, "PNG"))
    second = tmp_path / "night2"
    r = run_cli(
        "convert", "--input", str(tmp_path / "in"), "--output", str(second), *QUICK,
        "--incremental-from", str(first),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    info = json.loads((second / "dataset.json").read_text())
    assert info["incremental"]["converted"] == 1  # the others were reused: their hashes came from the index
    pairs = {(x["a"], x["b"]) for x in map(json.loads, (second / "near_duplicates.jsonl").read_text().splitlines())}
    assert ("dogs/p05.jpg", "dogs/p05_tonight.png") in pairs
    before = (first / "near_duplicates.jsonl").read_text().splitlines()
    assert len(pairs) == len(before) + 1


def test_a_wrong_distance_is_one_line(tmp_path):
    from .conftest import run_cli

    r = run_cli("convert", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--near-duplicate-distance", "16")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--near-duplicate-distance must be 0 to 12" in r.stderr


def test_a_damaged_hash_in_an_index_is_no_hash():
    from beam_pipeline.images.phash import valid_hash

    assert valid_hash("0123456789abcdef") == "0123456789abcdef"
    assert [valid_hash(v) for v in ("zz", "0123456789ABCDEF", "123", 5, None)] == [""] * 5


def test_bits_are_counted_alike_with_and_without_numpy_2(monkeypatch):
    values = np.array([0, 1, 3, 2**64 - 1, 12345678901234567, 2**63], dtype=np.uint64)
    want = [int(v).bit_count() for v in values.tolist()]
    assert nd._bit_counts(values).tolist() == want
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert nd._bit_counts(values).tolist() == want


# ---- drop-leaks -------------------------------------------------------------------------------------


def shard_bytes(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("x-*.tfrecord-*"))}


@pytest.mark.e2e
@pytest.mark.smoke
def test_drop_leaks_rejects_the_copies_in_other_splits_and_writes_what_a_run_without_them_writes(tmp_path):
    from .conftest import run_cli

    src = tmp_path / "in"
    leaky_folder(src)
    leaky = tmp_path / "leaky"
    # no allowance for bad input: the leaks must not count as such
    flags = (*QUICK, "--name", "x", "--reject-allowance", "0", "--max-reject-fraction", "0.01")
    r = run_cli("convert", "--input", str(src), "--output", str(leaky), *flags, "--near-duplicates", "drop-leaks")
    assert r.returncode == 0, r.stderr
    rejects = [json.loads(x) for x in (leaky / "rejects.jsonl").read_text().splitlines()]
    leaks = {x["path"]: x for x in rejects if x["reason"] == "near_duplicate_leak"}
    assert leaks, "the folder has copies across splits"
    index = [json.loads(x) for x in (leaky / "index.jsonl").read_text().splitlines()]
    assert not set(leaks) & {e["path"] for e in index}
    for line in map(json.loads, (leaky / "near_duplicates.jsonl").read_text().splitlines()):
        assert "train" not in {line["split_a"], line["split_b"]} or line["split_a"] == line["split_b"]
    for row in leaks.values():
        assert row["detail"].startswith("near-duplicate of ") and "(train)" in row["detail"], row

    # the same input without the leaked files, converted plainly: the same shards, byte for byte
    clean_src = tmp_path / "clean-in"
    shutil.copytree(src, clean_src)
    for path in leaks:
        (clean_src / path).unlink()
    clean = tmp_path / "clean"
    r = run_cli("convert", "--input", str(clean_src), "--output", str(clean), *flags)
    assert r.returncode == 0, r.stderr
    assert shard_bytes(clean) == shard_bytes(leaky) and shard_bytes(leaky)
    assert (clean / "index.jsonl").read_text() == (leaky / "index.jsonl").read_text()

    # whatever the order the engine runs things in
    again = tmp_path / "again"
    r = run_cli(
        "convert", "--input", str(src), "--output", str(again), *flags, "--near-duplicates", "drop-leaks",
        "--direct_running_mode", "multi_threading", "--direct_num_workers", "3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert shard_bytes(again) == shard_bytes(leaky)
    assert (again / "rejects.jsonl").read_bytes() == (leaky / "rejects.jsonl").read_bytes()


@pytest.mark.e2e
def test_too_many_rejects_counts_and_names_only_what_counts(tmp_path):
    """Leaks dropped on request are not bad input: the one line that stops a run says how many bad inputs
    there are and sets the leaks aside."""
    from .conftest import run_cli

    src = tmp_path / "in"
    leaky_folder(src)
    (src / "cats" / "broken.jpg").write_bytes(b"not an image")
    flags = (*QUICK, "--reject-allowance", "0", "--max-reject-fraction", "0.01", "--near-duplicates", "drop-leaks")
    r = run_cli("convert", "--input", str(src), "--output", str(tmp_path / "out"), *flags)
    assert r.returncode == 3
    info = json.loads((tmp_path / "out" / "dataset.json").read_text())
    leaks = info["rejects"]["by_reason"]["near_duplicate_leak"]
    assert leaks and f"; {leaks} near-duplicate leaks dropped on request are not counted)" in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: 1 of {info['examples'] + 1} inputs rejected (not_an_image 1; "), r.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("point", ["writer.result:1:kill", "near_duplicates.write:1:kill"])
def test_drop_leaks_killed_half_way_resumes_to_the_same_bytes(tmp_path, monkeypatch, point):
    from .conftest import run_cli

    src = tmp_path / "in"
    leaky_folder(src)
    flags = (*QUICK, "--name", "x", "--near-duplicates", "drop-leaks")
    whole = tmp_path / "whole"
    assert run_cli("convert", "--input", str(src), "--output", str(whole), *flags).returncode == 0
    out = tmp_path / "out"
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", point)
    assert run_cli("convert", "--input", str(src), "--output", str(out), *flags).returncode != 0
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    assert not (out / "_SUCCESS").exists()
    r = run_cli("convert", "--input", str(src), "--output", str(out), *flags)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "dataset.json").read_text())["resumed"]["shards"] >= 1  # the shards were kept
    assert shard_bytes(out) == shard_bytes(whole)
    for name in ("index.jsonl", "rejects.jsonl", "near_duplicates.jsonl"):
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name


def test_a_leak_is_the_non_train_side_and_a_crowd_with_train_images_leaks_its_others():
    from beam_pipeline import leaks

    pair = {"a": "x.jpg", "b": "y.jpg", "split_a": "test", "split_b": "train", "distance": 3}
    assert list(leaks.leaks_of(pair)) == [("x.jpg", (3, "y.jpg", "near-duplicate of y.jpg (train), 3 bits apart"))]
    assert list(leaks.leaks_of({**pair, "split_b": "validation"})) == []  # no train image: no leak
    assert list(leaks.leaks_of({**pair, "split_a": "train"})) == []
    crowds = {"ff": {"test": 2, "train": 150}}
    assert [p for p, _ in leaks.crowd_leaks(("ff", ("t.png", "test")), crowds)] == ["t.png"]
    assert list(leaks.crowd_leaks(("ff", ("r.png", "train")), crowds)) == []
    assert list(leaks.crowd_leaks(("ee", ("t.png", "test")), crowds)) == []


def test_an_unchanged_file_of_a_night_keeps_its_hash_unread(tmp_path):
    from beam_pipeline import index, leaks
    from beam_pipeline.vocab.refs import Ref

    previous = index.Previous("shard", 0, 1, "sha", None, None, "", None, "0123456789abcdef")
    ref = Ref(str(tmp_path / "gone.jpg"), "gone.jpg", 1, "test", None, 0, previous=previous)
    reuse = leaks.HashRefFn(ImageOptions(), reuse=True)
    assert list(reuse.process(ref)) == [("0123456789abcdef", ("gone.jpg", "test"))]
    # the previous night's records may not be reused (other code): its hashes are not trusted either
    assert list(leaks.HashRefFn(ImageOptions(), reuse=False).process(ref)) == []  # gone: no hash
    unread = dataclasses.replace(ref, previous=None)
    assert list(reuse.process(unread)) == []  # gone: no hash (the writer rejects it)
    rejected = dataclasses.replace(ref, previous=index.PreviousReject("truncated", "cut"))
    assert list(reuse.process(rejected)) == []  # rejected again unread: never a record
