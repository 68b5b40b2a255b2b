"""--keep-last N: old dated outputs go once this run published, and only those that are safe to delete."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_pipeline import lease, retention
from beam_pipeline.inspection import verify

from .conftest import BUCKET, REPO, convert, load_info, run_cli
from .test_incremental import make_images

pytestmark = pytest.mark.e2e

ARGS = ["--name", "ds", "--target-shard-mb", "0.004", "--no-transform", "--no-tfds-metadata"]
TMP = ".beam_pipeline-tmp-"


def scratch_name(age_days: float) -> str:
    return TMP + time.strftime("%Y%m%d-%H%M%S-", time.gmtime(time.time() - age_days * 86400)) + "0123abcd"


def dated_outputs(tmp_path: Path) -> tuple[Path, Path]:
    """(source folder, out/) with one real conversion copied to several dates, some spoilt on purpose."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_images(src, {"cat": 4, "dog": 4})
    convert("--input", str(src), "--output", str(out / "2026-01-01"), *ARGS)
    for date in ("2025-12-30", "2025-12-31", "2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05", "2026-01-06"):
        shutil.copytree(out / "2026-01-01", out / date)
    # 2025-12-30: a night that died (or a deletion cut short): no _SUCCESS, an old scratch folder
    (out / "2025-12-30" / "_SUCCESS").unlink()
    (out / "2025-12-30" / scratch_name(5)).mkdir()
    (out / "2025-12-30" / scratch_name(5) / "part.tfrecord").write_bytes(b"x")
    (out / "2026-01-02" / "notes.txt").write_text("mine")  # a user's file
    (out / "2026-01-03" / scratch_name(0.1)).mkdir()  # a run writing there now (a re-run of that date)
    (out / "2026-01-03" / scratch_name(0.1) / "_run.lock").write_text("host")
    (out / "2026-01-05" / "_SUCCESS").unlink()  # a failed night newer than the oldest kept one
    (out / "notes").mkdir()
    (out / "notes" / "2025-01-01.txt").write_text("not a dated output")
    return src, out


def test_keep_last_deletes_only_what_is_safe(tmp_path):
    src, out = dated_outputs(tmp_path)
    result = convert(
        "--input", str(src), "--output", str(out / "{date}"), "--run-date", "2026-01-07", *ARGS,
        "--keep-last", "3", "--incremental-from", str(out / "2026-01-01"),
    )  # fmt: skip
    left = sorted(p.name for p in out.iterdir())
    # kept: the 3 newest complete (07 this run, 06, 04), the incremental base (01), the folder with a user's
    # file (02), the one a live run writes (03), the failed night newer than the oldest kept (05), no date (notes)
    assert left == [
        "2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05", "2026-01-06", "2026-01-07", "notes"
    ]  # fmt: skip
    assert (out / "2026-01-02" / "notes.txt").read_text() == "mine"
    assert (out / "2026-01-04" / "_SUCCESS").exists() and load_info(out / "2026-01-07")["examples"] == 8
    lines = [line for line in result.stdout.splitlines() if line.startswith("  keep-last")]
    assert lines == [
        "  keep-last    deleted 2: 2025-12-31, 2025-12-30",
        "  keep-last    left 2026-01-03: a run is writing in it",
        "  keep-last    left 2026-01-02: holds files this tool did not write (notes.txt)",
        "  keep-last    left 2026-01-01: this run's --incremental-from",
    ]

    # the next night: the same rules again, and nothing fails over what is gone already
    again = convert(
        "--input", str(src), "--output", str(out / "{date}"), "--run-date", "2026-01-08", *ARGS,
        "--keep-last", "2", "--incremental-from", "latest",
    )  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["2026-01-02", "2026-01-03", "2026-01-07", "2026-01-08", "notes"]
    assert "  keep-last    deleted 4: 2026-01-06, 2026-01-05, 2026-01-04, 2026-01-01" in again.stdout


def test_keep_last_never_deletes_a_later_date_or_after_a_failed_run(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_images(src, {"cat": 3})
    for date in ("2026-02-01", "2026-02-02", "2026-02-09"):
        convert("--input", str(src), "--output", str(out / date), *ARGS)
    (src / "cat" / "bad.png").write_bytes(b"not an image")
    failed = run_cli(
        "convert", "--input", str(src), "--output", str(out / "{date}"), "--run-date", "2026-02-05", *ARGS,
        "--keep-last", "1", "--max-reject-fraction", "0", "--reject-allowance", "0",
    )  # fmt: skip
    assert failed.returncode == 3
    assert sorted(p.name for p in out.iterdir()) == ["2026-02-01", "2026-02-02", "2026-02-05", "2026-02-09"]
    (src / "cat" / "bad.png").unlink()
    convert(
        "--input", str(src), "--output", str(out / "{date}"), "--run-date", "2026-02-05", *ARGS,
        "--keep-last", "2", "--overwrite",
    )  # fmt: skip
    # the 2 newest complete are 02-09 (a later date, never deleted anyway) and 02-05 (this run)
    assert sorted(p.name for p in out.iterdir()) == ["2026-02-05", "2026-02-09"]


@pytest.mark.unit
def test_keep_last_on_gcs(gcs, tmp_path):
    bucket = gcs.bucket(BUCKET)
    own = {
        "_SUCCESS": b"",
        "dataset.json": b"{}",
        "ds-train.tfrecord-00000-of-00001": b"x",
        "idx/ds-train.tfrecord-00000-of-00001.idx": b"0 17\n",
    }
    for date in ("2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"):
        for name, data in own.items():
            bucket.blob(f"keep/{date}/v1/{name}").upload_from_string(data)
    bucket.blob("keep/2026-03-02/v1/mine.csv").upload_from_string(b"a")
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(["--no_auth"]))
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    done = retention.keep_last(f"gs://{BUCKET}/keep/{{date}}/v1", "2026-03-04", 2)
    names = {b.name for b in gcs.list_blobs(BUCKET, prefix="keep/")}
    assert {n.split("/")[1] for n in names} == {"2026-03-02", "2026-03-03", "2026-03-04"}
    assert done.deleted == [f"gs://{BUCKET}/keep/2026-03-01/v1"]
    assert done.left == [(f"gs://{BUCKET}/keep/2026-03-02/v1", "holds files this tool did not write (mine.csv)")]


