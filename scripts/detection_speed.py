"""CPU per image of a detection convert (``--coco``) against a classification convert of the same images (issue #21).

    .venv/bin/python scripts/detection_speed.py                      # 2,000 JPEGs of 512x384, 3 rounds
    .venv/bin/python scripts/detection_speed.py --images 1000 --repeat 2 --work /tmp/detspeed

One generated set (``make_sample_images.write_samples``: ~95 KB JPEGs, class
folders) and two COCO files naming every image with 0-8 objects each (seeded):
one with boxes only (no ``segmentation``), one with a polygon mask per object.
Three conversions of the same folder, each a fresh ``beam-pipeline convert``
process with ``--no-transform`` (TFT's analysis is the same for all three and
is not what is compared; every other flag is the default):

    (a) classification   labels from the class folders
    (b) --coco boxes     the boxes-only file
    (c) --coco masks     the polygon file (one PNG mask per object)

CPU is the whole process tree's (user + system of the reaped children,
``RUSAGE_CHILDREN``): on a shared machine a busy neighbour stretches wall time
but hardly the CPU a run needs. Start-up (imports, pipeline construction,
finalize) is cancelled by differencing a run on all images and a run on the
first ``--small`` of them; the rounds interleave the three modes so load
changes hit each alike. Each row prints ``uptime``'s load averages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sample_images import write_samples  # noqa: E402

# Non-contiguous ids, as COCO's.
CATEGORIES = [{"id": cid, "name": f"class{cid}"} for cid in (1, 2, 3, 5, 7, 11, 13, 17, 19, 23)]
MODES = ("classification", "coco-boxes", "coco-masks")


def list_images(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.jpg") if p.is_file())


def polygon(box: tuple[float, float, float, float], rng: np.random.Generator) -> list[float]:
    """A 12-point polygon inside ``box`` (x, y, w, h): an ellipse with jittered radii, as a COCO outline."""
    x, y, w, h = box
    angles = np.linspace(0, 2 * math.pi, 12, endpoint=False)
    radius = rng.uniform(0.7, 1.0, size=12)
    xs = x + w / 2 + np.cos(angles) * radius * w / 2
    ys = y + h / 2 + np.sin(angles) * radius * h / 2
    return [round(float(v), 2) for pair in zip(xs, ys, strict=True) for v in pair]


def polygon_area(flat: list[float]) -> float:
    xs, ys = np.array(flat[0::2]), np.array(flat[1::2])
    return float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2)


def make_coco(root: Path, files: list[Path], width: int, height: int, masks: bool, seed: int = 0) -> dict[str, Any]:
    """A COCO dict naming ``files`` (relative to ``root``) with 0-8 objects each; the same boxes for any ``masks``."""
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for image_id, path in enumerate(files, start=1):
        images.append({"id": image_id, "file_name": str(path.relative_to(root)), "width": width, "height": height})
        for _ in range(int(rng.integers(0, 9))):
            w, h = float(rng.uniform(16, width / 2)), float(rng.uniform(16, height / 2))
            x, y = float(rng.uniform(0, width - w)), float(rng.uniform(0, height - h))
            box = (round(x, 2), round(y, 2), round(w, 2), round(h, 2))
            outline = polygon(box, rng)
            ann = {
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": CATEGORIES[int(rng.integers(0, len(CATEGORIES)))]["id"],
                "bbox": list(box),
                "area": round(polygon_area(outline), 2),
                "iscrowd": 0,
            }
            if masks:
                ann["segmentation"] = [outline]
            annotations.append(ann)
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}


def subset(root: Path, files: list[Path], dest: Path) -> None:
    """``dest`` holds hard links to ``files`` at the same relative paths."""
    shutil.rmtree(dest, ignore_errors=True)
    for f in files:
        target = dest / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, target)


def load() -> str:
    """``uptime``'s load averages (1, 5, 15 min)."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def convert(folder: Path, out: Path, coco: Path | None, extra: list[str]) -> dict[str, float]:
    """One ``beam-pipeline convert`` process; CPU seconds of its process tree and wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "beam_pipeline", "convert", "--input", str(folder), "--output", str(out)]
    command += ["--no-transform", *extra]
    if coco is not None:
        command += ["--coco", str(coco)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"error: convert failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    info = json.loads((out / "dataset.json").read_text())
    records = sum(s["examples"] for s in info["splits"].values())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu": cpu, "wall": wall, "records": records}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000, help="images in the big run")
    p.add_argument("--small", type=int, default=200, help="images in the start-up run (subtracted)")
    p.add_argument("--size", default="512x384", help="WIDTHxHEIGHT of the generated JPEGs")
    p.add_argument("--repeat", type=int, default=3, help="rounds (each: small and big run of every mode)")
    p.add_argument("--work", default="", help="scratch folder, kept (default: a temp dir, removed)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    p.add_argument("extra", nargs="*", help="more convert flags, after --")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown mode(s) {', '.join(sorted(unknown))}")
    width, height = (int(v) for v in args.size.lower().split("x"))
    work = Path(args.work or tempfile.mkdtemp(prefix="detspeed-"))
    work.mkdir(parents=True, exist_ok=True)

    data = work / "images"
    if len(list_images(data)) < args.images:
        shutil.rmtree(data, ignore_errors=True)
        write_samples(str(data), math.ceil(args.images / 3), width, height, corrupt=False, jpeg_only=True)
    files = list_images(data)[: args.images]
    sets = {"big": (work / "big", files), "small": (work / "small", files[: args.small])}
    coco: dict[tuple[str, str], Path | None] = {}
    for name, (folder, chosen) in sets.items():
        subset(data, chosen, folder)
        for mode, masks in (("coco-boxes", False), ("coco-masks", True)):
            path = work / f"{name}-{mode}.json"
            path.write_text(json.dumps(make_coco(folder, list_images(folder), width, height, masks)))
            coco[(name, mode)] = path
        coco[(name, "classification")] = None
    nbytes = sum(f.stat().st_size for f in files)
    objs = len(json.loads(coco[("big", "coco-boxes")].read_text())["annotations"])  # type: ignore[arg-type]
    print(f"{len(files)} JPEGs of {width}x{height}, {nbytes / len(files) / 1e3:.0f} KB mean, {objs} objects "
          f"({objs / len(files):.1f} per image); start-up run: {args.small} images; "
          f"{os.cpu_count()} cores; convert --no-transform {' '.join(args.extra)}", flush=True)  # fmt: skip

    convert(sets["small"][0], work / "out", None, args.extra)  # warm-up: page cache, .pyc
    per_image: dict[str, list[float]] = {m: [] for m in modes}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    n = len(files) - args.small
    print("| round | mode | CPU ms / image | wall ms / image | big run CPU s | big run wall s | load (uptime) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for round_ in range(1, args.repeat + 1):
        for mode in modes:
            small = convert(sets["small"][0], work / "out", coco[("small", mode)], args.extra)
            big = convert(sets["big"][0], work / "out", coco[("big", mode)], args.extra)
            if big["records"] != len(files) or small["records"] != args.small:
                sys.exit(f"error: {mode}: {big['records']}/{small['records']} records, expected all images")
            cpu_ms, wall_ms = (big["cpu"] - small["cpu"]) / n * 1e3, (big["wall"] - small["wall"]) / n * 1e3
            per_image[mode].append(cpu_ms)
            walls[mode].append(wall_ms)
            print(f"| {round_} | {mode} | {cpu_ms:.2f} | {wall_ms:.2f} | {big['cpu']:.1f} | {big['wall']:.1f} "
                  f"| {load()} |", flush=True)  # fmt: skip
    print()
    print("| mode | CPU ms / image (median) | min | wall ms / image (median) | CPU vs classification |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(per_image["classification"]) if "classification" in per_image else None
    for mode in modes:
        med = statistics.median(per_image[mode])
        ratio = f"{med / base:.2f}" if base else "-"
        print(f"| {mode} | {med:.2f} | {min(per_image[mode]):.2f} | {statistics.median(walls[mode]):.2f} | {ratio} |")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
