"""Near-duplicates (issue #36): what the perceptual hash costs per image, and the pair join at scale.

    .venv/bin/python scripts/benchmark.py near-dups                     # both
    .venv/bin/python scripts/benchmark.py near-dups --only hash --rounds 5
    .venv/bin/python scripts/benchmark.py near-dups --only join --hashes 1000000 --crowd 10000

``hash``, in one run on the same files (1,000 generated photo-like 640x480 images, 3 JPEGs to 1 PNG; 200 of
each kind timed one by one):

1. CPU per image of the check as the writer runs it (``prepare_image``, one thread, ``time.process_time``)
   with and without the hash, interleaved file by file, ``--rounds`` times; the medians and their ratio.
2. ``convert --no-transform --no-tfds-metadata`` with ``--near-duplicates off``, ``report`` and
   ``drop-leaks``, over the whole set and over a quarter of it, interleaved: the CPU of the process tree;
   the difference of the two sizes gives the steady CPU per image (start-up cancelled), the quarter less
   its images the fixed cost.

``join``: ``--hashes`` generated hashes (random 64-bit pHash, dHash and colour; 1 % of them with a copy 0-12
pHash bits and 0-5 dHash bits away) in index parts of 5,000 records, plus ``--crowd`` images sharing one
look (blank frames) and ``--crowd`` distinct hashes sharing one 16-bit band value, through
``FindNearDuplicates`` on the local runner in a fresh process: wall time, CPU and peak RSS of that process,
and what it found (dataset.json's block).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from bench.common import (
    interleaved,
    link_files,
    list_images,
    load,
    measure,
    measure_beam,
    scratch,
    steady_ms,
)

QUICK = ["--no-transform", "--no-tfds-metadata", "--max-reject-fraction", "1", "--split-ratios", "train=0.8,test=0.2"]
PART_RECORDS = 5_000
MODES = ("off", "report", "drop-leaks")


def make_photos(folder: Path, count: int) -> None:
    """``count`` distinct photo-like 640x480 images (tests/imagegen.photo_like: unrelated as photos are, unlike
    the gradients of make_sample_images, which a perceptual hash finds alike): 3 in 4 JPEGs, 1 in 4 PNGs."""
    from tests.imagegen import photo_like

    for i in range(count):
        label = ("a", "b", "c")[i % 3]
        (folder / label).mkdir(parents=True, exist_ok=True)
        img = photo_like(10_000 + i, 640, 480)
        if i % 4 == 3:
            img.save(folder / label / f"{i:05d}.png")
        else:
            img.save(folder / label / f"{i:05d}.jpg", quality=90)
    print(f"wrote {count} photo-like images to {folder}")


def hash_cost(files: list[Path], rounds: int) -> dict[str, float]:
    from beam_pipeline.images.convert import prepare_image
    from beam_pipeline.images.options import ImageOptions

    with_hash, without = ImageOptions(), ImageOptions(perceptual_hash=False)
    datas = [f.read_bytes() for f in files]
    prepare_image(datas[0], with_hash)  # imports (imagehash, SciPy) outside the timing
    on: list[float] = []
    off: list[float] = []
    for _ in range(rounds):
        t_on = t_off = 0.0
        for data in datas:
            for options, kind in ((with_hash, "on"), (without, "off")):
                start = time.process_time()
                prepare_image(data, options)
                spent = time.process_time() - start
                if kind == "on":
                    t_on += spent
                else:
                    t_off += spent
        on.append(1000 * t_on / len(datas))
        off.append(1000 * t_off / len(datas))
    return {"with_ms": statistics.median(on), "without_ms": statistics.median(off)}


def run_hash(args: argparse.Namespace) -> None:
    with scratch(args.work, "near-dups-") as work:
        data = Path(args.input) if args.input else work / "data"
        if not args.input:
            make_photos(data, args.images)
        files = list_images(data)
        jpegs = [f for f in files if f.suffix.lower() in (".jpg", ".jpeg")][: args.per_kind]
        pngs = [f for f in files if f.suffix.lower() == ".png"][: args.per_kind]
        print(f"load {load()}; {len(jpegs)} JPEGs, {len(pngs)} PNGs from {data}")
        for name, chosen in (("JPEG (kept as is: 1/8-scale check)", jpegs), ("PNG (full decode)", pngs)):
            if not chosen:
                continue
            cost = hash_cost(chosen, args.rounds)
            extra = cost["with_ms"] - cost["without_ms"]
            print(
                f"{name}: check {cost['without_ms']:.3f} ms/img, with hash {cost['with_ms']:.3f} ms/img: "
                f"+{extra:.3f} ms (+{100 * extra / cost['without_ms']:.1f} %)"
            )
        quarter = link_files(files[: len(files) // 4], data, work / "quarter")
        runs = {
            (mode, name): (
                lambda mode=mode, src=src, name=name: measure_beam(
                    "convert", "--input", str(src), "--output", str(work / f"out-{mode}-{name}"), "--overwrite",
                    *QUICK, "--near-duplicates", mode,
                )
            )
            for mode in MODES
            for name, src in (("all", data), ("quarter", quarter))
        }  # fmt: skip
        results = interleaved(args.rounds, runs)
        n_all, n_quarter = len(files), len(files) // 4
        steady = {}
        for mode in MODES:
            cpu_all = statistics.median(r["cpu_seconds"] for r in results[(mode, "all")])
            cpu_q = statistics.median(r["cpu_seconds"] for r in results[(mode, "quarter")])
            wall_all = statistics.median(r["seconds"] for r in results[(mode, "all")])
            steady[mode] = steady_ms(cpu_all, cpu_q, n_all - n_quarter)
            fixed = cpu_q - steady[mode] * n_quarter / 1000
            print(
                f"convert --near-duplicates {mode:<6}: {n_all} images in {wall_all:.2f} s (CPU {cpu_all:.2f} s); "
                f"steady CPU {steady[mode]:.3f} ms/img, fixed CPU {fixed:.2f} s"
            )
        for mode in MODES[1:]:
            extra = steady[mode] - steady["off"]
            print(f"{mode} against off, per image of the job: +{extra:.3f} ms (+{100 * extra / steady['off']:.1f} %)")


def make_index_parts(folder: Path, hashes: int, crowd: int, seed: int = 36) -> int:
    """Index parts of generated hashes (pHash, dHash, colour); returns how many records."""
    rng = random.Random(seed)
    rows: list[tuple[str, str, int, int, int]] = []
    splits = ("train", "validation", "test")
    grey = int.from_bytes(bytes([85]) * 8, "big")
    for i in range(hashes):
        value, second, colour = rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64)
        rows.append((f"img/{i:08d}.jpg", splits[i % 10 // 8], value, second, colour))
        if i % 100 == 0:
            copy, copy2 = value, second
            for bit in rng.sample(range(64), rng.randrange(13)):
                copy ^= 1 << bit
            for bit in rng.sample(range(64), rng.randrange(6)):
                copy2 ^= 1 << bit
            rows.append((f"img/{i:08d}_copy.jpg", splits[(i // 100) % 3], copy, copy2, colour))
    blank = (rng.getrandbits(64), rng.getrandbits(64), grey)
    rows += [(f"blank/{i:06d}.png", splits[i % 3], *blank) for i in range(crowd)]
    shared = rng.getrandbits(16)
    rows += [
        (f"band/{i:06d}.png", splits[i % 3], (rng.getrandbits(48) << 16) | shared, rng.getrandbits(64), grey)
        for i in range(crowd)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(rows), PART_RECORDS):
        lines = (
            json.dumps({"path": p, "split": s, "phash": f"{v:016x}", "confirm": f"{d:016x}{c:016x}"})
            for p, s, v, d, c in rows[start : start + PART_RECORDS]
        )
        (folder / f"part-{start // PART_RECORDS:05d}.jsonl").write_text("\n".join(lines) + "\n")
    return len(rows)


def join_here(folder: Path, distance: int) -> None:
    """In this process: the join over ``folder``'s index parts; prints what it found as one JSON line."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from beam_pipeline import near_duplicates as nd
    from beam_pipeline.vocab.records import ShardResult

    parts = sorted(folder.glob("part-*.jsonl"))
    results = [ShardResult("train", i, f"/x/{i}", PART_RECORDS, 1, index_path=str(p)) for i, p in enumerate(parts)]
    out = folder / "near.jsonl"
    summary_file = folder / "summary.json"
    options = PipelineOptions([], direct_running_mode="in_memory", direct_num_workers=1)
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        found = p | beam.Create(results) | nd.FindNearDuplicates(str(folder / "staging"), distance)
        _ = found["summary"] | beam.Map(lambda s: summary_file.write_text(json.dumps(s)))
        _ = found["parts"] | beam.combiners.ToList() | beam.Map(lambda ps: nd.merge_parts(ps, str(out), distance))
    print(summary_file.read_text())


