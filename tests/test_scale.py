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
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_pipeline.config import ConvertConfig, Layout
from beam_pipeline.pipeline import build_pipeline
from beam_pipeline.planning import PlanShards
from beam_pipeline.vocab.refs import Previous, PreviousReject, Ref
from beam_pipeline.writer import pieces

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
    assert steps["List/SpreadFiles"] == ["List/ListFolder/AllFiles"]  # (path bytes, size, mtime) as listed
    assert steps["Dedupe"] == ["List/Refs"]
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


# --- what crosses every shuffle once per image (issue #45) ----------------------------------------


def _coder_of(p: beam.Pipeline, label: str) -> str:
    """The coder of the main output of the step labelled ``label``, as the runner gets it."""
    from apache_beam.runners.pipeline_context import PipelineContext

    proto = p.to_runner_api()
    for transform in proto.components.transforms.values():
        if transform.unique_name == label:
            pcoll = proto.components.pcollections[transform.outputs["None"]]
            return repr(PipelineContext(proto.components).coders.get_by_id(pcoll.coder_id))
    raise AssertionError(f"no step {label}")


def test_refs_cross_the_listing_and_the_shard_grouping_in_the_ref_coder(tmp_path):
    from beam_pipeline.vocab.refs import RefCoder

    assert isinstance(beam.coders.registry.get_coder(Ref), RefCoder)
    cfg = ConvertConfig(output=str(tmp_path / "out"), name="d", input=str(tmp_path / "in"))
    p = build_pipeline(cfg, _layout(tmp_path, tmp_dir=str(tmp_path / "t")), PipelineOptions())
    listed = {n.full_label: n for n in _nodes(p)}
    assert listed["List/Refs"].outputs[None].element_type is Ref
    assert _coder_of(p, "List/Refs") == "RefCoder"
    # the local runner packs a shard's refs into files (RefCoder): only their paths are grouped
    assert _coder_of(p, "Write/GroupByShard").endswith("IterableCoder[StrUtf8Coder]]")
    assert [pc.element_type for pc in listed["Write/PackPieces"].main_inputs.values()] == [Ref]
    # Dataflow groups the refs themselves, in RefCoder
    with beam.Pipeline(runner=FnApiRunner()) as g:
        refs = g | beam.Create([Ref("/in/a.jpg", "a.jpg", 3, "train", None, 5)])
        plans = refs | PlanShards(10**6)
        _ = pieces.group_refs_by_shard(refs, plans, str(tmp_path / "t"), pieces.GROUP)
        assert _coder_of(g, "GroupByShard").endswith("IterableCoder[RefCoder]]")


def test_each_runner_gets_the_path_of_a_shards_refs_it_can_carry():
    from beam_pipeline.pipeline import _refs_path

    def how(*args: str) -> str:
        return _refs_path(PipelineOptions(list(args)))

    assert how() == how("--runner=DirectRunner") == how("--runner=apache_beam.runners.DirectRunner") == pieces.PACK
    assert how("--runner=FlinkRunner") == how("--runner=SparkRunner") == how("--runner=PortableRunner") == pieces.PIECES
    # Dataflow, and a runner this tool does not know: one GroupByKey (its workers may not see a scratch folder)
    assert (
        how("--runner=DataflowRunner") == how("--runner=TestDataflowRunner") == how("--runner=MyRunner") == pieces.GROUP
    )


def _nodes(p: beam.Pipeline) -> list:
    found = []

    class Visitor(PipelineVisitor):
        def visit_transform(self, node) -> None:
            found.append(node)

    p.visit(Visitor())
    return found


