"""Benchmark: beam_pipeline against the tutorial loop, the textbook Beam pipeline and two decode floors.

    .venv/bin/python scripts/benchmark.py --make-gb 2 --data bench-data   # generate, then measure
    .venv/bin/python scripts/benchmark.py --data bench-data               # measure an existing folder
    .venv/bin/python scripts/benchmark.py contenders --data bench-data    # the same, named

Everything runs on the same files in one invocation, so ratios are comparable
even on a noisy machine. Each contender runs as its own process; peak RSS is
of its whole process tree (``bench.common.measure``). Start-up (imports, worker
start, TFT graph tracing) is separated from steady-state throughput by also
running on a small prefix of the input: steady rate = (N_big - N_small) /
(t_big - t_small), each time the median of ``--repeat`` rounds; every
round runs every contender once, so a slow spell of a shared machine hits
them alike. Writes results JSON and a PNG bar chart.

Every run also records its CPU seconds (the process tree's user + system)
and the load average: on a shared machine wall-time ratios move with the
neighbours, CPU per image hardly does, so the summary gives the issue's
ratios both ways (issue #22): ``convert`` against its own decode check and
against Pillow's full decode (steady img/s and CPU ms per image), against the
tutorial loop (img/s), its peak RSS, and the wall time of a small job
(``--job-images``, 200) with defaults against the loop's on the same files.
``--contenders issue`` runs only what those ratios need.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image, ImageDraw

from beam_pipeline.images.convert import prepare_image
from bench.common import TUTORIAL, interleaved, link_files, list_images, make_samples, measure, steady_ms, steady_rate

TEXTBOOK = r"""
import io, os, sys
import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from PIL import Image
import tensorflow as tf
def to_example(readable):
    data = readable.read()
    img = Image.open(io.BytesIO(data)); img.load()
    label = os.path.basename(os.path.dirname(readable.metadata.path))
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
        "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[img.height])),
        "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[img.width])),
        "image/class/text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[label.encode()])),
    })).SerializeToString()
files = [l.strip() for l in open(sys.argv[1])]
with beam.Pipeline(runner=FnApiRunner()) as p:
    (p | beam.Create(files) | fileio.MatchAll() | fileio.ReadMatches() | beam.Map(to_example)
       | beam.io.WriteToTFRecord(sys.argv[2], num_shards=int(sys.argv[3])))
"""


def full_decode(data: bytes) -> None:
    """The issue's floor: Pillow's full decode (``Image.load()``)."""
    Image.open(io.BytesIO(data)).load()


def validation_decode(data: bytes) -> None:
    """The check ``convert`` runs per image (``prepare_image``: a JPEG kept as it is decodes at 1/8 scale)."""
    prepare_image(data)


def decode_floor(blobs: list[bytes], threads: int, decode) -> dict[str, object]:
    """``decode`` of preloaded bytes on one thread per core: no reading, hashing, Examples or writing.

    Its CPU is this process's during the run (nothing else runs in it then).
    """

    def attempt(data: bytes) -> None:
        try:
            decode(data)
        except Exception:  # noqa: BLE001 - a broken file in the user's folder costs its failed decode
            pass

    cpu, started = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(attempt, blobs))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": None, "load": os.getloadavg()[0]}


def measure_once(name: str, command: list[str], clean: Path | None = None) -> dict[str, object]:
    """Wall time and peak RSS of one run of ``command`` (``clean`` is removed first); exits if it fails."""
    if clean is not None:
        shutil.rmtree(clean, ignore_errors=True)
    result = measure(command)
    if result["returncode"] != 0:  # a contender that did not finish has no throughput to compare
        sys.exit(f"error: {name} failed (exit {result['returncode']}): {' '.join(command)}")
    return result


def summarize(runs: list[dict[str, object]], images: int, nbytes: int) -> dict[str, object]:
    """Median wall time and CPU, largest peak RSS over the rounds, and the load average at each."""
    seconds = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    return {"seconds": seconds, "all_seconds": [r["seconds"] for r in runs], "images": images, "bytes": nbytes,
            "cpu_seconds": cpu, "all_cpu_seconds": [r["cpu_seconds"] for r in runs],
            "loads": [r["load"] for r in runs],
            "peak_rss_mb": max((r["peak_rss_mb"] or 0) for r in runs) or None}  # fmt: skip


def steady(big: dict, small: dict) -> float:
    """Images per second with start-up cancelled; nan when the two runs cannot tell it apart."""
    return steady_rate(big["seconds"], small["seconds"], big["images"] - small["images"])


def steady_cpu_ms(big: dict, small: dict | None) -> float:
    """CPU ms per image in steady state: start-up's CPU cancels in the difference."""
    if small is None:
        return 1000 * big["cpu_seconds"] / big["images"]
    return steady_ms(big["cpu_seconds"], small["cpu_seconds"], big["images"] - small["images"])


