"""Beam options and the runner object for a run: the Python engine for local runs, never Prism.

Below every stage that starts a pipeline (the launcher, the post-steps run
as the job's last step), so none of them imports another for it.

    options, runner = make_options(["--runner=DirectRunner"])  # runner None: Beam picks it from the options
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from .errors import UsageError

# Runner names that mean "run it here": always the Python engine, never Prism
# (which downloads a binary at run time). SwitchingDirectRunner is what DirectRunner names in Beam.
LOCAL_RUNNERS = {"", "direct", "directrunner", "switchingdirectrunner", "fnapirunner"}
# Refused: Prism fetches its binary from GitHub when the job starts, and this tool downloads nothing at run
# time (a local run is the Python engine above, which needs no download).
REFUSED_RUNNERS = {"prism", "prismrunner"}


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


def make_options(beam_args: Sequence[str]) -> tuple[PipelineOptions, Any]:
    """PipelineOptions plus the runner object to use (the Python engine for local runs); UsageError for options
    ``check_runner_options`` refuses."""
    options = PipelineOptions(list(beam_args))
    check_runner_options(options)
    if runner_key(options.view_as(StandardOptions).runner) in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        # Measured (README, "Local runs"): one in-process worker whose shard
        # writer decodes on one thread per core is as fast as multi_threading
        # with a worker per core, and needs ~100 MB less (no gRPC buffers).
        direct = options.view_as(DirectOptions)
        given = " ".join(beam_args)
        if "direct_running_mode" not in given:
            direct.direct_running_mode = "in_memory"
        if "direct_num_workers" not in given:
            direct.direct_num_workers = 1
        return options, FnApiRunner(provision_info=_provision_info(options))
    return options, None


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
