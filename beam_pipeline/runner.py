"""Beam options and the runner object for a run: the Python engine for local runs, never Prism.

Below every stage that starts a pipeline (the launcher, the post-steps run
as the job's last step), so none of them imports another for it.

    options, runner = make_options(["--runner=DirectRunner"])  # runner None: Beam picks it from the options
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from apache_beam.options.pipeline_options import DebugOptions, DirectOptions, PipelineOptions, StandardOptions

from .errors import UsageError

_LOG = logging.getLogger(__name__)

# Runner names that mean "run it here": always the Python engine, never Prism
# (which downloads a binary at run time). SwitchingDirectRunner is what DirectRunner names in Beam.
LOCAL_RUNNERS = {"", "direct", "directrunner", "switchingdirectrunner", "fnapirunner"}
# Refused: Prism fetches its binary from GitHub when the job starts, and this tool downloads nothing at run
# time (a local run is the Python engine above, which needs no download).
REFUSED_RUNNERS = {"prism", "prismrunner"}


# Runners whose Java side sends each stage's input to the Python workers over Beam's Fn API data channel.
PORTABLE_RUNNERS = {"flinkrunner", "sparkrunner", "portablerunner", "samzarunner"}
# The largest data message on that channel, both ways (Beam's experiment ``data_buffer_size_limit``, 1 MB by
# default). The runner checks whether a worker keeps up with what it is sent only every 100 messages
# (Beam's DirectStreamObserver), so up to 100 messages per worker connection wait in the runner's direct
# memory: ~100 MB at Beam's default, which a stage reading a million refs fills (a Flink TaskManager's 128 MB
# of framework off-heap memory failed with "Direct buffer memory" at 320k tiles). At 64 KB it is ~6.4 MB,
# whatever the number of images; a message still carries hundreds of refs (docs/engines.md, "Sizing").
DATA_BUFFER_BYTES = 64 * 1024


# What one conversion costs per image, measured on 16,171 JPEGs of ~93 KB (docs/benchmarks.md, "Cores"): CPU
# time, and how much of it holds the GIL (py-spy --gil). One interpreter cannot keep more than their ratio
# (~4.3) of cores busy, however many decode threads it runs.
CPU_MS_PER_IMAGE = 1.87
GIL_MS_PER_IMAGE = 0.43
PHOTO_BYTES = 93_000
# The GIL-held part is per image (Python around each file: Pillow's header parsing, the Example, the
# index line), the rest grows with the file (libjpeg, sha256, CRC32C, with the GIL released). On 96 px
# tiles of 2.4 KB this gives 0.47 ms, almost all of it holding the GIL (measured: ~0.45 ms, and one
# process kept ~1.1 of 2 cores busy; docs/benchmarks.md, "Small images against the tutorial loop").
CPU_MS_PER_BYTE = (CPU_MS_PER_IMAGE - GIL_MS_PER_IMAGE) / PHOTO_BYTES
# What a local worker process adds to a run's start-up (its own Beam import, the runner's connections),
# measured on 2 cores: a 40-image job took 4.2 s in one process, 8.3 s on 2 worker processes.
WORKER_START_S = 4.0
# Each local worker process holds ~250 MB of its own (Beam, Pillow, numpy, its buffers) besides its share of
# the memory budget: the default starts at most one per this much of the machine's memory.
MEMORY_PER_PROCESS = 512 * 2**20
# Set in each worker process of a local multi_processing run (run/sdk_worker.py, from its command line): how
# many share the machine (writer/budget.py divides the memory budget and the decode threads by it).
LOCAL_PROCESSES_ENV = "BEAM_PIPELINE_LOCAL_PROCESSES"


def cpu_ms_per_image(image_bytes: float | None = None) -> float:
    """CPU a conversion spends on an image of ``image_bytes`` (None: the photos it was measured on)."""
    if image_bytes is None:
        return CPU_MS_PER_IMAGE
    return GIL_MS_PER_IMAGE + CPU_MS_PER_BYTE * max(0.0, image_bytes)


def single_process_ceiling(image_bytes: float | None = None) -> float:
    """How many cores' worth of conversion one process can use: CPU per image over GIL-held time per image
    (photos: ~4.3; 2.4 KB tiles: ~1.1)."""
    return cpu_ms_per_image(image_bytes) / GIL_MS_PER_IMAGE


def local_processes(cores: int, image_bytes: float | None = None, images: int | None = None) -> int:
    """The local default's worker processes for ``cores``, for images of ``image_bytes`` on average (None:
    photos), ``images`` of them (None: many).

    Enough processes that their GIL-bound ceilings cover the cores: photos one up to 4 cores, then one more
    per ~4.3 (8 cores: 2, 16: 4); tiles one per core. Then one process after all when the images are too few
    for the faster rate to win back the extra processes' start-up (``WORKER_START_S``).
    """
    ceiling = single_process_ceiling(image_bytes)
    processes = max(1, math.ceil(cores / ceiling))
    if processes > 1 and images is not None:
        cpu_s = cpu_ms_per_image(image_bytes) / 1000
        saved_s = images * cpu_s * (1 / min(ceiling, cores) - 1 / min(processes * ceiling, cores))
        if saved_s < WORKER_START_S:
            return 1
    return processes


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or ``taskset``'s limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# A container's memory limit (cgroup v2, then v1): lower than the machine's memory it runs on.
CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_cap() -> int:
    """How many local worker processes this machine's memory (or its container's limit) allows
    (``MEMORY_PER_PROCESS`` each)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # not POSIX: the cores decide alone
        return 1 << 16
    for path in CGROUP_MEMORY_LIMITS:
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit
            total = min(total, int(text))
        break
    return max(1, total // MEMORY_PER_PROCESS)


def runner_key(name: str | None) -> str:
    """``--runner`` as compared: lower case, without a module path (``apache_beam.runners....PrismRunner``)."""
    return (name or "").rsplit(".", 1)[-1].lower()


def is_dataflow(options: PipelineOptions) -> bool:
    """Whether the run goes to Google Cloud Dataflow (its workers see gs:// only, never this machine's disk)."""
    return runner_key(options.view_as(StandardOptions).runner) == "dataflowrunner"


def check_runner_options(options: PipelineOptions) -> None:
    """UsageError for Beam options that would download at run time or fail inside Beam."""
    name = options.view_as(StandardOptions).runner
    if runner_key(name) in REFUSED_RUNNERS:
        raise UsageError(
            f"--runner {name}: Prism downloads its binary when the job starts, and this tool downloads nothing "
            "at run time; leave --runner out (or DirectRunner) for a local run on Beam's Python engine"
        )
    workers = options.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 0:
        raise UsageError(f"--direct_num_workers {workers}: must be 0 (one worker per core) or more")


def make_options(beam_args: Sequence[str], look: Callable[[], Any] | None = None) -> tuple[PipelineOptions, Any]:
    """PipelineOptions plus the runner object to use (the Python engine for local runs); UsageError for options
    ``check_runner_options`` refuses. ``look``: called only when the local default picks the process count,
    it returns what a look at the input found (``run.sizing.InputSample``: ``mean_bytes``, ``images``,
    ``capped``) or None (``local_processes`` then assumes photos, many of them)."""
    options = PipelineOptions(list(beam_args))
    check_runner_options(options)
    runner_name = runner_key(options.view_as(StandardOptions).runner)
    if runner_name in PORTABLE_RUNNERS:
        debug = options.view_as(DebugOptions)
        if debug.lookup_experiment("data_buffer_size_limit") is None:  # a user's own value stays
            debug.add_experiment(f"data_buffer_size_limit={DATA_BUFFER_BYTES}")
    if runner_name in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        # Measured (README, "Local runs"): one in-process worker whose shard
        # writer decodes on one thread per core is as fast as multi_threading
        # with a worker per core, and needs ~100 MB less (no gRPC buffers).
        # Past what one interpreter can feed (local_processes: photos ~4.3 cores, small images ~1), several
        # worker processes, as on Dataflow.
        # Either flag given: the user's choice, with Beam's default for the other (in_memory, 1 worker).
        direct = options.view_as(DirectOptions)
        given = " ".join(beam_args)
        if "direct_running_mode" not in given and "direct_num_workers" not in given:
            sample = look() if look is not None else None
            if sample is None:
                processes = local_processes(usable_cores())
            else:
                images = None if sample.capped else sample.images
                processes = local_processes(usable_cores(), sample.mean_bytes, images)
            processes = min(processes, memory_cap())
            direct.direct_running_mode = "in_memory" if processes == 1 else "multi_processing"
            direct.direct_num_workers = processes
            if sample is not None:
                _LOG.info(
                    "local run: %d process(es) (input: %s%d images, %.1f KB on average)",
                    processes, "at least " if sample.capped else "", sample.images, sample.mean_bytes / 1000,
                )  # fmt: skip
        if direct.direct_running_mode == "multi_processing":
            # as Beam counts them: 0 is one per core
            processes = direct.direct_num_workers or multiprocessing.cpu_count()
            runner_class = _worker_processes_runner_class()
            return options, runner_class(processes, provision_info=_provision_info(options))
        return options, FnApiRunner(provision_info=_provision_info(options))
    return options, None


WORKER_MODULE = "beam_pipeline.run.sdk_worker"


def _worker_processes_runner_class() -> type:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms import environments

    class WorkerProcessesRunner(FnApiRunner):
        """Beam's engine with ``direct_num_workers`` worker processes running ``run/sdk_worker.py`` (Beam's
        own worker, ending quietly on Ctrl-C) instead of Beam's worker module."""

        def __init__(self, processes: int, **kwargs: Any) -> None:
            # Beam starts it through a shell: exec leaves no shell between (none to print "Killed", and the
            # worker's own exit status reaches the runner)
            command = f"exec {shlex.quote(sys.executable)} -m {WORKER_MODULE} {int(processes)}"
            environment = environments.SubprocessSDKEnvironment.from_command_string(command_string=command)
            super().__init__(default_environment=environment, **kwargs)

        def run_pipeline(self, pipeline: Any, options: PipelineOptions) -> Any:
            direct = options.view_as(DirectOptions)
            mode = direct.direct_running_mode
            # FnApiRunner replaces the environment for "multi_processing" with Beam's worker command; left unset,
            # it keeps this one (same worker count, same protocol). Runs to the end before it returns.
            direct.direct_running_mode = None
            try:
                return super().run_pipeline(pipeline, options)
            finally:
                direct.direct_running_mode = mode

    return WorkerProcessesRunner


def _provision_info(options: PipelineOptions) -> Any:
    """The pipeline's options for the runner's workers, as Beam's DirectRunner hands them over.

    Without it, multi_processing workers (fresh processes) start with no
    options: no GCS settings for FileSystems, no ``--beam_plugin``.
    """
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
