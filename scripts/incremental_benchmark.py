"""Full run vs ``--incremental-from`` run after adding new images (issue #15).

    python scripts/incremental_benchmark.py --data bench-data --new new-images --work /tmp/incbench/runs

``--data`` is a folder of class folders; ``--new`` one of the same shape
whose files are added (hard-linked) into a copy of ``--data`` between the
runs. Three runs, each a separate process measured by ``measure_run.py``:
the first full run (the previous dataset), a full run over the grown set
(with the incremental run's labels.txt), and the incremental run. Prints one
JSON object; the two outputs' shards are compared byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def link_tree(src: Path, dst: Path) -> int:
    """Hard-links every file of ``src`` under ``dst`` (same relative path); returns how many."""
    n = 0
    for root, _, files in os.walk(src):
        for name in files:
            target = dst / Path(root).relative_to(src) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(Path(root) / name, target)
            n += 1
    return n


def measure(*args: str) -> dict:
    cmd = [sys.executable, str(HERE / "measure_run.py"), "--", sys.executable, "-m", "beam_pipeline", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=HERE.parent).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if result["returncode"] != 0:
        raise SystemExit(f"failed: {' '.join(args)}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    base = link_tree(Path(a.data), src)
    common = ["--no-transform", "--no-tfds-metadata", "--name", "bench", "--seed", "1"]
    first = measure("convert", "--input", str(src), "--output", str(work / "first"), *common)
    added = link_tree(Path(a.new), src)
    previous = str(work / "first")
    inc_out = str(work / "inc")
    inc = measure("convert", "--input", str(src), "--output", inc_out, *common, "--incremental-from", previous)
    labels = str(work / "inc" / "labels.txt")
    full = measure("convert", "--input", str(src), "--output", str(work / "full"), *common, "--labels-file", labels)
    info = json.loads((work / "inc" / "dataset.json").read_text())
    shards = [s["file"] for split in info["splits"].values() for s in split["shards"]]
    same = all(filecmp.cmp(work / "inc" / f, work / "full" / f, shallow=False) for f in shards)
    print(
        json.dumps(
            {
                "files_before": base,
                "files_added": added,
                "bytes": info["bytes"],
                "first_full_s": first["seconds"],
                "full_s": full["seconds"],
                "incremental_s": inc["seconds"],
                "full_peak_rss_mb": full["peak_rss_mb"],
                "incremental_peak_rss_mb": inc["peak_rss_mb"],
                "incremental": info["incremental"],
                "shards_identical": same,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
