"""What the shard writer's read budget sees of images that grow when converted (issue #13 review).

CMYK JPEGs are converted to PNG (TensorFlow cannot read CMYK), ~10-20 times
their file. Before the fix the read budget charged only the listed size, so
finished records waiting in the writer's queue were invisible to it. This
runs one WriteShardFn over such files in this process and prints the read
budget's peak, the bytes the budget was told about, peak RSS and wall time.

    python scripts/benchmark.py read-budget [--images 16] [--side 2400] [--budget-mb 256] [--off]

``--off`` runs the same with the accounting turned off (the old behaviour).
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import tempfile
import time

import numpy as np
from PIL import Image

from beam_pipeline import hashing
from beam_pipeline.images.options import ImageOptions
from beam_pipeline.vocab.records import ShardResult
from beam_pipeline.vocab.refs import Ref
from beam_pipeline.writer import shard


def cmyk_jpeg(side: int, seed: int) -> bytes:
    """A photo-like CMYK JPEG (a smooth random field): small as a JPEG, large as a PNG."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (side // 24, side // 24, 4), dtype=np.uint8), "CMYK")
    buf = io.BytesIO()
    small.resize((side, side), Image.BICUBIC).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmark.py read-budget", description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--side", type=int, default=2400)
    parser.add_argument("--budget-mb", type=int, default=256)
    parser.add_argument("--off", action="store_true", help="old behaviour: results charged their listed size")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        refs = []
        for i in range(args.images):
            path = os.path.join(tmp, f"{i}.jpg")
            with open(path, "wb") as fh:
                fh.write(cmyk_jpeg(args.side, i))
            refs.append(Ref(path, f"{i}.jpg", os.path.getsize(path), "train", None, hashing.shuffle_key(str(i), 0)))
        if args.off:
            original = shard.read_then_convert

            def without_size(*a, size=None, **kw):  # WriteShardFn passes size=: drop it
                return original(*a, **kw)

            shard.read_then_convert = without_size
        fn = shard.WriteShardFn(
            os.path.join(tmp, "out"), "none", 0, ImageOptions(memory_budget_bytes=args.budget_mb << 20)
        )
        fn.setup()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        [result] = [o for o in fn.process((("train", 0), refs), [], {}) if isinstance(o, ShardResult)]
        wall = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        listed = sum(r.size for r in refs)
        print(
            f"accounting={'off' if args.off else 'on'} images={args.images} side={args.side} "
            f"listed={listed / 1e6:.1f} MB shard={result.bytes / 1e6:.1f} MB "
            f"read budget={fn._read_budget.capacity / 1e6:.0f} MB peak held={fn._read_budget.peak / 1e6:.1f} MB "
            f"peak RSS={rss / 1024:.0f} MB (before the shard {rss0 / 1024:.0f} MB) wall={wall:.1f} s"
        )
