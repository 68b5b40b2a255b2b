"""Resume (resume.py): a run killed half-way, run again with the same command, takes the shards it finished.

The kill is real: ``BEAM_PIPELINE_FAILPOINTS=writer.result:k:kill`` SIGKILLs the
process (or, with the multi-process runner, a worker) right after its k-th
finished shard, so nothing of the run's own clean-up happens. The re-run must
give the same shards, index and rejects as a run that was never killed, and
must not read the images of the shards it took: those files are overwritten
with garbage of the same size and mtime before it starts, so a read would make
them rejects.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from beam_pipeline import hashing, lease, metadata, resume, storage
from beam_pipeline.images.options import ImageOptions
from beam_pipeline.index import Previous, PreviousReject
from beam_pipeline.run.files import stale_tmp_dirs
from beam_pipeline.run.publish import cleanup_staging
from beam_pipeline.vocab.records import ShardResult
from beam_pipeline.vocab.refs import Ref
from beam_pipeline.writer.shard import WriteShardFn

from .conftest import BUCKET, convert, load_info, run_cli
from .imagegen import image_bytes, write
from .test_incremental import make_images, shard_bytes

pytestmark = pytest.mark.unit

ARGS = ["--name", "ds", "--seed", "3", "--target-shard-mb", "0.004", "--max-reject-fraction", "1"]
QUICK = ["--no-transform", "--no-tfds-metadata"]
TMP = ".beam_pipeline-tmp-"


def make_source(src: Path) -> None:
    make_images(src, {"cat": 14, "dog": 14})
    for i in range(6):  # rejects spread over the shards: some land in shards that are taken
        write(str(src / ["cat", "dog"][i % 2] / f"broken_{i}.png"), b"not an image %d" % i)


def scratch_folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.name.startswith(TMP)) if out.exists() else []


def finished(scratch: Path) -> list[dict]:
    """The results of the shards a run finished, from its markers."""
    done = scratch / resume.DONE
    return [json.loads(p.read_text())["result"] for p in sorted(done.glob("*.json")) if p.name != resume.RENAMED]


def killed_run(src: Path, out: Path, monkeypatch, point: str, *extra: str) -> Path:
    """Runs convert until the failpoint kills it; the dead run's scratch folder."""
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", point)
    result = run_cli("convert", "--input", str(src), "--output", str(out), *ARGS, *extra)
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    assert result.returncode != 0, result
    assert not (out / "_SUCCESS").exists()
    [scratch] = scratch_folders(out)
    return scratch


def spoil_taken_files(src: Path, results: list[dict]) -> int:
    """Overwrites every image of the given shards with garbage, keeping its size and mtime."""
    spoiled = 0
    for result in results:
        for line in Path(result["index_path"]).read_text().splitlines():
            target = src / json.loads(line)["path"]
            stat = target.stat()
            target.write_bytes(b"\0" * stat.st_size)
            os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            spoiled += 1
    return spoiled


def same_output(got: Path, want: Path) -> None:
    assert shard_bytes(got) == shard_bytes(want)
    idx = {p.name: p.read_bytes() for p in (want / "idx").iterdir()}
    assert {p.name: p.read_bytes() for p in (got / "idx").iterdir()} == idx
    assert len(idx) == len(shard_bytes(want))
    assert (got / "index.jsonl").read_text() == (want / "index.jsonl").read_text()
    assert (got / "rejects.jsonl").read_text() == (want / "rejects.jsonl").read_text()
    assert (got / "labels.txt").read_text() == (want / "labels.txt").read_text()
    assert (got / "_SUCCESS").exists()


