"""Our COCO conversion against TF Model Garden's ``create_coco_tf_record.py``, image by image, and timed.

Run by hand (minutes of machine time; Model Garden in its own venv, never a
dependency of this project):

    python3 -m venv /work/mg-venv && /work/mg-venv/bin/pip install tf-models-official pycocotools
    .venv/bin/python scripts/benchmark.py model-garden --mg-python /work/mg-venv/bin/python --work /tmp/mg

1. Generates a COCO set in ``--work`` (default 1,500 JPEGs of varied sizes;
   polygons, multi-polygon objects, crowd objects as uncompressed RLE, some as
   compressed RLE, non-contiguous category ids, images without annotations,
   crowd-only images; annotations listed in no particular order, as in
   COCO's own files). Model Garden's script cannot read a compressed RLE
   (pycocotools' ``frPyObjects`` takes only run-length lists), so it gets a
   copy of the file with those few written as run-length lists: same masks.
2. Runs ``beam_pipeline convert --input IMAGES --coco instances.json --output
   OUT`` (default flags) and ``create_coco_tf_record.py --include_masks`` (its
   defaults: all cores, 32 shards), each timed (wall) with the peak RSS of
   its whole process tree (``bench.common.measure``).
3. Decodes both outputs with Model Garden's ``TfExampleDecoder(include_mask=True)``
   (scripts/bench/mg_decode.py, run by ``--mg-python``) and compares per source_id:
   boxes to 1e-4, classes, crowd flags, areas, masks IoU >= 0.97, the set of
   images, and our label_map.pbtxt against the file's categories.

Prints a table and one JSON line; exits 1 on any disagreement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import beam_pipeline, load, measure

HERE = Path(__file__).resolve().parent
CATEGORIES = [(1, "person"), (3, "car"), (4, "motorcycle"), (8, "truck"), (13, "stop sign"), (27, "backpack")]
CATEGORIES += [(44, "bottle"), (90, "toothbrush")]  # ids with gaps, as COCO's 80 in 1-90
BOX_TOL, IOU_MIN, AREA_TOL = 1e-4, 0.97, 1e-3


def runs(binary: Any) -> list[int]:
    """A binary mask as COCO's uncompressed RLE counts (column-major, starting with a run of zeros)."""
    import numpy as np

    flat = np.asarray(binary, dtype=np.uint8).flatten(order="F")
    edges = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    counts = np.diff(bounds).tolist()
    return counts if flat[0] == 0 else [0, *counts]


def polygon(rng: Any, cx: float, cy: float, r: float, w: int, h: int) -> list[float]:
    """A star-shaped polygon around (cx, cy), vertices clipped to the image, 2 decimals as tools write."""
    import numpy as np

    k = int(rng.integers(5, 11))
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radii = rng.uniform(0.5, 1.0, k) * r
    xs = np.clip(cx + radii * np.cos(angles), 0, w).round(2)
    ys = np.clip(cy + radii * np.sin(angles), 0, h).round(2)
    return [float(v) for xy in zip(xs, ys, strict=True) for v in xy]


def blob(rng: Any, w: int, h: int) -> Any:
    """A crowd region: a union of a few ellipses, as a height x width 0/1 array."""
    import numpy as np

    yy, xx = np.mgrid[0:h, 0:w]
    out = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(2, 5))):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        ax, ay = rng.uniform(5, w / 4), rng.uniform(5, h / 4)
        out |= (((xx - cx) / ax) ** 2 + ((yy - cy) / ay) ** 2 <= 1).astype(np.uint8)
    return out


