"""The steps after finalize: TFT analysis, TFDS metadata, then publish with ``_SUCCESS`` last.

They run where ``--post-steps`` says:

- ``launcher`` (the default for local runs): the process that ran the
  pipeline does them after it finished, with the same runner;
- ``job`` (the default for remote runners such as Dataflow): one more step
  of the job itself, after finalize. A Flex Template launcher submits the
  job and leaves (``--detach``), so only the job can write ``_SUCCESS``.
  The analysis then runs on that one worker, in process: without
  ``--image-stats`` it reads no image (the label vocabulary comes from the
  label list). With ``--image-stats`` the per-channel statistics come in
  as a side input, computed by the job itself over every train shard in
  parallel (``analysis.TrainPixelStats``): this worker reads no image.

Either way the steps read and write the run's staging folder only, so a
failure leaves an older dataset in the output untouched. In the job, a
Reshuffle separates them from finalize (a failed post-step is retried
alone), and a retried step finds the run published (and stops) or its
publish half done (and finishes it from the manifest); otherwise it does its
work again, over what a failed attempt left in the staging folder.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from .. import failpoints, metadata
from ..config import ConvertConfig, Layout, settings_for
from ..errors import PipelineError, last_line
from ..runner import make_options
from ..storage import read_json, write_text
from ..vocab.dataset_info import OK, DatasetInfo, TfdsInfo
from .publish import TFT_DIRS, already_published, publish, published_run

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PostStepsSettings:
    """What the post-steps see of the run's settings (``PostStepsFn`` on a worker, or the launcher's
    ``run_post_steps``): the output, and which steps run with what image size and statistics."""

    output: str
    transform: bool
    image_size: int
    image_stats: bool
    tfds_metadata: bool

    @classmethod
    def of(cls, cfg: ConvertConfig) -> PostStepsSettings:
        """Built on the launcher, from the run's config."""
        return settings_for(cls, cfg)


def run_post_steps(
    settings: PostStepsSettings,
    layout: Layout,
    info: DatasetInfo,
    *,
    options: Any,
    runner: Any,
    temp_root: str | None,
    pixel_stats: Mapping[str, Any] | None = None,
    graph_cache: str | None = None,
) -> DatasetInfo:
    """TFT artifacts and TFDS metadata into the staging folder, then publish. Returns dataset.json's content.

    ``pixel_stats``: the train split's statistics when the job computed them (``--image-stats``).
    ``graph_cache``: the local graph cache's folder (``run.graph_cache``), for post-steps in the launcher.
    """
    from .. import tfds_metadata

    staging = layout.tmp_dir

    def published() -> DatasetInfo | None:
        # A late attempt (a stalled worker whose retry published and cleaned up) stops here, before it
        # recreates the staging folder; one that gets past this is refused by publish.
        return already_published(settings.output, layout.run_id)

    if settings.transform:
        failpoints.hit("poststeps.step")
        if (done := published()) is not None:
            return done
        try:
            transform = _graph(
                settings, layout, info, pixel_stats, graph_cache, options=options, runner=runner, temp_root=temp_root
            )
        except Exception as e:
            raise PipelineError(f"tensorflow-transform analysis: {last_line(e)}") from e
        info = info.with_(transform=transform)
    if settings.tfds_metadata:
        failpoints.hit("poststeps.step")
        if (done := published()) is not None:
            return done
        why_not = tfds_metadata.skip_reason(info)
        tfds = (
            TfdsInfo(files=tuple(tfds_metadata.write(staging, info))) if why_not is None else TfdsInfo(skipped=why_not)
        )
        info = info.with_(tfds=tfds)
    failpoints.hit("poststeps.step")
    if (done := published()) is not None:
        return done
    write_text(FileSystems.join(staging, metadata.DATASET_JSON), info.to_text())
    publish(staging, settings.output, leased=layout.leased)
    return info


def _graph(
    settings: PostStepsSettings,
    layout: Layout,
    info: DatasetInfo,
    pixel_stats: Mapping[str, Any] | None,
    cache: str | None,
    **engine: Any,
) -> dict[str, Any]:
    """The TFT graph into the staging folder, reused (``run.graph_cache``) or built; dataset.json's
    ``transform`` block (with the files written, which a later publish replaces).

    ``engine``: the options, runner and temp_root a build (and the statistics' pipeline) runs with."""
    from . import graph_cache

    staging = layout.tmp_dir
    if settings.image_stats and pixel_stats is None:
        from ..analysis import train_pixel_stats

        pixel_stats = train_pixel_stats(staging, info, settings.image_size, **engine)
    key = graph_cache.graph_key(info, settings.image_size, pixel_stats if settings.image_stats else None)
    reused = graph_cache.reuse(key, staging, previous=layout.previous, cache=cache)
    if reused is not None:
        transform, source = reused
        _LOG.info("TFT graph %s: %s", key, source)
    else:
        from ..analysis import run_analysis

        transform = run_analysis(
            staging,
            info,
            image_size=settings.image_size,
            image_stats=settings.image_stats,
            pixel_stats=pixel_stats,
            **engine,
        )
        files = tft_files(staging)
        graph_cache.remember(key, staging, transform, files, cache)
        return {**transform, "graph_key": key, "files": files}
    return {**transform, "graph_key": key, "files": tft_files(staging)}


def tft_files(staging: str) -> list[str]:
    """The files under the staging folder's TFT folders (relative paths), for dataset.json."""
    prefix = staging.rstrip("/") + "/"
    found = []
    for name in TFT_DIRS:
        try:
            matched = FileSystems.match([FileSystems.join(staging, name, "**")])[0].metadata_list
        except Exception:  # noqa: BLE001 - no such folder
            continue
        found += [m.path[len(prefix) :] for m in matched]
    return sorted(found)


class PostStepsFn(beam.DoFn):
    """The post-steps as the job's last step (``--post-steps job``); yields dataset.json's content."""

    def __init__(self, settings: PostStepsSettings, layout: Layout) -> None:
        self._settings = settings
        self._layout = layout

    def process(self, info: DatasetInfo, pixel_stats: Mapping[str, Any] | None = None) -> Iterator[DatasetInfo]:
        settings, layout = self._settings, self._layout
        if info.status != OK:  # finalize decided: nothing to analyse or publish
            yield info
            return
        done = published_run(settings.output, layout.tmp_dir, layout.run_id, layout.leased)  # a retried step
        if done is not None:
            yield done
            return
        # in this worker's own process, whatever its cores (not the local default's worker processes)
        options, runner = make_options(["--runner=DirectRunner", "--direct_running_mode=in_memory"])
        staging_info = FileSystems.join(layout.tmp_dir, metadata.DATASET_JSON)
        yield run_post_steps(
            settings,
            layout,
            DatasetInfo.from_json(read_json(staging_info)),
            options=options,
            runner=runner,
            temp_root=None,
            pixel_stats=pixel_stats,
        )
