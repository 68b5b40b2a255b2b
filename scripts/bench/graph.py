"""The TFT step's fixed cost, reused or not: a small job with defaults against ``--no-transform``, in one run.

    .venv/bin/python scripts/benchmark.py graph --rounds 3
    .venv/bin/python scripts/benchmark.py graph --input samples/photos --rounds 5

Each run is ``python -m beam_pipeline convert`` in a fresh process, timed from
outside, interleaved round by round (docs/benchmarks.md). The modes:

- ``no-transform``: the baseline, ``--no-transform`` (TFDS metadata on, as with defaults);
- ``cold``: defaults, an empty graph cache (the graph is built);
- ``cached``: defaults into another output, the graph in the cache;
- ``night-no-transform`` / ``night``: ``--incremental-from`` a previous night over the same inputs
  (nothing new to convert), the cache off: ``night`` takes the previous night's graph.

Prints the median wall time per mode and the ratios the issue sets targets for:
cold ≤ 1.8×, cached ≤ 1.15× and night ≤ 1.1× their ``--no-transform`` baselines.
Then the graph alone in a fresh process (imports, then ``run_analysis`` on the
first night's dataset): the least a cold run would take even if the graph
were built beside the conversion, in a process of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import interleaved, load, make_samples, measure_beam

# The graph alone: Beam and this package, TensorFlow and TFT, then the analysis; seconds of each on one line.
_GRAPH_ALONE = """
import os, sys, time
t0 = time.perf_counter()
from beam_pipeline.analysis import import_tft, run_analysis
from beam_pipeline.runner import make_options
from beam_pipeline.storage import read_json
from beam_pipeline.vocab.dataset_info import DatasetInfo
t1 = time.perf_counter()
import_tft()
t2 = time.perf_counter()
info = DatasetInfo.from_json(read_json(os.path.join(sys.argv[1], "dataset.json")))
options, runner = make_options([])
run_analysis(sys.argv[2], info, image_size=224, image_stats=False, options=options, runner=runner, temp_root=None)
t3 = time.perf_counter()
print(f"{t1 - t0:.2f} {t2 - t1:.2f} {t3 - t2:.2f}")
"""

TARGETS = {"cold": ("no-transform", 1.8), "cached": ("no-transform", 1.15), "night": ("night-no-transform", 1.1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="benchmark.py graph", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", help="a folder of class folders (default: 201 generated 640x480 JPEGs)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="beam_pipeline-graph-") as tmp:
        work = Path(tmp)
        source = Path(args.input) if args.input else work / "in"
        if not args.input:
            make_samples(source, per_class=67, jpeg_only=True)
        common = ["--input", str(source), "--split-ratios", "train=0.8,validation=0.1,test=0.1"]
        counter = iter(range(1_000_000))

        def convert(*extra: str, cache: str) -> float:
            out = work / f"out{next(counter)}"
            env = {**os.environ, "BEAM_PIPELINE_GRAPH_CACHE": cache}
            seconds = measure_beam("convert", *common, "--output", str(out), *extra, env=env)["seconds"]
            shutil.rmtree(out, ignore_errors=True)
            return seconds

        def cold() -> float:
            cache = tempfile.mkdtemp(dir=work, prefix="cache-")
            try:
                return convert(cache=cache)
            finally:
                shutil.rmtree(cache)

        warm = str(work / "warm-cache")
        night1, night1_nt = work / "night1", work / "night1-nt"
        env_off = {**os.environ, "BEAM_PIPELINE_GRAPH_CACHE": "off"}
        measure_beam("convert", *common, "--output", str(night1), env=env_off)
        measure_beam("convert", *common, "--output", str(night1_nt), "--no-transform", env=env_off)
        convert(cache=warm)  # fills the warm cache
        runs = {
            "no-transform": lambda: convert("--no-transform", cache="off"),
            "cold": cold,
            "cached": lambda: convert(cache=warm),
            "night-no-transform": lambda: convert("--no-transform", "--incremental-from", str(night1_nt), cache="off"),
            "night": lambda: convert("--incremental-from", str(night1), cache="off"),
        }

        def report(round_no: int, name: str, seconds: float) -> None:
            print(f"round {round_no} {name:<20} {seconds:6.2f} s  (load {load()})", flush=True)

        results = interleaved(args.rounds, runs, report)
        stage = work / "graph-alone"
        stage.mkdir()
        alone = subprocess.run(
            [sys.executable, "-c", _GRAPH_ALONE, str(night1), str(stage)],
            capture_output=True,
            text=True,
            check=True,
        )
        imports, tft_imports, analysis = (float(v) for v in alone.stdout.split())
    median = {name: statistics.median(values) for name, values in results.items()}
    print(f"\n{'mode':<20} {'median s':>9} {'min s':>7}")
    for name, values in results.items():
        print(f"{name:<20} {median[name]:9.2f} {min(values):7.2f}")
    print()
    for name, (baseline, target) in TARGETS.items():
        ratio = median[name] / median[baseline]
        verdict = "met" if ratio <= target else "NOT met"
        print(f"{name} / {baseline}: {ratio:.2f}x (target <= {target}x: {verdict})")
    total = imports + tft_imports + analysis
    print(
        f"\nthe graph alone in a fresh process: {total:.2f} s (Beam and this package {imports:.2f} s, TensorFlow and "
        f"TFT {tft_imports:.2f} s, the analysis {analysis:.2f} s): {total / median['no-transform']:.2f}x the "
        "--no-transform run, the least a cold run takes with the graph built beside it"
    )
