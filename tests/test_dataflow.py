"""The Dataflow job, built offline (Beam's --dry_run), and the package Dataflow workers install."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from .conftest import BUCKET, REPO, gcs_that_does_not_answer, run_cli
from .imagegen import image_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("checkout_build_lock")]

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
    # No worker image: the sdist of setup.py, built here (no stray "No module named build" line), and one note
    assert job["sdk_container_image"] is None and job["setup_file"] is None
    assert [p.rsplit("-", 1)[0] for p in job["extra_packages"]] == ["beam_pipeline"]
    assert "build" not in result.stderr.replace("building", "")
    assert result.stderr.count("note: --setup_file: each worker pip-installs") == 1, result.stderr
    assert job["steps"] > 20
    # The job analyses and publishes itself: a Flex Template launcher does not wait for it.
    assert job["post_steps"] == "job" and "PostSteps" in job["step_names"]
    assert elapsed < 90, elapsed  # seconds, not a credential time-out
    assert not list(gcs.list_blobs(BUCKET, prefix="dry/out/"))  # nothing ran


def _template_run(gcs, monkeypatch, name: str, config: str = "configs/dataflow.yaml") -> tuple[dict, dict[str, str]]:
    """A --template_location run of one image's folder: (the job request, {staged file name: its blob name})."""
    gcs.bucket(BUCKET).blob(f"{name}/in/cat/a.jpg").upload_from_string(image_bytes("jpeg"))
    for key, value in DATAFLOW_ENV.items():
        monkeypatch.setenv(key, value)
    template = f"gs://{BUCKET}/{name}/templates/pets.json"
    result = run_cli(
        "convert", "--config", config, "--input", f"gs://{BUCKET}/{name}/in",
        "--output", f"gs://{BUCKET}/{name}/out", "--name", "pets", "--template_location", template, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"job request written to {template}" in result.stdout
    assert not list(gcs.list_blobs(BUCKET, prefix=f"{name}/out/"))  # nothing ran
    request = json.loads(gcs.bucket(BUCKET).blob(f"{name}/templates/pets.json").download_as_bytes())
    [pool] = request["environment"]["workerPools"]
    prefix = f"storage.googleapis.com/{BUCKET}/"
    return request, {p["name"]: p["location"][len(prefix) :] for p in pool["packages"]}


def test_full_dataflow_job_request_is_staged_on_the_emulator(gcs, monkeypatch):
    """--template_location: the DataflowRunner stages the package and writes the whole job request, unsubmitted."""
    request, staged = _template_run(gcs, monkeypatch, "tl")
    assert request["type"] == "JOB_TYPE_BATCH"
    env = request["environment"]
    [pool] = env["workerPools"]
    assert (pool["machineType"], pool["diskSizeGb"], pool["autoscalingSettings"]["maxNumWorkers"]) == (
        "n2-standard-4", 50, 20,
    )  # fmt: skip
    assert "use_runner_v2" in env["experiments"]
    assert env["sdkPipelineOptions"]["options"]["project"] == "my-project"
    [sdist] = [name for name in staged if name.startswith("beam_pipeline-")]  # the sdist of setup.py
    # TFT is an extra: --setup_file workers that run the analysis get it from the staged requirements file
    requirements = gcs.bucket(BUCKET).blob(staged["requirements.txt"]).download_as_bytes().decode()
    assert "tensorflow-transform==" in requirements and "pillow==" in requirements  # the converter too
    sdist = gcs.bucket(BUCKET).blob(staged[sdist]).download_as_bytes()
    with tarfile.open(fileobj=io.BytesIO(sdist)) as tar:
        assert any(n.endswith("beam_pipeline/run/poststeps.py") for n in tar.getnames())
    graph = gcs.bucket(BUCKET).blob(staged["pickled_main_session"].rsplit("/", 1)[0] + "/pipeline.pb")
    assert b"PostSteps" in graph.download_as_bytes()  # the job analyses and publishes itself


def test_a_worker_image_is_the_workers_sdk_container_and_nothing_is_installed(gcs, monkeypatch):
    """WORKER_IMAGE (configs/dataflow.yaml): the job request runs the workers in it; no sdist, no requirements."""
    image = "europe-west1-docker.pkg.dev/my-project/beam-pipeline/beam-pipeline:1.0"
    monkeypatch.setenv("WORKER_IMAGE", image)
    request, staged = _template_run(gcs, monkeypatch, "wi")
    [pool] = request["environment"]["workerPools"]
    assert {c["containerImage"] for c in pool["sdkHarnessContainerImages"]} == {image}
    assert request["environment"]["sdkPipelineOptions"]["options"]["sdk_container_image"] == image
    assert not [n for n in staged if n.startswith("beam_pipeline-") or n in ("requirements.txt", "workflow.tar.gz")]


def test_a_setup_file_alone_stages_our_requirements_file_and_leaves_no_local_file(gcs, monkeypatch, tmp_path):
    """--setup_file without a requirements file: the launcher writes one for the workers (the converter and TFT
    extras), the runner stages it, and no local file of the submission is left when the launcher returns (ours,
    nor the sdist and pickled session Beam's stager builds: a nightly launcher would gather them per run)."""
    config = tmp_path / "dataflow.yaml"
    lines = (REPO / "configs" / "dataflow.yaml").read_text().splitlines(keepends=True)
    config.write_text("".join(line for line in lines if "requirements_" not in line))
    launcher_tmp = tmp_path / "tmp"
    launcher_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(launcher_tmp))
    _, staged = _template_run(gcs, monkeypatch, "sf", config=str(config))
    requirements = gcs.bucket(BUCKET).blob(staged["requirements.txt"]).download_as_bytes().decode().split()
    from importlib import metadata

    # at the launcher's versions: a worker resolving setup.py's ranges could get newer releases than built the job
    for name in ("tensorflow-transform", "pillow", "tensorflow", "numpy"):
        assert f"{name}=={metadata.version(name)}" in requirements, requirements
    assert not list(launcher_tmp.iterdir()), sorted(p.name for p in launcher_tmp.iterdir())


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
    for module in (
        "cli.py",
        "pipeline.py",
        "storage.py",
        "backends/gcs.py",
        "writer/shard.py",
        "analysis.py",
        "__main__.py",
    ):
        assert any(n.endswith(f"beam_pipeline/{module}") for n in names), module
    base = requires.split("\n[", 1)[0]  # requires.txt lists extras under [name] sections after the base
    assert base.split() == ["tensorflow<3,>=2.16"]  # workers add the converter from a requirements file
    convert = requires.split("[convert]\n", 1)[1].split("\n[", 1)[0]
    assert "apache-beam[gcp]" in convert and "pillow" in convert
    assert "tensorflow-transform<1.22,>=1.21" in requires.split("[transform]\n", 1)[1]


