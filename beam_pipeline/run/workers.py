"""What the workers need: Dataflow's paths and access, GCS credentials, the requirements and packages
staged for them, and the pipeline options every run starts from.

    options, runner = options_for(cfg, beam_args)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    WorkerOptions,
)

from .. import storage
from ..config import LATEST, ConvertConfig
from ..errors import UsageError
from ..runner import is_dataflow, make_options
from .common import note
from .local import RUN_TEMPORARY_FOLDER
from .preflight import ask_gcs, gcs_locations, run_locations
from .sizing import input_sample

_LOG = logging.getLogger(__name__)


# What Dataflow workers read or write themselves (--labels-file is read by the launcher alone).
_WORKER_FLAGS = ("--input", "--manifest", "--coco", "--voc", "--masks", "--output", "--incremental-from")


def _dataflow_locations(options: PipelineOptions) -> list[tuple[str, str]]:
    """(flag, value) of the Beam options that name where Dataflow stages, keeps temporary files or writes the
    job request."""
    gcp = options.view_as(GoogleCloudOptions)
    places = [
        ("--temp_location", gcp.temp_location),
        ("--staging_location", gcp.staging_location),
        ("--template_location", gcp.template_location),
    ]
    return [(flag, value) for flag, value in places if value]


def check_dataflow_paths(cfg: ConvertConfig, options: PipelineOptions) -> None:
    """DataflowRunner: a UsageError for a local path the workers would have to read or write (they cannot see
    this machine's disk), before anything is asked or staged. A local --template_location is this machine's."""
    if not is_dataflow(options):
        return
    places = [(flag, value) for flag, value, _ in run_locations(cfg) if flag in _WORKER_FLAGS]
    places += [(flag, value) for flag, value in _dataflow_locations(options) if flag != "--template_location"]
    for flag, value in places:
        if not storage.is_remote(value):
            raise UsageError(
                f"{flag} {value}: a local path, but Dataflow workers cannot read this machine's disk; give a gs:// path"
            )


def check_dataflow_access(options: PipelineOptions) -> None:
    """DataflowRunner: asks GCS about the buckets of --temp_location, --staging_location and
    --template_location with the short deadline of the run's own locations (storage.gcs_check). Beam asks about
    them first with its client's two-minute retries each (its soft-delete policy warning, when the options are
    validated), so no network was minutes of silence before any error."""
    if not is_dataflow(options):
        return
    for flag, value in _dataflow_locations(options):
        if storage.is_remote(value):
            ask_gcs(flag, value, folder=True)  # a prefix not there yet is fine: the bucket answered


def use_anonymous_gcs_for_emulator() -> bool:
    """With STORAGE_EMULATOR_HOST set, skip Beam's credential lookup (anonymous client).

    Off Google Cloud and without credentials, Beam retries the lookup for about
    25 s per process before falling back to an anonymous client; an emulator
    needs no credentials, so the fallback is taken at once.
    """
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return False
    storage.settle_gcs_credentials()
    return True


def _settle_gcs_credentials(cfg: ConvertConfig, options: PipelineOptions) -> None:
    """For a run that names a gs:// location: credentials, or anonymous at once (storage.settle_gcs_credentials).
    ``--no_auth`` does not reach Beam's GCS client in 2.77 (it still looks credentials up): here it does."""
    dataflow = is_dataflow(options) and any(storage.is_remote(v) for _, v in _dataflow_locations(options))
    dated = cfg.incremental_from == LATEST and storage.is_remote(cfg.output_template or "")
    if gcs_locations(cfg) or dated or dataflow:
        storage.settle_gcs_credentials(no_auth=bool(options.view_as(GoogleCloudOptions).no_auth))
    else:
        use_anonymous_gcs_for_emulator()


