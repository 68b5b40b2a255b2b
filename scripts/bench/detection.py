"""CPU per image of a detection convert (``--coco``) against a classification convert of the same images (issue #21).

    .venv/bin/python scripts/benchmark.py detection                      # 2,000 JPEGs of 512x384, 3 rounds
    .venv/bin/python scripts/benchmark.py detection --images 1000 --repeat 2 --work /tmp/detspeed

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

``--parts`` then times, in this process on one thread, each piece of work a
``--coco`` boxes run does per image beyond classification, whatever the code
around it: the launcher's scan of the file, streaming its two sections, the
join and checks, pickling the annotations as the pipeline's shuffles carry them
(the raw JSON by image id, the checked image by file name, the ref with its
annotations to its shard), the object keys and the longer Example, the
annotation digest. Their sum over classification's CPU per image (same run) is
the least a streamed join of boxes could cost with no Beam overhead at all.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from make_sample_images import write_samples  # scripts/ is on sys.path (scripts/benchmark.py puts it there)

from bench.common import (
    interleaved,
    link_files,
    list_images,
    load,
    markdown_table,
    measure_beam,
    scratch,
    steady_ms,
)

# Non-contiguous ids, as COCO's.
CATEGORIES = [{"id": cid, "name": f"class{cid}"} for cid in (1, 2, 3, 5, 7, 11, 13, 17, 19, 23)]
MODES = ("classification", "coco-boxes", "coco-masks")


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


def convert(folder: Path, out: Path, coco: Path | None, extra: list[str]) -> dict[str, float]:
    """One ``beam-pipeline convert`` process; CPU seconds of its process tree and wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    coco_args = ["--coco", str(coco)] if coco is not None else []
    run = measure_beam("convert", "--input", str(folder), "--output", str(out), "--no-transform", *extra, *coco_args)
    info = json.loads((out / "dataset.json").read_text())
    records = sum(s["examples"] for s in info["splits"].values())
    return {"cpu": run["cpu_seconds"], "wall": run["seconds"], "records": records}


def _best_ms(work: Any, count: int, repeat: int = 3) -> float:
    """The least CPU ms per item of ``work()`` (this thread) over ``repeat`` tries."""
    best = math.inf
    for _ in range(repeat):
        started = time.thread_time()
        work()
        best = min(best, time.thread_time() - started)
    return best / count * 1e3


