"""Shared fixtures: CLI runs in a subprocess, TensorFlow read-back helpers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def gcs_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> str:
    """Points STORAGE_EMULATOR_HOST at a closed loopback port and lets the gs:// checks give up after 2 s:
    a GCS server that is down. Returns the address."""
    from beam_pipeline import storage

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    address = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", address)
    monkeypatch.setattr(storage, "GCS_CHECK_DEADLINE_S", 2.0)
    return address


def run_cli(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 300) -> CliResult:
    """``python -m beam_pipeline ARGS`` as a user runs it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def convert(*args: str, transform: bool = False, tfds: bool = False, **kwargs: Any) -> CliResult:
    """A conversion that must succeed; TFT analysis and TFDS metadata (TensorFlow imports, seconds
    each) only where a test asks for them."""
    if not transform and "--no-transform" not in args:
        args = (*args, "--no-transform")
    if not tfds and "--no-tfds-metadata" not in args:
        args = (*args, "--no-tfds-metadata")
    result = run_cli("convert", *args, **kwargs)
    assert result.returncode == 0, f"convert failed ({result.returncode}):\n{result.stderr}\n{result.stdout}"
    return result


def load_info(out: Path) -> dict[str, Any]:
    return json.loads((out / "dataset.json").read_text())


def read_records(out: Path, split: str | None = None) -> list[dict[str, Any]]:
    """Every record of the output, parsed with TensorFlow, in shard order."""
    import tensorflow as tf

    info = load_info(out)
    compression = "GZIP" if info["compression"] == "gzip" else None
    rows = []
    for name, s in info["splits"].items():
        if split is not None and name != split:
            continue
        for shard in s["shards"]:
            for raw in tf.data.TFRecordDataset(str(out / shard["file"]), compression_type=compression):
                example = tf.train.Example.FromString(raw.numpy())
                row: dict[str, Any] = {"_split": name, "_shard": shard["file"]}
                for key, feature in example.features.feature.items():
                    kind = feature.WhichOneof("kind")
                    values = list(getattr(feature, kind).value)
                    row[key] = values[0] if len(values) == 1 else values
                rows.append(row)
    return rows


@pytest.fixture(scope="session")
def tf():
    import tensorflow

    return tensorflow


def local_pipeline(**kwargs: Any):
    """A TestPipeline on the Python engine (the plain DirectRunner would try Prism first)."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.test_pipeline import TestPipeline

    return TestPipeline(runner=FnApiRunner(), **kwargs)


@pytest.fixture(autouse=True, scope="session")
def _no_prism():
    """Fails any test whose pipeline reaches Prism: it would download a binary."""
    from apache_beam.runners.portability import prism_runner

    original = prism_runner.PrismRunner.run_pipeline

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("a pipeline tried the Prism runner (a run-time download)")

    prism_runner.PrismRunner.run_pipeline = refuse
    yield
    prism_runner.PrismRunner.run_pipeline = original


BUCKET = "beam-pipeline-test"


@pytest.fixture(scope="session")
def gcs():
    """A GCS protocol server on loopback (gcp-storage-emulator); CLI runs inherit its address."""
    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"  # inherited by the CLI runs
    try:
        yield storage.Client(project="test", credentials=AnonymousCredentials())
    finally:
        server.stop()
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old
