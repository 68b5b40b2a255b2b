"""Benchmark: reading many small gs:// objects, Beam's FileSystems.open per read vs the writer's reader.

    .venv/bin/python scripts/benchmark.py gcs-read --objects 300

Starts the pure-Python GCS emulator (gcp-storage-emulator) on loopback,
uploads ``--objects`` JPEGs of ~30 KB, then reads them all three ways and
prints objects per second:

- ``FileSystems.open`` (a new GcsIO and storage client per read, a metadata
  request before the media request), on as many threads as cores: the old path;
- ``storage.read_bytes`` (one client per thread, one request per object) on
  as many threads as cores;
- ``storage.read_bytes`` on ``writer.shard.IO_THREADS`` threads: the writer now.

The emulator answers far faster than real GCS (no network, no TLS), so the
ratios understate what latency does to the old path on Dataflow.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

from bench.common import gcs_client, start_gcs_emulator


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py gcs-read", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--objects", type=int, default=300)
    args = p.parse_args(argv)

    server = start_gcs_emulator("bench")
    try:
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        from beam_pipeline import storage as bp_storage
        from beam_pipeline.writer.shard import IO_THREADS
        from tests.imagegen import image_bytes

        bucket = gcs_client().bucket("bench")
        data = image_bytes("jpeg", 240, 320, seed=1)
        paths = []
        for i in range(args.objects):
            bucket.blob(f"small/{i:05d}.jpg").upload_from_string(data)
            paths.append(f"gs://bench/small/{i:05d}.jpg")

        def old(path: str) -> bytes:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
                return fh.read()

        def new(path: str) -> bytes:
            return bp_storage.read_bytes(path, len(data))

        cores = os.cpu_count() or 1
        for name, fn, threads in (
            ("FileSystems.open per read", old, cores),
            ("read_bytes, client per thread", new, cores),
            ("read_bytes, IO_THREADS", new, IO_THREADS),
        ):
            started = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                assert all(len(b) == len(data) for b in pool.map(fn, paths))
            seconds = time.perf_counter() - started
            print(f"{name:32} {threads:>3} threads  {args.objects / seconds:8.1f} objects/s")
    finally:
        server.stop()
    return 0