def time_parts(folder: Path, coco_path: Path) -> dict[str, float]:
    """CPU ms per image of each piece of work a --coco boxes run adds to classification (see the docstring)."""
    import dataclasses
    import pickle

    from beam_pipeline import index
    from beam_pipeline.annotations import coco, objects
    from beam_pipeline.examples import build_example
    from beam_pipeline.hashing import shuffle_key
    from beam_pipeline.images.options import Geometry
    from beam_pipeline.vocab.refs import Ref

    path = str(coco_path)
    categories = coco.read_categories(path).pairs
    reader = coco._ReadSection()  # noqa: SLF001 - the real reader, timed alone
    sections = [*reader.process((coco.IMAGES, path)), *reader.process((coco.ANNOTATIONS, path))]
    grouped: dict[str, list[Any]] = {}
    for key, tagged in sections:
        grouped.setdefault(key, []).append(tagged)
    joiner = coco._JoinImageObjects(path, str(folder), categories)  # noqa: SLF001
    joined = [out for key, values in grouped.items() for out in joiner._join(key, values)]  # noqa: SLF001
    found = [out[1][1] for out in joined if isinstance(out, tuple)]  # (file key, (COCO, CocoImage)); no rejects here
    n = len(found)
    refs = []
    for image in found:
        relpath = image.file_name
        plain = Ref(str(folder / relpath), relpath, 95_000, "train", None, shuffle_key(relpath, 0), (), 1.0)
        refs.append((plain, dataclasses.replace(plain, annotations=image.annotations)))

    def carried() -> None:  # through JoinById, JoinByFileName, and to the shard with the ref (less the plain ref)
        for element in sections:
            pickle.loads(pickle.dumps(element))
        for image in found:
            pickle.loads(pickle.dumps(image))
        for _, annotated in refs:
            pickle.loads(pickle.dumps(annotated))

    def plain_refs() -> None:
        for plain, _ in refs:
            pickle.loads(pickle.dumps(plain))

    width, height = found[0].annotations.width, found[0].annotations.height
    geometry = Geometry(width, height, width, height)  # recorded as stored: no orientation, no resize
    base = {"image/encoded": b"\xff" * 95_000, "image/format": "jpeg", "image/height": height, "image/width": width,
            "image/channels": 3, "image/filename": "circle/circle_00000.jpg", "image/key/sha256": "0" * 64}  # fmt: skip

    def with_objects() -> None:
        for image in found:
            build_example({**base, **objects.object_features(image.annotations, geometry)})

    def without() -> None:
        for _ in found:
            build_example(base)

    def digests() -> None:
        for _, annotated in refs:
            fresh = dataclasses.replace(annotated, annotations=dataclasses.replace(annotated.annotations))
            index.extras_digest(fresh)

    return {
        "the launcher's scan of the file (categories, depth, category 0)": _best_ms(
            lambda: coco.read_categories(path), n
        ),
        "streaming its images and annotations sections": _best_ms(
            lambda: [*reader.process((coco.IMAGES, path)), *reader.process((coco.ANNOTATIONS, path))], n
        ),
        "the join by image id and the checks": _best_ms(
            lambda: [out for key, values in grouped.items() for out in joiner._join(key, values)],
            n,  # noqa: SLF001
        ),
        "pickling what the shuffles carry, beyond a plain ref": _best_ms(carried, n) - _best_ms(plain_refs, n),
        "the object keys and the longer Example": _best_ms(with_objects, n) - _best_ms(without, n),
        "the annotation digest (resume digest, index line)": _best_ms(digests, n),
    }


def print_parts(folder: Path, coco_path: Path, classification: float | None, measured: float | None) -> None:
    parts = time_parts(folder, coco_path)
    total = sum(parts.values())
    rows = [*((name, f"{ms:.3f}") for name, ms in parts.items()),
            ("**sum: the least a streamed join of boxes adds**", f"**{total:.3f}**")]  # fmt: skip
    header = ("part of a --coco boxes run's extra work (this process, one thread)", "CPU ms / image")
    print(f"\n{markdown_table(header, rows)}")
    if classification:
        print(f"\nfloor with no Beam overhead: {(classification + total) / classification:.2f}x classification "
              f"({classification:.2f} + {total:.2f} ms)")  # fmt: skip
        if measured:
            rest = measured - classification - total
            print(f"measured: {measured / classification:.2f}x; the rest, {rest:.2f} ms per image, is Beam's "
                  "(the join's steps and shuffles, and the larger refs through the shard shuffle)")  # fmt: skip


