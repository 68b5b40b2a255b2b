"""Crash every step at every operation, re-run it as a runner would, check what the output shows.

The steps are driven in-process the way Dataflow runs them: each shard
writer, each rejects part, finalize and the post-steps are separate bundles;
a bundle that raised is run again with the same inputs (same run id, same
side inputs). ``BEAM_PIPELINE_FAILPOINTS`` arms one point at its k-th
operation; k is swept from 1 until the step no longer crashes.

After the crash: if ``_SUCCESS`` is there, the output is byte for byte the
previous dataset or the new one, complete; a crash before publishing leaves
the previous dataset byte-identical. After the re-run the output is the new
dataset, the same bytes as a run that never crashed (that run is read back
with TensorFlow once).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from beam_pipeline import failpoints, hashing
from beam_pipeline.config import ConvertConfig, Layout
from beam_pipeline.run.finalize import FinalizeFn, FinalizeSettings, WriteRejectPartFn, reject_bucket
from beam_pipeline.run.publish import PUBLISHED_DIRS, publish
from beam_pipeline.vocab.dataset_info import DatasetInfo
from beam_pipeline.vocab.records import ShardResult
from beam_pipeline.vocab.refs import Ref
from beam_pipeline.writer.shard import WriteShardFn

from .imagegen import broken_bytes, image_bytes, write

pytestmark = pytest.mark.unit

NEW_RUN = "20991231-000000-feedf00d"
OLD_RUN = "20991230-000000-0ld0ld00"
LABELS = ["cat", "dog"]


@dataclass
class Job:
    cfg: ConvertConfig
    layout: Layout
    shards: list[tuple[tuple[str, int], list[Ref]]]


def _inputs(root: Path, variant: int) -> list[Ref]:
    """9 good images, one broken, one missing; two labels, train and test."""
    refs = []
    for i in range(9):
        label = LABELS[i % 2]
        rel = f"{label}/{i}.{'png' if i % 3 else 'jpg'}"
        data = image_bytes("png" if i % 3 else "jpeg", 20 + i, 30, seed=i + 100 * variant)
        path = write(str(root / rel), data)
        refs.append(Ref(path, rel, len(data), "test" if i % 4 == 0 else "train", label, hashing.shuffle_key(rel, 1)))
    bad = write(str(root / "cat" / "bad.jpg"), broken_bytes("truncated"))
    refs.append(Ref(bad, "cat/bad.jpg", 10, "train", "cat", hashing.shuffle_key("cat/bad.jpg", 1)))
    gone = str(root / "dog" / "gone.jpg")
    refs.append(Ref(gone, "dog/gone.jpg", 10, "train", "dog", hashing.shuffle_key("dog/gone.jpg", 1)))
    return refs


def _job(root: Path, out: Path, run_id: str, shards_per_split: int, post_steps: bool) -> Job:
    refs = _inputs(root, 1 if run_id == OLD_RUN else 0)
    shards: dict[tuple[str, int], list[Ref]] = {}
    for split in ("train", "test"):
        for s in range(shards_per_split + 1):  # the last one stays empty: finalize drops it
            shards[(split, s)] = []
    for i, ref in enumerate(refs):
        shards[(ref.split, i % shards_per_split)].append(ref)
    cfg = ConvertConfig(
        output=str(out),
        name="aa",  # sorts before dataset.json
        input=str(root),
        transform=post_steps,
        tfds_metadata=post_steps,
        max_reject_fraction=1.0,
        post_steps="job",
        image_size=16,
        decode_threads=2,
    )
    layout = Layout(
        root=str(root),
        pattern=None,
        manifest=None,
        manifest_format=None,
        tmp_dir=str(out / f".beam_pipeline-tmp-{run_id}"),
        run_id=run_id,
    )
    return Job(cfg, layout, sorted(shards.items()))


def _retrying(step: Callable[[], list[Any]], on_crash: Callable[[], None]) -> list[Any]:
    """A bundle as a runner runs it: if it crashes, once more with the same inputs."""
    try:
        return step()
    except failpoints.FailpointError:
        on_crash()
        return step()


def run_until_finalized(job: Job, on_crash: Callable[[], None]) -> DatasetInfo:
    """Writers, rejects parts and finalize (which publishes when there are no post-steps)."""
    staging = job.layout.tmp_dir
    writer = WriteShardFn(staging, "none", job.cfg.decode_threads)
    writer.setup()
    results, rejects = [], []
    try:
        for element in job.shards:
            out = _retrying(lambda e=element: list(writer.process(e, LABELS, {})), on_crash)
            results += [o for o in out if isinstance(o, ShardResult)]
            rejects += [o.value for o in out if not isinstance(o, ShardResult)]
    finally:
        writer.teardown()
    buckets: dict[int, list[dict[str, str]]] = collections.defaultdict(list)
    for r in rejects:
        buckets[reject_bucket(r["path"])].append(r)
    parts = []
    for bucket, rows in sorted(buckets.items()):
        parts += _retrying(lambda b=bucket, r=rows: list(WriteRejectPartFn(staging).process((b, r))), on_crash)
    counts = list(collections.Counter(r["reason"] for r in rejects).items())
    [info] = _retrying(
        lambda: list(
            FinalizeFn(FinalizeSettings.of(job.cfg), job.layout).process(
                None, results, parts, counts, [], LABELS, {}, {}
            )
        ),
        on_crash,
    )
    return info


def run_post_steps(job: Job, info: DatasetInfo, on_crash: Callable[[], None]) -> DatasetInfo:
    from beam_pipeline.run.poststeps import PostStepsFn, PostStepsSettings

    [done] = _retrying(lambda: list(PostStepsFn(PostStepsSettings.of(job.cfg), job.layout).process(info)), on_crash)
    return done


def snapshot(folder: Path, raw: bool = False) -> dict[str, bytes]:
    """Every file of the output but the runs' scratch folders and the output lease (no part of a dataset).

    Unless ``raw``, the output's own path (dataset.json's config names it) reads OUT, so runs
    into different folders compare equal; a copy of an older dataset is compared raw.
    """
    return {
        str(p.relative_to(folder)): p.read_bytes() if raw else p.read_bytes().replace(str(folder).encode(), b"OUT")
        for p in sorted(folder.rglob("*"))
        if p.is_file()
        and not p.relative_to(folder).parts[0].startswith(".beam_pipeline-tmp-")
        and p.name != ".beam_pipeline-lease.json"
    }


def same_dataset(got: dict[str, bytes], want: dict[str, bytes]) -> bool:
    """Byte for byte; TFT folders by file names only (a re-run analysis may serialize differently)."""
    if set(got) != set(want):
        return False
    return all(got[k] == want[k] for k in want if k.split("/", 1)[0] not in PUBLISHED_DIRS)


def check_new_dataset(out: Path, labels: list[str], transform: bool) -> None:
    """The output read back with TensorFlow: every shard, counts as dataset.json says."""
    import tensorflow as tf

    info = json.loads((out / "dataset.json").read_text())
    assert (out / "_SUCCESS").exists() and info["run_id"] == NEW_RUN
    listed = set()
    for split in info["splits"].values():
        for shard in split["shards"]:
            listed.add(shard["file"])
            records = list(tf.data.TFRecordDataset(str(out / shard["file"])))
            assert len(records) == shard["records"] > 0
        assert sum(s["records"] for s in split["shards"]) == split["examples"]
    assert {p.name for p in out.iterdir() if ".tfrecord-" in p.name} == listed
    assert info["examples"] == 9
    assert (out / "labels.txt").read_text().splitlines() == labels
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rejects) == ["missing", "truncated"] == sorted(info["rejects"]["by_reason"])
    if transform:
        import tensorflow_transform as tft

        vocab = tft.TFTransformOutput(str(out)).vocabulary_by_name("label")
        assert [v.decode() for v in vocab] == labels
        assert (out / "dataset_info.json").exists()


@pytest.fixture
def armed(monkeypatch):
    """Arms one failpoint (fresh counts); disarms it again with ``armed(None)``."""

    def arm(spec: str | None) -> None:
        failpoints.reset()
        if spec:
            monkeypatch.setenv(failpoints.ENV, spec)
        else:
            monkeypatch.delenv(failpoints.ENV, raising=False)

    yield arm
    failpoints.reset()


def test_failpoint_spec_and_once_semantics(monkeypatch):
    assert failpoints.parse("publish.move:3, finalize.rename:2,") == {"publish.move": 3, "finalize.rename": 2}
    for bad in ("publish.move", "publish.move:0", "x:y", ":3"):
        with pytest.raises(ValueError, match=failpoints.ENV):
            failpoints.parse(bad)
    monkeypatch.setenv(failpoints.ENV, "writer.record:2")
    failpoints.reset()
    failpoints.hit("writer.record")
    failpoints.hit("writer.result")
    with pytest.raises(failpoints.FailpointError, match="writer.record at operation 2"):
        failpoints.hit("writer.record")
    for _ in range(5):  # once per process
        failpoints.hit("writer.record")
    failpoints.reset()
    failpoints.hit("writer.record")
    with pytest.raises(failpoints.FailpointError):
        failpoints.hit("writer.record")
    failpoints.reset()


# near_duplicates.write: the sweep's images have no near-duplicates (tests/test_near_duplicates.py kills a run there)
BEFORE_PUBLISH = {"writer.record", "writer.result", "rejects.write", "finalize.rename", "finalize.write"}


@pytest.mark.e2e
def test_sweep_every_point_without_post_steps(tmp_path, armed):
    """Finalize publishes itself (no TFT, no TFDS): writer, rejects, finalize and publish points."""
    base = tmp_path / "base"
    old = _job(tmp_path / "old_in", base, OLD_RUN, 4, post_steps=False)
    run_until_finalized(old, lambda: None)
    assert (base / "_SUCCESS").exists()
    old_snap = snapshot(base, raw=True)

    ref_out = tmp_path / "ref"
    shutil.copytree(base, ref_out)
    run_until_finalized(_job(tmp_path / "in", ref_out, NEW_RUN, 2, post_steps=False), lambda: None)
    check_new_dataset(ref_out, LABELS, transform=False)
    want = snapshot(ref_out)
    assert [n for n in old_snap if n.startswith("aa-") and n not in want]  # stale shards to remove
    assert [n for n in old_snap if n.startswith("aa-") and n in want and old_snap[n] != want[n]]  # and to replace

    swept = collections.Counter()
    for point in sorted(BEFORE_PUBLISH | {"publish.manifest", "publish.move", "publish.delete", "publish.success"}):
        for k in range(1, 100):
            out = tmp_path / f"{point}-{k}"
            shutil.copytree(base, out)
            crashed = []

            def after_crash(out=out, point=point, k=k, crashed=crashed) -> None:
                crashed.append(True)
                now = snapshot(out, raw=True)
                if point in BEFORE_PUBLISH or point == "publish.manifest":
                    assert now == old_snap, (point, k)
                elif "_SUCCESS" in now:
                    assert now == old_snap or snapshot(out) == want, (point, k)

            armed(f"{point}:{k}")
            run_until_finalized(_job(tmp_path / "in", out, NEW_RUN, 2, post_steps=False), after_crash)
            armed(None)
            assert snapshot(out) == want, (point, k)
            assert not [p for p in out.iterdir() if p.name.startswith(".")], (point, k)
            shutil.rmtree(out)
            if not crashed:
                break
            swept[point] += 1
    # Every point was reached at least once, the per-file ones many times.
    assert set(swept) == BEFORE_PUBLISH | {"publish.manifest", "publish.move", "publish.delete", "publish.success"}
    assert swept["writer.record"] == 9 and swept["publish.move"] >= 5 and swept["publish.delete"] >= 4, swept


@pytest.mark.e2e
def test_sweep_post_steps_and_publish_with_tft_and_tfds(tmp_path, armed):
    """Post-steps as the job's last step: TFT folders and TFDS files replace an older run's."""
    base = tmp_path / "base"
    old = _job(tmp_path / "old_in", base, OLD_RUN, 4, post_steps=True)
    old = replace(old, cfg=replace(old.cfg, image_size=8))
    run_post_steps(old, run_until_finalized(old, lambda: None), lambda: None)
    old_snap = snapshot(base, raw=True)
    assert "transform_fn/saved_model.pb" in old_snap and "dataset_info.json" in old_snap

    # The new run up to the end of finalize (it leaves publishing to the post-steps) ...
    finalized = tmp_path / "finalized"
    shutil.copytree(base, finalized)
    job = _job(tmp_path / "in", finalized, NEW_RUN, 2, post_steps=True)
    info = run_until_finalized(job, lambda: None)
    assert snapshot(finalized, raw=True) == old_snap
    # ... and up to the first publish step, TFT and TFDS files in staging.
    ready = tmp_path / "ready"
    shutil.copytree(finalized, ready)
    from beam_pipeline.run.poststeps import PostStepsFn, PostStepsSettings

    armed("publish.manifest:1")
    with pytest.raises(failpoints.FailpointError):
        list(PostStepsFn(PostStepsSettings.of(_at(job, ready).cfg), _at(job, ready).layout).process(info))
    armed(None)
    staged = Path(_at(job, ready).layout.tmp_dir)
    assert (staged / "transform_fn" / "saved_model.pb").exists() and (staged / "dataset_info.json").exists()

    ref_out = tmp_path / "ref"
    shutil.copytree(ready, ref_out)
    run_post_steps(_at(job, ref_out), info, lambda: None)
    check_new_dataset(ref_out, LABELS, transform=True)
    want = snapshot(ref_out)

    swept = collections.Counter()
    cases = [("poststeps.step", finalized)] + [
        (p, ready) for p in ("publish.manifest", "publish.move", "publish.delete", "publish.success")
    ]
    for point, start in cases:
        for k in range(1, 200):
            out = tmp_path / f"{point}-{k}"
            shutil.copytree(start, out)
            here = _at(job, out)
            crashed = []

            def after_crash(out=out, point=point, k=k, crashed=crashed) -> None:
                crashed.append(True)
                now = snapshot(out, raw=True)
                if point in ("poststeps.step", "publish.manifest"):
                    assert now == old_snap, (point, k)
                elif "_SUCCESS" in now:
                    assert now == old_snap or same_dataset(snapshot(out), want), (point, k)

            armed(f"{point}:{k}")
            if start is finalized:
                run_post_steps(here, info, after_crash)
            else:
                # The crashing attempt is the publish the post-steps end with; the re-run is the whole step.
                try:
                    publish(here.layout.tmp_dir, str(out))
                except failpoints.FailpointError:
                    after_crash()
                run_post_steps(here, info, lambda: pytest.fail("a re-run crashed"))
            armed(None)
            assert same_dataset(snapshot(out), want), (point, k)
            if point == "poststeps.step" and crashed:
                check_new_dataset(out, LABELS, transform=True)
            shutil.rmtree(out)
            if not crashed:
                break
            swept[point] += 1
    assert swept["poststeps.step"] == 3 and swept["publish.move"] >= 10 and swept["publish.delete"] >= 3, swept


def _at(job: Job, out: Path) -> Job:
    """The same job on a copy of its output folder (staging folder included)."""
    tmp_dir = str(out / Path(job.layout.tmp_dir).name)
    return replace(job, cfg=replace(job.cfg, output=str(out)), layout=replace(job.layout, tmp_dir=tmp_dir))


def test_publish_keeps_a_concurrent_runs_scratch_and_removes_long_dead_ones(tmp_path):
    import time

    out = tmp_path / "out"
    job = _job(tmp_path / "in", out, NEW_RUN, 1, post_steps=False)
    young = out / (".beam_pipeline-tmp-" + time.strftime("%Y%m%d-%H%M%S-") + "0therrun") / "train-00000-x.tfrecord"
    dead = out / ".beam_pipeline-tmp-20200101-000000-deadbeef" / "train-00000-x.tfrecord"
    write(str(young), b"a run going on right now")
    write(str(dead), b"killed years ago")
    run_until_finalized(job, lambda: None)
    assert (out / "_SUCCESS").exists()
    assert young.read_bytes() == b"a run going on right now"
    assert not dead.parent.exists() and not Path(job.layout.tmp_dir).exists()


def test_a_retried_finalize_after_publish_changes_nothing(tmp_path):
    out = tmp_path / "out"
    job = _job(tmp_path / "in", out, NEW_RUN, 2, post_steps=False)
    info = run_until_finalized(job, lambda: None)
    before = snapshot(out)
    again = run_until_finalized(job, lambda: pytest.fail("no crash expected"))
    assert again == info and snapshot(out) == before
    assert not [p for p in os.listdir(out) if p.startswith(".")]


@pytest.mark.e2e
def test_the_cli_honours_the_variable_and_the_next_run_takes_over(tmp_path, monkeypatch):
    """The local runner does not retry: the crash fails the run (exit 1, one line, no _SUCCESS),
    and the next run publishes over what it left."""
    from .conftest import convert, read_records, run_cli

    root = tmp_path / "in"
    for i in range(6):
        write(str(root / LABELS[i % 2] / f"{i}.png"), image_bytes("png", seed=i))
    out = tmp_path / "out"
    flags = ("--input", str(root), "--output", str(out), "--target-shard-mb", "0.001", "--overwrite")
    convert(*flags)
    monkeypatch.setenv(failpoints.ENV, "publish.move:2")
    failed = run_cli("convert", *flags, "--seed", "4", "--no-transform", "--no-tfds-metadata")
    assert failed.returncode == 1 and "failpoint publish.move at operation 2" in failed.stderr, failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1
    assert not (out / "_SUCCESS").exists()
    monkeypatch.delenv(failpoints.ENV)
    convert(*flags, "--seed", "4")
    assert (out / "_SUCCESS").exists() and len(read_records(out)) == 6
    assert json.loads((out / "dataset.json").read_text())["seed"] == 4


def test_a_manifest_that_cannot_be_read_fails_the_publish_instead_of_planning_again(tmp_path, monkeypatch):
    # Planning again from a half-moved staging folder would call the moved files stale and delete them.

    staging = tmp_path / "staging"
    staging.mkdir()
    from beam_pipeline.run import publish as protocol

    assert protocol._read_manifest(str(staging)) is None  # absent: no plan yet
    (staging / protocol.PUBLISH_MANIFEST).write_text('{"files": {}, "stale": [], "complete": true}')
    assert protocol._read_manifest(str(staging)) == protocol.PublishPlan(files={}, stale=(), complete=True)

    def unavailable(path):
        raise ConnectionResetError("transient")

    monkeypatch.setattr(protocol, "read_json", unavailable)
    with pytest.raises(ConnectionResetError):
        protocol.publish(str(staging), str(tmp_path / "out"))


def test_a_run_published_over_mid_publish_writes_no_success(tmp_path, monkeypatch):
    """Run B's publish, with run A's dataset.json put back right before B's last check: no _SUCCESS."""

    out = tmp_path / "out"
    run_until_finalized(_job(tmp_path / "in-a", out, OLD_RUN, 1, post_steps=False), lambda: None)
    assert (out / "_SUCCESS").exists()
    theirs = (out / "dataset.json").read_bytes()
    real_hit = failpoints.hit

    def interleave(point: str) -> None:
        if point == "publish.success":  # run A publishes again, its dataset.json last
            (out / "dataset.json").write_bytes(theirs)
        real_hit(point)

    monkeypatch.setattr(failpoints, "hit", interleave)
    job = _job(tmp_path / "in-b", out, NEW_RUN, 1, post_steps=False)
    from beam_pipeline.run.publish import PublishConflict

    with pytest.raises(PublishConflict, match=f"another run \\({OLD_RUN}\\) published into .* {NEW_RUN}"):
        run_until_finalized(job, lambda: None)
    assert not (out / "_SUCCESS").exists()
    # A retry of the step (Dataflow's) fails the same way: the job fails, nothing marks the mix complete.
    with pytest.raises(PublishConflict):
        run_until_finalized(job, lambda: None)
    assert not (out / "_SUCCESS").exists()


