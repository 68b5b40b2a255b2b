"""Where the job's graph breaks fusion so that nothing big runs on one worker (issue #12).

The local runner cannot show a fusion break by behaviour (it never spreads a
bundle over machines), so these tests read the built graph: which step
produces the input of the step that does the per-file work.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import PipelineVisitor

from beam_pipeline.config import ConvertConfig, Layout
from beam_pipeline.pipeline import build_pipeline

pytestmark = pytest.mark.pipeline


def _producers(p: beam.Pipeline) -> dict[str, list[str]]:
    """{step label: [labels of the steps producing its inputs]}."""
    out: dict[str, list[str]] = {}

    class Visitor(PipelineVisitor):
        def visit_transform(self, node) -> None:
            out[node.full_label] = [pc.producer.full_label for pc in node.main_inputs.values() if pc.producer]

        def enter_composite_transform(self, node) -> None:
            self.visit_transform(node)

    p.visit(Visitor())
    return out


def _layout(tmp_path, **kw) -> Layout:
    root = str(tmp_path / "in")
    return Layout(root=root, pattern=root + "/**", manifest=None, manifest_format=None, **kw)


def test_per_file_work_follows_a_reshuffle_of_the_listing(tmp_path):
    cfg = ConvertConfig(output=str(tmp_path / "out"), name="d", input=str(tmp_path / "in"), dedupe=True)
    steps = _producers(build_pipeline(cfg, _layout(tmp_path, tmp_dir=str(tmp_path / "t")), PipelineOptions()))
    # listed files are spread before any per-file step (refs, dedupe's hashing)
    assert steps["List/ToRefs"][0].startswith("List/SpreadFiles/")
    assert steps["List/SpreadFiles"] == ["List/PathAndSize"]
    assert steps["Dedupe"] == ["List/ToRefs/ParDo(_MatchedToRef)"]
    # the folder is listed level by level, each level's folders spread before they are listed
    assert steps["List/ListFolder/ListLevel1"][0].startswith("List/ListFolder/SpreadFolders0/")
    assert steps["List/ListFolder/ListTrees"][0].startswith("List/ListFolder/SpreadFolders1/")


def test_write_to_tfrecord_counts_each_shard_file_after_a_reshuffle(tmp_path):
    cfg = ConvertConfig(output=str(tmp_path / "out"), name="d", input=str(tmp_path / "in"), sink="write_to_tfrecord")
    lay = _layout(tmp_path, tmp_dir=str(tmp_path / "t"))
    steps = _producers(build_pipeline(cfg, lay, PipelineOptions(), wtt_shards={"train": 3, "test": 1}))
    for split in ("train", "test"):
        assert steps[f"Describe_{split}"][0].startswith(f"SpreadShardFiles_{split}/")
        assert steps[f"SpreadShardFiles_{split}"][0].startswith(f"WriteToTFRecord_{split}/")


def test_image_stats_in_the_job_are_a_distributed_step_feeding_the_post_steps(tmp_path):
    cfg = ConvertConfig(
        output=str(tmp_path / "out"), name="d", input=str(tmp_path / "in"), image_stats=True, post_steps="job"
    )
    steps = _producers(build_pipeline(cfg, _layout(tmp_path, tmp_dir=str(tmp_path / "t")), PipelineOptions()))
    # one element per train shard, spread before the shards are decoded
    assert steps["TrainPixelStats/ShardMoments"][0].startswith("TrainPixelStats/SpreadTrainShards/")
    assert steps["TrainPixelStats/TrainShardPaths"] == ["AfterFinalize/RemoveRandomKeys"]  # after the fusion break
    p = build_pipeline(cfg, _layout(tmp_path, tmp_dir=str(tmp_path / "t")), PipelineOptions())
    side = {}

    class Visitor(PipelineVisitor):
        def visit_transform(self, node) -> None:
            side[node.full_label] = [s.pvalue.producer.full_label for s in node.side_inputs]

    p.visit(Visitor())
    assert side["PostSteps"] == ["TrainPixelStats/PixelStats"]