def generate(work: Path, count: int, seed: int) -> dict[str, Any]:
    """``count`` JPEGs in work/images and the COCO dict describing them (ids, order and RLEs as above)."""
    import numpy as np
    from PIL import Image
    from pycocotools import mask as coco_mask

    rng = np.random.default_rng(seed)
    images_dir = work / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    ann_id = 500
    for i in range(count):
        w, h = int(rng.integers(160, 641)), int(rng.integers(120, 481))
        image_id = 100_000 + 7 * i  # non-contiguous image ids
        name = f"{i:05d}.jpg"
        path = images_dir / name
        base = rng.integers(0, 256, size=3)
        grad = np.linspace(0, 1, w)[None, :, None] * rng.integers(0, 256, size=3)
        noise = rng.integers(0, 40, size=(h, w, 3))
        pixels = np.clip(base * 0.5 + grad * 0.5 + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels, "RGB").save(path, quality=90)
        images.append({"id": image_id, "file_name": name, "width": w, "height": h})
        roll = rng.uniform()
        if roll < 0.07:
            continue  # a negative: no annotations
        kinds = (
            ["crowd"]
            if roll < 0.10
            else rng.choice(["poly", "multi", "crowd"], p=[0.75, 0.15, 0.10], size=rng.integers(1, 7))
        )
        for kind in kinds:
            ann_id += int(rng.integers(1, 4))
            cat = CATEGORIES[int(rng.integers(0, len(CATEGORIES)))][0]
            if kind == "crowd":
                binary = blob(rng, w, h)
                rle = coco_mask.encode(np.asfortranarray(binary))
                if rng.uniform() < 0.5:
                    seg: Any = {"size": [h, w], "counts": rle["counts"].decode("ascii")}
                else:
                    seg = {"size": [h, w], "counts": runs(binary)}
                box = [float(v) for v in coco_mask.toBbox(rle)]
                area = float(coco_mask.area(rle))
                crowd = 1
            else:
                r = float(rng.uniform(8, min(w, h) / 3))
                cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
                seg = [polygon(rng, cx, cy, r, w, h)]
                if kind == "multi":
                    seg.append(polygon(rng, rng.uniform(0, w), rng.uniform(0, h), r / 2, w, h))
                xs = [v for p in seg for v in p[0::2]]
                ys = [v for p in seg for v in p[1::2]]
                box = [min(xs), min(ys), round(max(xs) - min(xs), 2), round(max(ys) - min(ys), 2)]
                if box[2] <= 0 or box[3] <= 0:
                    continue
                area = float(coco_mask.area(coco_mask.merge(coco_mask.frPyObjects(seg, h, w))))
                crowd = 0
            annotations.append(
                {
                    "id": ann_id,
                    "image_id": image_id,
                    "category_id": cat,
                    "bbox": box,
                    "area": area,
                    "iscrowd": crowd,
                    "segmentation": seg,
                }
            )
    # COCO's own files do not list annotations in id order: neither does this one
    annotations = [annotations[k] for k in rng.permutation(len(annotations))]
    categories = [{"id": cid, "name": name, "supercategory": "thing"} for cid, name in CATEGORIES]
    return {"images": images, "annotations": annotations, "categories": categories}


def for_model_garden(doc: dict[str, Any]) -> dict[str, Any]:
    """The same file with compressed RLEs written as run-length lists (Model Garden reads only those)."""
    from pycocotools import mask as coco_mask

    anns = []
    for ann in doc["annotations"]:
        seg = ann["segmentation"]
        if isinstance(seg, dict) and isinstance(seg["counts"], str):
            binary = coco_mask.decode({"size": seg["size"], "counts": seg["counts"].encode("ascii")})
            ann = {**ann, "segmentation": {"size": seg["size"], "counts": runs(binary)}}
        anns.append(ann)
    return {**doc, "annotations": anns}


def timed(command: list[str], log: Path, env: dict[str, str]) -> dict[str, Any]:
    """``measure`` on the command with ``env`` added, its output sent to ``log``."""
    settings = [f"{k}={v}" for k, v in env.items()]
    return measure(["sh", "-c", f'exec "$0" "$@" > {log} 2>&1', "env", *settings, *command])