def test_an_unknown_point_is_an_error_naming_the_known_points(monkeypatch):
    """A misspelt name fails at parse, in one line that lists every known point (never silently unarmed)."""
    with pytest.raises(ValueError) as caught:
        failpoints.parse("publsh.move:1")
    message = str(caught.value)
    assert "publsh.move" in message and "\n" not in message
    assert all(point in message for point in failpoints.POINTS)
    with pytest.raises(ValueError, match="publsh.move"):
        failpoints.parse_actions("writer.record:2,publsh.move:1:kill")
    monkeypatch.setenv(failpoints.ENV, "publsh.move:1")
    failpoints.reset()
    with pytest.raises(ValueError, match="publsh.move"):
        failpoints.hit("publish.move")  # armed through the variable: the same check, at the first hit


@pytest.mark.e2e
def test_the_cli_refuses_an_unknown_point_before_starting(tmp_path, monkeypatch):
    from .conftest import run_cli

    root = tmp_path / "in"
    write(str(root / "cat" / "0.png"), image_bytes("png"))
    out = tmp_path / "out"
    monkeypatch.setenv(failpoints.ENV, "publsh.move:1")
    result = run_cli("convert", "--input", str(root), "--output", str(out), "--no-transform")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "publsh.move" in lines[0] and "publish.move" in lines[0]
    assert "Traceback" not in result.stderr and not out.exists()


def test_every_point_the_code_hits_is_known_and_documented():
    """POINTS is the one list: each point named in the package's source is in it, and the docs name each."""
    import re

    package = Path(failpoints.__file__).parent
    named = set()
    for source in package.rglob("*.py"):
        if source.name != "failpoints.py":
            # a point is a call argument: hit("p") or move_files(..., "p", guard)
            text = source.read_text()
            stages = "launcher|writer|rejects|near_duplicates|finalize|poststeps|publish"
            named |= set(re.findall(rf"\"((?:{stages})\.[a-z_]+)\"[,)]", text))
    assert named == set(failpoints.POINTS), named ^ set(failpoints.POINTS)
    documented = (package.parent / "docs" / "development.md").read_text()
    assert all(f"`{point}`" in documented for point in failpoints.POINTS)
