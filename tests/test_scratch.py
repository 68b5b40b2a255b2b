"""Scratch folders of other runs: convert and inspect report them (size, age), ``clean`` removes those of runs
that are over and never a live run's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_pipeline import lease, resume, scratch

from .conftest import BUCKET, REPO, convert, run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e

TMP = ".beam_pipeline-tmp-"


def _folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.name.startswith(TMP))


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _files(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and not p.relative_to(out).parts[0].startswith(TMP)
    }


def test_a_killed_runs_folder_is_reported_by_inspect_and_convert_and_removed_by_clean(tmp_path, monkeypatch):
    root = tmp_path / "in"
    for i in range(12):
        write(str(root / ["cat", "dog"][i % 2] / f"{i}.png"), image_bytes("png", 40, 40, seed=i))
    out = tmp_path / "out"
    flags = ("--input", str(root), "--output", str(out), "--overwrite", "--no-transform", "--no-tfds-metadata")
    convert(*flags, "--target-shard-mb", "0.01")

    # another run (other shard size) killed half-way: its scratch folder stays, hidden
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.record:5:kill")
    killed = run_cli("convert", *flags, "--target-shard-mb", "0.005")
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    assert killed.returncode != 0
    [left] = _folders(out)
    size = scratch.size_text(_size(left))
    assert _size(left) > 0 and resume.run_state(str(left)) == resume.DEAD

    shown = run_cli("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "scratch folders of other runs: 1, " + size in shown.stdout
    assert left.name[len(TMP) :] in shown.stdout and "its run is over" in shown.stdout
    command = f"    beam-pipeline clean {out}"
    assert command in shown.stdout.splitlines()
    assert all(len(line) <= 80 for line in shown.stdout.splitlines() if line != command)

    # the next run (the first run's settings: it takes nothing from the killed one) says so in its summary
    again = convert(*flags, "--target-shard-mb", "0.01")
    assert _folders(out) == [left]
    assert "scratch folders of other runs: 1, " + size in again.stdout, again.stdout

    dataset = _files(out)
    dry = run_cli("clean", str(out), "--dry-run")
    assert dry.returncode == 0 and f"would remove {left.name} ({size}" in dry.stdout and left.exists()
    cleaned = run_cli("clean", str(out))
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed {left.name} ({size}" in cleaned.stdout and "its run is over" in cleaned.stdout
    assert _folders(out) == [] and _files(out) == dataset  # the dataset itself untouched
    assert "scratch folders" not in run_cli("inspect", str(out)).stdout


def test_inspect_of_a_killed_first_run_names_its_scratch_folder(tmp_path, monkeypatch):
    root = tmp_path / "in"
    for i in range(6):
        write(str(root / "cat" / f"{i}.png"), image_bytes("png", 40, 40, seed=i))
    out = tmp_path / "out"
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.record:3:kill")
    flags = ("--input", str(root), "--output", str(out), "--no-transform", "--target-shard-mb", "0.01")
    killed = run_cli("convert", *flags)
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    assert killed.returncode != 0
    [left] = _folders(out)
    result = run_cli("inspect", str(out))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "no dataset.json" in result.stderr and "scratch folders of other runs: 1, " in result.stderr
    assert scratch.size_text(_size(left)) in result.stderr and f"beam-pipeline clean {out}" in result.stderr


LOCK_HOLDER = """
import sys
from beam_pipeline import resume
with resume.run_lock(sys.argv[1]):
    open(sys.argv[1] + "/part.tfrecord", "wb").write(b"x" * 5000)
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes stdin
"""


def test_a_live_runs_folder_is_never_removed(tmp_path):
    out = tmp_path / "out"
    live = out / f"{TMP}20200101-000000-11111111"  # days old: age alone would let it go
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(live)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert resume.run_state(str(live)) == resume.LIVE
        for extra in ((), ("--force",), ("--older-than", "0")):
            result = run_cli("clean", str(out), *extra)
            assert result.returncode == 0, result.stderr
            assert f"kept {live.name}" in result.stdout and "its run is live" in result.stdout
            assert (live / "part.tfrecord").exists()
        [found] = scratch.other_runs(str(out))
        assert found.state == resume.LIVE and found.bytes >= 5000
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert resume.run_state(str(live)) == resume.DEAD  # the run ended: now it goes
    result = run_cli("clean", str(out))
    assert f"removed {live.name}" in result.stdout and not live.exists()


@pytest.mark.unit
def test_without_a_lock_only_age_or_force_removes_a_folder(tmp_path):
    """A folder with no lock file (an older version's run, a file system without locks) goes by age."""
    out = tmp_path / "out"
    young = out / (TMP + time.strftime("%Y%m%d-%H%M%S-") + "22222222")
    old = out / f"{TMP}20200101-000000-33333333"
    write(str(young / "a.tfrecord"), b"y" * 100)
    write(str(old / "a.tfrecord"), b"o" * 100)
    os.utime(old / "a.tfrecord", (0, 0))
    results = {s.name: why for s, why in scratch.clean(str(out))}
    assert results[young.name] is None and young.exists()
    assert results[old.name] and not old.exists()
    assert [why for s, why in scratch.clean(str(out), force=True)] == ["--force"] and not young.exists()


@pytest.mark.unit
def test_an_old_run_with_a_fresh_file_is_kept(tmp_path):
    """Started days ago but wrote a file a minute ago (a long run): neither age lets it go."""
    out = tmp_path / "out"
    folder = out / f"{TMP}20200101-000000-44444444"
    write(str(folder / "a.tfrecord"), b"z")
    [(found, why)] = scratch.clean(str(out), older_than_s=3600)
    assert why is None and folder.exists() and found.idle_s < 3600 < found.age_s


def test_clean_usage_errors(tmp_path):
    missing = run_cli("clean", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such folder" in missing.stderr and "Traceback" not in missing.stderr
    bad = run_cli("clean", str(tmp_path), "--older-than", "soon")
    assert bad.returncode == 2 and "--older-than" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.unit
@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("30m", 1800), ("6h", 21600), ("1.5d", 129600)])
def test_parse_age(text, seconds):
    assert scratch.parse_age(text) == seconds


