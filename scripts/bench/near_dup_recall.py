"""Near-duplicate recall (issue #36): known copies among distinct images, found by ``convert`` and by a
single-machine search in the same run.

    .venv/bin/python scripts/benchmark.py near-dup-recall                       # 300 generated originals
    .venv/bin/python scripts/benchmark.py near-dup-recall --originals ~/photos  # your photos as originals too
    .venv/bin/python scripts/benchmark.py near-dup-recall --worst-crop           # every crop: 5 % off one corner

Each original (``--generated`` photo-like images, and the images under ``--originals``) is saved as a JPEG
beside six copies, each in a random class folder:

- ``reencode``: JPEG quality 50-85;
- ``resize``: 50-200 %, bilinear;
- ``crop``: up to ``--crop`` (5 %) off the width and off the height, each share and where it is cut random
  (``--worst-crop``: all of ``--crop`` off both, at one corner);
- ``brightness``: ±10 %;
- ``png``: the same pixels as a PNG;
- ``exif``: the pixels turned 90° with an EXIF orientation that turns them back.

The originals are the distinct images: no two are copies of each other. Known pairs are original-copy
pairs; a reported pair is false when its two images come from different originals (two copies of one
original are a true pair too, though not a known one).

Two searches over the same files:

1. ``convert --near-duplicates report`` (``--near-duplicate-distance``, default 10): its near_duplicates.jsonl;
   the process tree's wall time and CPU.
2. The single-machine way of imagededup's or cleanvision's perceptual hash: ``imagehash.phash`` of each file
   as Pillow opens it (no EXIF turn), every pair compared, the same distance.

Per kind of copy: the share of known pairs each found, and the distances (mean, 95th percentile, largest);
over all: recall, reported pairs, the share of them that are false, and the closest two originals.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import beam_pipeline, list_images, markdown_table, measure, scratch

KINDS = ("reencode", "resize", "crop", "brightness", "png", "exif")
QUICK = ["--no-transform", "--no-tfds-metadata", "--max-reject-fraction", "1", "--split-ratios", "train=0.7,test=0.3"]


def make_set(folder: Path, originals: list[tuple[str, Any]], crop: float, worst_crop: bool, seed: int) -> list:
    """Writes each original and its copies under ``folder``; returns the known pairs (original, copy, kind)."""
    from PIL import Image, ImageEnhance

    rng = random.Random(seed)
    known = []

    def save(img: Any, rel: str, fmt: str = "JPEG", **options: Any) -> str:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (img if fmt == "PNG" or img.mode in ("RGB", "L") else img.convert("RGB")).save(path, fmt, **options)
        return rel

    def cropped(img: Any) -> Any:
        w, h = img.size
        fw, fh = (crop, crop) if worst_crop else (rng.uniform(0, crop), rng.uniform(0, crop))
        cut_w, cut_h = round(w * fw), round(h * fh)
        left, top = (0, 0) if worst_crop else (rng.randint(0, cut_w), rng.randint(0, cut_h))
        return img.crop((left, top, w - (cut_w - left), h - (cut_h - top)))

    for name, img in originals:
        original = save(img, f"{rng.choice('ab')}/{name}.jpg", quality=92)
        scale = rng.uniform(0.5, 2.0)
        exif = Image.Exif()
        exif[0x0112] = 6  # display turned 90° clockwise: undoes the counter-clockwise turn below
        copies = {
            "reencode": (img, "JPEG", {"quality": rng.randint(50, 85)}),
            "resize": (img.resize((max(8, round(img.width * scale)), max(8, round(img.height * scale)))), "JPEG", {}),
            "crop": (cropped(img), "JPEG", {"quality": 90}),
            "brightness": (ImageEnhance.Brightness(img).enhance(rng.uniform(0.9, 1.1)), "JPEG", {"quality": 90}),
            "png": (img, "PNG", {}),
            "exif": (img.transpose(Image.Transpose.ROTATE_90), "JPEG", {"quality": 90, "exif": exif.tobytes()}),
        }
        for kind, (copy, fmt, options) in copies.items():
            suffix = "png" if fmt == "PNG" else "jpg"
            known.append((original, save(copy, f"{rng.choice('ab')}/{name}_{kind}.{suffix}", fmt, **options), kind))
    return known


def load_originals(generated: int, folder: str | None, seed: int) -> list[tuple[str, Any]]:
    from PIL import Image, ImageOps

    from tests.imagegen import photo_like

    rng = random.Random(seed)
    out = []
    for i, path in enumerate(list_images(Path(folder)) if folder else []):
        with Image.open(path) as img:
            img = ImageOps.exif_transpose(img)
            out.append((f"o{i:05d}", img.convert("RGB") if img.mode not in ("RGB", "L") else img.copy()))
    for i in range(generated):
        out.append((f"g{i:05d}", photo_like(5_000 + i, rng.choice((320, 480, 640)), rng.choice((240, 360, 480)))))
    return out


def origin(rel: str) -> str:
    return Path(rel).stem.split("_", 1)[0]


def single_machine(folder: Path, rels: list[str], distance: int) -> tuple[dict[str, int], set, float]:
    """imagehash.phash of every file as Pillow opens it, every pair compared: the hashes, pairs, seconds."""
    import imagehash
    import numpy as np
    from PIL import Image

    started = time.process_time()
    hashes = {}
    for rel in rels:
        with Image.open(folder / rel) as img:
            hashes[rel] = int(str(imagehash.phash(img)), 16)
    names = sorted(hashes)
    values = np.array([hashes[n] for n in names], dtype=np.uint64)
    pairs = set()
    for i in range(len(names) - 1):
        bits = np.unpackbits((values[i] ^ values[i + 1 :]).view(np.uint8).reshape(-1, 8), axis=1).sum(1)
        pairs.update((names[i], names[i + 1 + j]) for j in np.flatnonzero(bits <= distance))
    return hashes, pairs, time.process_time() - started


def converted(folder: Path, out: Path, distance: int) -> tuple[dict[str, int], set, dict[str, Any]]:
    run = measure(
        beam_pipeline(
            "convert", "--input", str(folder), "--output", str(out), *QUICK,
            "--near-duplicate-distance", str(distance),
        ),
        quiet=True,
    )  # fmt: skip
    assert run["returncode"] == 0, run.get("stderr_tail")
    hashes = {}
    with open(out / "index.jsonl") as fh:
        for line in fh:
            record = json.loads(line)
            if record.get("phash"):
                hashes[record["path"]] = int(record["phash"], 16)
    pairs = set()
    with open(out / "near_duplicates.jsonl") as fh:
        for line in fh:
            found = json.loads(line)
            if "a" in found:  # a version 1 file's pair
                pairs.add((found["a"], found["b"]))
            elif "group" in found:  # a group (or a version 1 crowd): every two of its images
                group = sorted(found["group"])
                pairs.update((a, b) for i, a in enumerate(group) for b in group[i + 1 :])
    return hashes, pairs, run


def scores(
    known: list, hashes: dict[str, int], pairs: set, distance: int
) -> tuple[list[list[object]], dict[str, float]]:
    """Per kind: found, recall, how many are within ``distance`` (what an exhaustive search of these hashes
    finds), the distances; over all: recall and false pairs."""
    rows, found_all = [], 0
    by_kind = collections.defaultdict(list)
    for a, b, kind in known:
        by_kind[kind].append((bin(hashes[a] ^ hashes[b]).count("1"), tuple(sorted((a, b))) in pairs))
    for kind in KINDS:
        got = by_kind[kind]
        distances = sorted(d for d, _ in got)
        found = sum(f for _, f in got)
        found_all += found
        p95 = distances[max(0, int(0.95 * len(distances)) - 1)]
        rows.append(
            [
                kind,
                f"{found}/{len(got)}",
                f"{found / len(got):.1%}",
                sum(d <= distance for d in distances),
                f"{statistics.mean(distances):.1f}",
                p95,
                distances[-1],
            ]
        )
    false = sum(1 for a, b in pairs if origin(a) != origin(b))
    total = {
        "recall": found_all / len(known),
        "pairs": len(pairs),
        "false": false,
        "false_share": false / max(1, len(pairs)),
    }
    return rows, total


def closest_originals(hashes: dict[str, int]) -> int:
    firsts = {}
    for rel, value in sorted(hashes.items()):
        firsts.setdefault(origin(rel), []).append(value)
    best = 64
    groups = list(firsts.values())
    flat = [(i, v) for i, values in enumerate(groups) for v in values]
    for n, (i, v) in enumerate(flat):
        for j, w in flat[n + 1 :]:
            if i != j:
                best = min(best, bin(v ^ w).count("1"))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmark.py near-dup-recall", description=__doc__.split("\n\n")[0])
    parser.add_argument("--generated", type=int, default=300, help="photo-like originals generated")
    parser.add_argument("--originals", help="a folder of your own images, each an original too")
    parser.add_argument("--crop", type=float, default=0.05, help="largest share cropped off each dimension")
    parser.add_argument("--worst-crop", action="store_true", help="every crop takes all of --crop, at one corner")
    parser.add_argument("--distance", type=int, default=10)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--work", default="", help="kept folder for data and outputs (default: a temp one)")
    args = parser.parse_args(argv)
    with scratch(args.work, "near-dup-recall-") as work:
        originals = load_originals(args.generated, args.originals, args.seed)
        known = make_set(work / "in", originals, args.crop, args.worst_crop, args.seed)
        print(f"{len(originals)} originals, {len(known)} copies ({'worst' if args.worst_crop else 'random'} crops)")
        ours, our_pairs, run = converted(work / "in", work / "out", args.distance)
        rels = sorted({rel for a, b, _ in known for rel in (a, b)})
        theirs, their_pairs, cpu = single_machine(work / "in", rels, args.distance)
        header = ["copy", "found", "recall", "within distance", "mean bits", "p95", "max"]
        for title, hashes, pairs in (
            (f"convert (groups): {run['seconds']:.1f} s wall, {run['cpu_seconds']:.1f} s CPU", ours, our_pairs),
            (f"imagehash.phash of each file, all pairs: {cpu:.1f} s CPU", theirs, their_pairs),
        ):
            rows, total = scores(known, hashes, pairs, args.distance)
            print(f"\n{title} (distance {args.distance})\n")
            print(markdown_table(header, rows))
            print(
                f"\nrecall {total['recall']:.1%} of {len(known)} known pairs; {total['pairs']} pairs reported, "
                f"{total['false']} false ({total['false_share']:.2%}); closest two originals "
                f"{closest_originals(hashes)} bits apart"
            )
    return 0