def run_join(args: argparse.Namespace) -> None:
    with scratch(args.work, "near-dups-join-") as work:
        folder = work / "parts"
        start = time.monotonic()
        records = make_index_parts(folder, args.hashes, args.crowd)
        print(f"load {load()}; {records:,} records in index parts made in {time.monotonic() - start:.1f} s")
        here = Path(__file__).resolve().parents[1] / "benchmark.py"
        result = measure(
            [sys.executable, str(here), "near-dups", "--join-here", str(folder), "--distance", str(args.distance)],
            quiet=False,
        )
        if result["returncode"] != 0:
            raise SystemExit(f"error: the join failed: {result.get('stderr_tail', '')}")
        print(
            f"join: wall {result['seconds']:.1f} s, CPU {result['cpu_seconds']:.1f} s, peak RSS "
            f"{result['peak_rss_mb']:.0f} MB ({records / result['seconds']:,.0f} records/s)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmark.py near-dups", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("hash", "join"))
    parser.add_argument("--input", help="images for the hash measurement (default: generated)")
    parser.add_argument("--images", type=int, default=1000, help="photo-like images generated (3 JPEGs to 1 PNG)")
    parser.add_argument("--per-kind", type=int, default=200, help="JPEGs and PNGs timed (each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hashes", type=int, default=1_000_000)
    parser.add_argument("--crowd", type=int, default=10_000)
    parser.add_argument("--distance", type=int, default=10)
    parser.add_argument("--work", default="", help="kept folder for data and outputs (default: a temp one)")
    parser.add_argument("--join-here", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.join_here:
        join_here(Path(args.join_here), args.distance)
        return 0
    if args.only in (None, "hash"):
        run_hash(args)
    if args.only in (None, "join"):
        run_join(args)
    return 0
