"""What can be checked here of the Dataflow deployment: template parameters, image, scripts, DAG, dates."""

from __future__ import annotations

import json
import os
import py_compile
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from beam_pipeline.cli import parse_convert
from beam_pipeline.flags import CONFIG_KEYS
from beam_pipeline.flex_main import convert_args

from .conftest import REPO

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("checkout_build_lock")]

EXAMPLES = {
    "input": "gs://b/photos",
    "manifest": "gs://b/list.csv",
    "coco": "gs://b/annotations/instances_train2017.json",
    "coco_category_offset": "1",
    "voc": "gs://b/VOC2012/Annotations",
    "masks": "gs://b/VOC2012/SegmentationClass",
    "manifest_objects": "rows",
    "box_units": "normalized",
    "output": "gs://b/datasets/photos/{date}",
    "name": "photos",
    "run_date": "2026-11-22",
    "labels_from": "folder",
    "label_regex": "_([a-z]+)\\.png$",
    "labels_file": "gs://b/labels.txt",
    "label_separator": "|",
    "incremental_from": "latest",
    "keep_last": "7",
    "allow_split_names": "false",
    "no_split_folders": "false",
    "split_ratios": "train=0.8,validation=0.1,test=0.1",
    "seed": "7",
    "target_shard_mb": "150",
    "compression": "none",
    "format": "array_record",
    "max_reject_fraction": "0.05",
    "reject_allowance": "10",
    "overwrite": "true",
    "dedupe": "false",
    "near_duplicates": "drop-leaks",
    "report": "true",
    "image_size": "224",
}


def test_template_parameters_are_convert_settings_with_working_regexes():
    meta = json.loads((REPO / "templates" / "metadata.json").read_text())
    names = [p["name"] for p in meta["parameters"]]
    assert set(names) == set(EXAMPLES)
    for param in meta["parameters"]:
        assert param["name"] in CONFIG_KEYS and param["label"] and param["helpText"]
        for regex in param["regexes"]:
            assert re.match(regex, EXAMPLES[param["name"]]), param["name"]
    [incremental] = [p["regexes"] for p in meta["parameters"] if p["name"] == "incremental_from"]
    assert all(re.match(r, "gs://b/datasets/photos/2026-11-21") for r in incremental)
    assert not any(re.match(r, v) for r in incremental for v in ("yesterday", "Latest", "/local/path"))
    required = {p["name"] for p in meta["parameters"] if not p["isOptional"]}
    assert required == {"output", "name"}


def test_template_parameters_reach_convert():
    sources = ("coco", "coco_category_offset", "voc", "masks", "manifest_objects", "box_units")  # tested below
    skip = ("manifest", "label_regex", "labels_from", "labels_file", "label_separator", *sources)
    params = [f"--{k}={v}" for k, v in EXAMPLES.items() if k not in skip]
    command, *args = convert_args([*params, "--project=p", "--region=r"])
    assert "--incremental-from=latest" in args
    cfg, beam_flags, _ = parse_convert(args)
    assert command == "convert"
    assert cfg.detach is True  # the template launcher submits and leaves; the job publishes itself
    assert "--runner=DataflowRunner" in beam_flags
    assert cfg.output == "gs://b/datasets/photos/2026-11-22"
    assert cfg.overwrite is True and cfg.dedupe is False and cfg.format == "array_record"
    assert cfg.split_ratios == (("train", 0.8), ("validation", 0.1), ("test", 0.1))
    assert "--project=p" in beam_flags and "--job_name=photos-2026-11-22" in beam_flags
    assert cfg.incremental_from == "latest" and cfg.output_template == "gs://b/datasets/photos/{date}"
    assert cfg.run_date == "2026-11-22"
    assert cfg.keep_last == 7 and cfg.allow_split_names is False
    assert cfg.near_duplicates == "drop-leaks" and cfg.report is True