def worker_requirements(extra: str, *more: str) -> list[str]:
    """What a ``--setup_file`` worker installs beside Beam: setup.py's base requirement and ``extra``'s (and
    ``more`` extras': ``array_record`` for ``--format array_record``), each at the version installed here
    (``pillow==12.3.0``), from this installed package's metadata, less Beam.

    Without the pins a worker resolves setup.py's ranges when it starts and may get newer releases than the
    launcher that built and checked the job (a newer Beam release changed how every run with a reject coded its
    rows). A requirement not installed here keeps its range. Beam is left out because the worker image's Beam
    is the launcher's already. Their own dependencies are resolved on the worker within these pins.
    """
    from importlib import metadata as importlib_metadata

    from packaging.requirements import Requirement

    try:
        lines = importlib_metadata.requires("beam_pipeline") or []
    except importlib_metadata.PackageNotFoundError:
        raise UsageError(
            "--setup_file: workers need the converter's requirements, read from the installed package; "
            "install it (pip install '.[convert]') or pass --requirements_file"
        ) from None
    wanted, seen = [], set()
    for line in lines:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is not None and not any(marker.evaluate({"extra": e}) for e in (extra, *more)):
            continue  # another extra
        if requirement.name != "apache-beam" and requirement.name not in seen:
            seen.add(requirement.name)
            requirement.marker = None
            wanted.append(_as_installed(requirement, importlib_metadata))
    return wanted


def _as_installed(requirement: Any, importlib_metadata: Any) -> str:
    """``name==version`` of the installed distribution when it meets ``requirement``; the requirement otherwise."""
    try:
        version = importlib_metadata.version(requirement.name)
    except importlib_metadata.PackageNotFoundError:
        return str(requirement)
    if not requirement.specifier.contains(version, prereleases=True):
        return str(requirement)
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{requirement.name}{extras}=={version}"


def with_worker_requirements(cfg: ConvertConfig, beam_args: Sequence[str], folder: str) -> list[str]:
    """Beam flags that give ``--setup_file`` workers the converter (and TFT when they run the analysis).

    Workers install the package from setup.py without extras, which is the
    reader side (TensorFlow only); the converter is the ``[convert]`` extra and
    tensorflow-transform the ``[transform]`` one (its exact TensorFlow pin must
    not reach every install). A requirements file asks the workers to
    pip-install them at start (``[transform]`` when the job itself runs the
    analysis, ``--post-steps job``); ``--requirements_cache=skip`` keeps the
    launcher from downloading them first. Workers built from a prebuilt image
    (``--sdk_container_image``, the Dockerfile) have them; a given
    ``--requirements_file`` wins (with Beam's download cache outside the
    run's temporary folder unless ``--requirements_cache`` says where). The
    file is written in ``folder``, which must last until the job is submitted
    (the runner stages it then).
    """
    options = PipelineOptions(list(beam_args))
    setup = options.view_as(SetupOptions)
    if setup.requirements_file and setup.requirements_cache is None:
        # Beam's default cache of the requirements' downloads, meant to outlive the run, is in tempfile's
        # folder: the one outside the run's own (_RunTemporaryFolder)
        cache = os.path.join(RUN_TEMPORARY_FOLDER.system_folder(), "beam-requirements-cache")
        return [*beam_args, f"--requirements_cache={cache}"]
    if not setup.setup_file or setup.requirements_file or options.view_as(WorkerOptions).sdk_container_image:
        return list(beam_args)
    extra = "transform" if cfg.transform and cfg.post_steps == "job" else "convert"
    path = os.path.join(folder, "requirements.txt")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(f"{r}\n" for r in worker_requirements(extra, *format_extras(cfg))))
    return [*beam_args, f"--requirements_file={path}", "--requirements_cache=skip"]


def format_extras(cfg: ConvertConfig) -> tuple[str, ...]:
    """The pip extras of the output format's library, and for a night of every format the previous output may be
    in (its records are read); TFRecord has none (the converter has it)."""
    from ..formats import registry

    names = registry.FORMATS if cfg.incremental_from else (cfg.format,)
    return tuple(dict.fromkeys(registry.get(name).extra for name in names if registry.get(name).extra))


# Said once by a run whose workers install the package at start (no worker image).
SETUP_FILE_COST = (
    "--setup_file: each worker pip-installs beam_pipeline and its requirements (TensorFlow, and TFT when the job "
    "runs the analysis: over 1 GB of wheels) when it starts, minutes per worker before it converts anything; "
    "a worker image has them (--sdk_container_image; configs/dataflow.yaml: WORKER_IMAGE; docs/dataflow.md)"
)


_PACKAGE_FLAGS = ("--setup_file", "--requirements_file", "--requirements_cache")


