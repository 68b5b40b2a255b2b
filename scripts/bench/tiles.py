"""Small images: the tutorial loop against ``convert`` on 96 px tiles, check off and at the defaults (issue #46).

    .venv/bin/python scripts/benchmark.py tiles --data /work/mil-data                  # 80k and 320k tiles
    .venv/bin/python scripts/benchmark.py tiles --data /work/mil-data --sizes 80000 --repeat 3
    .venv/bin/python scripts/benchmark.py tiles --data /work/mil-data --processes 1    # one process only

The tiles are ``million``'s (96x96 JPEGs of ~2.4 KB in 10 class folders, made once under ``--data``; the
smaller sets are hard links to the first files). For each size, on the same files and in one invocation:

- ``loop``: the tutorial loop (read, Pillow decode, build the Example, one ``TFRecordWriter``; one process);
- ``off P``: ``convert --no-transform --near-duplicates off`` on P local processes;
- ``defaults P``: ``convert --no-transform`` (the near-duplicate check on) on P processes.

P is each of ``--processes`` (default 1 and 2): 1 is ``--direct_running_mode in_memory``, more is
``multi_processing`` with that many workers. The line before the table says how many the default rule
(``runner.local_processes``) picks on this machine. Every round runs every contender once (``--repeat``
rounds, medians reported), so a slow spell of the machine hits them alike. The files are read once first, so
every contender finds them in the page cache.

Measured from outside, whole run (start-up included, as a user waits for it): wall, images per second, CPU
seconds of the process tree, CPU ms per image, peak RSS of the process tree, and ``vs loop``: the loop's wall
over the contender's (above 1 is faster than the loop). One JSON line per run, then a table per size;
``--out-json`` appends the JSON lines to a file as well. Outputs go under ``--work`` and are removed after
each run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import TUTORIAL, beam_pipeline, interleaved, load, make_tiles, markdown_table, measure, tile_subset


def contenders(folder: Path, files: Path, work: Path, processes: list[int]) -> dict[str, list[str]]:
    """{name: command} for one size."""
    out = str(work / "out")
    jobs = {"loop": [sys.executable, "-c", TUTORIAL, str(files), str(work / "loop.tfrecord")]}
    for mode, flags in (("off", ["--near-duplicates", "off"]), ("defaults", [])):
        for count in processes:
            how = (
                ["--direct_running_mode", "in_memory", "--direct_num_workers", "1"]
                if count == 1
                else ["--direct_running_mode", "multi_processing", "--direct_num_workers", str(count)]
            )
            convert = ["convert", "--input", str(folder), "--output", out, "--no-transform", *flags, *how]
            jobs[f"{mode} {count}"] = beam_pipeline(*convert)
    return jobs


def run(command: list[str], work: Path) -> dict[str, Any]:
    result = measure(command, quiet=True)
    for leftover in (work / "out", work / "loop.tfrecord"):
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink(missing_ok=True)
    return result


def warm(folder: Path) -> list[Path]:
    """The folder's tiles, sorted, each read once (into the page cache)."""
    paths = sorted(folder.rglob("*.jpg"))
    for path in paths:
        path.read_bytes()
    return paths


def summary(images: int, runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    loop = statistics.median(r["seconds"] for r in runs["loop"])
    rows = []
    for name, results in runs.items():
        failed = [r for r in results if r["returncode"] != 0]
        seconds = statistics.median(r["seconds"] for r in results)
        cpu = statistics.median(r["cpu_seconds"] for r in results)
        rows.append(
            {
                "images": images,
                "contender": name,
                "seconds": round(seconds, 1),
                "images_per_second": round(images / seconds),
                "cpu_ms_per_image": round(1000 * cpu / images, 3),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
                "vs_loop": round(loop / seconds, 2),
                "failed": len(failed),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmark.py tiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="where the tiles are made (once) and kept")
    parser.add_argument("--sizes", type=int, nargs="+", default=[80000, 320000])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="local processes per convert")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (medians reported)")
    parser.add_argument("--work", type=Path, default=None, help="outputs go here (default: a temporary folder)")
    parser.add_argument("--out-json", type=Path, default=None, help="append the JSON lines here as well")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.sizes) or any(p < 1 for p in args.processes):
        parser.error("--sizes and --processes must be 1 or more")

    from beam_pipeline.runner import local_processes, usable_cores

    full = make_tiles(args.data, max(args.sizes))
    work = Path(tempfile.mkdtemp(prefix="tiles-", dir=args.work))
    print(f"load {load()}; the default rule picks {local_processes(usable_cores())} process(es) here", flush=True)
    lines = []
    try:
        for size in sorted(args.sizes):
            folder = tile_subset(args.data, full, size)  # hard links: each size its own folder, made once
            paths = warm(folder)
            files = work / f"files-{size}.txt"
            files.write_text("".join(f"{p}\n" for p in paths))
            jobs = contenders(folder, files, work, args.processes)

            def report(round_no: int, name: str, result: dict[str, Any], size: int = size) -> None:
                line = {"images": size, "round": round_no, "contender": name, **result}
                if name == "loop":  # not the script's text
                    line["command"] = "python -c TUTORIAL FILES loop.tfrecord (bench/common.py)"
                lines.append(line)
                print(json.dumps(line), flush=True)
                if result["returncode"] != 0:
                    print(f"note: {name} failed: {result.get('stderr_tail', '').strip().splitlines()[-1:]}")

            runs = interleaved(args.repeat, {name: (lambda c=c: run(c, work)) for name, c in jobs.items()}, report)
            rows = summary(size, runs)
            lines.extend({"summary": True, **row} for row in rows)
            header = ["contender", "wall s", "img/s", "CPU ms/img", "peak RSS MB", "vs loop", "failed"]
            body = [
                [r["contender"], r["seconds"], r["images_per_second"], r["cpu_ms_per_image"], r["peak_rss_mb"],
                 f"{r['vs_loop']:.2f}x", r["failed"]]
                for r in rows
            ]  # fmt: skip
            print(f"\n{size:,} tiles ({args.repeat} round(s), medians), load {load()}")
            print(markdown_table(header, body))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.out_json:
        with args.out_json.open("a") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
    return 0
