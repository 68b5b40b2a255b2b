"""Local runs past one interpreter: how many worker processes the default picks, what each one takes of the
machine, and a Ctrl-C that ends every process of a run on several."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import DirectOptions

from beam_pipeline import runner
from beam_pipeline.cli import INTERRUPTED
from beam_pipeline.images.options import ImageOptions
from beam_pipeline.writer import budget

from .conftest import REPO, convert
from .test_resume import ARGS, QUICK, make_source, same_output

pytestmark = pytest.mark.unit

MULTI = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]


def test_one_process_while_one_can_feed_the_cores_then_one_per_ceiling():
    assert 4.0 < runner.single_process_ceiling() < 4.5  # 1.87 ms of CPU per image, 0.43 ms of it holding the GIL
    assert [runner.local_processes(c) for c in (1, 2, 4, 5, 8, 9, 16, 64)] == [1, 1, 1, 2, 2, 3, 4, 15]


def test_small_images_get_a_process_per_core_unless_too_few_to_pay_for_starting_them():
    assert 1.0 < runner.single_process_ceiling(2_400) < 1.2  # a 96 px tile: almost all of its CPU holds the GIL
    assert [runner.local_processes(c, 2_400) for c in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert [runner.local_processes(c, 40_000) for c in (2, 4, 8)] == [1, 2, 4]  # 640x480 JPEGs of 40 KB
    assert runner.local_processes(2, 93_000) == runner.local_processes(2) == 1  # the photos it was measured on
    # 2 processes save ~0.2 ms per tile on 2 cores: ~20,000 tiles pay for the second one's start-up
    assert runner.local_processes(2, 2_400, images=10_000) == 1
    assert runner.local_processes(2, 2_400, images=30_000) == 2
    assert runner.local_processes(8, 93_000, images=200) == 1 and runner.local_processes(8, 93_000, 50_000) == 2


def test_the_default_looks_at_a_local_inputs_image_sizes(monkeypatch, tmp_path):
    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run import sizing, workers

    monkeypatch.delenv(runner.LOCAL_PROCESSES_ENV, raising=False)
    monkeypatch.setattr(runner, "usable_cores", lambda: 2)
    for label in ("a", "b"):
        (tmp_path / "tiles" / label).mkdir(parents=True)
        for i in range(30):
            (tmp_path / "tiles" / label / f"{i}.jpg").write_bytes(b"t" * 2_400)
    (tmp_path / "tiles" / "a" / "notes.txt").write_bytes(b"n" * 10**6)  # not an image: not in the mean
    (tmp_path / "tiles" / "a" / "._0.jpg").write_bytes(b"m" * 4096)  # macOS metadata: the listing skips it too
    (tmp_path / "tiles" / ".thumbnails").mkdir()
    (tmp_path / "tiles" / ".thumbnails" / "0.jpg").write_bytes(b"m" * 4096)
    cfg = ConvertConfig(input=str(tmp_path / "tiles"), output=str(tmp_path / "out"), name="t")
    assert sizing.input_sample(cfg) == sizing.InputSample(60, 2_400.0, capped=False)
    options, _ = workers.make_local_aware_options(cfg, [])
    assert _direct(options) == ("in_memory", 1)  # 60 tiles: done before a second process has started

    monkeypatch.setattr(sizing, "SAMPLE_NAMES", 50)  # as if the folder held past the cap
    options, engine = workers.make_local_aware_options(cfg, [])
    assert _direct(options) == ("multi_processing", 2) and _worker_command(engine).endswith(" 2")
    options, _ = workers.make_local_aware_options(cfg, ["--direct_running_mode=in_memory"])  # the user's choice
    assert _direct(options) == ("in_memory", 1)
    monkeypatch.setattr(runner, "memory_cap", lambda: 1)  # a machine without the memory for a second one
    assert _direct(workers.make_local_aware_options(cfg, [])[0]) == ("in_memory", 1)
    monkeypatch.setattr(sizing, "SAMPLE_NAMES", 32_768)
    monkeypatch.setattr(sizing, "SAMPLE_ENTRIES", 20)  # a look cut short (time or entries): as many images
    cut = sizing.input_sample(cfg)
    assert cut is not None and cut.capped and cut.images < 20 and cut.mean_bytes == 2_400.0
    monkeypatch.setattr(sizing, "SAMPLE_ENTRIES", 4 * 32_768)

    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label\n" + "".join(f"tiles/a/{i}.jpg,a\n" for i in range(30)) + "gone.jpg,a\n")
    assert sizing.input_sample(ConvertConfig(manifest=str(manifest), output="o", name="t")) == sizing.InputSample(
        31, 2_400.0, capped=False
    )  # a listed file that is missing is named, not sized
    glob_cfg = ConvertConfig(input=str(tmp_path / "tiles" / "*" / "1*.jpg"), output="o", name="t")
    assert sizing.input_sample(glob_cfg) == sizing.InputSample(22, 2_400.0, capped=False)
    for nothing in (
        ConvertConfig(input="gs://bucket/tiles", output="o", name="t"),  # a bucket: not looked at, photos assumed
        ConvertConfig(input=str(tmp_path / "missing"), output="o", name="t"),  # preflight names it, not this
        ConvertConfig(manifest=str(tmp_path / "missing.csv"), output="o", name="t"),
    ):
        assert sizing.input_sample(nothing) is None


def test_the_input_is_looked_at_only_when_the_default_picks_the_processes():
    def refuse():
        raise AssertionError("looked at the input")

    for flags in (["--direct_running_mode=in_memory"], ["--direct_num_workers=2"], ["--runner=FlinkRunner"]):
        runner.make_options(flags, look=refuse)  # the user's choice, or not a local run: nothing to look at
    looked = []
    runner.make_options([], look=lambda: looked.append(1))  # None: the rule for photos
    assert looked == [1]


def test_the_memory_cap_follows_a_containers_limit(monkeypatch, tmp_path):
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(runner, "CGROUP_MEMORY_LIMITS", (str(limit), str(tmp_path / "v1")))
    limit.write_text("max\n")
    unlimited = runner.memory_cap()
    assert unlimited >= 1
    limit.write_text(f"{3 * runner.MEMORY_PER_PROCESS}\n")
    assert runner.memory_cap() == min(3, unlimited)
    limit.write_text("1000\n")
    assert runner.memory_cap() == 1


def _direct(options) -> tuple[str, int]:
    d = options.view_as(DirectOptions)
    return d.direct_running_mode, d.direct_num_workers


def test_the_default_picks_processes_by_cores_and_the_users_flags_win(monkeypatch):
    monkeypatch.delenv(runner.LOCAL_PROCESSES_ENV, raising=False)
    monkeypatch.setattr(runner, "usable_cores", lambda: 2)
    options, engine = runner.make_options([])
    assert _direct(options) == ("in_memory", 1) and type(engine).__name__ == "FnApiRunner"

    monkeypatch.setattr(runner, "usable_cores", lambda: 8)
    options, engine = runner.make_options([])
    assert _direct(options) == ("multi_processing", 2) and type(engine).__name__ == "WorkerProcessesRunner"
    assert _worker_command(engine).endswith(f"-m {runner.WORKER_MODULE} 2")  # each worker told how many share

    options, engine = runner.make_options(["--direct_running_mode=in_memory"])  # the user's choice
    assert _direct(options) == ("in_memory", 1) and type(engine).__name__ == "FnApiRunner"
    options, engine = runner.make_options(["--direct_num_workers=3", "--direct_running_mode=multi_processing"])
    assert _direct(options) == ("multi_processing", 3) and _worker_command(engine).endswith(" 3")
    _, engine = runner.make_options(["--direct_num_workers=0", "--direct_running_mode=multi_processing"])
    assert _worker_command(engine).endswith(f" {multiprocessing.cpu_count()}")  # Beam's count for 0: every core
    assert runner.LOCAL_PROCESSES_ENV not in os.environ  # nothing process-wide: another run may choose otherwise


def _worker_command(engine) -> str:
    return engine._default_environment.command_string  # noqa: SLF001 - what the runner starts each worker with


def test_a_local_worker_process_takes_its_share_of_the_memory_and_the_cores(monkeypatch):
    options = ImageOptions(memory_budget_bytes=600 * 2**20)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(runner, "usable_cores", lambda: 8)
    monkeypatch.delenv(runner.LOCAL_PROCESSES_ENV, raising=False)
    assert budget.sdk_processes_per_machine() == 1 and budget.decode_threads(0) == 8  # the launcher itself

    monkeypatch.setattr(budget, "_in_sdk_worker_process", lambda: True)
    assert budget.sdk_processes_per_machine() == 8  # Dataflow: one SDK process per vCPU
    monkeypatch.setenv(runner.LOCAL_PROCESSES_ENV, "3")
    assert budget.sdk_processes_per_machine() == 3
    assert budget.decode_threads(0) == 3 and budget.decode_threads(5) == 5  # 8 cores over 3 processes; the flag
    share = options.memory_budget_bytes // 3
    reads, decodes = budget.budgets(options)
    assert reads.capacity + decodes.capacity == pytest.approx(share, abs=1)


# The conversion on two worker processes, each stalled at its 3rd record (the file the pause names is made),
# so that it is surely converting when the Ctrl-C comes.
@pytest.mark.e2e
def test_ctrl_c_ends_every_worker_process_with_one_line_and_the_same_command_resumes(tmp_path):
    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_source(src)
    args = ["convert", "--input", str(src), "--output", str(out), *ARGS, *QUICK, *MULTI]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "BEAM_PIPELINE_FAILPOINTS": "writer.record:3:pause",
        "BEAM_PIPELINE_FAILPOINTS_PAUSE": str(tmp_path / "paused"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job ignores SIGINT
    )
    try:
        for _ in range(1200):
            if (tmp_path / "paused").exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        workers = _group(proc.pid) - {proc.pid}
        assert len(workers) == 2, workers  # the worker processes (exec: no shell between)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        stdout, stderr = proc.communicate(timeout=120)
        for _ in range(100):
            if not _group(proc.pid):
                break
            time.sleep(0.1)
        assert not _group(proc.pid), "a process of the run outlived the Ctrl-C"
    finally:
        if _group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert stderr == INTERRUPTED + "\n"
    assert stdout == ""
    assert not (out / "_SUCCESS").exists()

    convert("--input", str(src), "--output", str(out), *ARGS, *QUICK, *MULTI)
    convert("--input", str(src), "--output", str(ref), *ARGS, *QUICK)  # one process, never interrupted
    same_output(out, ref)


def _group(pgid: int) -> set[int]:
    """The live processes of a process group."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


