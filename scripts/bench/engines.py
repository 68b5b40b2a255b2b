"""The same data converted locally and on the local Flink cluster (scripts/cluster.sh), in one run.

    .venv/bin/python scripts/benchmark.py engines --per-class 300      # 900 JPEGs of 640x480
    .venv/bin/python scripts/benchmark.py engines --per-class 300 --engine spark

Starts the cluster if it is not running (``cluster.sh ENGINE start``), then runs, interleaved and ``--rounds``
times each: a tiny job on the cluster (its fixed cost: submission, translation, worker start), the full job on
the cluster, and the full job on the local runner. Each run's process tree is sampled every 0.2 s: for a local
run the convert process and its children, for a cluster run the convert process plus every process of the
cluster (JVMs, job server, worker pool and its SDK workers). Printed per run: wall time, CPU seconds, peak RSS
of the tree (the cluster's idle RSS is printed on its own), images/s, images/s per slot, and the marginal rate
per slot once the fixed cost is taken off, which is what a cluster of N such slots scales by.
CPU of a process that ends between two samples is counted up to its last sample (under 0.2 s each).
Data lives under .cluster/shared/bench (outside /tmp: the workers have their own /tmp).
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import (
    REPO,
    TreeSampler,
    beam_pipeline,
    cluster_sessions,
    idle_rss,
    interleaved,
    make_samples,
    markdown_table,
)

CLUSTER = str(REPO / "scripts" / "cluster.sh")
SLOTS = 2


def run(label: str, args: list[str], sessions: set[int], images: int) -> dict[str, float | str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = beam_pipeline("convert", *args, "--overwrite")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    sampler = TreeSampler(sessions | {proc.pid}, running=sessions)
    _, err = proc.communicate()
    wall = time.monotonic() - started
    cpu, peak = sampler.stop()
    if proc.returncode:
        raise SystemExit(f"{label} failed: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}")
    return {"run": label, "images": images, "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmark.py engines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("flink", "spark"), default="flink")
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    base = Path(os.environ.get("BEAM_CLUSTER_HOME") or REPO / ".cluster") / "shared" / "bench"
    data, tiny = base / f"photos-{args.per_class}", base / "tiny"
    for folder, per_class in ((data, args.per_class), (tiny, 4)):
        if not folder.exists():
            make_samples(folder, per_class, "640x480")
    images = 3 * args.per_class
    started = subprocess.run([CLUSTER, args.engine, "start"], capture_output=True, text=True)
    if started.returncode:
        raise SystemExit(started.stderr.strip())
    options = shlex.split(started.stdout.strip())
    sessions = cluster_sessions(args.engine)
    common = ["--split-ratios", "train=0.8,validation=0.1,test=0.1", "--no-transform", "--no-tfds-metadata"]
    idle = idle_rss(sessions)
    out = base / "out"

    def job(label: str, folder: Path, dest: str, engine_options: list[str], watched: set[int], n: int) -> Callable:
        flags = ["--input", str(folder), "--output", str(out / dest), *common, *engine_options]
        return functools.partial(run, label, flags, watched, n)

    runs = {  # the cluster's fixed cost (a tiny job), the job on the cluster, the job on the local runner
        "tiny": job(f"{args.engine} tiny", tiny, "tiny", options, sessions, 12),
        "engine": job(args.engine, data, "engine", options, sessions, images),
        "local": job("local", data, "local", [], set(), images),
    }
    by_kind = interleaved(args.rounds, runs)
    rows = [row for rounds in zip(*by_kind.values(), strict=True) for row in rounds]
    shutil.rmtree(out, ignore_errors=True)

    print(f"{images} images of 640x480, {os.cpu_count()} cores; {args.engine} cluster idle RSS {idle / 2**20:.0f} MB")
    table = []
    for row in rows:
        rate = row["images"] / row["wall_s"]
        per_slot = f"{rate / SLOTS:.1f}" if row["run"] != "local" else "-"
        table.append((row["run"], row["images"], f"{row['wall_s']:.1f}", f"{row['cpu_s']:.1f}",
                      f"{row['peak_rss_mb']:.0f}", f"{rate:.1f}", per_slot))  # fmt: skip
    header = ("run", "images", "wall s", "CPU s", "peak RSS MB", "img/s", "img/s per slot")
    print(markdown_table(header, table, right=len(header)))  # as before: no column right-aligned
    fixed = statistics.median(r["wall_s"] for r in rows if r["run"].endswith("tiny"))
    full = statistics.median(r["wall_s"] for r in rows if r["run"] == args.engine)
    local = statistics.median(r["wall_s"] for r in rows if r["run"] == "local")
    print(f"\nmedians: {args.engine} {full:.1f} s (fixed cost, the tiny job: {fixed:.1f} s), local {local:.1f} s")
    if full - fixed < 0.2 * full:
        print("the full job is within the fixed cost's noise: use more images (--per-class) for a marginal rate")
    else:
        marginal = images / (full - fixed) / SLOTS
        print(
            f"marginal rate {marginal:.1f} img/s per slot: N slots convert about {marginal:.0f}*N images/s "
            f"after the fixed {fixed:.0f} s"
        )
    return 0
