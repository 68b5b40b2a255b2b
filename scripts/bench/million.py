"""Many small images: 80k, 320k and 1 M tiles, local and on the local Flink cluster, in one run.

    .venv/bin/python scripts/benchmark.py million --data /work/mil-data                 # 80k, 320k, 1 M; both
    .venv/bin/python scripts/benchmark.py million --data /work/mil-data --sizes 80000 320000 --runner local
    .venv/bin/python scripts/benchmark.py million --data /work/mil-data --sizes 1000000 --mode defaults

The tiles are 96x96 JPEGs of about 2.4 KB (soft gradients and a few blocks, like map or microscopy tiles,
each distinct) in 10 class folders. The 1 M set is made once under ``--data``; the smaller sets are hard
links to its first files (no second copy on disk). Each run is ``convert --no-transform`` with
``--near-duplicates off`` (``--mode off``, the default) or at the defaults (``--mode defaults``), and is
measured from outside: wall time, images per second, CPU seconds and the peak RSS of its process tree,
the cluster's processes included for a Flink run (JobManager, TaskManager, job server, worker pool and its
SDK workers; the cluster's idle RSS is printed too). Printed per run: one JSON line, then a table.

Flink: the cluster is started if it is not running (``scripts/cluster.sh flink start``, before each Flink run,
so a cluster that died in one run is there for the next) and left running at the end, so that later runs
compare warm (a last line says so; ``--stop-cluster`` stops it, as ``scripts/cluster.sh flink stop`` does: a
cluster left running holds the ports the test suite's own cluster needs). Every process of the convert's
session and of the cluster's sessions is sampled every 0.2 s from /proc (an SDK worker started by the worker
pool is in the pool's session); the CPU of a process that ends between two samples is counted up to its last
sample (under 0.2 s each). RSS in MB and KB is 2^20 and 2^10 bytes. ``cluster_idle_rss_mb`` is the cluster's
RSS just before the run (JVM heaps and SDK workers a job left behind grow it from one run to the next);
``peak_rss_mb`` includes it.

Each run writes to ``<data>/out-<runner>-<size>``, removed after the run (a 1 M run's output is ~2.5 GB)
unless ``--keep-output``. The Flink cluster is shared: ``cluster_jobs`` is how many jobs it ran during the run
(its REST API), 1 when it ran only this one; a note follows the table otherwise. A failed run is reported
(``returncode``, ``error``: the last line of its stderr) and the next one runs. At the end: a table, and per
runner the peak RSS added per image from one size to the next (KB per image) and, for Flink, the peak RSS at
the largest size over the smallest. ``--out-json`` appends the JSON lines to a file as well.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from cluster import port  # scripts/cluster.py (scripts/benchmark.py puts scripts/ on sys.path)

from bench.common import (
    REPO,
    TreeSampler,
    beam_pipeline,
    cluster_sessions,
    emit_json,
    idle_rss,
    load,
    make_tiles,
    markdown_table,
    tile_subset,
)

CLUSTER = str(REPO / "scripts" / "cluster.sh")
MB = 2**20


# --- a process tree by sessions, sampled from /proc (as bench/engines.py does; modules share only common) ------


# --- the runs -------------------------------------------------------------------------------------


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def start_flink() -> tuple[list[str], str]:
    """The Beam options of the running Flink cluster (started if need be), or ([], the error) if it will not start."""
    started = subprocess.run([CLUSTER, "flink", "start"], capture_output=True, text=True)
    if started.returncode:
        return [], _last_line(started.stderr) or f"cluster.sh flink start: exit {started.returncode}"
    return shlex.split(_last_line(started.stdout)), ""


def flink_jobs(since: float, until: float) -> int | None:
    """How many jobs the Flink cluster ran between ``since`` and ``until`` (epoch seconds), from its REST API;
    None if it does not answer. 1 for a run that had the cluster to itself: the cluster is shared (tests, other
    benchmarks), and another job's CPU and RSS would be counted as this run's."""
    url = f"http://127.0.0.1:{port('FLINK_REST_PORT')}/jobs/overview"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            jobs = json.loads(response.read())["jobs"]
    except (OSError, ValueError, KeyError):
        return None
    # times in ms; end-time is -1 while a job runs
    return sum(
        1 for j in jobs if j["start-time"] < until * 1000 and (j["end-time"] < 0 or j["end-time"] > since * 1000)
    )


def convert(runner: str, mode: str, folder: Path, images: int, out: Path) -> dict[str, Any]:
    """One measured ``convert`` of ``folder`` into ``out``: the JSON line's fields."""
    row: dict[str, Any] = {"runner": runner, "mode": mode, "images": images}
    args = ["convert", "--input", str(folder), "--output", str(out), "--no-transform", "--overwrite"]
    args += ["--near-duplicates", "off"] if mode == "off" else []
    cluster: set[int] = set()
    if runner == "flink":
        options, error = start_flink()
        if error:  # reported as a failed run; the next run tries again
            nothing = dict.fromkeys(("cluster_idle_rss_mb", "cluster_jobs", "wall_s", "images_per_s", "cpu_s"))
            return {**row, **nothing, "peak_rss_mb": None, "returncode": None, "error": error}
        args += options
        cluster = cluster_sessions("flink")
        row["cluster_idle_rss_mb"] = round(idle_rss(cluster) / MB, 1)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryFile() as err:  # stderr can be long (a Flink job's log): a file, not a pipe
        since = time.time()
        started = time.monotonic()
        proc = subprocess.Popen(
            beam_pipeline(*args), env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        sampler = TreeSampler(cluster | {proc.pid}, running=cluster)  # its own session: its pid
        try:
            proc.wait()
        except BaseException:  # Ctrl-C: end the convert (its own session misses the terminal's signal) first
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
        wall = time.monotonic() - started
        cpu, peak = sampler.stop()
        err.seek(max(0, err.seek(0, os.SEEK_END) - 4000))
        tail = err.read().decode(errors="replace")
    if runner == "flink":
        row["cluster_jobs"] = flink_jobs(since, time.time())
    ok = proc.returncode == 0
    return {
        **row,
        "wall_s": round(wall, 1),
        "images_per_s": round(images / wall, 1) if ok else None,
        "cpu_s": round(cpu, 1),
        "peak_rss_mb": round(peak / MB, 1),
        "returncode": proc.returncode,
        "error": None if ok else _last_line(tail) or f"exit {proc.returncode}",
    }


def commit() -> str:
    """The checkout's short commit, "+dirty" when a tracked file is changed."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    dirty = any(line and not line.startswith("??") for line in status.stdout.splitlines())
    return (head.stdout.strip() or "unknown") + ("+dirty" if dirty else "")


def growth(rows: list[dict[str, Any]]) -> list[str]:
    """Per runner with two sizes or more that succeeded: peak RSS added per image (KB) from one size to the next;
    for Flink, the peak RSS at the largest size over the smallest."""
    lines = []
    for runner in ("local", "flink"):
        done = sorted((r["images"], r["peak_rss_mb"]) for r in rows if r["runner"] == runner and r["returncode"] == 0)
        if len(done) < 2:
            continue
        for (n_a, rss_a), (n_b, rss_b) in itertools.pairwise(done):
            per_image = (rss_b - rss_a) * 1024 / (n_b - n_a)  # MB → KB
            lines.append(f"{runner}: {n_a:,} → {n_b:,} images: peak RSS {rss_a:,.0f} → {rss_b:,.0f} MB, "
                         f"{per_image:+.2f} KB per image")  # fmt: skip
        if runner == "flink":
            (n_a, rss_a), (n_b, rss_b) = done[0], done[-1]
            lines.append(f"flink: peak RSS at {n_b:,} images / at {n_a:,}: {rss_b / rss_a:.2f}x")
    return lines


def warm(folder: Path) -> None:
    """Reads every tile once, so each run finds them in the page cache: a cold read of a million small files
    costs a random disk read each and made a 320k run I/O-bound (~750 tiles/s, 601 s against 214 s warm)."""
    started = time.monotonic()
    files = [str(p) for p in folder.rglob("*.jpg")]
    chunks = [files[i : i + 2000] for i in range(0, len(files), 2000)]
    for chunk in chunks:
        subprocess.run(["cat", *chunk], stdout=subprocess.DEVNULL, check=True)
    print(f"warmed {len(files):,} tiles into the page cache in {time.monotonic() - started:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmark.py million", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / ".cluster" / "shared" / "bench" / "million")
    parser.add_argument("--sizes", type=int, nargs="+", default=[80_000, 320_000, 1_000_000])
    parser.add_argument("--runner", choices=("local", "flink", "both"), default="both")
    parser.add_argument("--mode", choices=("off", "defaults"), default="off")
    parser.add_argument("--make-only", action="store_true", help="make the tiles and stop")
    parser.add_argument("--keep-output", action="store_true", help="keep each run's output (removed by default)")
    parser.add_argument("--out-json", type=Path, help="also append the JSON lines to this file")
    parser.add_argument("--stop-cluster", action="store_true", help="stop the Flink cluster at the end")
    args = parser.parse_args(argv)
    full = make_tiles(args.data, max(args.sizes))
    made = max(int(m.name.rsplit("-", 1)[1]) for m in args.data.glob(".complete-tiles-[0-9]*"))
    # the full set only where it is the size asked for: a 1 M set made earlier is not the 320k set
    sets = {n: full if n == made else tile_subset(args.data, full, n) for n in args.sizes}
    warm(full)
    if args.make_only:
        return 0

    runners = ["local", "flink"] if args.runner == "both" else [args.runner]
    print(f"load {load()}; commit {commit()}; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {os.cpu_count()} cores")
    rows = []
    for size in sorted(set(args.sizes)):
        for runner in runners:
            out = args.data / f"out-{runner}-{size}"
            try:
                row = convert(runner, args.mode, sets[size], size, out)
            finally:
                if not args.keep_output:  # the disk is limited: a 1 M run writes ~2.5 GB
                    shutil.rmtree(out, ignore_errors=True)
            rows.append(row)
            emit_json(row, args.out_json)

    def cell(value: object, fmt: str = "{:,.1f}") -> str:
        return "-" if value is None else fmt.format(value)

    header = ("runner", "mode", "images", "wall s", "img/s", "CPU s", "peak RSS MB", "cluster idle MB", "exit")
    table = [(r["runner"], r["mode"], f"{r['images']:,}", cell(r["wall_s"]), cell(r["images_per_s"]),
              cell(r["cpu_s"]), cell(r["peak_rss_mb"], "{:,.0f}"), cell(r.get("cluster_idle_rss_mb"), "{:,.0f}"),
              cell(r["returncode"], "{}")) for r in rows]  # fmt: skip
    print()
    print(markdown_table(header, table, right=2))
    for line in growth(rows):
        print(line)
    for r in rows:
        if r.get("cluster_jobs", 1) != 1:  # None: the REST API did not answer
            print(f"note: flink {r['images']:,}: {r['cluster_jobs']} jobs on the cluster during the run, not 1: "
                  "another job's slots, CPU and RSS are in its numbers")  # fmt: skip
        if r["error"]:
            print(f"failed: {r['runner']} {r['images']:,}: {r['error']}")
    if "flink" in runners:
        if args.stop_cluster:
            subprocess.run([CLUSTER, "flink", "stop"], check=False)
        else:
            print("the Flink cluster is still running: scripts/cluster.sh flink stop (or --stop-cluster) stops it")
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