def issue_ratios(results: dict[str, dict], job: dict[str, dict], cores: int) -> list[str]:
    """The issue's ratios (#22): convert against both floors and the loop, RSS, the small job's wall."""
    conv, loop = results["convert (defaults)"], results["tutorial loop"]
    check = results["check floor (convert's decode check, preloaded)"]
    full = results["decode floor (Pillow full decode, preloaded)"]
    loads = [x for r in (*results.values(), *job.values()) for x in r["big"]["loads"]]
    lines = [f"issue #22 ratios (one run; load average {min(loads):.1f}-{max(loads):.1f} on {cores} cores):",
             f"{'':<34}{'img/s':>9}{'CPU ms/img':>12}",
             *(f"  {name:<32}{r['steady_images_per_s']:>9,.0f}{r['cpu_ms_per_image']:>12.3f}"
               for name, r in (("convert (defaults)", conv), ("check floor", check),
                               ("Pillow full-decode floor", full), ("tutorial loop", loop))),
             f"  convert / check floor       : {conv['steady_images_per_s'] / check['steady_images_per_s']:.2f}x img/s,"
             f" {check['cpu_ms_per_image'] / conv['cpu_ms_per_image']:.2f}x in CPU per image (target >= 0.85)",
             f"  convert / full-decode floor : {conv['steady_images_per_s'] / full['steady_images_per_s']:.2f}x img/s,"
             f" {full['cpu_ms_per_image'] / conv['cpu_ms_per_image']:.2f}x in CPU per image (target >= 1.0)",
             f"  convert / tutorial loop     : {conv['steady_images_per_s'] / loop['steady_images_per_s']:.2f}x img/s"
             f" (target >= 2.2; the loop uses one core)",
             f"  convert peak RSS            : {conv['big']['peak_rss_mb'] or 0:,.0f} MB on {conv['big']['images']:,}"
             f" images, {conv['small']['peak_rss_mb'] or 0:,.0f} MB on {conv['small']['images']:,}"
             " (target <= 1 GB, flat)"]  # fmt: skip
    if job:
        cj, lj = job["convert (defaults)"]["big"], job["tutorial loop"]["big"]
        lines.append(f"  {cj['images']}-image job wall    : convert {cj['seconds']:.2f} s, loop {lj['seconds']:.2f} s ="
                     f" {cj['seconds'] / lj['seconds']:.2f}x (target <= 1.3); CPU {cj['cpu_seconds']:.2f} s vs"
                     f" {lj['cpu_seconds']:.2f} s")  # fmt: skip
    return lines


