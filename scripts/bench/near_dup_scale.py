"""Near-duplicates at scale: what the default search (``--near-duplicates`` not given) costs against ``off`` on
sets full of near-duplicates, and what it lists.

    .venv/bin/python scripts/benchmark.py near-dup-scale --data /work/nd-data            # all three sets
    .venv/bin/python scripts/benchmark.py near-dup-scale --data /work/nd-data --only tiles --tiles 20000
    .venv/bin/python scripts/benchmark.py near-dup-scale --only scenes,photos --scenes 4000 --rounds 3

Three generated sets (seeded: the same files on every machine), made once under ``--data`` (one folder per
set and size, a marker beside it when whole; without ``--data`` a temporary folder), on ``--workers``
processes:

1. ``scenes`` (``--scenes``, 16,000): 640x480 JPEGs (quality 90, ~90 KB each), frames of 8 scenes: each
   scene one 800x600 photo-like image (tests/imagegen.photo_like), each frame a 640x480 crop of it up to
   20 px off centre plus uniform pixel noise (±13 levels), as bursts or a video's frames are; 4 class
   folders, each scene in all of them. Most frames of a scene are within 10 bits of each other.
2. ``tiles`` (``--tiles``, 80,000): 96x96 PNGs, near-blank map or microscopy tiles: 1 in 10 one flat
   light grey (their pHashes all alike), the others a 3x3 or 4x4 grid of blocks a little off a light
   background (±16 levels), many of them within 10 bits of each other; 4 class folders.
3. ``photos`` (``--photos``, 2,000): distinct photo-like 640x480 JPEGs (quality 90, ~40 KB), no
   near-duplicates made: the search's cost where it finds (almost) nothing (at 2,000, two unrelated pairs
   fall within 10 bits by chance); 3 class folders.

For each set, in one run: ``convert --no-transform --no-tfds-metadata --max-reject-fraction 1
--split-ratios train=0.8,test=0.2`` with ``--near-duplicates off`` and with the defaults (no
``--near-duplicates``), interleaved, ``--rounds`` times (the medians): wall time, CPU and peak RSS of the
process tree (``measure_beam``), the default's ratios to ``off``, its extra RSS per image, and what the
default run listed: near_duplicates.jsonl's lines and size, its lines by kind (``a``: pairs, ``group``:
groups, other first keys as they are) and dataset.json's ``near_duplicates`` block.

The converter is ``python -m beam_pipeline`` of this interpreter, from this process's environment and
working folder: to measure another checkout, run this script with ``PYTHONPATH`` set to it (the first
lines print which ``beam_pipeline`` the runs import).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import interleaved, load, markdown_table, measure_beam, scratch

QUICK = ["--no-transform", "--no-tfds-metadata", "--max-reject-fraction", "1", "--split-ratios", "train=0.8,test=0.2"]
SETS = ("scenes", "tiles", "photos")
MODES = ("off", "default")
SEED = 2026

SCENES = 8  # scenes the frames are taken from
SCENE_SIZE = (800, 600)  # each scene's photo-like image
FRAME_SIZE = (640, 480)
JITTER = 20  # px a frame's crop may sit off the scene's centre, each way
NOISE = 13  # uniform pixel noise of a frame, ± levels (with quality 90: ~90 KB per frame)
TILE = 96
BLANK_SHARE = 0.1  # tiles of one flat grey
TILE_SPREAD = 16  # ± levels a block of a tile is off its background


# --- generated sets -----------------------------------------------------------------------------

_SCENE_CACHE: dict[int, Any] = {}


def _scene(k: int) -> Any:
    """Scene ``k``'s photo-like image as an array, made once per process."""
    import numpy as np

    from tests.imagegen import photo_like

    if k not in _SCENE_CACHE:
        _SCENE_CACHE[k] = np.asarray(photo_like(SEED + k, *SCENE_SIZE), dtype=np.int16)
    return _SCENE_CACHE[k]


def _save(img: Any, path: Path, **options: Any) -> None:
    """Saves through a temporary name: a file there is whole (a killed generation resumes where it was)."""
    tmp = path.with_name(path.name + ".part")
    img.save(tmp, **options)
    os.replace(tmp, path)


