"""A run from start to end: options, the output's lease, preflight, the pipeline, then its outcome.

    info = run_convert(cfg, beam_args)    # dataset.json's record (a DatasetInfo), or NotRunHere
    plan = run_plan(cfg, beam_args)       # lists and plans, writes nothing

A program may call ``run_convert`` itself, from several threads at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
    WorkerOptions,
)

from .. import lease, metadata, resume
from ..config import ConvertConfig, Layout
from ..errors import PipelineError, RejectsError, UsageError, last_line
from ..runner import is_dataflow, make_options
from ..storage import read_json
from ..vocab.dataset_info import DatasetInfo
from .common import absolute, without_step
from .local import RUN_TEMPORARY_FOLDER, LiveProgress, wait_for
from .outcome import raise_unless_publishable
from .poststeps import PostStepsSettings, run_post_steps
from .preflight import prepare
from .workers import make_local_aware_options, options_for, with_worker_packages

if TYPE_CHECKING:
    from ..planning import PlanSummary

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NotRunHere:
    """A job this process only built (``--dry_run``, ``--template_location``) or submitted and left (``--detach``)."""

    output: str
    # --dry_run: the built job's description (runner, options, steps), printed as JSON
    dry_run: Mapping[str, Any] | None = None
    template_location: str | None = None  # where Dataflow wrote the job request
    detached: bool = False
    job_id: str | None = None


def run_convert(cfg: ConvertConfig, beam_args: Sequence[str], *, own_process: bool = False) -> DatasetInfo | NotRunHere:
    """Runs the whole conversion; returns dataset.json's record (``NotRunHere`` for a job only built or left
    running). ``own_process``: the process is the tool's (the command line), so the run may take over
    ``tempfile``'s folder (``_RunTemporaryFolder``)."""
    options, runner = options_for(cfg, beam_args)
    # One run writes into an output at a time (lease.py): taken before anything reads or writes the output,
    # held (renewed) while the job runs, released when it ends; a submitted job's publish releases it.
    writes = not options.view_as(TestOptions).dry_run and not options.view_as(GoogleCloudOptions).template_location
    with contextlib.ExitStack() as held:
        # This process's temporary files, removed when the run returns: the workers' requirements file, and
        # what other code makes in tempfile's folder and leaves (Beam's stager: the sdist of --setup_file and
        # the pickled main session; TensorFlow's autograph: its generated modules). A scheduled launcher would
        # otherwise gather them run after run.
        local = held.enter_context(RUN_TEMPORARY_FOLDER.held(redirect=own_process))

        def claim(output: str, run_id: str) -> None:
            try:
                held.enter_context(lease.held(output, run_id, detached=cfg.detach))
            except lease.LeaseHeld as e:
                raise UsageError(
                    f"--output {cfg.output}: {e} is writing into it; this run stops before touching it "
                    f"(a dead run's lease can be taken once it expires; if you know that run is dead, delete "
                    f"{lease.LEASE} in the output and run again)"
                ) from None

        cfg, layout = prepare(cfg, claim=claim if writes else None)
        return _run_claimed(cfg, layout, beam_args, options, runner, local)


def _run_claimed(
    cfg: ConvertConfig,
    layout: Layout,
    beam_args: Sequence[str],
    options: PipelineOptions,
    runner: Any,
    local: str,
) -> DatasetInfo | NotRunHere:
    """The run, once its output is claimed: the pipeline, then the post-steps unless the job does them.

    ``local``: a folder of this process's, removed when the run returns (the workers' requirements file goes
    there).
    """
    import tempfile

    from ..pipeline import build_pipeline, build_plan_pipeline

    _LOG.info("input root %s, split source %s, label source %s", layout.root, layout.split_source, layout.label_source)
    if cfg.post_steps == "auto":
        cfg = dataclasses.replace(cfg, post_steps="launcher" if runner is not None else "job")
    if cfg.detach and (runner is not None or cfg.post_steps != "job"):
        raise UsageError("--detach needs a remote runner (e.g. --runner DataflowRunner) and --post-steps job")
    if runner is None:
        beam_args = with_worker_packages(cfg, beam_args, tempfile.mkdtemp(dir=local))
        options, runner = make_options(beam_args)
        FileSystems.set_options(options)
    if options.view_as(TestOptions).dry_run:
        return _dry_run(cfg, layout, options, runner)
    # While this process runs, its scratch folder is locked: a later run resumes from it, and
    # removes it after publishing, only once the lock is free (resume.py). Local outputs only.
    with resume.run_lock(layout.tmp_dir):
        wtt_shards = None
        try:
            if cfg.sink == "write_to_tfrecord":
                plan_path = FileSystems.join(layout.tmp_dir, "plan.json")
                wait_for(build_plan_pipeline(cfg, layout, options, plan_path, runner=runner).run())
                wtt_shards = {s: d["num_shards"] for s, d in read_json(plan_path)["splits"].items()}
                options, runner = make_local_aware_options(cfg, beam_args)
            pipeline = build_pipeline(cfg, layout, options, runner=runner, wtt_shards=wtt_shards)
            template = options.view_as(GoogleCloudOptions).template_location
            if template and runner is None:
                # Dataflow writes the full job request there instead of submitting it.
                pipeline.run()
                return NotRunHere(output=cfg.output, template_location=template)
            if cfg.detach:
                result = pipeline.run()
                job_id = getattr(result, "job_id", None)
                return NotRunHere(output=cfg.output, detached=True, job_id=job_id() if callable(job_id) else job_id)
            with LiveProgress():
                wait_for(pipeline.run())
        except PipelineError:
            raise
        except UsageError as e:  # found inside the pipeline (a JSONL row's column against a flag)
            raise UsageError(without_step(last_line(e))) from None
        except Exception as e:  # the runner wraps worker errors in assorted types
            raise PipelineError(last_line(e)) from e
        try:
            info = _after_pipeline(cfg, layout, beam_args)
        except (UsageError, RejectsError, PipelineError):
            raise
        except Exception as e:  # publish in this process: a lost lease, a staging folder refused
            raise PipelineError(last_line(e)) from e
        return _with_retention(cfg, layout, info)