def chart(results: dict[str, dict], path: Path) -> None:
    rows = [(k, v["steady_images_per_s"]) for k, v in results.items() if v.get("steady_images_per_s", 0) > 0]
    top = max(r for _, r in rows) if rows else 1
    img = Image.new("RGB", (880, 40 + 30 * len(rows)), "white")
    draw = ImageDraw.Draw(img)
    draw.text((10, 10), "steady-state images/s (same files, same run)", fill="black")
    for i, (name, rate) in enumerate(rows):
        y = 40 + 30 * i
        draw.text((10, y + 6), name[:52], fill="black")
        width = int(420 * rate / top) if rate == rate else 0
        draw.rectangle((380, y + 4, 380 + width, y + 22), fill=(70, 120, 200))
        draw.text((385 + width, y + 6), f"{rate:,.0f}", fill="black")
    img.save(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py [contenders]", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", default="bench-data", help="folder of class folders of JPEGs")
    p.add_argument("--make-gb", type=float, default=0, help="generate about this many GB of 640x480 JPEGs first")
    p.add_argument("--small", type=int, default=400, help="images in the start-up run")
    p.add_argument("--textbook-images", type=int, default=3000, help="subset for the textbook pipeline (~7.5x RAM)")
    p.add_argument("--out", default="bench-out", help="folder for outputs, results.json and chart.png")
    p.add_argument("--repeat", type=int, default=3, help="rounds, each running every contender once (3)")
    p.add_argument("--job-images", type=int, default=200, help="images in the small job timed whole (0: none)")
    p.add_argument("--contenders", choices=("all", "issue"), default="all",
                   help="issue: only the loop, convert (defaults) and the floors: the ratios of issue #22")  # fmt: skip
    args = p.parse_args(argv)
    rounds = max(1, args.repeat)

    data, out = Path(args.data), Path(args.out)
    py = sys.executable
    if args.make_gb:
        make_samples(data, int(args.make_gb * 1e9 / 138_000 / 3), "640x480", jpeg_only=True)
    files = [str(f) for f in list_images(data)]
    if not files:
        sys.exit(f"error: no images under {data}")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=out))
    cores = os.cpu_count() or 1
    total_bytes = sum(os.path.getsize(f) for f in files)
    print(f"{len(files)} images, {total_bytes / 1e9:.2f} GB, {cores} cores")

    def listing(name: str, subset: list[str]) -> str:
        path = work / f"{name}.txt"
        path.write_text("\n".join(subset) + "\n")
        return str(path)

    def subset_folder(name: str, subset: list[str]) -> str:
        return str(link_files(map(Path, subset), data, work / name))

    small = files[: args.small]
    sub = files[: args.textbook_images]
    job_files = files[: args.job_images]
    sizes = {"all": (len(files), total_bytes), "small": (len(small), sum(os.path.getsize(f) for f in small)),
             "sub": (len(sub), sum(os.path.getsize(f) for f in sub)),
             "job": (len(job_files), sum(os.path.getsize(f) for f in job_files))}  # fmt: skip
    folders = {"all": str(data), "small": subset_folder("small", small), "sub": subset_folder("sub", sub),
               "job": subset_folder("job", job_files)}  # fmt: skip
    lists = {"all": listing("all", files), "small": listing("small", small), "sub": listing("sub", sub),
             "job": listing("job", job_files)}  # fmt: skip

    def convert(tag: str, which: str, *flags: str) -> tuple[list[str], Path]:
        dest = work / f"out-{tag}-{which}"
        return [py, "-m", "beam_pipeline", "convert", "--input", folders[which], "--output", str(dest), *flags], dest

    # (contender, input) → (command, output to clean). Memory-hungry contenders run on the subset.
    jobs: dict[tuple[str, str], tuple[list[str], Path | None]] = {}
    everything = args.contenders == "all"
    for which in ("all", "small", *(("job",) if args.job_images else ())):
        jobs["tutorial loop", which] = ([py, "-c", TUTORIAL, lists[which], str(work / "t.tfrecord")], None)
        jobs["convert (defaults)", which] = convert("defaults", which)
        if everything and which != "job":
            jobs["convert, 1 decode thread", which] = convert("1thread", which, "--decode-threads", "1")
            jobs["convert, no TFT", which] = convert("notft", which, "--no-transform", "--no-tfds-metadata")
    for which in ("sub", "small") if everything else ():
        jobs["textbook Beam (subset)", which] = ([py, "-c", TEXTBOOK, lists[which], str(work / "tb"), "3"], None)
        jobs["convert --sink write_to_tfrecord (subset)", which] = convert("wtt", which, "--sink", "write_to_tfrecord")
    floors = {"decode floor (Pillow full decode, preloaded)": full_decode,
              "check floor (convert's decode check, preloaded)": validation_decode}  # fmt: skip
    blobs = [Path(f).read_bytes() for f in files]

    # Rounds: every contender once per round, so a slow spell of a shared
    # machine hits all of them alike; the median round counts.
    contenders: dict[tuple[str, str], Callable[[], dict[str, object]]] = {
        (name, which): functools.partial(measure_once, f"{name} ({which})", command, clean)
        for (name, which), (command, clean) in jobs.items()
    }
    contenders.update({(name, "all"): functools.partial(decode_floor, blobs, cores, decode)
                       for name, decode in floors.items()})  # fmt: skip

    def report(round_no: int, key: tuple[str, str], run: dict[str, object]) -> None:
        print(f"  round {round_no}/{rounds}: {key[0]} ({key[1]}, {sizes[key[1]][0]} images) {run['seconds']:.1f} s",
              flush=True)  # fmt: skip

    runs = interleaved(rounds, contenders, report)
    del blobs
    results: dict[str, dict] = {}
    job: dict[str, dict] = {}  # the small job, timed whole (start-up included)
    for name in dict.fromkeys(name for name, _ in runs):
        big_which = "sub" if (name, "sub") in runs else "all"
        big = summarize(runs[name, big_which], *sizes[big_which])
        if (name, "small") in runs:
            little = summarize(runs[name, "small"], *sizes["small"])
            results[name] = {"big": big, "small": little, "steady_images_per_s": steady(big, little),
                             "cpu_ms_per_image": steady_cpu_ms(big, little)}  # fmt: skip
        else:  # no start-up to remove
            results[name] = {"big": big, "steady_images_per_s": big["images"] / big["seconds"],
                             "cpu_ms_per_image": steady_cpu_ms(big, None)}  # fmt: skip
        if (name, "job") in runs:
            job[name] = {"big": summarize(runs[name, "job"], *sizes["job"])}

    base = results["tutorial loop"]["steady_images_per_s"]
    floor_rate, check_rate = (results[name]["steady_images_per_s"] for name in floors)
    mean_image = total_bytes / len(files)
    print(f"\n{'contender':<48}{'img/s':>8}{'MB/s':>8}{'startup s':>10}{'peak MB':>9}"
          f"{'/loop':>7}{'/floor':>7}{'/check':>7}{'CPU ms/img':>11}")  # fmt: skip
    for name, r in results.items():
        rate = r["steady_images_per_s"]
        startup = r["small"]["seconds"] - r["small"]["images"] / rate if "small" in r and rate == rate else 0.0
        r.update(ratio_to_loop=rate / base, ratio_to_floor=rate / floor_rate, ratio_to_check=rate / check_rate,
                 startup_seconds=startup)  # fmt: skip
        rss = r["big"].get("peak_rss_mb")
        print(f"{name:<48}{rate:>8,.0f}{rate * mean_image / 1e6:>8,.1f}{startup:>10.1f}{(rss or 0):>9,.0f}"
              f"{rate / base:>7.2f}{rate / floor_rate:>7.2f}{rate / check_rate:>7.2f}"
              f"{r['cpu_ms_per_image']:>11.3f}")  # fmt: skip
    print()
    print("\n".join(issue_ratios(results, job, cores)))
    meta = {"images": len(files), "bytes": total_bytes, "cores": cores, "subset_images": len(sub)}
    (out / "results.json").write_text(json.dumps({"dataset": meta, "results": results, "job": job}, indent=2))
    chart(results, out / "chart.png")
    shutil.rmtree(work, ignore_errors=True)
    print(f"\nwrote {out / 'results.json'} and {out / 'chart.png'}")
    return 0