@pytest.mark.parametrize(
    "ref",
    [
        Ref("/data/tiles/class_3/0123453.jpg", "class_3/0123453.jpg", 2345, "train", "class_3", 2**64 - 1, mtime=1.5),
        # a manifest's path that is not root + relpath, a lone surrogate, a multi-label image, extra columns
        Ref("gs://b/x/\udcff.jpg", "other/\udcff.jpg", 0, "test", ("a", "b"), 0, (("w", 1.5), ("n", None))),
        Ref("p.png", "p.png", 1, "val", None, 7, previous=Previous("s", 1, 2, "f" * 64, "l", 3, "e", size=(4, 5))),
        Ref("q.png", "", 1, "train", "", 7, previous=PreviousReject("truncated", "cut at 10 bytes")),
        # a Previous's odd shapes: a label not the ref's, multi-label ids, no id, text where hex is expected,
        # upper-case hex (kept as text), converted and extras set, with extra columns beside it
        Ref("a.jpg", "a.jpg", 1, "train", ("a", "b"), 1, previous=Previous("s", 0, 0, "F" * 64, ("a",), [0, 2], "")),
        Ref("b.jpg", "b.jpg", 1, "val", "x", 1, previous=Previous("s", 2**40, 1, "zz", "y", None, "{}", "png", "abc")),
        Ref("c.jpg", "c.jpg", 1, "test", None, 1, (("w", 2),), previous=Previous("\udcff", 1, 1, "", None, None, "")),
        # a damaged index line's numbers past what a varint holds (the run converted such a file again before)
        Ref("d.jpg", "d.jpg", 1, "test", "x", 1, previous=Previous("s", 1, 1, "", "x", 2**64, "", size=(2**63, 1))),
    ],
)
def test_the_ref_coder_gives_back_every_field_in_half_the_fallbacks_bytes(ref):
    coder = beam.coders.registry.get_coder(Ref)
    encoded = coder.encode(ref)
    back = coder.decode(encoded)
    assert back == ref and type(back.previous) is type(ref.previous)
    assert coder.encode(back) == encoded  # deterministic
    if ref.relpath == "class_3/0123453.jpg":  # a listed file: ~70 bytes, where Beam's fallback pickle takes ~150
        assert len(encoded) <= 80 and 2 * len(encoded) <= len(beam.coders.FastPrimitivesCoder().encode(ref))


def test_a_previous_index_line_with_an_offset_past_any_shard_is_not_reused():
    from beam_pipeline.index import index_entry

    line = {"path": "a.jpg", "shard": "ds-train.tfrecord-00000-of-00001", "offset": 0, "length": 10, "sha256": "ab"}
    assert index_entry(line)
    assert not index_entry({**line, "offset": 2**63}) and not index_entry({**line, "length": 2**64})
    assert not index_entry({**line, "shard": "s"})  # not a shard name: its format is unknown
    ar = {**line, "shard": "ds-train.array_record-00000-of-00001", "offset": None, "record": 3}
    assert index_entry(ar) and not index_entry({**ar, "record": -1})  # ArrayRecord: found by its position


def test_a_nights_unchanged_tile_carries_its_previous_record_in_half_the_primitives_bytes():
    """An --incremental-from night's refs carry where the previous run stored each record; they wait in every
    buffer of the night as a first run's refs do (docs/how-it-works.md)."""
    coder = beam.coders.registry.get_coder(Ref)
    ref = Ref("/data/tiles/class_3/0123453.jpg", "class_3/0123453.jpg", 2345, "train", "class_3", 2**63, mtime=1.5)
    shard = "/data/out/train-00003-of-00017.tfrecord"
    previous = Previous(shard, 123456789, 2600, "ab" * 32, "class_3", 3, "", None, "0f" * 24, (96, 96))
    night = coder.encode(Ref(**{**{f: getattr(ref, f) for f in ref.__slots__}, "previous": previous}))
    alone = len(beam.coders.FastPrimitivesCoder().encode(tuple(previous)))
    assert len(night) - len(coder.encode(ref)) <= alone / 2 + len(shard) / 2
    assert coder.decode(night).previous == previous


def test_a_cluster_run_sends_the_workers_small_data_messages_unless_told_otherwise():
    from apache_beam.options.pipeline_options import DebugOptions

    from beam_pipeline.runner import DATA_BUFFER_BYTES, make_options

    def experiments(*args: str) -> list[str]:
        return make_options(list(args))[0].view_as(DebugOptions).experiments or []

    # the runner checks that a worker keeps up only every 100 messages: 100 x 64 KB wait at most, not 100 MB
    assert f"data_buffer_size_limit={DATA_BUFFER_BYTES}" in experiments("--runner=FlinkRunner")
    assert f"data_buffer_size_limit={DATA_BUFFER_BYTES}" in experiments("--runner=SparkRunner", "--experiments=x")
    assert experiments("--runner=FlinkRunner", "--experiments=data_buffer_size_limit=5") == ["data_buffer_size_limit=5"]
    assert not any("data_buffer" in e for e in experiments("--runner=DirectRunner"))
