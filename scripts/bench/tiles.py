"""Small images: the tutorial loop against ``convert`` on 96 px tiles, check off and at the defaults (issue #46).

    .venv/bin/python scripts/benchmark.py tiles --data /work/mil-data                  # 80k and 320k tiles
    .venv/bin/python scripts/benchmark.py tiles --data /work/mil-data --sizes 80000 --repeat 3
    .venv/bin/python scripts/benchmark.py tiles --data /work/mil-data --processes 1    # one process only

The tiles are ``million``'s (96x96 JPEGs of ~2.4 KB in 10 class folders, made once under ``--data``; the
smaller sets are hard links to the first files). For each size, on the same files and in one invocation:

- ``loop``: the tutorial loop (read, Pillow decode, build the Example, one ``TFRecordWriter``; one process);
- ``off P``: ``convert --no-transform --near-duplicates off`` on P local processes;
- ``defaults P``: ``convert --no-transform`` (the near-duplicate check on) on P processes.

P is each of ``--processes`` (default 0, 1 and 2): 0 is no flag (the default rule, ``runner.local_processes``,
which looks at the input), 1 is ``--direct_running_mode in_memory``, more is ``multi_processing`` with that
many workers. Every round runs every contender once (``--repeat`` rounds, medians reported), so a slow spell
of the machine hits them alike. The files are read once first, so every contender finds them in the page
cache.

``--before DIR`` (a checkout of older code, e.g. ``git worktree add DIR REV``) adds ``before off P`` and
``before defaults P``: the same commands run from DIR (its ``beam_pipeline`` package), in the same rounds.

``--photos DIR`` (a folder of class folders of photos, e.g. 640x480 JPEGs) adds the no-regression check on
photos: the loop and ``convert --no-transform`` at the defaults (and the before code's, with ``--before``),
each on all of DIR and on its first ``--photos-small`` files, in the same rounds; the steady rate (images
over the difference of the two walls, start-up cancelled) and its ratio to the loop's.

Measured from outside, whole run (start-up included, as a user waits for it): wall, images per second, CPU
seconds of the process tree, CPU ms per image, peak RSS of the process tree, and ``vs loop``: the loop's wall
over the contender's (above 1 is faster than the loop). One JSON line per run, then a table per size;
``--out-json`` appends the JSON lines to a file as well. Outputs go under ``--work`` and are removed after
each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    TUTORIAL,
    beam_pipeline,
    interleaved,
    link_files,
    load,
    make_tiles,
    markdown_table,
    measure,
    steady_rate,
    tile_subset,
)

# A contender: its command and the folder it runs from (None: here; a --before checkout: its own).
Job = tuple[list[str], Path | None]


def process_flags(count: int) -> list[str]:
    """The Beam flags for ``count`` local processes (0: none, the default rule)."""
    if count == 0:
        return []
    if count == 1:
        return ["--direct_running_mode", "in_memory", "--direct_num_workers", "1"]
    return ["--direct_running_mode", "multi_processing", "--direct_num_workers", str(count)]


def process_name(count: int) -> str:
    return "default rule" if count == 0 else str(count)


def contenders(folder: Path, files: Path, work: Path, processes: list[int], before: Path | None) -> dict[str, Job]:
    """{name: (command, folder to run it from)} for one size."""
    out = str(work / "out")
    jobs: dict[str, Job] = {"loop": ([sys.executable, "-c", TUTORIAL, str(files), str(work / "loop.tfrecord")], None)}
    for code, where in (("", None), *((("before ", before),) if before else ())):
        for mode, flags in (("off", ["--near-duplicates", "off"]), ("defaults", [])):
            for count in processes:
                convert = ["convert", "--input", str(folder), "--output", out, "--no-transform", *flags]
                jobs[f"{code}{mode} {process_name(count)}"] = (beam_pipeline(*convert, *process_flags(count)), where)
    return jobs


def photo_contenders(
    folders: dict[str, Path], lists: dict[str, Path], work: Path, before: Path | None
) -> dict[str, Job]:
    """{name: job} for the photos: the loop and convert at the defaults (and the before code's), all and small."""
    jobs: dict[str, Job] = {}
    for which in ("all", "small"):
        jobs[f"photos loop ({which})"] = (
            [sys.executable, "-c", TUTORIAL, str(lists[which]), str(work / "loop.tfrecord")],
            None,
        )
        for code, where in (("", None), *((("before ", before),) if before else ())):
            convert = ["convert", "--input", str(folders[which]), "--output", str(work / "out"), "--no-transform"]
            jobs[f"photos {code}defaults ({which})"] = (beam_pipeline(*convert), where)
    return jobs


def run(job: Job, work: Path) -> dict[str, Any]:
    command, where = job
    result = measure(command, quiet=True, cwd=where)
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
    parser.add_argument("--processes", type=int, nargs="+", default=[0, 1, 2],
                        help="local processes per convert (0: the default rule)")  # fmt: skip
    parser.add_argument("--before", type=Path, default=None, help="a checkout of older code, run in the same rounds")
    parser.add_argument("--photos", type=Path, default=None, help="a folder of class folders of photos (no-regression)")
    parser.add_argument("--photos-small", type=int, default=400, help="photos in the start-up run")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (medians reported)")
    parser.add_argument("--work", type=Path, default=None, help="outputs go here (default: a temporary folder)")
    parser.add_argument("--out-json", type=Path, default=None, help="append the JSON lines here as well")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.sizes) or any(p < 0 for p in args.processes):
        parser.error("--sizes must be 1 or more, --processes 0 or more")
    if args.before is not None and not (args.before / "beam_pipeline" / "__init__.py").is_file():
        parser.error(f"--before {args.before}: no beam_pipeline package in it")

    full = make_tiles(args.data, max(args.sizes))
    work = Path(tempfile.mkdtemp(prefix="tiles-", dir=args.work))
    print(f"load {load()}; {os.cpu_count()} cores", flush=True)
    lines: list[dict[str, Any]] = []
    try:
        if args.photos is not None:
            lines += photos(args, work)
        for size in sorted(args.sizes):
            folder = tile_subset(args.data, full, size)  # hard links: each size its own folder, made once
            paths = warm(folder)
            files = work / f"files-{size}.txt"
            files.write_text("".join(f"{p}\n" for p in paths))
            jobs = contenders(folder, files, work, args.processes, args.before)

            def report(round_no: int, name: str, result: dict[str, Any], size: int = size) -> None:
                line = {"images": size, "round": round_no, "contender": name, **result}
                if name == "loop":  # not the script's text
                    line["command"] = "python -c TUTORIAL FILES loop.tfrecord (bench/common.py)"
                lines.append(line)
                print(json.dumps(line), flush=True)
                if result["returncode"] != 0:
                    print(f"note: {name} failed: {result.get('stderr_tail', '').strip().splitlines()[-1:]}")

            runs = interleaved(args.repeat, {name: (lambda j=j: run(j, work)) for name, j in jobs.items()}, report)
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