def scene_frame(folder: Path, i: int) -> None:
    import numpy as np
    from PIL import Image

    path = folder / "abcd"[(i // SCENES) % 4] / f"{i:06d}.jpg"
    if path.exists():
        return
    rng = np.random.default_rng((SEED, 1, i))
    base = _scene(i % SCENES)
    (sw, sh), (fw, fh) = SCENE_SIZE, FRAME_SIZE
    x = (sw - fw) // 2 + int(rng.integers(-JITTER, JITTER + 1))
    y = (sh - fh) // 2 + int(rng.integers(-JITTER, JITTER + 1))
    frame = base[y : y + fh, x : x + fw] + rng.integers(-NOISE, NOISE + 1, size=(fh, fw, 3), dtype=np.int16)
    _save(Image.fromarray(np.clip(frame, 0, 255).astype(np.uint8), "RGB"), path, format="JPEG", quality=90)


def tile(folder: Path, i: int) -> None:
    import numpy as np
    from PIL import Image

    path = folder / "abcd"[i % 4] / f"{i:06d}.png"
    if path.exists():
        return
    rng = np.random.default_rng((SEED, 2, i))
    background = rng.integers(200, 241) + rng.integers(-4, 5, size=3)
    if rng.random() < BLANK_SHARE:
        blocks = np.broadcast_to(background, (1, 1, 3))
    else:
        grid = (3, 4)[i % 2]
        blocks = background + rng.integers(-TILE_SPREAD, TILE_SPREAD + 1, size=(grid, grid, 1))
    side = TILE // blocks.shape[0]
    pixels = np.repeat(np.repeat(blocks, side, 0), side, 1)
    _save(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB"), path, format="PNG")


def photo(folder: Path, i: int) -> None:
    from tests.imagegen import photo_like

    path = folder / "abc"[i % 3] / f"{i:06d}.jpg"
    if not path.exists():
        _save(photo_like(SEED + 100_000 + i, *FRAME_SIZE), path, format="JPEG", quality=90)


MAKERS: dict[str, Callable[[Path, int], None]] = {"scenes": scene_frame, "tiles": tile, "photos": photo}
CLASSES = {"scenes": "abcd", "tiles": "abcd", "photos": "abc"}


def _make_range(job: tuple[str, str, int, int]) -> int:
    name, folder, start, stop = job
    for i in range(start, stop):
        MAKERS[name](Path(folder), i)
    return stop - start


def make_set(data: Path, name: str, count: int, workers: int) -> Path:
    """``name``'s ``count`` images under ``data`` (made once: a marker beside the folder says it is whole)."""
    folder = data / f"{name}-{count}"
    done = data / f".complete-{name}-{count}"
    if done.exists():
        print(f"{name}: {count:,} images kept in {folder}")
        return folder
    for label in CLASSES[name]:
        (folder / label).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    step = 500
    jobs = [(name, str(folder), s, min(s + step, count)) for s in range(0, count, step)]
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            made = sum(pool.imap_unordered(_make_range, jobs))
    else:
        made = sum(map(_make_range, jobs))
    done.touch()
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(
        f"{name}: {made:,} images made in {folder} in {time.monotonic() - start:.0f} s "
        f"({size / 1e6:,.0f} MB, {size / max(1, made) / 1e3:.1f} KB each)"
    )
    return folder


# --- what a run listed --------------------------------------------------------------------------


def listed(out: Path) -> dict[str, Any]:
    """near_duplicates.jsonl's lines, bytes and lines by kind; dataset.json's ``near_duplicates`` block."""
    found: dict[str, Any] = {"lines": None, "bytes": None, "kinds": {}, "block": None}
    path = out / "near_duplicates.jsonl"
    if path.exists():
        kinds: collections.Counter[str] = collections.Counter()
        lines = 0
        with path.open("rb") as fh:
            for raw in fh:
                lines += 1
                try:
                    obj = json.loads(raw)
                except ValueError:
                    kinds["(not JSON)"] += 1
                    continue
                if not isinstance(obj, dict):
                    kinds[f"({type(obj).__name__})"] += 1
                elif "a" in obj:
                    kinds["pairs"] += 1
                elif "group" in obj:
                    kinds["groups"] += 1
                else:
                    kinds["keys " + ",".join(obj)] += 1
        found.update(lines=lines, bytes=path.stat().st_size, kinds=dict(kinds))
    info = out / "dataset.json"
    if info.exists():
        found["block"] = json.loads(info.read_text()).get("near_duplicates")
    return found


# --- the runs -----------------------------------------------------------------------------------


def which_code() -> str:
    """The ``beam_pipeline`` the runs import (same interpreter, environment and folder), and its commit."""
    probe = [sys.executable, "-c", "import beam_pipeline; print(beam_pipeline.__file__)"]
    where = Path(subprocess.run(probe, check=True, capture_output=True, text=True).stdout.strip()).parent.parent
    commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(where), "status", "--porcelain", "--", "beam_pipeline"], capture_output=True, text=True
    )
    state = (commit.stdout.strip() or "?") + (" + changes in beam_pipeline/" if dirty.stdout.strip() else "")
    return f"{where} at {state}"


def run_set(name: str, images: Path, count: int, work: Path, rounds: int) -> dict[str, Any]:
    outs = {mode: work / f"out-{name}-{mode}" for mode in MODES}
    flags = {"off": ["--near-duplicates", "off"], "default": []}
    runs = {
        mode: (
            lambda mode=mode: measure_beam(
                "convert", "--input", str(images), "--output", str(outs[mode]), "--overwrite", *QUICK, *flags[mode]
            )
        )
        for mode in MODES
    }  # fmt: skip

    def report(round_no: int, mode: str, r: dict[str, Any]) -> None:
        print(
            f"  round {round_no} {mode:<7}: wall {r['seconds']:.1f} s, CPU {r['cpu_seconds']:.1f} s, "
            f"peak RSS {r['peak_rss_mb']:,.0f} MB (launcher {r['root_peak_rss_mb']:,.0f} MB), load {r['load']:.2f}",
            flush=True,
        )

    print(f"{name}: {count:,} images; load {load()}", flush=True)
    results = interleaved(rounds, runs, report)
    keys = ("seconds", "cpu_seconds", "peak_rss_mb")
    med = {mode: {key: statistics.median(r[key] for r in results[mode]) for key in keys} for mode in MODES}
    found = listed(outs["default"])
    row = {"set": name, "images": count, **{mode: med[mode] for mode in MODES}, "listed": found}
    off, on = med["off"], med["default"]
    print(
        f"{name}: off {off['seconds']:.1f} s wall, {off['cpu_seconds']:.1f} s CPU, {off['peak_rss_mb']:,.0f} MB; "
        f"default {on['seconds']:.1f} s wall, {on['cpu_seconds']:.1f} s CPU, {on['peak_rss_mb']:,.0f} MB; "
        f"time x{on['seconds'] / off['seconds']:.2f}, CPU x{on['cpu_seconds'] / off['cpu_seconds']:.2f}, "
        f"RSS x{on['peak_rss_mb'] / off['peak_rss_mb']:.2f} "
        f"({1000 * (on['peak_rss_mb'] - off['peak_rss_mb']) / count:+.1f} KB per image)"
    )
    if found["lines"] is None:
        print(f"{name}: the default run wrote no near_duplicates.jsonl")
    else:
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(found["kinds"].items())) or "none"
        print(f"{name}: near_duplicates.jsonl {found['lines']:,} lines, {found['bytes'] / 1e6:,.2f} MB ({kinds})")
    print(f"{name}: dataset.json near_duplicates {json.dumps(found['block'], separators=(',', ':'))}", flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    header = [
        "set", "images", "off wall s", "off CPU s", "off RSS MB", "default wall s", "default CPU s",
        "default RSS MB", "time x", "RSS x", "RSS KB/img", "lines", "MB listed",
    ]  # fmt: skip
    body = []
    for r in rows:
        off, on, found = r["off"], r["default"], r["listed"]
        body.append(
            [
                r["set"], f"{r['images']:,}",
                f"{off['seconds']:.1f}", f"{off['cpu_seconds']:.1f}", f"{off['peak_rss_mb']:,.0f}",
                f"{on['seconds']:.1f}", f"{on['cpu_seconds']:.1f}", f"{on['peak_rss_mb']:,.0f}",
                f"{on['seconds'] / off['seconds']:.2f}", f"{on['peak_rss_mb'] / off['peak_rss_mb']:.2f}",
                f"{1000 * (on['peak_rss_mb'] - off['peak_rss_mb']) / r['images']:+.1f}",
                "-" if found["lines"] is None else f"{found['lines']:,}",
                "-" if found["bytes"] is None else f"{found['bytes'] / 1e6:,.2f}",
            ]
        )  # fmt: skip
    return markdown_table(header, body)


def chosen_sets(only: list[str] | None) -> list[str]:
    if not only:
        return list(SETS)
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SETS))
    if unknown:
        raise SystemExit(f"error: unknown set(s) {', '.join(unknown)}; choose from {', '.join(SETS)}")
    return [n for n in SETS if n in names]


