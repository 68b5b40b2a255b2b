"""The Dataflow job, built offline (Beam's --dry_run), and the package Dataflow workers install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time

from .conftest import BUCKET, REPO, run_cli
from .imagegen import image_bytes

DATAFLOW_ENV = {"GCP_PROJECT": "my-project", "GCP_REGION": "europe-west1", "GCS_BUCKET": BUCKET}


def test_dataflow_job_builds_offline_with_the_configured_options(gcs, monkeypatch):
    gcs.bucket(BUCKET).blob("dry/in/cat/a.jpg").upload_from_string(image_bytes("jpeg"))
    for key, value in DATAFLOW_ENV.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    result = run_cli(
        "convert", "--config", "configs/dataflow.yaml", "--input", f"gs://{BUCKET}/dry/in",
        "--output", f"gs://{BUCKET}/dry/out", "--name", "pets", "--dry_run=True", cwd=REPO,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout.split("\n", 1)[1])
    assert job["runner"] == "DataflowRunner"
    assert (job["project"], job["region"]) == ("my-project", "europe-west1")
    assert job["temp_location"] == f"gs://{BUCKET}/beam_pipeline/tmp"
    assert (job["machine_type"], job["max_num_workers"]) == ("n2-standard-4", 20)
    assert job["setup_file"] == "./setup.py"
    assert job["steps"] > 20
    assert elapsed < 90, elapsed  # seconds, not a credential time-out
    assert not list(gcs.list_blobs(BUCKET, prefix="dry/out/"))  # nothing ran


def test_dataflow_config_names_a_missing_environment_variable(monkeypatch):
    monkeypatch.delenv("GCP_PROJECT", raising=False)
    result = run_cli("convert", "--config", "configs/dataflow.yaml", "--input", "x", "--output", "y", cwd=REPO)
    assert result.returncode == 2 and "GCP_PROJECT" in result.stderr


def test_sdist_for_setup_file_carries_the_package_and_its_requirements(tmp_path):
    env = dict(os.environ)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)],
        cwd=REPO, check=True, capture_output=True, env=env,
    )  # fmt: skip
    [archive] = list(tmp_path.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        pkg_info = next(n for n in names if n.endswith("beam_pipeline.egg-info/requires.txt"))
        requires = tar.extractfile(pkg_info).read().decode()
    for module in ("cli.py", "pipeline.py", "writing.py", "analysis.py", "__main__.py"):
        assert any(n.endswith(f"beam_pipeline/{module}") for n in names), module
    for requirement in ("apache-beam[gcp]", "tensorflow-transform", "tensorflow", "pillow"):
        assert requirement in requires, requirement
