"""Shared fixtures: CLI runs (in process, or in a subprocess where a process is the point), TensorFlow
read-back helpers, and the test layers.

Every test has exactly one layer marker (``pytest.ini`` registers them; an unmarked test fails
collection): ``unit`` (pure functions, no Beam pipeline), ``pipeline`` (builds or runs Beam pipelines
in this process), ``e2e`` (the CLI through ``main``, or a subprocess where a process is the point) and
``cluster`` (a real Flink or Spark cluster). ``scripts/test.sh --fast`` runs ``unit or pipeline``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

# The package is installed editable, so nothing compiled its modules ahead (pip does for site-packages). With
# PYTHONDONTWRITEBYTECODE set (some shells and CI images set it), every Python process a test starts (CLI runs,
# Beam's worker processes, the cluster's worker pool) would compile all of them again, ~1 s each: the tests
# let Python keep its bytecode caches (__pycache__/, ignored by git).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


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


LAYERS = ("unit", "pipeline", "e2e", "cluster")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in exactly one layer: its module's (or class's) ``pytestmark`` names it, and a marker on the
    test itself replaces that one (for ``-m`` too). A test with none, or with two of its own, fails collection."""
    problems = []
    for item in items:
        own = {m.name for m in item.own_markers if m.name in LAYERS}
        inherited = {m.name for node in item.listchain()[:-1] for m in node.own_markers if m.name in LAYERS}
        if len(own) > 1 or (not own and len(inherited) != 1):
            problems.append(f"  {item.nodeid}: {', '.join(sorted(own or inherited)) or 'no layer'}")
        elif own and inherited - own:
            _hide_markers(item, inherited - own)
    if problems:
        raise pytest.UsageError(f"every test needs exactly one of {', '.join(LAYERS)}:\n" + "\n".join(problems))


def _hide_markers(item: pytest.Item, names: set[str]) -> None:
    """Markers ``names`` of the test's module or class no longer apply to this test (its own marker does)."""
    inherited = item.iter_markers_with_node

    def iter_markers_with_node(name: str | None = None):  # noqa: ANN202 - pytest's own signature
        for node, mark in inherited(name=name):
            if node is item or mark.name not in names:
                yield node, mark

    item.iter_markers_with_node = iter_markers_with_node  # type: ignore[method-assign]


# Set, these make a run a process's business: failpoints count per process and may kill it.
PROCESS_ENV = ("BEAM_PIPELINE_FAILPOINTS",)


# Set (to anything), every conversion a test runs checks each element against the type hints of the step that
# takes or makes it (Beam's --runtime_type_check): a hint that lies fails the run. .ci/run's newest lane sets it.
TYPE_CHECK_ENV = "BEAM_PIPELINE_TEST_TYPE_CHECK"


def run_cli(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 300, process: bool = False) -> CliResult:
    """``python -m beam_pipeline ARGS``: in this process through ``cli.main`` (no 2 s of imports per run),
    or in a fresh one with ``process=True`` or while a failpoint is armed (``PROCESS_ENV``).
    ``timeout`` only bounds a subprocess. With ``TYPE_CHECK_ENV`` set, a conversion or plan runs Beam's type
    check."""
    # Not where another library's steps fail the check: the TFT analysis (tensorflow-transform's ApplySavedModel
    # yields TF tensors where its hint says numpy arrays) and --sink write_to_tfrecord (Beam's own FinalizeWrite
    # yields TimestampedValues where its hint says str).
    other = "write_to_tfrecord" in args or "--sink=write_to_tfrecord" in args
    runs_ours = args[:1] == ("plan",) or (args[:1] == ("convert",) and "--no-transform" in args and not other)
    if os.environ.get(TYPE_CHECK_ENV) and runs_ours and "--help" not in args:
        args = (*args, "--runtime_type_check")
    if process or any(os.environ.get(name) for name in PROCESS_ENV):
        return run_cli_process(*args, cwd=cwd, timeout=timeout)
    return run_cli_in_process(*args, cwd=cwd)


def run_cli_process(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 300) -> CliResult:
    """``python -m beam_pipeline ARGS`` as a user runs it, in a subprocess."""
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


def _stream() -> io.TextIOWrapper:
    """A text stream like a pipe's (an encoding, a buffer, not a terminal) that keeps what is written."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", errors="backslashreplace")  # type: ignore[attr-defined]


TEST_SERVER_LOGGERS = ("gcp_storage_emulator",)


def run_cli_in_process(*args: str, cwd: str | os.PathLike | None = None) -> CliResult:
    """``cli.main(args)`` as ``console_main`` runs it, with what a process would not carry over undone
    afterwards: the root logger's handlers and level, logger levels, signal handlers, os.environ, the
    working directory, sys.argv, tempfile's cached folder, the per-process GCS client."""
    from beam_pipeline import cli
    from beam_pipeline.backends import gcs as gcs_backend

    out, err = _stream(), _stream()
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    for name in ("apache_beam", "absl", "tensorflow", "tensorflow_transform"):  # the ones main quiets
        logging.getLogger(name)
    levels = {name: lg.level for name, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    handlers_of = {signum: signal.getsignal(signum) for signum in signal.valid_signals()}
    environ, cwd_before, argv, tempdir = dict(os.environ), os.getcwd(), sys.argv[:], tempfile.tempdir
    root.handlers = []  # basicConfig only configures a root logger without handlers, as in a fresh process
    # Servers of the test's own (the GCS emulator's threads) log in this process; in a subprocess run their lines
    # never reached the CLI's stderr, nor do they here: they go to the handlers the root logger had (pytest's).
    servers = [logging.getLogger(name) for name in TEST_SERVER_LOGGERS]
    before = [(lg.propagate, lg.handlers[:]) for lg in servers]
    for lg in servers:
        lg.propagate, lg.handlers = False, [*lg.handlers, *handlers]
    gcs_backend.reset()  # "one per process": a run in a new process makes its own
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = [str(REPO / "beam_pipeline" / "__main__.py"), *args]
        # Processes the run starts (the multi-process runner's workers) import this checkout, as run_cli_process's do.
        os.environ["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
        tempfile.tempdir = None  # TMPDIR as the run's environment has it
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except KeyboardInterrupt:
                code = cli._interrupted()  # noqa: SLF001
            except SystemExit as e:  # argparse's --help and usage errors, as console_main reports them
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(root_level)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for signum, handler in handlers_of.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd_before)
        sys.argv, tempfile.tempdir = argv, tempdir
        gcs_backend.reset()
        for lg, (propagate, own) in zip(servers, before, strict=True):
            lg.propagate, lg.handlers = propagate, own
    return CliResult(code, _text(out), _text(err))


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


@pytest.fixture
def checkout_build_lock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Held while a test builds or installs the package from this checkout (setup.py sdist, a wheel, pip
    install): each writes beam_pipeline.egg-info/ and a release tree beside setup.py, so two at once, on two
    pytest-xdist workers, break each other. The lock file sits in the folder every worker's temp folder is in."""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    with open(root / "checkout-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session", autouse=True)
def graph_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TFT graph cache (run/graph_cache.py) of the test session, shared by the xdist workers (its entries
    are renamed into place whole), never the user's ~/.cache. CLI runs inherit it."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    os.environ["BEAM_PIPELINE_GRAPH_CACHE"] = str(root / "graph-cache")
    return root / "graph-cache"


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