def test_keep_last_without_a_dated_output_is_a_usage_error(tmp_path):
    result = run_cli("convert", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--keep-last", "3")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "{date}" in result.stderr


@pytest.mark.smoke
def test_keep_last_as_the_jobs_last_step(tmp_path):
    """--post-steps job (a Flex Template's --detach run): the job itself deletes, after it published."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_images(src, {"cat": 3})
    for date in ("2026-04-01", "2026-04-02"):
        convert("--input", str(src), "--output", str(out / date), *ARGS)
    convert(
        "--input",
        str(src),
        "--output",
        str(out / "{date}"),
        "--run-date",
        "2026-04-03",
        *ARGS[:-2],
        "--keep-last",
        "2",
        "--post-steps",
        "job",
        "--incremental-from",
        "latest",
        tfds=True,
    )  # fmt: skip (tfds: the post-steps run, as the job's PostSteps step)
    assert sorted(p.name for p in out.iterdir()) == ["2026-04-02", "2026-04-03"]
    assert load_info(out / "2026-04-03")["incremental"]["reused"] == 3


# --- the output lease (lease.py): a dated folder a run holds is never deleted from under it ------------


def _three_complete_dates(tmp_path: Path) -> tuple[Path, Path]:
    src, out = tmp_path / "src", tmp_path / "out"
    make_images(src, {"cat": 3, "dog": 3})
    convert("--input", str(src), "--output", str(out / "2026-05-01"), *ARGS)
    for date in ("2026-05-02", "2026-05-03"):
        shutil.copytree(out / "2026-05-01", out / date)
    return src, out


def test_keep_last_deletes_a_folder_whose_lease_a_killed_run_left(tmp_path):
    """A re-run of an old date SIGKILLed leaves its lease (and a scratch folder `clean` removes): the folder is
    this tool's and its holder is provably dead, so retention deletes it, without waiting for the lease's ttl."""
    src, out = _three_complete_dates(tmp_path)
    env = {"BEAM_PIPELINE_FAILPOINTS": "writer.record:1:kill"}
    killed = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "convert", "--input", str(src), "--output", str(out / "2026-05-01"),
         "--overwrite", *ARGS],
        env={**os.environ, **env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / "2026-05-01" / lease.LEASE).exists()
    assert run_cli("clean", str(out / "2026-05-01")).returncode == 0  # its scratch folder: its run is over
    assert not [p for p in (out / "2026-05-01").iterdir() if p.name.startswith(TMP)]
    done = retention.keep_last(str(out / "{date}"), "2026-05-04", 2)
    assert done.deleted == [str(out / "2026-05-01")], done.left
    assert sorted(p.name for p in out.iterdir()) == ["2026-05-02", "2026-05-03"]


def test_keep_last_leaves_a_folder_whose_lease_a_live_run_holds(tmp_path):
    """A live run holding an old date's lease (before it has a scratch folder) keeps that folder."""
    _, out = _three_complete_dates(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from beam_pipeline import lease; "
         "lease.acquire(sys.argv[1], 'rerun-of-05-01'); print('held', flush=True); time.sleep(600)",
         str(out / "2026-05-01")],
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        done = retention.keep_last(str(out / "{date}"), "2026-05-04", 2)
    finally:
        holder.kill()
        holder.wait()
    assert done.deleted == [] and done.left == [(str(out / "2026-05-01"), retention.LIVE)]
    assert (out / "2026-05-01" / "_SUCCESS").exists()


def test_a_rerun_of_a_date_while_keep_last_deletes_it_never_gets_success_over_a_partial_folder(tmp_path, monkeypatch):
    """Retention has begun deleting 2026-05-01 (its _SUCCESS is gone) when a re-run of that date starts and runs
    whole; then retention carries on. The re-run must be refused (retention holds the folder's lease) rather
    than publish a dataset whose files retention then deletes from under its _SUCCESS."""
    src, out = _three_complete_dates(tmp_path)
    real = retention.delete_files
    reruns = []

    def delete_then_rerun(paths, *args, **kwargs):
        if paths and not reruns:
            real(paths[:1], *args, **kwargs)
            reruns.append(
                run_cli(
                    "convert",
                    "--input",
                    str(src),
                    "--output",
                    str(out / "2026-05-01"),
                    "--overwrite",
                    "--seed",
                    "7",
                    *ARGS,
                )  # fmt: skip
            )
            paths = paths[1:]
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(retention, "delete_files", delete_then_rerun)
    done = retention.keep_last(str(out / "{date}"), "2026-05-04", 2)
    [rerun] = reruns
    folder = out / "2026-05-01"
    if (folder / "_SUCCESS").exists():  # whatever happened, _SUCCESS stands over a dataset that verifies
        assert (folder / "dataset.json").exists(), sorted(p.name for p in folder.iterdir())
        info = load_info(folder)
        assert verify(str(folder), info, stream=open(os.devnull, "w")) == info["examples"]
    assert rerun.returncode == 2 and "lease" in rerun.stderr and "Traceback" not in rerun.stderr, rerun.stderr
    assert done.deleted == [str(folder)] and not folder.exists()
