"""A run killed after most of its shards, then the same command again, vs a run never killed (issue #15).

    python scripts/benchmark.py resume --data bench-data --work /tmp/resbench --kill-after 0.8

``--data`` is a folder of class folders. Three runs, each its own process
measured by ``bench.common.measure``, ``--no-transform --no-tfds-metadata``,
defaults otherwise: a full run (the baseline), a run SIGKILLed right after
its shard writers finished ``--kill-after`` of the shards
(``BEAM_PIPELINE_FAILPOINTS=writer.result:K:kill``), and the same command
again, which takes the finished shards. Prints one JSON object; the resumed
output's shards, index and .idx files are compared byte for byte with the
baseline's.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
from pathlib import Path

from bench.common import measure_beam, published_shards


def measure(*args: str, env: dict[str, str] | None = None) -> dict:
    """One measured run; a failed (or killed) one too: its returncode says it."""
    return measure_beam(*args, env=env, check=False)


def published(out: Path) -> list[str]:
    """The shard, index and .idx files of an output, relative to it."""
    shards = published_shards(out)
    return [*shards, "index.jsonl", "rejects.jsonl", *(f"idx/{f}.idx" for f in shards if (out / "idx").exists())]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="benchmark.py resume", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--kill-after", type=float, default=0.8, help="share of the shards finished before the kill")
    a = p.parse_args(argv)
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    common = ["--input", str(Path(a.data).resolve()), "--no-transform", "--no-tfds-metadata", "--name", "bench"]

    full = measure("convert", *common, "--output", str(work / "full"))
    if full["returncode"] != 0:
        raise SystemExit("the full run failed")
    files = published(work / "full")
    info = json.loads((work / "full" / "dataset.json").read_text())
    shards = sum(s["num_shards"] for s in info["splits"].values())
    kill_at = max(1, min(shards - 1, round(shards * a.kill_after)))

    env = {**os.environ, "BEAM_PIPELINE_FAILPOINTS": f"writer.result:{kill_at}:kill"}
    killed = measure("convert", *common, "--output", str(work / "out"), env=env)
    if killed["returncode"] == 0:
        raise SystemExit("the run to kill finished")
    resumed = measure("convert", *common, "--output", str(work / "out"))
    if resumed["returncode"] != 0:
        raise SystemExit("the resumed run failed")
    again = json.loads((work / "out" / "dataset.json").read_text())
    same = all(filecmp.cmp(work / "full" / f, work / "out" / f, shallow=False) for f in files)
    print(
        json.dumps(
            {
                "examples": info["examples"],
                "bytes": info["bytes"],
                "shards": shards,
                "killed_after_shards": kill_at,
                "full_s": full["seconds"],
                "killed_run_s": killed["seconds"],
                "resumed_s": resumed["seconds"],
                "resumed_over_full": round(resumed["seconds"] / full["seconds"], 3),
                "killed_plus_resumed_over_full": round((killed["seconds"] + resumed["seconds"]) / full["seconds"], 3),
                "full_peak_rss_mb": full["peak_rss_mb"],
                "resumed_peak_rss_mb": resumed["peak_rss_mb"],
                "resumed": again.get("resumed"),
                "identical_files": same,
            },
            indent=2,
        )
    )