@pytest.mark.unit
def test_on_gcs_only_age_or_force_removes_a_folder(gcs):
    """GCS has no lock: a folder goes once its run started and its newest object was written over
    --older-than ago, or with --force. The emulator cannot backdate objects, so the clock is moved on 4 days."""
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    bucket = gcs.bucket(BUCKET)
    later = time.time() + 4 * 86400
    recent = TMP + time.strftime("%Y%m%d-%H%M%S-", time.localtime(later - 3600)) + "55555555"  # started 1 h before
    old = f"{TMP}20200101-000000-66666666"
    for folder in (recent, old):
        bucket.blob(f"scratch-test/{folder}/_done/a.json").upload_from_string(b"{}" * 50)
    bucket.blob("scratch-test/dataset.json").upload_from_string(b"{}")
    output = f"gs://{BUCKET}/scratch-test"
    found = {s.name: s for s in scratch.other_runs(output)}
    assert found[old].bytes == 100 and found[old].state == resume.UNKNOWN
    lines = scratch.report_lines(output, list(found.values()))
    assert lines[0].startswith("scratch folders of other runs: 2, 200 B") and "liveness unknown" in lines[1]

    def names() -> set[str]:
        return {b.name for b in gcs.list_blobs(BUCKET, prefix="scratch-test/")}

    assert all(why is None for _, why in scratch.clean(output))  # today: written seconds ago, both stay
    assert len(names()) == 3
    results = {s.name: why for s, why in scratch.clean(output, older_than_s=3 * 86400, now=later)}
    assert results[recent] is None and results[old]
    assert names() == {"scratch-test/dataset.json", f"scratch-test/{recent}/_done/a.json"}

    # the run holding the output's lease is live: not even --force removes its folder
    running = recent[len(TMP) :]
    lease.acquire(output, running, detached=True)
    [(found, why)] = scratch.clean(output, force=True)
    assert found.state == resume.LIVE and why is None
    assert f"scratch-test/{recent}/_done/a.json" in names()
    lease.release(output, running)
    scratch.clean(output, force=True)
    assert names() == {"scratch-test/dataset.json"}


def test_on_gcs_a_killed_runs_lease_does_not_keep_its_folder_live(gcs, tmp_path, monkeypatch):
    """A run on this host SIGKILLed in its writers leaves its lease (unexpired) beside its scratch folder: its
    pid is gone, so the lease proves nothing live; `clean --force` removes the folder at once, and inspect
    does not call the run live."""
    bucket = gcs.bucket(BUCKET)
    for i in range(6):
        data = image_bytes("png", 20 + i, 24, seed=i)
        bucket.blob(f"killed-in/{['cat', 'dog'][i % 2]}/{i}.png").upload_from_string(data)
    gs_in, gs_out = f"gs://{BUCKET}/killed-in", f"gs://{BUCKET}/killed-out"
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.result:1:kill")
    killed = run_cli("convert", "--input", gs_in, "--output", gs_out, "--no_auth", "--no-transform",
                     "--no-tfds-metadata")  # fmt: skip
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    assert killed.returncode != 0

    def tops() -> set[str]:
        return {b.name.split("/")[1] for b in gcs.list_blobs(BUCKET, prefix="killed-out/")}

    dead = {n for n in tops() if n.startswith(TMP)}
    assert len(dead) == 1 and lease.LEASE in tops()
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    [found] = scratch.other_runs(gs_out)
    assert found.state != resume.LIVE
    result = run_cli("clean", gs_out, "--force")
    assert result.returncode == 0, result.stderr
    assert not (tops() & dead), result.stdout
