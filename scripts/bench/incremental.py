"""Full run vs ``--incremental-from`` run after adding new images (issue #15).

    python scripts/benchmark.py incremental --data bench-data --new new-images --work /tmp/incbench/runs

``--data`` is a folder of class folders; ``--new`` one of the same shape
whose files are added (hard-linked) into a copy of ``--data`` between the
runs. Three runs, each a separate process measured by ``bench.common.measure``:
the first full run (the previous dataset), a full run over the grown set
(with the incremental run's labels.txt), and the incremental run. Prints one
JSON object; the two outputs' shards are compared byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
from pathlib import Path

from bench.common import link_tree, published_shards
from bench.common import measure_beam as measure


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="benchmark.py incremental", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args(argv)
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
    same = all(filecmp.cmp(work / "inc" / f, work / "full" / f, shallow=False) for f in published_shards(work / "inc"))
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