@pytest.mark.e2e
def test_a_killed_run_takes_its_finished_shards_when_run_again(tmp_path, monkeypatch):
    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_source(src)
    convert("--input", str(src), "--output", str(ref), *ARGS)  # never killed
    total_shards = sum(s["num_shards"] for s in load_info(ref)["splits"].values())

    # killed as its last shard but one finishes: the finished ones hold rejects whichever order shards run in
    kill_after = total_shards - 1
    scratch = killed_run(src, out, monkeypatch, f"writer.result:{kill_after}:kill", *QUICK)
    taken = finished(scratch)
    assert len(taken) == kill_after >= 3
    # some rejects are replayed, not found again
    assert any(r["rejects_path"] and Path(r["rejects_path"]).read_text() for r in taken)
    spoiled = spoil_taken_files(src, taken)
    assert spoiled == sum(r["records"] for r in taken) > 0

    convert("--input", str(src), "--output", str(out), *ARGS)  # the same command
    same_output(out, ref)  # the spoiled files were not read: they would be rejects now
    info = load_info(out)
    assert info["resumed"] == {"shards": kill_after, "records": spoiled, "from_runs": [scratch.name[len(TMP) :]]}
    assert info["rejects"] == load_info(ref)["rejects"]
    assert scratch_folders(out) == []  # the dead run's scratch folder went once this run published
    shown = run_cli("inspect", str(out))
    assert f"resumed: {kill_after} shards ({spoiled} records) from an earlier run that did not finish" in shown.stdout


@pytest.mark.e2e
def test_a_file_changed_after_the_kill_rewrites_its_shard_only(tmp_path, monkeypatch):
    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_source(src)
    scratch = killed_run(src, out, monkeypatch, "writer.result:4:kill", *QUICK)
    taken = finished(scratch)
    assert len(taken) == 4
    changed = json.loads(Path(taken[0]["index_path"]).read_text().splitlines()[0])["path"]
    os.utime(src / changed, (1_600_000_000, 1_600_000_000))  # touched: a changed file (same plan: same size)

    convert("--input", str(src), "--output", str(ref), *ARGS, *QUICK)
    convert("--input", str(src), "--output", str(out), *ARGS, *QUICK)
    same_output(out, ref)
    assert load_info(out)["resumed"]["shards"] == 3
    assert load_info(out)["resumed"]["records"] == sum(r["records"] for r in taken[1:])


@pytest.mark.e2e
def test_no_resume_writes_every_shard_again(tmp_path, monkeypatch):
    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_source(src)
    convert("--input", str(src), "--output", str(ref), *ARGS, *QUICK)
    dead = killed_run(src, out, monkeypatch, "writer.result:2:kill", *QUICK)
    convert("--input", str(src), "--output", str(out), *ARGS, *QUICK, "--no-resume")
    same_output(out, ref)
    assert "resumed" not in load_info(out)
    assert scratch_folders(out) == [dead]  # nothing was taken from it: it goes by age (run.files.STALE_TMP_AGE_S)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "point",
    [
        "finalize.rename:2:kill",
        "finalize.write:1:kill",
        "publish.manifest:1:kill",
        "publish.move:2:kill",
        "publish.move:last:kill",
        "publish.success:1:kill",
    ],
)
def test_a_run_killed_in_finalize_or_publish_is_finished_by_the_same_command(tmp_path, monkeypatch, point):
    """Finalize renames in staging (followed through renamed.jsonl); publish links the shards and .idx files
    into the output and keeps them in staging until _SUCCESS: every shard is taken, not one image read, wherever
    the publish was cut short (``last``: every file in but dataset.json). Publish used to move them: each shard
    already in the output was converted again, every one after a kill at the end of the publish."""
    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_source(src)
    convert("--input", str(src), "--output", str(ref), *ARGS, *QUICK)
    published = [p for p in ref.rglob("*") if p.is_file() and p.name != "_SUCCESS"]
    dead = killed_run(src, out, monkeypatch, point.replace(":last:", f":{len(published)}:"), *QUICK)
    spoiled = spoil_taken_files(src, finished(dead))
    convert("--input", str(src), "--output", str(out), *ARGS, *QUICK)
    same_output(out, ref)  # the spoiled files were not read: they would be rejects now
    shards = sum(s["num_shards"] for s in load_info(ref)["splits"].values())
    assert load_info(out)["resumed"] == {"shards": shards, "records": spoiled, "from_runs": [dead.name[len(TMP) :]]}
    assert scratch_folders(out) == []