@pytest.mark.unit
def test_the_dataflow_config_leaves_the_worker_requirements_to_the_launcher():
    """A fixed requirements file in the config gave the workers the repository's pins whatever the launcher ran;
    without one the launcher writes its own installed versions (run.workers.worker_requirements, tested in
    tests/test_install.py). The prebuilt worker image has the extra too."""
    config = (REPO / "configs" / "dataflow.yaml").read_text()
    assert "requirements_file" not in config and "setup_file: ./setup.py" in config
    assert '".[transform,array_record]"' in (REPO / "Dockerfile").read_text()


# ---- DataflowRunner before anything is staged: local paths, unreachable buckets, the sdist ------------------

DATAFLOW_FLAGS = ["--runner=DataflowRunner", "--project=my-project", "--region=europe-west1"]


def _convert_in_process(capsys, *args: str) -> tuple[int, str, float]:
    from beam_pipeline.cli import main

    started = time.monotonic()
    code = main(["convert", "--name", "pets", "--no-transform", "--no-tfds-metadata", *DATAFLOW_FLAGS, *args])
    return code, capsys.readouterr().err.strip(), time.monotonic() - started


def test_a_local_path_with_dataflow_is_a_usage_error_before_anything_is_staged(capsys, tmp_path):
    """Workers cannot read the launcher's disk: before, the job was built with paths no worker could read."""
    (tmp_path / "in" / "cat").mkdir(parents=True)
    (tmp_path / "in" / "cat" / "a.jpg").write_bytes(image_bytes("jpeg"))
    (tmp_path / "list.csv").write_text("path\n")
    remote = ["--input", "gs://b/in", "--output", "gs://b/out", "--temp_location", "gs://b/tmp"]
    cases = {
        "--input": str(tmp_path / "in"),
        "--output": str(tmp_path / "out"),
        "--temp_location": str(tmp_path / "tmp"),
        "--staging_location": str(tmp_path / "staging"),
    }
    for flag, local in cases.items():
        args = [*remote, flag, local]
        code, err, _ = _convert_in_process(capsys, *args)
        assert code == 2, (flag, err)
        assert err.splitlines() == [
            f"error: {flag} {local}: a local path, but Dataflow workers cannot read this machine's disk; "
            "give a gs:// path"
        ], err
    code, err, _ = _convert_in_process(capsys, "--manifest", str(tmp_path / "list.csv"), *remote[2:])
    assert code == 2 and err.startswith(f"error: --manifest {tmp_path / 'list.csv'}: a local path"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "list.csv"]  # nothing written


