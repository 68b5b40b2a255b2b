"""Past one interpreter: CPU and GIL-held ms per image, the ceiling they set, and the rates on 1 and 2 processes.

    .venv/bin/python scripts/benchmark.py cores                        # 4,002 generated 640x480 JPEGs
    .venv/bin/python scripts/benchmark.py cores --input DIR --rounds 3 --work bench-cores

In one run, on the same files:

1. ``convert --no-transform --no-tfds-metadata`` in one process (in_memory, 1 worker) under
   ``py-spy record --gil --nonblocking`` (it samples only while a thread holds the GIL): GIL-held seconds
   of a run over the whole set and over a quarter of it. The difference per image is the steady GIL-held
   time per image, start-up cancelled.
2. The same runs without py-spy, on 1 process and on 2 worker processes (multi_processing), interleaved
   round by round: CPU (the process tree's) and wall time, whole set and quarter; their differences give
   the steady CPU ms per image and the steady rates, and the quarter's wall time less its images at the
   steady rate the fixed cost of each way.

The single-process ceiling is CPU ms over GIL-held ms per image: how many cores one interpreter can keep
busy. ``runner.local_processes`` picks the local default's processes from the same two numbers.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from beam_pipeline import runner
from bench.common import (
    beam_pipeline,
    interleaved,
    link_files,
    list_images,
    load,
    make_samples,
    measure_beam,
    scratch,
    steady_ms,
    steady_rate,
)

QUICK = ["--no-transform", "--no-tfds-metadata", "--max-reject-fraction", "1"]
ONE = ["--direct_running_mode", "in_memory", "--direct_num_workers", "1"]
TWO = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
RATE = 250  # py-spy samples per second


def gil_seconds(source: Path, out: Path) -> float:
    """GIL-held seconds of one conversion in one process, by py-spy's GIL-only sampling."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("error: py-spy is not installed (pip install py-spy): it measures the GIL-held time")
    raw = out.with_suffix(".spy")
    command = [spy, "record", "--gil", "--nonblocking", "--rate", str(RATE), "--format", "raw", "--output", str(raw)]
    command += ["--", *beam_pipeline("convert", "--input", str(source), "--output", str(out), *QUICK, *ONE)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = 0
    for line in raw.read_text().splitlines():
        count = line.rsplit(" ", 1)[-1]
        samples += int(count) if count.isdigit() else 0
    shutil.rmtree(out, ignore_errors=True)
    return samples / RATE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="benchmark.py cores", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", help="a folder of class folders (default: generated 640x480 JPEGs)")
    parser.add_argument("--images", type=int, default=4002, help="how many to generate (default 4002)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", default="", help="keep the generated data here (made once)")
    args = parser.parse_args(argv)

    with scratch(args.work, "beam_pipeline-cores-") as work:
        big = Path(args.input) if args.input else work / "big"
        if not args.input and not big.exists():
            make_samples(big, per_class=args.images // 3, jpeg_only=True)
        files = list_images(big)
        small = link_files(files[::4], big, work / "small")
        n_big, n_small = len(files), len(list_images(small))
        mb = sum(f.stat().st_size for f in files) / 1e6
        print(f"{n_big:,} images ({mb:,.0f} MB) and a quarter of them ({n_small:,}); {runner.usable_cores()} cores")

        gil = {name: gil_seconds(src, work / f"spy-{name}") for name, src in (("big", big), ("small", small))}
        counter = iter(range(1_000_000))

        def run(source: Path, extra: list[str]) -> dict:
            out = Path(tempfile.mkdtemp(dir=work, prefix=f"out{next(counter)}-"))
            result = measure_beam("convert", "--input", str(source), "--output", str(out / "o"), *QUICK, *extra)
            shutil.rmtree(out, ignore_errors=True)
            return result

        runs = {
            "1 process, all": lambda: run(big, ONE),
            "1 process, quarter": lambda: run(small, ONE),
            "2 processes, all": lambda: run(big, TWO),
            "2 processes, quarter": lambda: run(small, TWO),
        }

        def report(round_no: int, name: str, r: dict) -> None:
            print(
                f"round {round_no} {name:<22} {r['seconds']:6.2f} s wall  {r['cpu_seconds']:6.2f} s CPU  "
                f"{r['peak_rss_mb']:6.0f} MB peak  (load {load()})",
                flush=True,
            )

        results = interleaved(args.rounds, runs, report)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    images = n_big - n_small
    gil_ms = steady_ms(gil["big"], gil["small"], images)
    cpu_ms = steady_ms(med("1 process, all", "cpu_seconds"), med("1 process, quarter", "cpu_seconds"), images)
    ceiling = cpu_ms / gil_ms if gil_ms > 0 else math.nan
    print(f"\nGIL held: {gil['big']:.2f} s (all), {gil['small']:.2f} s (quarter): {gil_ms:.3f} ms per image")
    print(f"CPU: {cpu_ms:.3f} ms per image (one process, steady)")
    print(f"single-process ceiling: {ceiling:.1f} cores (CPU / GIL-held); {1000 / gil_ms:,.0f} images/s at most")
    cores = runner.usable_cores()
    constants = f"{runner.CPU_MS_PER_IMAGE} / {runner.GIL_MS_PER_IMAGE} ms"
    print(f"the local default here: {runner.local_processes(cores)} process(es) on {cores} cores ({constants})")
    for label in ("1 process", "2 processes"):
        wall_all, wall_quarter = med(f"{label}, all", "seconds"), med(f"{label}, quarter", "seconds")
        rate = steady_rate(wall_all, wall_quarter, images)
        fixed = wall_quarter - n_small / rate if rate > 0 else math.nan
        cpu = steady_ms(med(f"{label}, all", "cpu_seconds"), med(f"{label}, quarter", "cpu_seconds"), images)
        peak = med(f"{label}, all", "peak_rss_mb")
        print(f"{label:<12} steady {rate:7.0f} images/s, fixed cost {fixed:5.1f} s, CPU {cpu:.3f} ms/image, "
              f"whole set {wall_all:.1f} s, peak RSS {peak:.0f} MB")  # fmt: skip