def read_label_map(path: Path) -> list[tuple[int, str]]:
    """(id, name) pairs of a TF Object Detection API label_map.pbtxt (the simple form we and the API write)."""
    text = path.read_text()
    items = re.findall(r"item\s*\{\s*id:\s*(\d+)\s*name:\s*'((?:[^'\\]|\\.)*)'\s*\}", text)
    return [(int(i), re.sub(r"\\(.)", r"\1", n)) for i, n in items]


def compare(ours: dict[str, Any], mg: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """Per-check counts of disagreeing images, with a few examples."""
    import numpy as np
    from pycocotools import mask as coco_mask

    checks = ["records", "size", "objects", "boxes", "classes", "is_crowd", "areas", "masks", "mask_values"]
    bad: dict[str, list[str]] = {c: [] for c in checks}
    worst = {"box_diff": 0.0, "min_iou": 1.0, "area_diff": 0.0}
    json_ids = {str(i["id"]) for i in doc["images"]}
    both = sorted(set(ours) & set(mg))
    for sid in both:
        a, b = ours[sid], mg[sid]
        if a["records"] != 1 or b["records"] != 1:
            bad["records"].append(sid)
        if (a["height"], a["width"]) != (b["height"], b["width"]):
            bad["size"].append(sid)
        if len(a["classes"]) != len(b["classes"]):
            bad["objects"].append(sid)
            continue
        if a["classes"]:
            diff = float(np.abs(np.array(a["boxes"]) - np.array(b["boxes"])).max())
            worst["box_diff"] = max(worst["box_diff"], diff)
            if diff > BOX_TOL:
                bad["boxes"].append(sid)
            area = float(np.abs(np.array(a["areas"]) - np.array(b["areas"])).max())
            worst["area_diff"] = max(worst["area_diff"], area)
            if area > AREA_TOL:
                bad["areas"].append(sid)
        if a["classes"] != b["classes"]:
            bad["classes"].append(sid)
        if a["is_crowd"] != b["is_crowd"]:
            bad["is_crowd"].append(sid)
        if len(a["masks"]) != len(b["masks"]):
            bad["masks"].append(sid)
        else:
            for ma, mb in zip(a["masks"], b["masks"], strict=True):
                ra, rb = ({**m, "counts": m["counts"].encode("ascii")} for m in (ma, mb))
                inter = float(coco_mask.area(coco_mask.merge([ra, rb], intersect=True)))
                union = float(coco_mask.area(coco_mask.merge([ra, rb])))
                iou = 1.0 if union == 0 else inter / union
                worst["min_iou"] = min(worst["min_iou"], iou)
                if iou < IOU_MIN or ma["size"] != mb["size"]:
                    bad["masks"].append(sid)
                    break
        if not set(a["mask_values"]) <= {0, 1} or a["mask_values"] != b["mask_values"] and a["masks"]:
            bad["mask_values"].append(sid)
    return {
        "images_in_json": len(json_ids),
        "images_ours": len(ours),
        "images_model_garden": len(mg),
        "only_ours": sorted(set(ours) - set(mg))[:10],
        "only_model_garden": sorted(set(mg) - set(ours))[:10],
        "missing_from_both": len(json_ids - set(ours) - set(mg)),
        "compared": len(both),
        "negatives": sum(1 for s in both if not mg[s]["classes"]),
        "objects": sum(len(mg[s]["classes"]) for s in both),
        "disagreeing": {c: len(v) for c, v in bad.items()},
        "examples": {c: v[:5] for c, v in bad.items() if v},
        **worst,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py model-garden", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mg-python", required=True, help="python of a venv with tf-models-official and pycocotools")
    p.add_argument("--work", default="/tmp/mg_compare", help="where the set and both outputs go (overwritten)")
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--json-out", help="also write the result JSON here")
    p.add_argument("--mg-first", action="store_true", help="time Model Garden first (default: ours first)")
    args = p.parse_args(argv)
    if not Path(args.mg_python).exists():
        p.error(f"--mg-python {args.mg_python}: no such file")

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    doc = generate(work, args.images, args.seed)
    (work / "instances.json").write_text(json.dumps(doc))
    (work / "instances_mg.json").write_text(json.dumps(for_model_garden(doc)))
    print(
        f"generated {len(doc['images'])} images, {len(doc['annotations'])} annotations "
        f"in {time.perf_counter() - started:.0f} s",
        flush=True,
    )

    ours_out, mg_out = work / "out_ours", work / "out_mg"
    for d in (ours_out, mg_out):
        shutil.rmtree(d, ignore_errors=True)
    mg_out.mkdir()
    quiet = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    commands = {
        "ours": beam_pipeline("convert", "--input", str(work / "images"), "--coco", str(work / "instances.json"),
                              "--output", str(ours_out)),
        "mg": [args.mg_python, "-m", "official.vision.data.create_coco_tf_record", "--logtostderr",
               f"--image_dir={work / 'images'}", f"--object_annotations_file={work / 'instances_mg.json'}",
               f"--output_file_prefix={mg_out / 'train'}", "--include_masks"],
    }  # fmt: skip
    order = ["mg", "ours"] if args.mg_first else ["ours", "mg"]
    uptimes, timings = [load()], {}
    for name in order:  # one after the other: each gets the whole machine (as far as a shared one allows)
        timings[name] = timed(commands[name], work / f"{name}.log", quiet)
        uptimes.append(load())
    ours_run, mg_run = timings["ours"], timings["mg"]
    for name, run in (("ours", ours_run), ("model garden", mg_run)):
        if run["returncode"]:
            print(f"{name} failed (exit {run['returncode']}): see {work}/{'ours' if name == 'ours' else 'mg'}.log")
            return 1

    summaries = {}
    for name, files in (("ours", sorted(ours_out.glob("*.tfrecord-*"))), ("mg", sorted(mg_out.glob("*.tfrecord")))):
        target = work / f"decoded_{name}.json"
        subprocess.run(
            [args.mg_python, str(HERE / "mg_decode.py"), "--out", str(target), *map(str, files)],
            check=True,
            env={**os.environ, **quiet},
            stderr=subprocess.DEVNULL,
        )
        summaries[name] = json.loads(target.read_text())
    result = compare(summaries["ours"], summaries["mg"], doc)
    want_map = sorted((c["id"], c["name"]) for c in doc["categories"])
    label_map = read_label_map(ours_out / "label_map.pbtxt")
    result["label_map_matches_categories"] = label_map == want_map
    result["annotations"] = len(doc["annotations"])
    result["runs"] = {"ours": ours_run, "model_garden": mg_run}
    result["uptime"] = uptimes
    result["order"] = order
    result["cpus"] = os.cpu_count()

    print(f"\n{'check':<24}{'disagreeing images':>20}")
    for check, n in result["disagreeing"].items():
        print(f"{check:<24}{n:>20}")
    print(f"{'label_map.pbtxt':<24}{'ok' if result['label_map_matches_categories'] else 'DIFFERS':>20}")
    print(
        f"images: json {result['images_in_json']}, ours {result['images_ours']}, "
        f"model garden {result['images_model_garden']}, compared {result['compared']} "
        f"({result['negatives']} without objects), objects {result['objects']}"
    )
    print(
        f"worst box diff {result['box_diff']:.2e}, worst area diff {result['area_diff']:.2e}, "
        f"lowest mask IoU {result['min_iou']:.4f}"
    )
    print(f"\n{'run':<16}{'wall s':>10}{'peak RSS MB':>14}")
    for name, run in (("ours", ours_run), ("model garden", mg_run)):
        print(f"{name:<16}{run['seconds']:>10}{run['peak_rss_mb']:>14}")
    print("load:", *result["uptime"], sep="\n  ")
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    agree = (
        not any(result["disagreeing"].values())
        and result["label_map_matches_categories"]
        and not result["only_ours"]
        and not result["only_model_garden"]
        and result["compared"] == result["images_in_json"]
    )
    print("AGREE" if agree else f"DISAGREE: {json.dumps(result['examples'])}")
    return 0 if agree else 1
