"""Runs a command and reports its wall time and the peak RSS of its whole process tree.

    python scripts/measure_run.py -- python -m beam_pipeline convert --input big --output out

Prints one JSON line: {"seconds", "cpu_seconds", "peak_rss_mb", "root_peak_rss_mb", "load",
"returncode", "command"}. RSS is summed over the process and all its descendants
(Beam worker processes included), sampled every 50 ms; root_peak_rss_mb is the
started process alone (the launcher, without the workers it starts).
``cpu_seconds`` is user + system CPU of the process and the descendants it
waited for (``RUSAGE_CHILDREN``): on a shared machine a busy neighbour
stretches the wall time far more than the CPU a run needs. ``load`` is the
1-minute load average when the run ended.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import psutil


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def measure(command: list[str], interval: float = 0.05) -> dict[str, object]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(command)
    proc = psutil.Process(child.pid)
    peak = root_peak = 0
    while child.poll() is None:
        try:
            peak = max(peak, tree_rss(proc))
            root_peak = max(root_peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(interval)
    seconds = time.perf_counter() - started
    child.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "load": round(os.getloadavg()[0], 2),
        "peak_rss_mb": round(peak / 1e6, 1),
        "root_peak_rss_mb": round(root_peak / 1e6, 1),
        "returncode": child.returncode,
        "command": " ".join(command),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give a command after --")
    result = measure(command)
    print(json.dumps(result))
    return int(result["returncode"] or 0)


if __name__ == "__main__":
    sys.exit(main())
