"""Install by role: the reader side runs without Beam; a part that is not installed is one line naming its extra.

"Not installed" is simulated in a fresh interpreter with ``sys.modules[name] = None``
(Python then refuses to import ``name``), so these tests run offline in the test
environment; scripts/check_install_matrix.sh checks the real installs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_pipeline.run import local

from .conftest import REPO, convert, load_info
from .imagegen import image_bytes, write

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("checkout_build_lock")]

CONVERTER_MODULES = ("apache_beam", "PIL", "yaml")


def _python(code: str, *, without: tuple[str, ...] = (), cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter where the modules ``without`` cannot be imported."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in without)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A converted dataset of 12 images in two shards (raw records only)."""
    root = tmp_path_factory.mktemp("install")
    for i in range(12):
        write(str(root / "in" / ["cat", "dog"][i % 2] / f"{i:02d}.png"), image_bytes("png", 8 + i, 8, seed=i))
    out = root / "out"
    convert("--input", str(root / "in"), "--output", str(out), "--target-shard-mb", "0.0005")
    assert load_info(out)["splits"]["train"]["num_shards"] > 1
    return out


def test_the_reader_modules_import_without_beam():
    """The base install (the reader side) has no Beam: importing what it uses must not pull Beam in."""
    result = _python(
        "import beam_pipeline, beam_pipeline.reader, beam_pipeline.cli, beam_pipeline.errors, beam_pipeline.config\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'tensorflow_transform', 'PIL'))\n"
        "print(bad)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.smoke
def test_reader_load_reads_two_epochs_with_beam_not_importable(small):
    result = _python(
        "from beam_pipeline import reader\n"
        f"ds = reader.load({str(small)!r}, 'train')\n"
        "first = [r['image/filename'].numpy() for r in ds]\n"
        "second = [r['image/filename'].numpy() for r in ds]\n"
        "assert sorted(first) == sorted(second) and first != second, (first, second)\n"
        "print(len(first))",
        without=CONVERTER_MODULES + ("tensorflow_transform",),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "12"


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("convert", ["--input", "photos", "--output", "out"]),
        ("plan", ["--input", "photos", "--output", "out"]),
        ("convert", ["--config", "configs/local.yaml", "--input", "photos", "--output", "out"]),
        ("inspect", ["out"]),
    ],
)
def test_a_command_without_the_converter_is_one_line_naming_the_install(command, args, tmp_path):
    result = _python(
        f"from beam_pipeline.cli import console_main\nsys.argv = ['beam-pipeline', {command!r}, *{args!r}]\n"
        "console_main()",
        without=("apache_beam",),
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == f"error: {command} needs the converter: pip install 'beam_pipeline[convert]'\n"


def test_transformed_without_tensorflow_transform_names_the_extra(small):
    result = _python(
        "from beam_pipeline import reader\n"
        "try:\n"
        f"    reader.load({str(small)!r}, 'train', transformed=True)\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e.name, str(e), sep='|')",
        without=("tensorflow_transform",),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "MissingExtraError|tensorflow_transform|"
        "reader.load(transformed=True) needs tensorflow-transform: pip install 'beam_pipeline[transform]'"
    )


def _worker_requirements(cfg_changes: dict, flags: list[str]) -> list[str] | None:
    """The requirements with_worker_requirements adds for these flags (None: it leaves the flags as they are)."""
    import dataclasses
    import tempfile

    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run.workers import with_worker_requirements

    cfg = dataclasses.replace(ConvertConfig(output="gs://b/out", name="d", input="gs://b/in"), **cfg_changes)
    flags = ["--runner=DataflowRunner", *flags]
    with tempfile.TemporaryDirectory() as folder:
        args = with_worker_requirements(cfg, flags, folder)
        if args == flags:
            return None
        assert args[: len(flags)] == flags and "--requirements_cache=skip" in args
        [path] = [a.split("=", 1)[1] for a in args if a.startswith("--requirements_file=")]
        assert Path(path).parent == Path(folder)
        return Path(path).read_text().split()


@pytest.mark.unit
def test_setup_file_workers_get_the_converter_they_install_without_extras():
    """--setup_file workers install the base package (TensorFlow only): the converter comes in a requirements file,
    TFT too when the job runs the analysis; Beam is the worker image's. Each at the launcher's version, not
    setup.py's range, which a worker would resolve to whatever is newest the day it starts."""
    from importlib import metadata

    converter_only = _worker_requirements({"transform": False}, ["--setup_file=./setup.py"])
    assert converter_only is not None
    pins = dict(r.split("==") for r in converter_only)
    assert {"pillow", "pyyaml", "google-cloud-storage", "tensorflow"} <= set(pins)
    assert "apache-beam" not in pins and "tensorflow-transform" not in pins
    assert all(version == metadata.version(name) for name, version in pins.items()), pins
    with_tft = _worker_requirements({"transform": True, "post_steps": "job"}, ["--setup_file=./setup.py"])
    assert set(converter_only) < set(with_tft)
    assert f"tensorflow-transform=={metadata.version('tensorflow-transform')}" in with_tft
    # --format array_record: its library too (its other requirements are the converter's already)
    with_array_record = _worker_requirements({"transform": False, "format": "array_record"}, ["--setup_file=s.py"])
    assert set(with_array_record) - set(converter_only) == {f"array-record=={metadata.version('array-record')}"}
    # a night may read a previous output in either format
    night = _worker_requirements({"transform": False, "incremental_from": "gs://b/prev"}, ["--setup_file=s.py"])
    assert set(night) == set(with_array_record)
    # TFT runs in the launcher: the workers only convert
    assert _worker_requirements({"transform": True, "post_steps": "launcher"}, ["--setup_file=s.py"]) == converter_only
    # a prebuilt image has everything; a given requirements file wins; no setup file, no package on the workers
    assert _worker_requirements({}, ["--setup_file=s.py", "--sdk_container_image=gcr.io/p/i"]) is None
    assert _worker_requirements({}, []) is None


@pytest.mark.unit
def test_a_given_requirements_file_keeps_beams_download_cache_outside_the_runs_temporary_folder(tmp_path):
    """A run's temporary files go to a folder of its own, removed after it (local._RunTemporaryFolder); Beam's
    cache of a --requirements_file's downloads lives in tempfile's folder by default and is meant to outlive
    runs: it is pointed at the folder outside the run's. A given --requirements_cache wins."""
    import os
    import tempfile

    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run.local import RUN_TEMPORARY_FOLDER as _RUN_TEMPORARY_FOLDER
    from beam_pipeline.run.workers import with_worker_requirements

    cfg = ConvertConfig(output="gs://b/out", name="d", input="gs://b/in")
    flags = ["--runner=DataflowRunner", "--setup_file=s.py", "--requirements_file=mine.txt"]
    system = tempfile.gettempdir()
    with _RUN_TEMPORARY_FOLDER.held(redirect=True) as folder:
        assert tempfile.gettempdir() == folder != system
        args = with_worker_requirements(cfg, flags, folder)
    assert args == [*flags, f"--requirements_cache={os.path.join(system, 'beam-requirements-cache')}"]
    given = [*flags, "--requirements_cache=/cache"]
    assert with_worker_requirements(cfg, given, str(tmp_path)) == given


@pytest.mark.unit
def test_runs_in_threads_share_one_temporary_folder_removed_after_the_last():
    """Two runs in one process that end in the order they started: the second keeps its temporary folder (and
    tempfile keeps working) until it ends; then tempfile's folder is what it was and the run folder is gone."""
    import os
    import tempfile

    from beam_pipeline.run.local import RUN_TEMPORARY_FOLDER as _RUN_TEMPORARY_FOLDER

    before, system = tempfile.tempdir, tempfile.gettempdir()
    first, second = _RUN_TEMPORARY_FOLDER.held(redirect=True), _RUN_TEMPORARY_FOLDER.held(redirect=True)
    folder = first.__enter__()
    assert second.__enter__() == folder == tempfile.gettempdir()
    first.__exit__(None, None, None)  # the first run ends first
    assert os.path.isdir(folder) and tempfile.gettempdir() == folder
    handle, path = tempfile.mkstemp()  # the second run still makes its files
    os.close(handle)
    assert os.path.dirname(path) == folder
    second.__exit__(None, None, None)
    assert not os.path.exists(folder)
    assert tempfile.tempdir == before and tempfile.gettempdir() == system


@pytest.mark.pipeline
def test_a_lock_file_that_is_a_fifo_does_not_stall_the_next_run(tmp_path):
    """Anyone can make a beam_pipeline-run-* folder in a shared /tmp: a FIFO planted as its _run.lock made the
    look at dead runs' folders (at every run's start) block for ever on open/read. It is left alone, at once;
    a dead run's folder beside it still goes."""
    import os
    import threading

    from beam_pipeline import resume

    planted = tmp_path / "beam_pipeline-run-planted"
    planted.mkdir()
    os.mkfifo(planted / resume.RUN_LOCK)
    dead = tmp_path / "beam_pipeline-run-dead"
    with resume.run_lock(str(dead)):
        pass  # its lock is free now: the run is over
    done = threading.Event()
    threading.Thread(
        target=lambda: (local._remove_dead_run_folders(str(tmp_path), ""), done.set()),
        daemon=True,  # noqa: SLF001
    ).start()
    assert done.wait(10), "the look at run folders is stuck on the FIFO"
    assert planted.is_dir() and not dead.exists()
