"""Scale check for ``--coco``: a generated COCO file with up to 1 M annotations, converted; wall time and RSS.

Not part of the test suite (minutes of machine time). The images are a few
hundred distinct small JPEGs, each hard-linked under many names, so every
COCO ``images`` entry is a real file the pipeline lists, reads, checks and
writes. Each image gets ``--per-image`` box annotations (no masks: this
measures the join, not PNG encoding); ``categories`` come last in the file,
as in COCO's own files, so reading them streams past everything else.

    python scripts/benchmark.py coco-scale --work /tmp/coco_scale                       # 100k images x 10
    python scripts/benchmark.py coco-scale --work /tmp/coco_scale --images 20000 --per-image 5 50

For each ``--per-image`` value it measures (``bench.common.measure``, RSS sampled
every 50 ms) the launcher's own read of the file (``read_categories``, what
``convert`` runs before it builds the job) and the whole ``convert`` with
default flags: wall seconds, peak RSS of the process tree, of the launcher
process alone, and the file's size. One JSON line per run and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from bench.common import beam_pipeline, distinct_images, hard_links, measure

CATEGORIES = [{"id": cid, "name": f"class_{cid}"} for cid in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89)]
WIDTH, HEIGHT = 64, 48


def write_coco(path: Path, names: list[str], per_image: int) -> int:
    """A COCO instances file, written as a stream (never one dict in memory); returns its annotation count."""
    import random

    rng = random.Random(per_image)
    ann_id = 0
    with open(path, "w") as fh:
        fh.write('{"info": {"description": "coco_scale_check"}, "images": [')
        for i, name in enumerate(names):
            sep = "," if i else ""
            fh.write(f'{sep}{{"id": {i + 1}, "file_name": "{name}", "width": {WIDTH}, "height": {HEIGHT}}}')
        fh.write('], "annotations": [')
        for i in range(len(names)):
            for _ in range(per_image):
                ann_id += 1
                x, y = rng.uniform(0, WIDTH - 9), rng.uniform(0, HEIGHT - 9)
                w, h = rng.uniform(1, WIDTH - x), rng.uniform(1, HEIGHT - y)
                cat = CATEGORIES[ann_id % len(CATEGORIES)]["id"]
                box = f"[{x:.2f}, {y:.2f}, {w:.2f}, {h:.2f}]"
                ann = (
                    f'{{"id": {ann_id}, "image_id": {i + 1}, "category_id": {cat}, "bbox": {box}, '
                    f'"area": {w * h:.2f}, "iscrowd": 0}}'
                )
                fh.write(("," if ann_id > 1 else "") + ann)
        fh.write('], "categories": ' + json.dumps(CATEGORIES) + "}")
    return ann_id


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py coco-scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--work", required=True, help="folder for the generated files (images kept between runs)")
    p.add_argument("--images", type=int, default=100_000)
    p.add_argument("--per-image", type=int, nargs="+", default=[10], help="annotations per image; one run each")
    p.add_argument("--distinct", type=int, default=500, help="distinct JPEGs behind the links")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    work = Path(args.work).resolve()
    sources = distinct_images(work / "src", args.distinct, WIDTH, HEIGHT, ".jpg")
    root = work / f"images-{args.images}"
    names = [f"{i // 1000:04d}/{i:07d}.jpg" for i in range(args.images)]
    hard_links(root, sources, names)
    results = []
    for per_image in args.per_image:
        coco = work / f"instances-{args.images}x{per_image}.json"
        if not coco.exists():
            write_coco(coco, names, per_image)
        launcher = measure(
            [sys.executable, "-c", f"from beam_pipeline.annotations.coco import read_categories as r; r({str(coco)!r})"]
        )
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        job = measure(beam_pipeline("convert", "--input", str(root), "--coco", str(coco), "--output", str(out)))
        info = json.loads((out / "dataset.json").read_text()) if (out / "dataset.json").exists() else {}
        result = {
            "images": args.images,
            "annotations": args.images * per_image,
            "coco_mb": round(coco.stat().st_size / 1e6, 1),
            "read_categories": launcher,
            "convert": job,
            "records": info.get("examples"),
            "objects": info.get("objects"),
            "uptime": os.popen("uptime").read().strip(),
        }
        print(json.dumps(result), flush=True)
        results.append(result)
        if job["returncode"] or launcher["returncode"]:
            return 1
    print(
        f"\n{'annotations':>12} {'file MB':>8} {'categories s':>13} {'its RSS MB':>11} "
        f"{'convert s':>10} {'tree peak MB':>13} {'launcher peak MB':>17}"
    )
    for r in results:
        cat, job = r["read_categories"], r["convert"]
        print(
            f"{r['annotations']:>12,} {r['coco_mb']:>8} {cat['seconds']:>13} {cat['peak_rss_mb']:>11} "
            f"{job['seconds']:>10} {job['peak_rss_mb']:>13} {job['root_peak_rss_mb']:>17}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0