@pytest.mark.e2e
def test_resume_with_the_multi_process_runner(tmp_path, monkeypatch):
    """A worker process killed: the job fails; run again on two worker processes, the finished shards are taken."""
    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_source(src)
    multi = ["--direct_running_mode=multi_processing", "--direct_num_workers=2", *QUICK]
    convert("--input", str(src), "--output", str(ref), *ARGS, *QUICK)
    scratch = killed_run(src, out, monkeypatch, "writer.result:3:kill", *multi)
    taken = finished(scratch)
    assert len(taken) >= 3  # each worker process counts its own failpoint hits
    spoil_taken_files(src, taken)
    convert("--input", str(src), "--output", str(out), *ARGS, *multi)
    same_output(out, ref)
    assert load_info(out)["resumed"]["shards"] == len(taken)


@pytest.mark.e2e
def test_a_run_killed_after_finalize_takes_every_shard(tmp_path, monkeypatch):
    """Killed in the post-steps (TFDS metadata here): the shards were renamed in staging; the re-run follows."""
    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_source(src)
    convert("--input", str(src), "--output", str(ref), *ARGS, tfds=True)
    scratch = killed_run(src, out, monkeypatch, "poststeps.step:1:kill", "--no-transform")
    assert (scratch / "dataset.json").exists() and (scratch / resume.DONE / resume.RENAMED).exists()
    taken = finished(scratch)
    spoil_taken_files(src, taken)
    convert("--input", str(src), "--output", str(out), *ARGS, tfds=True)
    same_output(out, ref)
    shards = sum(s["num_shards"] for s in load_info(ref)["splits"].values())
    assert len(taken) >= shards  # finished shards with no records (every image rejected) are dropped
    assert load_info(out)["resumed"] == {
        "shards": shards,
        "records": load_info(ref)["examples"],
        "from_runs": [scratch.name[len(TMP) :]],
    }
    assert (out / "dataset_info.json").exists()


@pytest.mark.e2e
def test_resume_on_gcs(gcs, tmp_path, monkeypatch):
    """gs:// output: the finished shards are copied server-side; the dead run's folder stays (GCS has no lock)."""
    src = tmp_path / "src"
    make_source(src)
    bucket = gcs.bucket(BUCKET)
    for path in src.rglob("*"):
        if path.is_file():
            bucket.blob(f"rs-in/{path.relative_to(src)}").upload_from_filename(str(path))
    gs_in, gs_out, gs_ref = f"gs://{BUCKET}/rs-in", f"gs://{BUCKET}/rs-out", f"gs://{BUCKET}/rs-ref"
    convert("--input", gs_in, "--output", gs_ref, "--no_auth", *ARGS)
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.result:3:kill")
    killed = run_cli("convert", "--input", gs_in, "--output", gs_out, "--no_auth", *ARGS, *QUICK)
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    assert killed.returncode != 0
    left = {b.name.split("/")[1] for b in gcs.list_blobs(BUCKET, prefix="rs-out/")}
    assert lease.LEASE in left  # a killed run leaves its lease; the re-run takes it (its pid is gone)
    dead = left - {lease.LEASE}
    assert len(dead) == 1 and next(iter(dead)).startswith(TMP)
    convert("--input", gs_in, "--output", gs_out, "--no_auth", *ARGS)

    def blobs(prefix: str) -> dict[str, bytes]:
        """The shards, index and rejects of a gs:// output."""
        out = {}
        for b in gcs.list_blobs(BUCKET, prefix=prefix):
            name = b.name[len(prefix) :]
            published = ".tfrecord-" in name or name in ("index.jsonl", "rejects.jsonl")
            if name.startswith("idx/") or ("/" not in name and published):
                out[name] = b.download_as_bytes()
        return out

    assert blobs("rs-out/") == blobs("rs-ref/") != {}
    assert any(n.startswith("idx/") for n in blobs("rs-out/")) and "index.jsonl" in blobs("rs-out/")
    resumed = json.loads(bucket.blob("rs-out/dataset.json").download_as_bytes())["resumed"]
    assert resumed["shards"] == 3 and resumed["from_runs"] == [next(iter(dead))[len(TMP) :]]
    assert {b.name.split("/")[1] for b in gcs.list_blobs(BUCKET, prefix="rs-out/")} >= dead