@pytest.mark.parametrize(
    ("source", "local"),
    [("coco", "/local/instances.json"), ("voc", "/local/Annotations"), ("masks", "/local/SegmentationClass")],
)
def test_annotation_template_parameters_reach_convert(source: str, local: str) -> None:
    """A detection or segmentation dataset launched from the Flex Template: --coco / --voc / --masks arrives
    as convert's flag."""
    params = [f"--{k}={EXAMPLES[k]}" for k in ("input", source, "output", "name", "run_date")]
    command, *args = convert_args(params)
    cfg, _, _ = parse_convert(args)
    assert command == "convert" and getattr(cfg, source) == EXAMPLES[source] and cfg.input == EXAMPLES["input"]
    meta = json.loads((REPO / "templates" / "metadata.json").read_text())
    [param] = [p for p in meta["parameters"] if p["name"] == source]
    assert not any(re.match(r, local) for r in param["regexes"])
    if source == "coco":  # a Label Studio export (categories from 0) launched from the template
        _, *args = convert_args([*params, f"--coco_category_offset={EXAMPLES['coco_category_offset']}"])
        assert parse_convert(args)[0].coco_category_offset == 1


def test_manifest_objects_template_parameters_reach_convert() -> None:
    keys = ("manifest", "manifest_objects", "box_units", "output", "name", "run_date")
    command, *args = convert_args([f"--{k}={EXAMPLES[k]}" for k in keys])
    cfg, _, _ = parse_convert(args)
    assert (cfg.manifest, cfg.manifest_objects, cfg.box_units) == ("gs://b/list.csv", "rows", "normalized")
    keys = ("manifest", "labels_from", "label_separator", "output", "name")
    _, *args = convert_args([f"--{k}={EXAMPLES[k]}" if k != "labels_from" else "--labels_from=manifest" for k in keys])
    cfg, _, _ = parse_convert(args)
    assert cfg.label_separator == "|"


def test_dated_output_and_job_name():
    cfg, flags, _ = parse_convert(
        ["--input", "i", "--output", "out/{date}", "--run-date", "2026-01-31", "--name", "Pets_1"]
    )
    assert cfg.output == "out/2026-01-31" and "--job_name=pets-1-2026-01-31" in flags
    cfg, flags, _ = parse_convert(["--input", "i", "--output", "out/{date}", "--job_name", "mine"])
    assert re.fullmatch(r"out/\d{4}-\d{2}-\d{2}", cfg.output) and not any(f.startswith("--job_name=") for f in flags)
    for bad in ("22.11.2026", "2026-02-30"):
        with pytest.raises(Exception, match="run-date"):
            parse_convert(["--input", "i", "--output", "o/{date}", "--run-date", bad])
    cfg, _, _ = parse_convert(["--input", "i", "--output", "o", "--run-date", "2026-01-31"])
    assert cfg.output == "o" and cfg.output_template is None and cfg.run_date is None


@pytest.mark.pipeline
def test_dockerfile_matches_the_pinned_versions():
    docker = (REPO / "Dockerfile").read_text()
    constraints = (REPO / "requirements" / "constraints.txt").read_text()
    beam = re.search(r"^apache-beam==(\S+)$", constraints, re.M).group(1)
    assert re.search(rf"ARG BEAM_VERSION={re.escape(beam)}$", docker, re.M)
    assert "FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}" in docker
    assert re.search(r'pip install .*-c requirements/constraints.txt "\.\[transform,array_record\]"', docker)
    assert "COPY setup.py" in docker and "FLEX_TEMPLATE_PYTHON_PY_FILE=/template/beam_pipeline/flex_main.py" in docker


@pytest.mark.e2e
@pytest.mark.parametrize("script", ["build_template.sh", "run_template.sh", "schedule.sh"])
def test_deploy_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / "scripts" / "dataflow" / script)], check=True)


@pytest.mark.e2e
def test_scheduled_runs_build_on_the_previous_night(tmp_path):
    """Every nightly launcher passes incremental_from=latest for a dated output (the first night converts all)."""
    body = _scheduler_body(tmp_path / "dated", "gs://b/datasets/photos/{date}")
    assert body["parameters"]["incremental_from"] == "latest" and body["parameters"]["output"].endswith("/{date}")
    assert "incremental_from" not in _scheduler_body(tmp_path / "plain", "gs://b/datasets/photos")["parameters"]
    run_template = (REPO / "scripts" / "dataflow" / "run_template.sh").read_text()
    assert 'INCREMENTAL=",incremental_from=latest"' in run_template and "${INCREMENTAL}" in run_template
    dag = (REPO / "scripts" / "airflow" / "beam_pipeline_dag.py").read_text()
    assert '"incremental_from": "latest"' in dag and '"output": f"gs://{bucket}/datasets/{NAME}/{{date}}"' in dag


