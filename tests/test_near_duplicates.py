"""The perceptual hash (images/phash.py) and the near-duplicate join (near_duplicates.py), without the CLI.

Hash: a copy of an image made by re-encoding, resizing, a small crop, a brightness shift, PNG<->JPEG or an
EXIF rotation stays within the default distance; unrelated images stay far outside it. Join: what it
reports equals a brute-force comparison for every pair the bands guarantee, never holds a pair farther
than the threshold, and writes the same bytes whatever the input order.
"""

from __future__ import annotations

import collections
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
    assert hashed is not None and len(hashed) == 48  # pHash, dHash, colour
    return hashed[:16]


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


def full_hash(data: bytes) -> str:
    hashed = prepare_image(data, ImageOptions()).phash
    assert hashed is not None
    return hashed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_second_measure_confirms_every_copy_and_refuses_a_recoloured_picture(seed):
    img = photo_like(seed)
    original = nd.key_of(full_hash(encode(img, "JPEG", quality=90)))
    for name, data in copies(img).items():
        assert confirmed(original, nd.key_of(full_hash(data)))[0], name
    # the same light and dark in other colours (blue and red chroma swapped): the hashes of the grey picture
    # agree, the colour does not
    y, cb, cr = img.convert("YCbCr").split()
    other = nd.key_of(full_hash(encode(Image.merge("YCbCr", (y, cr, cb)).convert("RGB"), "JPEG", quality=90)))
    assert distance(f"{original[0]:016x}", f"{other[0]:016x}") <= LIMIT
    assert not confirmed(original, other)[0]


def test_the_phash_is_imagehashs_of_the_same_small_picture():
    """images/phash.py computes imagehash.phash's bits itself (two small products instead of two full DCTs):
    the same bits on photo-like pictures, whose coefficients never tie with their median."""
    import imagehash

    from beam_pipeline.images.phash import _normalised

    for seed in range(20):
        img = photo_like(300 + seed, 96 + seed, 64 + 2 * seed)
        small, _ = _normalised(img)
        assert phash(encode(img, "PNG")) == str(imagehash.phash(small)), seed


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


def test_split_keys_put_train_first_and_a_group_keeps_its_first_split():
    assert nd.splits_key(["test", "train"]) == "train+test"
    assert nd.splits_key(["test", "validation", "test"]) == "validation+test"
    assert nd.splits_key(["extra", "train"]) == "train+extra"
    assert nd.first_split({"test": 1, "validation": 2}) == "validation"
    assert nd.first_split({"test": 1, "extra": 2}) == "test"


GREY = int.from_bytes(bytes([85]) * 8, "little")


def look(ph: int, dh: int = 0, col: int | None = None) -> tuple[int, int, int]:
    return ph, dh, GREY if col is None else col


def colour(*shares: int) -> int:
    """A colour field (8 bytes: red and green share of each quarter) from 8 shares."""
    return int.from_bytes(bytes(shares), "little")


def flip(value: int, bits: int, rng: random.Random) -> int:
    for bit in rng.sample(range(64), bits):
        value ^= 1 << bit
    return value


def confirmed(a, b, limit=LIMIT):
    keys = np.array([a, b], dtype=nd.KEY)
    kept, d, dd, dc, level = nd.confirm(nd.Looks(keys), np.array([0]), np.array([1]), limit)
    return bool(kept[0]), nd.LEVELS[int(level[0])]


def test_a_candidate_is_a_tie_only_when_the_second_measure_agrees():
    red = colour(120, 60, 120, 60, 120, 60, 120, 60)
    blue = colour(60, 70, 60, 70, 60, 70, 60, 70)
    base = 0x0123_4567_89AB_CDEF
    near = base ^ 0b111  # 3 bits
    at_limit = base ^ ((1 << LIMIT) - 1)  # 10 bits
    assert confirmed(look(base, 0, red), look(near, 0b11, red)) == (True, "sure")
    assert confirmed(look(base, 0, red), look(at_limit, 0b11, red)) == (True, "likely")
    # the pHash close, the picture's colours far apart (a circle and a square on other backgrounds)
    assert confirmed(look(base, 0, red), look(near, 0, blue))[0] is False
    # the pHash close, the dHash far: other shapes
    assert confirmed(look(base, 0, red), look(near, (1 << 20) - 1, red))[0] is False
    # grey and grey: the colour says nothing; grey and colour: only when both hashes are close
    assert confirmed(look(base), look(at_limit, 0b11)) == (True, "likely")
    assert confirmed(look(base), look(near, 0b11, red)) == (True, "likely")
    assert confirmed(look(base), look(at_limit, 0b11, red))[0] is False
    assert confirmed(look(base, 0, red), look(flip(base, LIMIT + 1, random.Random(1)), 0, red))[0] is False