# ---- the pieces ------------------------------------------------------------------------------


def _ref(root: Path, i: int, **changes) -> Ref:
    rel = f"cat/{i}.png"
    data = image_bytes("png", height=20 + i, width=24, seed=i)
    path = write(str(root / rel), data)
    return dataclasses.replace(Ref(path, rel, len(data), "train", "cat", hashing.shuffle_key(rel, 1)), **changes)


def test_the_digest_covers_what_decides_a_shards_bytes(tmp_path, monkeypatch):
    refs = [_ref(tmp_path, i) for i in range(3)]
    base = ("train", 0, refs, ["cat"], {}, ImageOptions(), "none")
    digest = resume.shard_digest(*base)
    assert resume.shard_digest(*base) == digest
    variants = [
        ("train", 1, *base[2:]),
        ("test", 0, *base[2:]),
        ("train", 0, refs[:2], *base[3:]),
        ("train", 0, refs[::-1], *base[3:]),
        ("train", 0, [*refs[:2], dataclasses.replace(refs[2], size=refs[2].size + 1)], *base[3:]),
        ("train", 0, [*refs[:2], dataclasses.replace(refs[2], mtime=1.5)], *base[3:]),
        ("train", 0, [*refs[:2], dataclasses.replace(refs[2], label="dog")], *base[3:]),
        ("train", 0, [*refs[:2], dataclasses.replace(refs[2], key=7)], *base[3:]),
        ("train", 0, [*refs[:2], dataclasses.replace(refs[2], extras=(("a", 1),))], *base[3:]),
        ("train", 0, [*refs[:2], dataclasses.replace(refs[2], path="/elsewhere.png")], *base[3:]),
        (*base[:3], ["cat", "dog"], *base[4:]),
        (*base[:4], {"a": "int"}, *base[5:]),
        (*base[:5], ImageOptions(reencode_quality=90), "none"),
        (*base[:5], ImageOptions(max_pixels=10), "none"),
        (*base[:6], "gzip"),
        (*base, "/previous/output"),  # --incremental-from whose records fit
        ("train", 0, [*refs[:2], dataclasses.replace(refs[2], previous=PreviousReject("truncated", ""))], *base[3:]),
        (
            "train",
            0,
            [*refs[:2], dataclasses.replace(refs[2], previous=Previous("s", 0, 9, "h", "cat", 0, ""))],
            *base[3:],
        ),
    ]
    digests = {resume.shard_digest(*v) for v in variants}
    assert digest not in digests and len(digests) == len(variants)
    # memory is not part of what is written
    assert resume.shard_digest(*base[:5], ImageOptions(memory_budget_bytes=1), "none") == digest
    # the code is: a fixed bug must not leave shards of the buggy code in a resumed run
    real = metadata.package_versions()
    monkeypatch.setattr(metadata, "package_versions", lambda: {**real, "beam_pipeline_code": "0" * 16})
    assert resume.shard_digest(*base) != digest