def with_worker_packages(cfg: ConvertConfig, beam_args: Sequence[str], folder: str) -> list[str]:
    """Beam flags that give a remote runner's workers the package, with ``folder`` for the files to stage.

    A worker image (``--sdk_container_image``, the Dockerfile's, which is also the Flex Template's) has the
    package and its requirements: the workers install nothing, so ``--setup_file`` and ``--requirements_file``
    (the config's fallback) are not staged. Without one, the workers install the sdist of ``--setup_file``
    and the requirements (with_worker_requirements), and the run says once what that costs. The sdist is built
    here (_built_sdist) and staged as an extra package.
    """
    options = PipelineOptions(list(beam_args))
    image = options.view_as(WorkerOptions).sdk_container_image
    setup_file = options.view_as(SetupOptions).setup_file
    if image:
        if setup_file or options.view_as(SetupOptions).requirements_file:
            _LOG.info("--sdk_container_image %s: workers run its beam_pipeline; not staging %s", image, _PACKAGE_FLAGS)
        return _without_flags(beam_args, _PACKAGE_FLAGS)
    args = with_worker_requirements(cfg, beam_args, folder)
    if not setup_file or os.path.basename(setup_file) != "setup.py":
        return args  # pyproject.toml: Beam's stager builds it (python -m build)
    note(SETUP_FILE_COST)
    return [*_without_flags(args, ("--setup_file",)), f"--extra_package={_built_sdist(setup_file, folder)}"]


def _without_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``args`` less ``--flag=value`` and ``--flag value`` for each of ``flags``."""
    out: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip_value = "=" not in arg
            continue
        out.append(arg)
    return out


@contextlib.contextmanager
def setup_folder_lock(setup_dir: str) -> Iterator[None]:
    """Held while ``setup.py sdist`` runs in ``setup_dir``: it writes ``<name>.egg-info/`` and a release tree
    beside setup.py, so two runs submitted from one checkout at once would break each other's build. The lock
    is on the folder itself (flock on its descriptor): runs in other processes share it, and no file is left."""
    import fcntl

    fd = os.open(setup_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _built_sdist(setup_file: str, folder: str) -> str:
    """The sdist of ``setup_file`` (a setup.py), built in ``folder``; what Beam's stager would stage.

    The stager runs ``python -m build`` in the setup file's folder first, and falls back to ``setup.py sdist``
    (what runs here) when that fails: pypa's ``build`` is not installed, and in a checkout the ``build/`` folder
    setuptools leaves shadows it, so each run printed a stray ``No module named build.__main__`` line.
    """
    import glob
    import subprocess
    import tempfile

    if not os.path.isfile(setup_file):
        raise UsageError(f"--setup_file {setup_file}: no such file")
    dist = tempfile.mkdtemp(prefix="sdist-", dir=folder)
    setup_dir = os.path.dirname(os.path.abspath(setup_file))
    with setup_folder_lock(setup_dir):
        done = subprocess.run(
            [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", dist],
            cwd=setup_dir,
            capture_output=True,
            text=True,
            check=False,
        )
    archives = glob.glob(os.path.join(dist, "*.tar.gz"))
    if done.returncode or len(archives) != 1:
        said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        cause = said[-1] if said else f"exit status {done.returncode}"
        raise UsageError(f"--setup_file {setup_file}: building its sdist failed: {cause}")
    return archives[0]


def make_local_aware_options(cfg: ConvertConfig, beam_args: Sequence[str]) -> tuple[PipelineOptions, Any]:
    """make_options, with a look at a local input (its images' mean size, how many: run/sizing.py) taken only
    when the local default picks the process count (no remote runner, no process flags of the user's)."""
    return make_options(beam_args, look=lambda: input_sample(cfg))


def options_for(cfg: ConvertConfig, beam_args: Sequence[str], *, images: bool = True) -> tuple[PipelineOptions, Any]:
    """make_options, checked against the run before anything is read or staged (Dataflow: no local path, its
    buckets answer), with the GCS credentials settled and FileSystems set to the same options. ``images``: the
    run decodes images (``plan`` does not: one process, whatever the input)."""
    options, runner = make_local_aware_options(cfg, beam_args) if images else make_options(beam_args)
    check_dataflow_paths(cfg, options)
    _settle_gcs_credentials(cfg, options)
    # gs:// checks before the pipeline use the same options.
    FileSystems.set_options(options)
    check_dataflow_access(options)
    return options, runner
