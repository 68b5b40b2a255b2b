"""Benchmark: hostile and oversized files beside ordinary images, converted at defaults.

    .venv/bin/python scripts/benchmark.py hostile --work /tmp/hostile-bench
    .venv/bin/python scripts/benchmark.py hostile --work /tmp/hb --big 6 --ordinary 500 -- --decode-threads 4

Builds (in ``--work``) a folder of ordinary JPEGs, large legal images
(13,000 × 13,000 PNGs, 676 MB each decoded), and files that are cheap to
store and costly to decode (tests/hostile.py: GIF frames declaring huge
extents, a 4,000-frame GIF, a 600-page TIFF, a PNG claiming 20,000 × 20,000,
a 3,000-scan JPEG, a PNG of a million empty chunks, a JPEG of 10 MB of
padding bytes, a 4 GB sparse ``.jpg``, a zlib stream expanding to 300 MB),
then runs ``convert`` on it with default settings (TFT analysis included; only
``--max-reject-fraction 1`` and ``--labels-from none``, as in the real-world run
that was OOM-killed) and prints wall time, peak RSS of the whole process tree,
and whether every file is accounted for and every legal image is a record.
Exit code 1 if any of the issue's targets (exit 0, ≤ 120 s, ≤ 2.5 GB) is missed.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from bench.common import beam_pipeline, measure
from tests import hostile  # the repository's root is on sys.path (scripts/benchmark.py puts it there)
from tests.imagegen import image_bytes, write


def build(root: Path, ordinary: int, big: int) -> tuple[set[str], set[str]]:
    """(relpaths of legal images, relpaths of hostile ones) written under ``root``."""
    legal: dict[str, bytes] = {}
    for i in range(ordinary):
        legal[f"ordinary/{i:05d}.jpg"] = image_bytes("jpeg", 480, 640, seed=i)
    for i in range(big):
        legal[f"big/{i}.png"] = hostile.zero_png(13000, 13000, "RGB", seed_row=i)
    legal["legal/anim_120_frames.gif"] = hostile.many_frame_gif(120, 480, 360)
    legal["legal/stream_bomb.png"] = hostile.png_stream_bomb(64, 64, 300_000_000)
    legal["legal/eight_pages.tiff"] = hostile.many_page_tiff(8, 640, 480)
    bad = {
        "hostile/extents.gif": hostile.gif_with_extents((10, 10), [(0, 0, 4, 4), (0, 0, 65535, 65535)]),
        "hostile/far_frame.gif": hostile.gif_with_extents((64, 64), [(0, 0, 4, 4), (60000, 60000, 4, 4)]),
        "hostile/4000_frames.gif": hostile.many_frame_gif(4000, 512, 512),
        "hostile/600_pages.tiff": hostile.many_page_tiff(600),
        "hostile/claims_20k.png": hostile.zero_png(20000, 20000, "L"),
        "hostile/3000_scans.jpg": hostile.jpeg_scan_bomb(3000, 1024, 1024),
        "hostile/1m_chunks.png": hostile.png_many_chunks(1_000_000),
        "hostile/10mb_padding.jpg": hostile.jpeg_padding(10_000_000),
        "hostile/comment_400k_blocks.gif": hostile.gif_comment_bomb(400_000),
        "hostile/400_pages_of_5000_tags.tiff": hostile.tiff_many_tags(400, 5000),
    }
    for rel, data in {**legal, **bad}.items():
        write(str(root / rel), data)
    hostile.sparse_file(str(root / "hostile" / "sparse_4gb.jpg"), 4 * 1024**3)
    return set(legal), {*bad, "hostile/sparse_4gb.jpg"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py hostile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--work", required=True, help="scratch folder (input and output go here)")
    p.add_argument("--ordinary", type=int, default=300, help="ordinary 640x480 JPEGs (300)")
    p.add_argument("--big", type=int, default=4, help="13,000 x 13,000 PNGs (4)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="more convert flags, after --")
    args = p.parse_args(argv)
    work = Path(args.work)
    root, out = work / "in", work / "out"
    shutil.rmtree(work, ignore_errors=True)
    legal, bad = build(root, args.ordinary, args.big)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    command = beam_pipeline("convert", "--input", str(root), "--output", str(out), "--labels-from", "none",
                            "--max-reject-fraction", "1", *extra)  # fmt: skip
    result = measure(command)
    records = rejected = set()
    if result["returncode"] == 0:
        info = json.loads((out / "dataset.json").read_text())
        rejected = {
            json.loads(line)["path"]  # relative to --input, as index.jsonl's
            for line in (out / "rejects.jsonl").read_text().splitlines()
        }
        records = legal | bad - rejected if info["examples"] == len(legal | bad) - len(rejected) else set()
    summary = {
        **result,
        "files": len(legal) + len(bad),
        "legal": len(legal),
        "hostile": len(bad),
        "every_legal_image_a_record": bool(records) and legal <= records,
        "every_file_accounted_for": bool(records) and records | rejected == legal | bad,
        "hostile_rejected": sorted(bad & rejected),
    }
    print(json.dumps(summary, indent=1))
    ok = (
        result["returncode"] == 0
        and float(result["seconds"]) <= 120
        and float(result["peak_rss_mb"]) <= 2500
        and summary["every_legal_image_a_record"]
        and summary["every_file_accounted_for"]
    )
    return 0 if ok else 1