def sizes(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    for name in chosen_sets(args.only):
        yield name, getattr(args, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmark.py near-dup-scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", action="append", metavar="SET", help=f"{', '.join(SETS)} (repeat, or a comma list)")
    parser.add_argument("--scenes", type=int, default=16_000, help="frames of 8 scenes (640x480 JPEGs)")
    parser.add_argument("--tiles", type=int, default=80_000, help="near-blank 96x96 PNG tiles")
    parser.add_argument("--photos", type=int, default=2_000, help="distinct photo-like 640x480 JPEGs")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data", default="", help="kept folder for the generated sets (default: a temp one)")
    parser.add_argument("--work", default="", help="kept folder for the outputs (default: a temp one)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes generating")
    args = parser.parse_args(argv)
    chosen = list(sizes(args))
    print(f"load {load()}; converter: {which_code()}; {sys.executable}", flush=True)
    rows = []
    with scratch(args.data, "near-dup-scale-data-") as data, scratch(args.work, "near-dup-scale-") as work:
        folders = {name: make_set(data, name, count, args.workers) for name, count in chosen}
        for name, count in chosen:
            rows.append(run_set(name, folders[name], count, work, args.rounds))
    print()
    print(table(rows))
    for r in rows:
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(r["listed"]["kinds"].items())) or "none"
        print(f"\n{r['set']}: lines by kind: {kinds}")
        print(f"{r['set']}: dataset.json near_duplicates {json.dumps(r['listed']['block'], separators=(',', ':'))}")
    return 0
