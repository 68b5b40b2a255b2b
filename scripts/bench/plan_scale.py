"""Scale check: ``plan`` over a 1 M-row manifest and over a folder of 200k files.

Not part of the test suite (minutes of machine time). Files are tiny PNGs,
a few thousand distinct ones, each reachable under many distinct paths
through hard links, so every manifest row and every listed file is a real
file that ``plan`` stats or lists, as it would be in a real collection.

    python scripts/benchmark.py plan-scale --work /tmp/scale                     # 1 M rows, 200k files
    python scripts/benchmark.py plan-scale --work /tmp/scale --rows 100000 --folder-files 20000
    python scripts/benchmark.py plan-scale --work /tmp/scale --repo /path/to/other/checkout   # compare code

Each kind runs at 100 files, at half the size and at the full size, and
prints one JSON line (wall seconds, peak RSS of the whole process tree) and
a table with two memory figures per listed file: above the 100-file run
(includes the planner's bucket table, which grows until its 2**18 buckets
per split are all in use, then stays), and between the half and the full
run (what one more file costs once the table is full). The generated tree
is kept in ``--work`` and reused by the next run.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.common import REPO, beam_pipeline, distinct_images, hard_links, measure

CLASSES = 10
PER_FOLDER = 1000


def relpaths(count: int, *, by_class: bool) -> list[str]:
    """by_class: c{k}/{chunk}/{i}.png (a labelled folder); else {chunk}/{i}.png, PER_FOLDER files a chunk."""
    return [
        f"c{i % CLASSES}/{i // PER_FOLDER:05d}/{i:07d}.png" if by_class else f"{i // PER_FOLDER:05d}/{i:07d}.png"
        for i in range(count)
    ]


def write_manifest(path: Path, rels: list[str]) -> None:
    if path.exists():
        return
    with open(path, "w") as fh:
        fh.write("path,label\n")
        for i, rel in enumerate(rels):
            fh.write(f"{rel},c{i % CLASSES}\n")


def run_plan(repo: str, input_args: list[str], out: Path, extra: list[str]) -> dict[str, object]:
    env_path = repo + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = env_path  # inherited by the measured process tree
    return measure(beam_pipeline("plan", *input_args, "--output", str(out), *extra))  # RSS sampled every 50 ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py plan-scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--work", required=True, help="folder for the generated files (kept between runs)")
    p.add_argument("--rows", type=int, default=1_000_000, help="manifest rows (0: skip)")
    p.add_argument("--folder-files", type=int, default=200_000, help="files in the listed folder (0: skip)")
    p.add_argument("--distinct", type=int, default=2000, help="distinct image files behind the links")
    p.add_argument("--repo", default=str(REPO), help="checkout to run")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("beam_args", nargs="*", help="extra flags for plan, after --")
    args = p.parse_args(argv)
    work = Path(args.work).resolve()
    sources = distinct_images(work / "src", args.distinct, 8, 8)
    results = []
    kinds = []
    if args.rows:
        kinds.append(("manifest", args.rows))
    if args.folder_files:
        kinds.append(("folder", args.folder_files))
    for kind, count in kinds:
        per_kind = []
        for n in (100, count // 2, count):
            base = work / f"{kind}-{n}"
            rels = relpaths(n, by_class=kind == "folder")
            hard_links(base / "files", sources, rels)
            if kind == "manifest":
                write_manifest(base / "files" / "manifest.csv", rels)
                input_args = ["--manifest", str(base / "files" / "manifest.csv")]
            else:
                input_args = ["--input", str(base / "files")]
            result = run_plan(args.repo, input_args, work / "out", args.beam_args)
            result.update(kind=kind, files=n)
            if result["returncode"]:
                print(json.dumps(result), flush=True)
                return 1
            per_kind.append(result)
        small, half, big = per_kind
        big["rss_per_file_bytes"] = round((big["peak_rss_mb"] - small["peak_rss_mb"]) * 1e6 / (big["files"] - 100))
        big["rss_per_extra_file_bytes"] = round(
            (big["peak_rss_mb"] - half["peak_rss_mb"]) * 1e6 / (big["files"] - half["files"])
        )
        big["half_peak_rss_mb"] = half["peak_rss_mb"]
        big["half_seconds"] = half["seconds"]
        big["files_per_second"] = round(big["files"] / big["seconds"])
        big["baseline_peak_rss_mb"] = small["peak_rss_mb"]
        big["baseline_seconds"] = small["seconds"]
        print(json.dumps(big), flush=True)
        results.append(big)
    print(
        f"{'kind':<9} {'files':>9} {'wall s':>8} {'files/s':>8} {'peak RSS MB':>12} {'at half MB':>11} "
        f"{'RSS/file B':>11} {'half→full B/file':>17}"
    )
    for r in results:
        print(
            f"{r['kind']:<9} {r['files']:>9} {r['seconds']:>8} {r['files_per_second']:>8} "
            f"{r['peak_rss_mb']:>12} {r['half_peak_rss_mb']:>11} {r['rss_per_file_bytes']:>11} "
            f"{r['rss_per_extra_file_bytes']:>17}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0