def photos(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """The photos' rounds: steady rates of the loop and of convert (and the before code's); their JSON lines."""
    paths = warm(args.photos)
    if len(paths) <= args.photos_small:
        sys.exit(
            f"error: --photos {args.photos}: {len(paths)} JPEGs, need more than --photos-small {args.photos_small}"
        )
    small = paths[: args.photos_small]
    folders = {"all": args.photos, "small": link_files(small, args.photos, work / "photos-small")}
    lists = {}
    for which, chosen in (("all", paths), ("small", small)):
        lists[which] = work / f"photos-{which}.txt"
        lists[which].write_text("".join(f"{p}\n" for p in chosen))
    lines: list[dict[str, Any]] = []

    def report(round_no: int, name: str, result: dict[str, Any]) -> None:
        line = {"photos": True, "round": round_no, "contender": name, **result}
        lines.append(line)
        print(json.dumps(line), flush=True)

    jobs = photo_contenders(folders, lists, work, args.before)
    runs = interleaved(args.repeat, {name: (lambda j=j: run(j, work)) for name, j in jobs.items()}, report)
    counts = {"all": len(paths), "small": len(small)}
    rates = {}
    for name in dict.fromkeys(n.rsplit(" (", 1)[0] for n in jobs):
        walls = {w: statistics.median(r["seconds"] for r in runs[f"{name} ({w})"]) for w in counts}
        rates[name] = steady_rate(walls["all"], walls["small"], counts["all"] - counts["small"])
    loop = rates["photos loop"]
    body = [[name, f"{rate:,.0f}", f"{rate / loop:.2f}x"] for name, rate in rates.items()]
    print(f"\n{len(paths):,} photos, {args.photos_small} in the start-up run ({args.repeat} round(s), medians)")
    print(markdown_table(["contender", "steady img/s", "vs loop"], body))
    lines += [{"summary": True, "photos": True, "contender": n, "steady_images_per_second": round(r, 1),
               "vs_loop": round(r / loop, 3)} for n, r in rates.items()]  # fmt: skip
    return lines
