"""Wall time of a small conversion (the demo's 180 images), start-up included, in each mode.

    .venv/bin/python scripts/benchmark.py startup --runs 5           # after scripts/demo.sh made samples/photos
    .venv/bin/python scripts/benchmark.py startup --input DIR --runs 3 --modes default no-transform

Each run is ``python -m beam_pipeline convert`` in a fresh process, as a user
starts it; the wall time is measured from outside (process start to exit),
and the summary's own "done in" is read back to check it reports the same.
Prints min and median per mode (the machine may be shared: look at both).
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, beam_pipeline, interleaved

MODES = {
    "default": [],
    "no-transform": ["--no-transform"],
    "no-transform-no-tfds": ["--no-transform", "--no-tfds-metadata"],
}


def one_run(input_dir: str, out: str, extra: list[str], repo: Path = REPO) -> tuple[float, float]:
    cmd = beam_pipeline("convert", "--config", "configs/local.yaml", "--input", input_dir, "--output", out,
                        "--split-ratios", "train=0.8,validation=0.1,test=0.1", "--overwrite", *extra)  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"convert failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    if proc.stderr.strip():
        print(f"  (stderr not empty: {proc.stderr.strip()[:200]!r})", file=sys.stderr)
    reported = float(re.search(r"done in ([0-9.]+) s", proc.stdout).group(1))
    return wall, reported


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="benchmark.py startup", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", default=str(REPO / "samples" / "photos"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--compare", metavar="CHECKOUT", help="also time another checkout (e.g. an older commit), interleaved"
    )
    args = parser.parse_args(argv)
    repos = {"": REPO} if not args.compare else {"this ": REPO, "other ": Path(args.compare).resolve()}

    def report(round_no: int, name: str, run: tuple[float, float]) -> None:
        print(f"run {round_no} {name:<28} wall {run[0]:5.2f} s  'done in {run[1]:.1f} s'", flush=True)

    with tempfile.TemporaryDirectory(prefix="beam_pipeline-startup-") as work:
        runs = {
            f"{tag}{mode}": functools.partial(one_run, args.input, f"{work}/{tag.strip()}{mode}", MODES[mode], repo)
            for tag, repo in repos.items()
            for mode in args.modes
        }
        results = interleaved(args.runs, runs, report)
    print(f"\n{'mode':<28} {'min':>6} {'median':>7}  (wall seconds, {args.runs} runs)")
    for mode, rows in results.items():
        walls = [w for w, _ in rows]
        print(f"{mode:<28} {min(walls):6.2f} {statistics.median(walls):7.2f}")
