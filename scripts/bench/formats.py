"""TFRecord against ArrayRecord on the same data: conversion time, and read rates one process each (issue #47).

    .venv/bin/python scripts/benchmark.py formats --data bench-formats                 # 2,000 photos, 3 rounds
    .venv/bin/python scripts/benchmark.py formats --input DIR --repeat 5                 # a folder of your own

On one folder (``--input``, or ``--photos`` 640x480 JPEGs made once under ``--data``), in one invocation:

- **convert**: ``convert --no-transform --format tfrecord`` and ``--format array_record``, taking turns,
  ``--repeat`` rounds; whole-run wall and CPU (start-up included), medians;
- **raw record bytes**: every record of the train split, in this process: TFRecord sequentially through
  ``tf.data.TFRecordDataset``; ArrayRecord through Grain (``MapDataset.source(ArrayRecordDataSource)``) in
  stored order and shuffled (random access: what Grain does in training);
- **decoded images**: the same, each record parsed and its image decoded to uint8 pixels: tf.data with
  ``tf.io.parse_single_example`` + ``tf.io.decode_image`` (sequential map, one private thread), Grain with
  ``reader.decode`` (Pillow, numpy; no worker processes).

Records per second, like for like (one process, no parallel reads, the files in the page cache: each read
runs once untimed first). One JSON line per measurement, then tables; ``--out-json`` appends the lines to a
file as well.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.common import emit_json, interleaved, list_images, make_samples, markdown_table, measure_beam

FORMATS = ("tfrecord", "array_record")


def _files(out: Path, split: str) -> list[str]:
    info = json.loads((out / "dataset.json").read_text())
    return [str(out / s["file"]) for s in info["splits"][split]["shards"]]


def _rate(read: Callable[[], Iterable[Any]], rounds: int) -> dict[str, Any]:
    """Records per second of iterating ``read()`` to the end: one untimed pass, then ``rounds`` timed ones."""
    count = sum(1 for _ in read())
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        n = sum(1 for _ in read())
        seconds.append(time.perf_counter() - started)
        assert n == count, (n, count)
    best = statistics.median(seconds)
    return {"records": count, "seconds": round(best, 3), "records_per_s": round(count / best, 1)}


def read_rates(tfr: Path, arr: Path, split: str, rounds: int) -> dict[str, dict[str, Any]]:
    import grain
    import tensorflow as tf

    from beam_pipeline import reader

    tf_files, ar_files = _files(tfr, split), _files(arr, split)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.autotune.enabled = False

    def tf_raw() -> Iterable[Any]:
        return tf.data.TFRecordDataset(tf_files).with_options(options)

    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}

    def tf_decoded() -> Iterable[Any]:
        ds = tf.data.TFRecordDataset(tf_files).map(
            lambda r: tf.io.decode_image(
                tf.io.parse_single_example(r, spec)["image/encoded"], channels=3, expand_animations=False
            )
        )
        return ds.with_options(options)

    def grain_raw(shuffle: bool) -> Callable[[], Iterable[Any]]:
        def read() -> Iterable[Any]:
            ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(ar_files))
            return ds.shuffle(seed=1) if shuffle else ds

        return read

    def grain_decoded() -> Iterable[Any]:
        ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(ar_files)).shuffle(seed=1)
        return ds.map(lambda r: reader.decode(r)["image"])

    return {
        "raw: TFRecord, tf.data, sequential": _rate(tf_raw, rounds),
        "raw: ArrayRecord, Grain, stored order": _rate(grain_raw(False), rounds),
        "raw: ArrayRecord, Grain, shuffled (random access)": _rate(grain_raw(True), rounds),
        "decoded: TFRecord, tf.data parse + decode_image, sequential": _rate(tf_decoded, rounds),
        "decoded: ArrayRecord, Grain shuffled, reader.decode (Pillow)": _rate(grain_decoded, rounds),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmark.py formats", description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--input", type=Path, help="a folder of class folders of images (default: made under --data)")
    ap.add_argument("--data", type=Path, default=Path("bench-formats"), help="where the photos are made, once")
    ap.add_argument("--photos", type=int, default=2000, help="photos made when --input is not given")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (conversions) and timed passes (reads)")
    ap.add_argument("--work", type=Path, default=None, help="where the outputs go (default: under --data)")
    ap.add_argument("--out-json", type=Path, help="append the JSON lines here too")
    args = ap.parse_args(argv)

    src = args.input
    if src is None:
        src = args.data / "photos"
        if not src.exists():
            make_samples(src, per_class=max(1, args.photos // 3), jpeg_only=True)
    images = len(list_images(src))
    work = args.work or args.data / "work"
    outs = {fmt: work / fmt for fmt in FORMATS}

    def emit(line: dict[str, Any]) -> None:
        emit_json(line, args.out_json)

    common = ("--input", str(src), "--name", "bench", "--no-transform", "--overwrite", "--split-ratios", "train=1")

    def run(fmt: str) -> Callable[[], dict[str, Any]]:
        return lambda: measure_beam("convert", *common, "--output", str(outs[fmt]), "--format", fmt)

    results = interleaved(
        args.repeat,
        {fmt: run(fmt) for fmt in FORMATS},
        lambda r, fmt, res: emit({"kind": "convert", "round": r, "format": fmt, "images": images, **res}),
    )
    sizes = {fmt: sum(Path(f).stat().st_size for f in _files(outs[fmt], "train")) for fmt in FORMATS}
    rows = []
    for fmt in FORMATS:
        wall = statistics.median(r["seconds"] for r in results[fmt])
        cpu = statistics.median(r["cpu_seconds"] for r in results[fmt])
        rows.append([fmt, f"{wall:.1f} s", f"{images / wall:,.0f}", f"{cpu:.1f} s", f"{sizes[fmt] / 1e6:,.1f} MB"])
    print(f"\nconvert, {images:,} images, {args.repeat} rounds, medians", file=sys.stderr)
    print(markdown_table(["format", "wall", "images/s", "CPU", "shard bytes"], rows), file=sys.stderr)

    rates = read_rates(outs["tfrecord"], outs["array_record"], "train", args.repeat)
    for what, r in rates.items():
        emit({"kind": "read", "what": what, **r})
    print(f"\nreads, one process, {args.repeat} timed passes each, medians", file=sys.stderr)
    table = [[w, f"{r['records']:,}", f"{r['records_per_s']:,.0f}"] for w, r in rates.items()]
    print(markdown_table(["read", "records", "records/s"], table), file=sys.stderr)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0