def test_a_retried_writer_takes_its_own_finished_shard(tmp_path):
    """A bundle that failed after its shard was finished (Dataflow retries it): the retry reads no image."""
    refs = [_ref(tmp_path / "in", i) for i in range(4)]
    scratch = tmp_path / "out" / f"{TMP}20990101-000000-aaaaaaaa"
    writer = WriteShardFn(str(scratch), "none", 2)
    writer.setup()
    [first] = list(writer.process((("train", 0), refs), ["cat"], {}))
    for ref in refs:  # a read now would reject every one of them
        Path(ref.path).write_bytes(b"x")
    [again] = list(writer.process((("train", 0), refs), ["cat"], {}))
    assert again.resumed_from == str(scratch) and again.tmp_path != first.tmp_path
    assert Path(again.tmp_path).read_bytes() == Path(first.tmp_path).read_bytes()
    assert again.records == first.records == 4
    # other refs: written afresh (and all rejected, as the files are spoiled)
    other = [dataclasses.replace(r, key=r.key + 1) for r in refs]
    outs = list(writer.process((("train", 0), other), ["cat"], {}))
    assert [o for o in outs if isinstance(o, ShardResult)][0].records == 0


def _write(scratch: Path, refs: list[Ref], resume_from: tuple[Path, ...] = ()) -> tuple[ShardResult, list[dict]]:
    writer = WriteShardFn(str(scratch), "none", 1, resume_from=[str(s) for s in resume_from])
    writer.setup()
    outs = list(writer.process((("train", 0), refs), ["cat"], {}))
    return [o for o in outs if isinstance(o, ShardResult)][0], [o.value for o in outs if not isinstance(o, ShardResult)]


def test_a_shard_with_a_missing_or_unreadable_reject_is_written_again(tmp_path, monkeypatch):
    """Those rejects say nothing of the bytes (a permission granted since): no marker, the re-run reads again."""
    import errno

    refs = [_ref(tmp_path / "in", i) for i in range(4)]
    out = tmp_path / "out"
    real = storage.local.read_image

    def denied(path, size, options, *rest):
        if path == refs[1].path:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path, size, options, *rest)

    monkeypatch.setattr(storage.local, "read_image", denied)
    first, rejects = _write(out / f"{TMP}20990101-000000-aaaaaaaa", refs)
    assert first.records == 3 and [r["reason"] for r in rejects] == ["unreadable"]
    assert not list((out / f"{TMP}20990101-000000-aaaaaaaa" / resume.DONE).glob("*.json"))
    monkeypatch.setattr(storage.local, "read_image", real)  # access granted
    again, rejects = _write(out / f"{TMP}20990102-000000-bbbbbbbb", refs, (out / f"{TMP}20990101-000000-aaaaaaaa",))
    assert again.records == 4 and rejects == [] and again.resumed_from is None


def test_a_retry_of_a_taken_shard_still_names_the_run_it_came_from(tmp_path):
    refs = [_ref(tmp_path / "in", i) for i in range(3)]
    a, b = tmp_path / "out" / f"{TMP}20990101-000000-aaaaaaaa", tmp_path / "out" / f"{TMP}20990102-000000-bbbbbbbb"
    _write(a, refs)
    first, _ = _write(b, refs, (a,))  # attempt 1 takes it from run a ...
    again, _ = _write(b, refs, (a,))  # ... a retry of the bundle takes attempt 1's copy
    assert first.resumed_from == again.resumed_from == str(a)
    assert Path(again.tmp_path).parent == b