def planted_looks(seed: int, scenes: int = 3, frames: int = 400) -> list[tuple[str, str, tuple[int, int, int]]]:
    """(path, split, look): 300 unrelated looks, copies of some 0-12 bits away, 120 images of one look, and
    ``scenes`` scenes of ``frames`` frames within a few bits of their scene (one large run of a band value)."""
    rng = random.Random(seed)
    splits = ("train", "validation", "test")
    rows = []
    for i in range(300):
        base = look(rng.getrandbits(64), rng.getrandbits(64), colour(*(rng.randrange(40, 130) for _ in range(8))))
        rows.append((f"img{i:04d}.jpg", splits[i % 3], base))
        if i % 10 == 0:
            copy = (flip(base[0], i // 10 % 13, rng), flip(base[1], i // 10 % 5, rng), base[2])
            rows.append((f"img{i:04d}_copy.jpg", splits[(i + 1) % 3], copy))
    blank = look(rng.getrandbits(64), rng.getrandbits(64))
    rows += [(f"blank/{i:03d}.png", splits[i % 2], blank) for i in range(120)]
    for s in range(scenes):
        scene = look(rng.getrandbits(64), rng.getrandbits(64))
        for f in range(frames):
            frame = (flip(scene[0], rng.randrange(3), rng), flip(scene[1], rng.randrange(3), rng), scene[2])
            rows.append((f"scene{s}/{f:04d}.jpg", splits[f % 3], frame))
    return [(path, split, f"{a:016x}{b:016x}{c:016x}") for path, split, (a, b, c) in rows]


def brute_groups(rows, limit=LIMIT) -> list[set[str]]:
    """Connected images of every confirmed pair, all pairs compared (and images of one look)."""
    looks = sorted({full for _, _, full in rows})
    keys = np.array([nd.key_of(f) for f in looks], dtype=nd.KEY)
    i, j = np.triu_indices(len(looks), 1)
    kept, *_ = nd.confirm(nd.Looks(keys), i, j, limit)
    parent = list(range(len(looks)))

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(i[kept].tolist(), j[kept].tolist(), strict=True):
        parent[root(a)] = root(b)
    at = {full: n for n, full in enumerate(looks)}
    groups: dict[int, set[str]] = {}
    for path, _, full in rows:
        groups.setdefault(root(at[full]), set()).add(path)
    return [g for g in groups.values() if len(g) > 1]


def test_the_search_groups_as_all_pairs_would_and_a_large_run_costs_linear_work(monkeypatch):
    rows = planted_looks(1)
    keys, counts = nd.AllLooks()._merged(
        [(np.array([nd.key_of(full)], dtype=nd.KEY), np.ones(1, np.int64)) for _, _, full in rows]
    )
    pairs_seen = []
    real = nd._run_pairs
    monkeypatch.setattr(nd, "_run_pairs", lambda *a: (out := real(*a), pairs_seen.append(len(out[0])))[0])
    index = nd.find_groups((keys, counts), LIMIT)
    assert max(pairs_seen) < 4 * len(keys)  # 1,200 frames of 3 scenes: never their 700,000 pairs
    assert index.large_runs > 0
    found: dict[int, set[str]] = {}
    groups = index.groups_of(np.array([nd.key_of(full) for _, _, full in rows], dtype=nd.KEY))
    for (path, _, _), group in zip(rows, groups.tolist(), strict=True):
        if group >= 0:
            found.setdefault(group, set()).add(path)
    want = brute_groups(rows)
    assert sorted(map(sorted, found.values())) == sorted(map(sorted, want))


def test_parts_merge_into_one_sorted_file_under_its_header(tmp_path):
    parts = []
    lines = [
        {"group": ["b.jpg", "c.jpg"], "images": 2, "splits": {"test": 1, "train": 1}},
        {"group": ["a0.png", "a1.png"], "images": 101, "splits": {"train": 101}},
        {"group": ["c0.jpg", "d.jpg"], "images": 2, "splits": {"test": 2}},
    ]
    for i, chunk in enumerate((lines[:2], lines[2:])):
        part = tmp_path / f"part-{i}.jsonl"
        part.write_text("".join(json.dumps(x) + "\n" for x in sorted(chunk, key=nd.line_key)))
        parts.append(str(part))
    nd.merge_parts(parts, str(tmp_path / "out.jsonl"), 7)
    header, *got = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert header == nd.header_line(7) and header["near_duplicates"] == nd.FORMAT
    assert [nd.line_key(x) for x in got] == sorted(nd.line_key(x) for x in lines)


def test_a_version_1_file_reads_as_groups():
    old = [
        {"a": "a.jpg", "b": "b.png", "split_a": "train", "split_b": "test", "distance": 3},
        {"group": ["z0.png", "z1.png"], "images": 150, "splits": {"train": 150}, "distance": 0},
    ]
    pair, crowd = nd.groups_of_file(old)
    assert pair["group"] == ["a.jpg", "b.png"] and pair["splits"] == {"test": 1, "train": 1}
    assert pair["ties"][0]["distance"] == 3 and crowd["images"] == 150
    assert list(nd.groups_of_file([nd.header_line(10)])) == []


def test_the_summary_line_names_the_groups_across_splits():
    block = nd.summary_block(
        10,
        {"groups": {"train": 5, "train+test": 2}, "images": 19, "confidence": {"sure": 6, "likely": 1},
         "across": 2, "leaking": 3},
        hashed=100,
        unhashed=0,
        large_runs=0,
    )  # fmt: skip
    info = DatasetInfo.from_json({"name": "x", "near_duplicates": block})
    (line,) = _near_duplicate_lines(info)
    assert "7 groups of 19 images, 2 across splits (3 images outside their group's first split)" in line
    assert "6 sure, 1 likely" in line and "[train+test 2]" in line
    assert line.endswith("-> near_duplicates.jsonl")
    old = {"pairs": {"train": 5, "train/test": 2}, "groups": {"train": 1}, "file": "near_duplicates.jsonl"}
    (line,) = _near_duplicate_lines(DatasetInfo.from_json({"name": "x", "near_duplicates": old}))
    assert "7 pairs, 2 across splits, 1 crowds" in line  # an older run's dataset.json


# ---- the join as a pipeline ---------------------------------------------------------------------------


def write_index_parts(folder, rows, shards: int) -> list[ShardResult]:
    results = []
    for shard in range(shards):
        part = folder / f"part-{shard}.jsonl"
        mine = rows[shard::shards]
        part.write_text(
            "".join(json.dumps({"path": p, "split": s, "phash": h[:16], "confirm": h[16:]}) + "\n" for p, s, h in mine)
        )
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
        _ = parts | beam.Map(lambda ps: nd.merge_parts(ps, str(folder / "near.jsonl"), LIMIT))
    text = (folder / "near.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()][1:], json.loads(summary_path.read_text())


@pytest.mark.pipeline
def test_the_join_lists_groups_as_all_pairs_would_the_same_in_any_order(tmp_path):
    rows = planted_looks(1, scenes=1, frames=150)
    got, summary = run_join(tmp_path, rows, 4, "first")
    shuffled = list(rows)
    random.Random(2).shuffle(shuffled)
    again, summary_again = run_join(tmp_path, shuffled, 7, "second")
    assert (tmp_path / "first" / "near.jsonl").read_bytes() == (tmp_path / "second" / "near.jsonl").read_bytes()
    assert summary == summary_again

    want = brute_groups(rows)
    assert len(got) == len(want)
    for line in got:
        (members,) = [g for g in want if line["group"][0] in g]
        assert line["images"] == len(members) and set(line["group"]) <= members
        assert len(line["group"]) == min(len(members), nd.GROUP_SIZE)
        assert len(line["ties"]) == len(line["group"]) - 1  # a tree over the listed images
        tied = {line["group"][0]}
        for tie in sorted(line["ties"], key=lambda t: t["a"]):
            assert tie["distance"] <= LIMIT and tie["dhash"] <= nd.DHASH_MAX
        for _ in line["ties"]:
            tied |= {t[k] for t in line["ties"] if {t["a"], t["b"]} & tied for k in ("a", "b")}
        assert tied == set(line["group"])  # the ties join every listed image
        assert line["confidence"] in nd.LEVELS
    blank = next(line for line in got if line["group"][0].startswith("blank/"))
    assert blank["images"] == 120 and blank["splits"] == {"train": 60, "validation": 60}
    assert blank["group"] == [f"blank/{i:03d}.png" for i in range(nd.GROUP_SIZE)] and blank["confidence"] == "exact"
    scene = next(line for line in got if line["group"][0].startswith("scene0/"))
    assert scene["images"] == 150 and len(scene["group"]) == nd.GROUP_SIZE
    assert [nd.line_key(x) for x in got] == sorted(nd.line_key(x) for x in got)
    assert summary["groups"] == dict(
        sorted(
            collections.Counter(nd.splits_key(line["splits"]) for line in got).items(),
            key=lambda kv: nd._key_rank(kv[0]),
        )
    )
    assert summary["images_in_groups"] == sum(len(g) for g in want)
    assert summary["across_splits"] == sum(len(line["splits"]) > 1 for line in got)
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
    header, *lines = [json.loads(x) for x in (out / "near_duplicates.jsonl").read_text().splitlines()]
    assert header == nd.header_line(LIMIT)
    groups = {tuple(x["group"]) for x in lines}
    assert {tuple(sorted(kv)) for kv in copied.items()} == groups  # every copy, nothing else
    index = {e["path"]: e for e in map(json.loads, (out / "index.jsonl").read_text().splitlines())}
    assert all(len(e["phash"]) == 16 and len(e["confirm"]) == 32 for e in index.values())
    for x in lines:
        assert x["splits"] == dict(collections.Counter(index[p]["split"] for p in x["group"]))
        (tie,) = x["ties"]
        assert tie["distance"] == distance(index[tie["a"]]["phash"], index[tie["b"]]["phash"]) <= LIMIT
    info = json.loads((out / "dataset.json").read_text())
    block = info["near_duplicates"]
    assert block["hash"] == "phash-64" and block["max_distance"] == LIMIT and block["images_hashed"] == len(index)
    assert block["format"] == nd.FORMAT and block["confirm"] == "dhash-64+colour-2x2"
    across = [x for x in lines if len(x["splits"]) > 1]
    assert block["across_splits"] == len(across) == sum(n for k, n in block["groups"].items() if "+" in k)
    assert sum(block["groups"].values()) == len(lines) and block["images_in_groups"] == 2 * len(lines)
    sizes = info["image_sizes"]["shorter_side"]
    assert sum(sizes.values()) == len(index) and set(sizes) <= {"<64", "64-127", "128-255"}
    assert all(isinstance(e["width"], int) and isinstance(e["height"], int) for e in index.values())
    assert "near-dups" in r.stdout and f"{len(lines)} groups of {2 * len(lines)} images" in r.stdout
    shown = run_cli("inspect", str(out)).stdout
    assert f"near-duplicates: {len(lines)} groups of {2 * len(lines)} images, {len(across)} across splits" in shown

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
    groups = {
        tuple(x["group"]) for x in map(json.loads, (second / "near_duplicates.jsonl").read_text().splitlines()[1:])
    }
    assert ("dogs/p05.jpg", "dogs/p05_tonight.png") in groups
    before = (first / "near_duplicates.jsonl").read_text().splitlines()[1:]
    assert len(groups) == len(before) + 1
    assert info["changes"]["near_duplicates_new"] == {"groups": 1, "across_splits": 1, "images": 2} or info["changes"][
        "near_duplicates_new"
    ] == {"groups": 1, "across_splits": 0, "images": 2}


def test_a_wrong_distance_is_one_line(tmp_path):
    from .conftest import run_cli

    r = run_cli("convert", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--near-duplicate-distance", "16")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--near-duplicate-distance must be 0 to 12" in r.stderr


def test_a_damaged_hash_in_an_index_is_no_hash():
    from beam_pipeline.images.phash import valid_hash

    assert valid_hash("0123456789abcdef") == "0123456789abcdef"
    assert [valid_hash(v) for v in ("zz", "0123456789ABCDEF", "123", 5, None)] == [""] * 5
    from beam_pipeline.images.phash import entry_hash

    ph, second = "0123456789abcdef", "fedcba9876543210" * 2
    assert entry_hash({"phash": ph, "confirm": second}) == ph + second
    # an index without the second measure (an older version) or a damaged one: the pHash alone, unsearched
    assert [entry_hash({"phash": ph, "confirm": c}) for c in (None, "zz" * 16, second[:-1], 7)] == [ph] * 4
    assert entry_hash({"confirm": second}) == "" and entry_hash("not a dict") == ""


def test_bits_are_counted_alike_with_and_without_numpy_2(monkeypatch):
    values = np.array([0, 1, 3, 2**64 - 1, 12345678901234567, 2**63], dtype=np.uint64)
    want = [int(v).bit_count() for v in values.tolist()]
    assert nd._bits(values).tolist() == want
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert nd._bits(values).tolist() == want


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
    for line in map(json.loads, (leaky / "near_duplicates.jsonl").read_text().splitlines()[1:]):
        assert len(line["splits"]) == 1  # no group spans splits any more
    for row in leaks.values():
        assert row["detail"].startswith("near-duplicate group of 2 images, 1 of them in "), row

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


def test_a_leak_is_an_image_outside_its_groups_first_split():
    from beam_pipeline import leaks

    spanning = {
        7: {"test": (2, "t0.png"), "train": (150, "a.jpg")},
        8: {"test": (1, "u.png"), "validation": (1, "v.png")},
    }
    assert list(leaks.leak_of((7, ("test", "t1.png")), spanning)) == [
        ("t1.png", (0, "a.jpg", "near-duplicate group of 152 images, 150 of them in train (first: a.jpg)"))
    ]
    assert list(leaks.leak_of((7, ("train", "a.jpg")), spanning)) == []
    assert [p for p, _ in leaks.leak_of((8, ("test", "u.png")), spanning)] == ["u.png"]  # validation stays
    assert list(leaks.leak_of((8, ("validation", "v.png")), spanning)) == []
    assert list(leaks.leak_of((9, ("test", "w.png")), spanning)) == []  # a group inside one split
    acc = leaks.GroupSplits()
    merged = acc.merge_accumulators(
        [acc.add_input(acc.create_accumulator(), ("test", "b")), acc.add_input(acc.create_accumulator(), ("test", "a"))]
    )
    assert acc.extract_output(merged) == {"test": (2, "a")}


def test_an_unchanged_file_of_a_night_keeps_its_hash_unread(tmp_path):
    from beam_pipeline import index, leaks
    from beam_pipeline.vocab.refs import Ref

    full = "0123456789abcdef" * 3
    previous = index.Previous("shard", 0, 1, "sha", None, None, "", None, full)
    ref = Ref(str(tmp_path / "gone.jpg"), "gone.jpg", 1, "test", None, 0, previous=previous)
    reuse = leaks.HashRefFn(ImageOptions(), reuse=True)
    assert list(reuse.process(ref)) == [(full, ("gone.jpg", "test"))]
    # the previous night's records may not be reused (other code): its hashes are not trusted either
    assert list(leaks.HashRefFn(ImageOptions(), reuse=False).process(ref)) == []  # gone: no hash
    unread = dataclasses.replace(ref, previous=None)
    assert list(reuse.process(unread)) == []  # gone: no hash (the writer rejects it)
    rejected = dataclasses.replace(ref, previous=index.PreviousReject("truncated", "cut"))
    assert list(reuse.process(rejected)) == []  # rejected again unread: never a record