@pytest.mark.e2e
def test_worker_processes_import_what_the_writer_needs_and_no_tensorflow(tmp_path):
    """A process is the point: Python's import-time report (inherited by the worker processes) names every module
    each process imports; three processes load Beam (the launcher and two workers), none TensorFlow."""
    src = tmp_path / "src"
    make_source(src)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    args = ["convert", "--input", str(src), "--output", str(tmp_path / "out"), *ARGS, *QUICK, *MULTI, "--verbose"]
    proc = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert imported.count("apache_beam") == 3  # once per process
    assert imported.count("beam_pipeline.writer.shard") == 3  # the workers write the shards
    assert not [m for m in imported if m == "tensorflow" or m.startswith("tensorflow.")]


@pytest.mark.e2e
def test_a_worker_process_killed_fails_the_run_with_its_cause_in_one_more_line(tmp_path):
    """The OOM killer, say: the job's own error names a closed channel; the line after it names the cause."""
    src = tmp_path / "src"
    make_source(src)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "BEAM_PIPELINE_FAILPOINTS": "writer.record:3:kill",  # SIGKILL, in each worker process
    }
    args = ["convert", "--input", str(src), "--output", str(tmp_path / "out"), *ARGS, *QUICK, *MULTI]
    proc = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1
    first, second = proc.stderr.splitlines()
    assert first.startswith("error: pipeline failed: ")
    assert second == "  the runner's threads said: Worker subprocess exited with return code -9"