def test_a_source_that_vanishes_while_taken_means_writing_afresh(tmp_path, monkeypatch):
    """The files linked before the source vanished share their bytes with it: the fresh write must not use them."""
    refs = [_ref(tmp_path / "in", i) for i in range(2)]
    a, b = tmp_path / "out" / f"{TMP}20990101-000000-aaaaaaaa", tmp_path / "out" / f"{TMP}20990102-000000-bbbbbbbb"
    found, _ = _write(a, refs)
    before = {k: Path(getattr(found, k)).read_bytes() for k in ("tmp_path", "index_path", "idx_path")}
    Path(found.tmp_path).rename(tmp_path / "published-shard")  # e.g. moved into an output by another run
    os.link(tmp_path / "published-shard", found.tmp_path)  # ... and still linked in the run's folder
    real, calls = resume._link_or_copy, []

    def vanishing(src: str, dst: str) -> None:
        calls.append(src)
        if len(calls) == 3:  # the run's folder is removed between two links
            raise FileNotFoundError(2, "No such file or directory", src)
        real(src, dst)

    monkeypatch.setattr(resume, "_link_or_copy", vanishing)
    real_read = storage.local.read_image

    def reset_on_the_second(path: str, size: int, options: object, *rest: object) -> bytes:
        if path == refs[1].path:  # the fresh write dies half-way: a retry will follow
            raise ConnectionResetError(104, "Connection reset by peer")
        return real_read(path, size, options, *rest)

    monkeypatch.setattr(storage.local, "read_image", reset_on_the_second)
    with pytest.raises(ConnectionResetError):
        _write(b, refs, (a,))
    assert len(calls) == 3
    assert {k: Path(getattr(found, k)).read_bytes() for k in before} == before  # written afresh under other names
    assert (tmp_path / "published-shard").read_bytes() == before["tmp_path"]
    monkeypatch.setattr(storage.local, "read_image", real_read)
    monkeypatch.setattr(resume, "_link_or_copy", real)
    result, _ = _write(b, refs, (a,))  # the retry: this time the source stays
    assert result.resumed_from == str(a) and Path(result.tmp_path).read_bytes() == before["tmp_path"]


def test_a_worker_that_decodes_with_other_code_reuses_no_record(tmp_path):
    """The launcher found the previous run's code equal to its own; a worker running other code must not reuse."""
    from beam_pipeline.index import PreviousRun
    from beam_pipeline.metadata import feature_spec, package_versions

    refs = [_ref(tmp_path / "in", i) for i in range(2)]
    prev, _ = _write(tmp_path / "prev" / f"{TMP}20990101-000000-aaaaaaaa", refs)
    entries = [json.loads(line) for line in Path(prev.index_path).read_text().splitlines()]
    at = {e["path"]: Previous(prev.tmp_path, e["offset"], e["length"], e["sha256"], "cat", 0, "") for e in entries}
    with_previous = [dataclasses.replace(r, previous=at[r.relpath]) for r in refs]
    for path in (r.path for r in refs):  # a decode now rejects them: a reused record would not
        Path(path).write_bytes(b"x")
    here = {k: package_versions()[k] for k in ("beam_pipeline", "beam_pipeline_code", "pillow")}
    for versions, records in ((here, 2), ({**here, "beam_pipeline_code": "0" * 16}, 0)):
        run = PreviousRun(str(tmp_path / "prev"), feature_spec(True, {}), versions)
        writer = WriteShardFn(str(tmp_path / "out" / f"{TMP}2099010{records}-000000-bbbbbbbb"), "none", 1, previous=run)
        writer.setup()
        outs = list(writer.process((("train", 0), with_previous), ["cat"], {}))
        assert [o for o in outs if isinstance(o, ShardResult)][0].records == records


def test_a_transient_error_looking_for_a_finished_shard_fails_the_bundle(tmp_path, monkeypatch):
    from apache_beam.io.filesystems import FileSystems
    from google.api_core import exceptions as gexc

    refs = [_ref(tmp_path / "in", i) for i in range(2)]

    def flaky(path):
        raise gexc.ServiceUnavailable("503 backend error")

    monkeypatch.setattr(FileSystems, "exists", flaky)
    with pytest.raises(gexc.ServiceUnavailable):
        _write(tmp_path / "out" / f"{TMP}20990101-000000-aaaaaaaa", refs)