def prepare(
    work: Path, images: int, small: int, width: int, height: int
) -> tuple[dict[str, Path], dict[tuple[str, str], Path | None]]:
    """The generated JPEGs (kept in ``work`` for the next run), the big and small sets hard-linked from them,
    and each set's COCO file per mode (None: classification)."""
    data = work / "images"
    if len(list_images(data, (".jpg",))) < images:
        shutil.rmtree(data, ignore_errors=True)
        write_samples(str(data), math.ceil(images / 3), width, height, corrupt=False, jpeg_only=True)
    files = list_images(data, (".jpg",))[:images]
    sets = {"big": link_files(files, data, work / "big"), "small": link_files(files[:small], data, work / "small")}
    coco: dict[tuple[str, str], Path | None] = {}
    for name, folder in sets.items():
        for mode, masks in (("coco-boxes", False), ("coco-masks", True)):
            path = work / f"{name}-{mode}.json"
            path.write_text(json.dumps(make_coco(folder, list_images(folder, (".jpg",)), width, height, masks)))
            coco[(name, mode)] = path
        coco[(name, "classification")] = None
    return sets, coco


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py detection", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--images", type=int, default=2000, help="images in the big run")
    p.add_argument("--small", type=int, default=200, help="images in the start-up run (subtracted)")
    p.add_argument("--size", default="512x384", help="WIDTHxHEIGHT of the generated JPEGs")
    p.add_argument("--repeat", type=int, default=3, help="rounds (each: small and big run of every mode)")
    p.add_argument("--work", default="", help="scratch folder, kept (default: a temp dir, removed)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    p.add_argument("--parts", action="store_true", help="also time each part of a boxes run's extra work (above)")
    p.add_argument("extra", nargs="*", help="more convert flags, after --")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown mode(s) {', '.join(sorted(unknown))}")
    width, height = (int(v) for v in args.size.lower().split("x"))
    with scratch(args.work, "detspeed-") as work:
        sets, coco = prepare(work, args.images, args.small, width, height)
        files = list_images(sets["big"], (".jpg",))
        nbytes = sum(f.stat().st_size for f in files)
        objs = len(json.loads(coco[("big", "coco-boxes")].read_text())["annotations"])  # type: ignore[union-attr]
        print(f"{len(files)} JPEGs of {width}x{height}, {nbytes / len(files) / 1e3:.0f} KB mean, {objs} objects "
              f"({objs / len(files):.1f} per image); start-up run: {args.small} images; "
              f"{os.cpu_count()} cores; convert --no-transform {' '.join(args.extra)}", flush=True)  # fmt: skip
        convert(sets["small"], work / "out", None, args.extra)  # warm-up: page cache, .pyc

        def steady(mode: str) -> dict[str, float]:
            """CPU and wall ms per image of ``mode``, the small run subtracted from the big one."""
            small = convert(sets["small"], work / "out", coco[("small", mode)], args.extra)
            big = convert(sets["big"], work / "out", coco[("big", mode)], args.extra)
            if big["records"] != len(files) or small["records"] != args.small:
                sys.exit(f"error: {mode}: {big['records']}/{small['records']} records, expected all images")
            n = len(files) - args.small
            cpu_ms, wall_ms = steady_ms(big["cpu"], small["cpu"], n), steady_ms(big["wall"], small["wall"], n)
            return {"cpu_ms": cpu_ms, "wall_ms": wall_ms, "big_cpu": big["cpu"], "big_wall": big["wall"]}

        def report(round_no: int, mode: str, r: dict[str, float]) -> None:
            print(f"| {round_no} | {mode} | {r['cpu_ms']:.2f} | {r['wall_ms']:.2f} | {r['big_cpu']:.1f} "
                  f"| {r['big_wall']:.1f} | {load()} |", flush=True)  # fmt: skip

        print("| round | mode | CPU ms / image | wall ms / image | big run CPU s | big run wall s | load (uptime) |")
        print("|---|---|---:|---:|---:|---:|---|")
        runs = interleaved(args.repeat, {mode: functools.partial(steady, mode) for mode in modes}, report)
        per_image = {mode: [r["cpu_ms"] for r in rs] for mode, rs in runs.items()}
        base = statistics.median(per_image["classification"]) if "classification" in per_image else None
        rows = []
        for mode, cpu in per_image.items():
            med = statistics.median(cpu)
            wall = statistics.median(r["wall_ms"] for r in runs[mode])
            rows.append((mode, f"{med:.2f}", f"{min(cpu):.2f}", f"{wall:.2f}", f"{med / base:.2f}" if base else "-"))
        header = ("mode", "CPU ms / image (median)", "min", "wall ms / image (median)", "CPU vs classification")
        print(f"\n{markdown_table(header, rows)}")
        if args.parts:
            measured = statistics.median(per_image["coco-boxes"]) if "coco-boxes" in per_image else None
            print_parts(sets["big"], coco[("big", "coco-boxes")], base, measured)  # type: ignore[arg-type]
    return 0