def _scheduler_body(stub_dir: Path, output: str) -> dict:
    """The launch request schedule.sh sends, through a stub gcloud that records its arguments."""
    stub_dir.mkdir()
    stub = stub_dir / "gcloud"
    stub.write_text('#!/bin/sh\n[ "$3" = describe ] && exit 1\nprintf "%s\\0" "$@" > "$(dirname "$0")/args"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", "GCP_PROJECT": "p",
           "GCP_REGION": "r", "GCS_BUCKET": "b", "SCHEDULER_SA": "sa@p.iam.gserviceaccount.com"}  # fmt: skip
    script = REPO / "scripts" / "dataflow" / "schedule.sh"
    subprocess.run(["bash", str(script), "gs://b/photos", output, "photos"], env=env, check=True, capture_output=True)
    args = (stub_dir / "args").read_text().split("\0")
    return json.loads(args[args.index("--message-body") + 1])["launchParameter"]


@pytest.mark.e2e
def test_every_launcher_runs_the_workers_in_the_template_image(tmp_path):
    """run_template.sh, schedule.sh and the DAG pass the image build_template.sh builds as sdk_container_image."""
    image = "r-docker.pkg.dev/p/beam-pipeline/beam-pipeline:" + _version()
    assert _scheduler_body(tmp_path / "s", "gs://b/out")["parameters"]["sdk_container_image"] == image
    stub_dir = tmp_path / "run"
    stub_dir.mkdir()
    stub = stub_dir / "gcloud"
    stub.write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$(dirname "$0")/args"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", "GCP_PROJECT": "p",
           "GCP_REGION": "r", "GCS_BUCKET": "b"}  # fmt: skip
    script = REPO / "scripts" / "dataflow" / "run_template.sh"
    subprocess.run(["bash", str(script), "gs://b/in", "gs://b/out", "photos"], env=env, check=True, capture_output=True)
    args = (stub_dir / "args").read_text().split("\0")
    assert f"sdk_container_image={image}" in args[args.index("--parameters") + 1].split(",")
    dag = (REPO / "scripts" / "airflow" / "beam_pipeline_dag.py").read_text()
    assert '"sdk_container_image": "{{ var.value.beam_pipeline_image }}"' in dag


def _version() -> str:
    import re

    return re.search(r'__version__ = "([^"]+)"', (REPO / "beam_pipeline" / "__init__.py").read_text()).group(1)


def test_airflow_dag_compiles():
    py_compile.compile(str(REPO / "scripts" / "airflow" / "beam_pipeline_dag.py"), doraise=True)


@pytest.mark.e2e
def test_the_wheel_installs_by_role(tmp_path):
    """pip install . is the reader (TensorFlow as a range, nothing else); Beam and TFT are extras; [test] has all."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [wheel] = list(tmp_path.glob("beam_pipeline-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    requires = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    base = [r for r in requires if "extra ==" not in r]
    assert base == ["tensorflow<3,>=2.16"]  # no Beam, no GCP client, no TFDS: a training environment keeps its TF

    def extra(name: str) -> set[str]:
        return {r.split(";")[0].strip() for r in requires if f'extra == "{name}"' in r}

    assert extra("tfds") == {"tensorflow-datasets<5,>=4.9.9", "tensorflow-metadata<1.18,>=1.17.3"}
    assert {"apache-beam[gcp]<3,>=2.77.0", "google-cloud-storage<4,>=3.17.1", "pillow>=12.3"} <= extra("convert")
    assert not any(r.startswith("tensorflow") for r in extra("convert"))
    assert extra("transform") == extra("convert") | {"tensorflow<2.22,>=2.21", "tensorflow-transform<1.22,>=1.21"}
    assert extra("test") >= extra("transform") | {"tensorflow-datasets<5,>=4.9.9", "pytest>=8"}
    assert not any(r.startswith("tensorflow-metadata") for r in extra("test"))  # TFT needs tfmd 1.21
    assert "beam-pipeline = beam_pipeline.cli:console_main" in entry_points