def test_a_marker_whose_shard_is_gone_is_passed_over(tmp_path):
    refs = [_ref(tmp_path / "in", i) for i in range(2)]
    old = tmp_path / "out" / f"{TMP}20990101-000000-aaaaaaaa"
    new = tmp_path / "out" / f"{TMP}20990102-000000-bbbbbbbb"
    writer = WriteShardFn(str(old), "none", 1)
    writer.setup()
    [first] = list(writer.process((("train", 0), refs), ["cat"], {}))
    Path(first.tmp_path).write_bytes(b"short")  # not the size the marker says
    writer = WriteShardFn(str(new), "none", 1, resume_from=[str(old)])
    writer.setup()
    [result] = list(writer.process((("train", 0), refs), ["cat"], {}))
    assert result.resumed_from is None and result.records == 2


def _scratch(out: Path, i: int) -> Path:
    folder = out / f"{TMP}2099010{i}-000000-0000000{i}"
    (folder / resume.DONE).mkdir(parents=True)
    (folder / resume.DONE / "x.json").write_text("{}")
    return folder


def test_only_dead_runs_taken_from_are_removed_after_publishing(tmp_path):
    out = tmp_path / "out"
    live, dead, no_lock, dead_untaken, other_host, own = (_scratch(out, i) for i in range(1, 7))
    for folder in (dead, dead_untaken, other_host):
        with resume.run_lock(str(folder)):
            pass  # the run ended (or was killed): nobody holds its lock
    (other_host / resume.RUN_LOCK).write_text("another-machine")  # a shared mount: its lock says nothing here
    with resume.run_lock(str(live)):
        assert resume.is_dead_local_run(str(dead)) and not resume.is_dead_local_run(str(live))
        assert not resume.is_dead_local_run(str(no_lock))  # an older version's run, or a mount without locks
        assert not resume.is_dead_local_run(str(other_host))
        assert stale_tmp_dirs(str(out), now=4_070_908_800) == []  # none is days old
        assert resume.resume_sources(str(out), str(own)) == tuple(
            str(f) for f in (other_host, dead_untaken, no_lock, dead)
        )  # newest first, MAX_SOURCES of them
        cleanup_staging(str(own), str(out), [str(f) for f in (live, dead, no_lock, other_host)])
        assert sorted(p.name for p in out.iterdir()) == sorted(
            f.name for f in (live, no_lock, dead_untaken, other_host)
        )
    assert resume.is_dead_local_run(str(live))


def test_the_lock_file_is_never_seen_unlocked(tmp_path, monkeypatch):
    """Made and locked under another name, then renamed into place: a cleanup at any instant sees a live run."""
    import fcntl

    real = fcntl.flock
    seen = []

    def spy(fd, op):
        seen.append(resume.is_dead_local_run(str(folder)))  # another run's cleanup, right now
        return real(fd, op)

    folder = tmp_path / "out" / f"{TMP}20990101-000000-00000001"
    monkeypatch.setattr(fcntl, "flock", spy)
    with resume.run_lock(str(folder)):
        monkeypatch.setattr(fcntl, "flock", real)
        assert not resume.is_dead_local_run(str(folder))
    assert seen and not any(seen)


def test_a_file_system_without_locks_runs_without_a_lock_file(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    folder = tmp_path / "out" / f"{TMP}20990101-000000-00000001"
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with resume.run_lock(str(folder)):
        assert list(folder.iterdir()) == []
    assert not resume.is_dead_local_run(str(folder))  # no lock file: counts as live, goes by age


@pytest.mark.parametrize("spec", ["writer.result:2:kill", "writer.result:2"])
def test_failpoint_kill_action_parses(spec):
    from beam_pipeline import failpoints

    assert failpoints.parse(spec) == {"writer.result": 2}
    assert failpoints.parse_actions(spec)["writer.result"][1] == ("kill" if spec.endswith("kill") else "raise")
    with pytest.raises(ValueError):
        failpoints.parse("writer.result:kill")
