"""Beam's Python worker pool (environment type EXTERNAL) on 127.0.0.1, for scripts/cluster.sh.

Beam's own ``python -m apache_beam.runners.worker.worker_pool_main`` listens on every interface ("[::]") and
starts each SDK worker as ``python`` from PATH. This one uses Beam's servicer unchanged but listens on
127.0.0.1 only, and puts this interpreter's folder first on PATH so the workers run the same Python (the one
with beam_pipeline installed), whatever PATH the caller had.

    .venv/bin/python scripts/worker_pool.py --port 50000
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from concurrent import futures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

    servicer = BeamFnExternalWorkerPoolServicer(use_process=True)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)],
    )
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(servicer, server)
    if not server.add_insecure_port(f"{args.host}:{args.port}"):
        print(f"error: worker pool: cannot listen on {args.host}:{args.port}", file=sys.stderr)
        return 1
    server.start()
    logging.info("worker pool listening on %s:%d, workers run %s", args.host, args.port, sys.executable)

    stopped = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped.wait()
    # The SDK workers this pool started end with it (a worker left behind would hold its slot's memory).
    for worker in list(servicer._worker_processes.values()):
        worker.terminate()
    for worker in list(servicer._worker_processes.values()):
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
    server.stop(2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