def test_dataflow_locations_without_an_answer_fail_in_seconds_naming_the_flag(gcs, monkeypatch, capsys):
    """No network (here: a missing bucket, and the server down): before, Beam's option validation asked GCS about
    --temp_location with two-minute retries per location, minutes of silence."""

    gcs.bucket(BUCKET).blob("dl/in/cat/a.jpg").upload_from_string(image_bytes("jpeg"))
    run = ["--input", f"gs://{BUCKET}/dl/in", "--output", f"gs://{BUCKET}/dl/out"]
    ours = f"--temp_location=gs://{BUCKET}/tmp"
    cases = [
        ([*run, "--temp_location=gs://no-such-bucket/tmp"], "--temp_location gs://no-such-bucket/tmp"),
        ([*run, ours, "--staging_location=gs://no-such-bucket/st"], "--staging_location gs://no-such-bucket/st"),
        ([*run, ours, "--template_location=gs://no-such-bucket/t.json"], "--template_location gs://no-such-bucket/t.json"),
    ]  # fmt: skip
    for args, flag in cases:
        code, err, took = _convert_in_process(capsys, *args)
        assert code == 2 and err.splitlines() == [f"error: {flag}: no bucket gs://no-such-bucket (GCS: 404 Not Found)"]
        assert took < 30, took
    address = gcs_that_does_not_answer(monkeypatch)
    code, err, took = _convert_in_process(capsys, *run, ours, f"--template_location=gs://{BUCKET}/t.json")
    assert code == 2
    assert err.splitlines() == [
        f"error: --temp_location gs://{BUCKET}/tmp: cannot reach the GCS emulator at {address} "
        "(STORAGE_EMULATOR_HOST) (Connection refused): check the network connection or proxy"
    ]
    assert took < 15, took


def test_the_sdist_is_built_without_a_stray_build_line_beside_a_build_folder(gcs, monkeypatch, capfd, tmp_path):
    """Beam's stager ran `python -m build` in the setup file's folder, where a checkout's build/ folder shadows
    pypa's build: 'No module named build.__main__' on stderr before its setup.py fallback."""
    import shutil

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy(REPO / name, checkout / name)
    shutil.copytree(REPO / "beam_pipeline", checkout / "beam_pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / "build" / "lib").mkdir(parents=True)  # what setuptools leaves
    gcs.bucket(BUCKET).blob("sd/in/cat/a.jpg").upload_from_string(image_bytes("jpeg"))
    monkeypatch.chdir(checkout)
    from beam_pipeline.cli import main

    code = main([
        "convert", "--name", "pets", "--no-transform", "--no-tfds-metadata", *DATAFLOW_FLAGS,
        "--input", f"gs://{BUCKET}/sd/in", "--output", f"gs://{BUCKET}/sd/out", f"--temp_location=gs://{BUCKET}/tmp",
        f"--setup_file={checkout / 'setup.py'}", "--dry_run=True",
    ])  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "No module named build" not in err and "No module named build" not in out
    job = json.loads(out.split("\n", 1)[1])
    assert job["setup_file"] is None and job["extra_packages"][0].startswith("beam_pipeline-")
