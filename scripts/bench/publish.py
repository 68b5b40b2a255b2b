"""Publishing N shards on GCS: requests and wall time, batched (now) against one file at a time (before).

    python scripts/benchmark.py publish --files 2000

Runs against a local gcp-storage-emulator (no network, no credentials), so
the wall times are the emulator's, not real GCS's; the request counts are
what carries over. Each variant publishes the same staging folder (N shards
plus dataset.json, labels.txt, rejects.jsonl) over an older dataset of N
shards with other names. "sequential" is the per-file way of commit 09cae3f
(exists + exists + copy + delete per file, a new client per call, each stale
file deleted alone), reproduced here; "batched" is ``publish.publish``.
Prints one JSON line per variant: {"variant", "files", "seconds", "requests",
"success_gone_seconds"} (the time the output had no _SUCCESS).
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from typing import Any

from bench.common import gcs_client, start_gcs_emulator

BUCKET = "bench"


class RequestCounter(logging.Handler):
    """Counts the emulator's access-log lines: one per HTTP request (a batch call is one).

    The watcher's polls of _SUCCESS are left out (so are publish's own few GETs of it).
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if 'HTTP/1.1"' in text and not ("GET" in text and "_SUCCESS" in text):
            with self._lock:
                self.count += 1


def _fill(client: Any, prefix: str, n: int, run: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    bucket = client.bucket(BUCKET)
    names = {f"{prefix}/old-train.tfrecord-{i:05d}-of-{n:05d}": b"o" for i in range(n)}
    names |= {f"{prefix}/dataset.json": b"{}", f"{prefix}/_SUCCESS": b""}
    staging = f"{prefix}/.beam_pipeline-tmp-{run}"
    names |= {f"{staging}/ds-train.tfrecord-{i:05d}-of-{n:05d}": b"n" for i in range(n)}
    names |= {f"{staging}/{m}": b"x" for m in ("labels.txt", "rejects.jsonl")}
    names[f"{staging}/dataset.json"] = json.dumps({"run_id": run, "status": "ok"}).encode()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: bucket.blob(kv[0]).upload_from_string(kv[1]), names.items()))


def sequential_publish(staging: str, out_dir: str) -> None:
    """The per-file publish of commit 09cae3f, for comparison."""
    from apache_beam.io.filesystems import FileSystems

    from beam_pipeline import metadata
    from beam_pipeline.run.publish import PUBLISHED_FILES
    from beam_pipeline.storage import files_under as _files_under
    from beam_pipeline.storage import list_dir

    def delete_quietly(paths: list[str]) -> None:
        for p in paths:
            try:
                FileSystems.delete([p])
            except Exception:  # noqa: BLE001
                pass

    success = FileSystems.join(out_dir, metadata.SUCCESS)
    delete_quietly([success])
    prefix = staging.rstrip("/") + "/"
    new_files = [p[len(prefix) :] for p in _files_under(staging)]
    new_top = {rel.split("/", 1)[0] for rel in new_files}
    for rel in new_files:
        src, dst = prefix + rel, FileSystems.join(out_dir, rel)
        if not FileSystems.exists(src) and FileSystems.exists(dst):
            continue
        FileSystems.rename([src], [dst])
    stale = [
        p
        for p in list_dir(out_dir)
        if p.rsplit("/", 1)[-1] not in new_top
        and (metadata.is_shard_file(p.rsplit("/", 1)[-1]) or p.rsplit("/", 1)[-1] in PUBLISHED_FILES)
    ]
    delete_quietly(stale)
    delete_quietly(_files_under(staging))
    with FileSystems.create(success) as fh:
        fh.write(b"")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmark.py publish", description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="shards in the new and in the old dataset")
    parser.add_argument("--variants", default="sequential,batched", help="comma-separated: sequential, batched")
    args = parser.parse_args(argv)
    chosen = args.variants.split(",")

    server = start_gcs_emulator(BUCKET)
    from beam_pipeline.run.publish import publish

    client = gcs_client()
    counter = RequestCounter()
    logging.getLogger("gcp_storage_emulator").addHandler(counter)
    logging.getLogger("gcp_storage_emulator").setLevel(logging.DEBUG)
    logging.getLogger("gcp_storage_emulator").propagate = False
    run = "20991231-000000-bench000"
    try:
        for variant, fn in (("sequential", sequential_publish), ("batched", publish)):
            if variant not in chosen:
                continue
            prefix = f"{variant}"
            _fill(client, prefix, args.files, run)
            out, staging = f"gs://{BUCKET}/{prefix}", f"gs://{BUCKET}/{prefix}/.beam_pipeline-tmp-{run}"
            gone: list[float] = []
            watcher_stop = threading.Event()

            def watch(prefix: str = prefix, gone: list[float] = gone, stop: threading.Event = watcher_stop) -> None:
                while not stop.is_set():  # when did _SUCCESS go, when did it come back
                    present = client.bucket(BUCKET).blob(f"{prefix}/_SUCCESS").exists()
                    if not present and not gone:
                        gone.append(time.perf_counter())
                    if present and gone and len(gone) == 1:
                        gone.append(time.perf_counter())
                    time.sleep(0.05)

            before = counter.count
            started = time.perf_counter()
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            fn(staging, out)
            seconds = time.perf_counter() - started
            time.sleep(0.2)
            watcher_stop.set()
            watcher.join()
            requests = counter.count - before
            names = [b.name for b in client.list_blobs(BUCKET, prefix=prefix + "/")]
            assert sum(".tfrecord-" in n for n in names) == args.files and f"{prefix}/_SUCCESS" in names
            print(
                json.dumps(
                    {
                        "variant": variant,
                        "files": args.files,
                        "seconds": round(seconds, 2),
                        "requests": requests,
                        "success_gone_seconds": round(gone[1] - gone[0], 2) if len(gone) == 2 else None,
                    }
                )
            )
    finally:
        server.stop()