def _with_retention(cfg: ConvertConfig, layout: Layout, info: DatasetInfo) -> DatasetInfo:
    """--keep-last after a run published here; with --post-steps job the job's last step does it (pipeline.py)."""
    if cfg.keep_last and cfg.post_steps == "launcher":
        from .. import retention

        outcome = retention.apply(cfg, layout)
        if outcome is not None:
            info = info.with_(keep_last=outcome.as_dict(absolute(cfg.output_template or "")))
    return info


def run_plan(cfg: ConvertConfig, beam_args: Sequence[str]) -> PlanSummary:
    """Lists and plans without reading pixels; nothing is written to the output. Returns the plan."""
    import tempfile

    from ..pipeline import build_plan_pipeline

    options, runner = options_for(cfg, beam_args, images=False)
    cfg, layout = prepare(cfg, check_output=False)
    with tempfile.TemporaryDirectory(prefix="beam_pipeline-plan-") as work:
        plan_path = os.path.join(work, "plan.json")
        try:
            wait_for(build_plan_pipeline(cfg, layout, options, plan_path, runner=runner).run())
        except PipelineError:
            raise
        except UsageError as e:
            raise UsageError(without_step(last_line(e))) from None
        except Exception as e:
            raise PipelineError(last_line(e)) from e
        if not os.path.exists(plan_path):
            raise PipelineError("the planning run wrote no plan")
        plan: PlanSummary = read_json(plan_path)
    for split, s in plan["splits"].items():
        n = s["num_shards"]
        s["files"] = [metadata.shard_name(cfg.name, split, i, n, cfg.compression, cfg.format) for i in range(n)]
    plan.update(output=cfg.output, name=cfg.name, target_shard_mb=cfg.target_shard_mb)
    return plan


def _dry_run(cfg: ConvertConfig, layout: Layout, options: PipelineOptions, runner: Any) -> NotRunHere:
    """Builds the job (Beam's --dry_run stops before submission) and describes it."""
    from ..pipeline import build_pipeline

    if cfg.sink == "write_to_tfrecord":
        raise UsageError("--dry_run builds the planned sink only (write_to_tfrecord needs its planning run)")
    try:
        pipeline = build_pipeline(cfg, layout, options, runner=runner, wtt_shards=None)
        result = pipeline.run()
    except Exception as e:
        raise PipelineError(f"building the job: {last_line(e)}") from e
    gcp = options.view_as(GoogleCloudOptions)
    worker = options.view_as(WorkerOptions)
    setup = options.view_as(SetupOptions)
    job = getattr(result, "job", None)
    description = {
        "dry_run": True,
        "runner": options.view_as(StandardOptions).runner or "DirectRunner",
        "job_name": gcp.job_name or (job.proto.name if job is not None else None),
        "project": gcp.project,
        "region": gcp.region,
        "temp_location": gcp.temp_location,
        "machine_type": worker.machine_type,
        "max_num_workers": worker.max_num_workers,
        "sdk_container_image": worker.sdk_container_image,
        "setup_file": setup.setup_file,
        "extra_packages": [os.path.basename(p) for p in setup.extra_packages or []],
        "steps": len(job.proto_pipeline.components.transforms) if job is not None else None,
        "post_steps": cfg.post_steps,
        "step_names": sorted(
            {t.unique_name.split("/")[0] for t in job.proto_pipeline.components.transforms.values()}
            if job is not None
            else []
        ),
        "output": cfg.output,
    }
    return NotRunHere(output=cfg.output, dry_run=description)


def _after_pipeline(cfg: ConvertConfig, layout: Layout, beam_args: Sequence[str]) -> DatasetInfo:
    """Reads finalize's verdict; runs the post-steps on the staging folder and publishes, unless the job did."""
    staging_info = FileSystems.join(layout.tmp_dir, metadata.DATASET_JSON)
    success = FileSystems.join(cfg.output, metadata.SUCCESS)
    published_info = FileSystems.join(cfg.output, metadata.DATASET_JSON)
    staged = FileSystems.exists(staging_info)
    if staged:
        info, kept_old = DatasetInfo.from_json(read_json(staging_info)), FileSystems.exists(success)
    elif FileSystems.exists(published_info):  # finalize published already (no post-steps, or a failed run)
        info, kept_old = DatasetInfo.from_json(read_json(published_info)), False
        if info.run_id != layout.run_id and not FileSystems.exists(success):
            raise PipelineError("the pipeline ended before finalize (dataset.json is an older run's)")
    else:
        raise PipelineError("the pipeline ended before finalize (no dataset.json)")
    raise_unless_publishable(cfg, layout, info, kept_old)
    if not staged:  # published by finalize or by the job's own post-steps
        return info
    options, runner = make_options(beam_args)
    remote_temp = options.view_as(GoogleCloudOptions).temp_location if runner is None else None
    from . import graph_cache

    return run_post_steps(
        PostStepsSettings.of(cfg),
        layout,
        info,
        options=options,
        runner=runner,
        temp_root=remote_temp,
        # a launcher beside Dataflow reuses the previous dataset's graph only, as the job would
        graph_cache=None if is_dataflow(options) else graph_cache.cache_folder(),
    )
