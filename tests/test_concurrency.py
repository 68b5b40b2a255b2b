"""Two runs on one output, late attempts of a run's steps, a self-incremental run killed while publishing.

Whatever the interleaving, ``_SUCCESS`` stands only over a dataset that
passes ``inspect --verify`` and holds no shard its dataset.json does not list.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from beam_pipeline import failpoints, lease, storage
from beam_pipeline.inspection import verify
from beam_pipeline.run import finalize as run_finalize
from beam_pipeline.run import outcome, publish
from beam_pipeline.vocab.dataset_info import DatasetInfo

from .conftest import BUCKET, REPO, convert, run_cli
from .imagegen import image_bytes, write
from .test_failpoints import NEW_RUN, _job, run_until_finalized, snapshot

pytestmark = pytest.mark.e2e


def _photos(root: Path, n: int = 8) -> Path:
    for i in range(n):
        write(str(root / ["cat", "dog"][i % 2] / f"{i}.png"), image_bytes("png", 24 + i, 20, seed=i))
    return root


def _check_complete(out: Path) -> dict:
    """_SUCCESS over a dataset that verifies, and no shard besides the ones dataset.json lists."""
    assert (out / "_SUCCESS").exists()
    info = json.loads((out / "dataset.json").read_text())
    listed = {s["file"] for split in info["splits"].values() for s in split["shards"]}
    assert {p.name for p in out.iterdir() if ".tfrecord-" in p.name} == listed
    assert verify(str(out), DatasetInfo.from_json(info), stream=open(os.devnull, "w")) == info["examples"]
    return info


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = str(REPO) + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "convert", *args, "--no-transform", "--no-tfds-metadata"],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)


# --- item 1: one writer per output --------------------------------------------------------------


def test_a_second_run_is_refused_while_the_first_is_inside_publish(tmp_path):
    root, out = _photos(tmp_path / "in"), tmp_path / "out"
    pause = tmp_path / "paused"
    a = _start(
        ["--input", str(root), "--output", str(out), "--target-shard-mb", "0.001"],
        {failpoints.ENV: "publish.move:2:pause", failpoints.PAUSE_ENV: str(pause)},
    )
    try:
        _wait_for(pause, a)
        [scratch] = [p.name for p in out.iterdir() if p.name.startswith(".beam_pipeline-tmp-")]
        run_a = scratch[len(".beam_pipeline-tmp-") :]
        b = run_cli("convert", "--input", str(root), "--output", str(out), "--overwrite", "--seed", "7",
                    "--target-shard-mb", "0.003", "--no-transform", "--no-tfds-metadata")  # fmt: skip
        assert b.returncode == 2, b.stderr
        assert len(b.stderr.strip().splitlines()) == 1 and f"run {run_a}" in b.stderr, b.stderr
        assert "Traceback" not in b.stderr
    finally:
        pause.unlink(missing_ok=True)
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err
    info = _check_complete(out)
    assert info["run_id"] == run_a and info["seed"] != 7
    assert not (out / lease.LEASE).exists()


def test_a_killed_runs_temporary_folder_is_removed_by_the_next_run_and_a_live_runs_is_kept(tmp_path):
    """A run SIGKILLed mid-shard cannot remove its temporary folder (local._RunTemporaryFolder); the next run
    on the machine does. A run that is alive (paused inside publish) keeps its folder and finishes."""
    root, tmp = _photos(tmp_path / "in"), tmp_path / "tmp"
    tmp.mkdir()
    runs = lambda: {p.name for p in tmp.iterdir() if p.name.startswith("beam_pipeline-run-")}  # noqa: E731
    killed = _start(
        ["--input", str(root), "--output", str(tmp_path / "killed")],
        {"TMPDIR": str(tmp), failpoints.ENV: "writer.record:2:kill"},
    )
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    [dead] = runs()
    pause = tmp_path / "paused"
    live = _start(
        ["--input", str(root), "--output", str(tmp_path / "live"), "--target-shard-mb", "0.001"],
        {"TMPDIR": str(tmp), failpoints.ENV: "publish.move:2:pause", failpoints.PAUSE_ENV: str(pause)},
    )
    try:
        _wait_for(pause, live)
        [alive] = runs() - {dead}
        later = _start(["--input", str(root), "--output", str(tmp_path / "later")], {"TMPDIR": str(tmp)})
        _, err = later.communicate(timeout=300)
        assert later.returncode == 0, err
        assert runs() == {alive}  # the killed run's folder is gone, the later run removed its own
    finally:
        pause.unlink(missing_ok=True)
    _, err = live.communicate(timeout=300)
    assert live.returncode == 0, err
    _check_complete(tmp_path / "live")
    assert runs() == set()


def test_a_stalled_run_whose_lease_was_taken_stops_and_leaves_the_new_dataset(tmp_path):
    """A freezes inside publish (SIGSTOP, heartbeat too) until its lease expires; B takes the output over
    and publishes; A wakes: it stops at its next change, _SUCCESS stays over B's dataset."""
    root, out = _photos(tmp_path / "in"), tmp_path / "out"
    pause = tmp_path / "paused"
    ttl = {lease.TTL_ENV: "3"}
    a = _start(
        ["--input", str(root), "--output", str(out), "--target-shard-mb", "0.001"],
        {failpoints.ENV: "publish.move:2:pause", failpoints.PAUSE_ENV: str(pause), **ttl},
    )
    try:
        _wait_for(pause, a)
        a.send_signal(signal.SIGSTOP)
        lease_file = out / lease.LEASE
        while lease_file.exists() and json.loads(lease_file.read_text())["expires"] > time.time():
            time.sleep(0.1)
        env = dict(os.environ, **ttl)
        b = subprocess.run(
            [sys.executable, "-m", "beam_pipeline", "convert", "--input", str(root), "--output", str(out),
             "--overwrite", "--seed", "7", "--target-shard-mb", "0.003", "--no-transform", "--no-tfds-metadata"],
            env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert b.returncode == 0, b.stderr
        b_info = _check_complete(out)
    finally:
        a.send_signal(signal.SIGCONT)
        pause.unlink(missing_ok=True)
    _, err = a.communicate(timeout=300)
    assert a.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert "lease" in err and "Traceback" not in err
    assert _check_complete(out) == b_info and b_info["seed"] == 7


def _cas_emulator(monkeypatch) -> None:
    """The emulator ignores ifGenerationMatch; GCS honours it on inserts and deletes: so does this wrapper."""
    import threading
    from http import HTTPStatus

    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    lock = threading.Lock()

    def guarded(handler: Callable, name_of: Callable) -> Callable:
        def run(request, response, storage, *args, **kwargs):
            want = request.query.get("ifGenerationMatch")
            with lock:
                if want:
                    try:
                        now = str(storage.get_file_obj(request.params["bucket_name"], name_of(request))["generation"])
                    except NotFound:
                        now = "0"
                    if now != want[0]:
                        response.status = HTTPStatus.PRECONDITION_FAILED
                        response.json({"error": {"code": 412, "message": "conditionNotMet"}})
                        return None
                return handler(request, response, storage, *args, **kwargs)

        return run

    def insert_name(request) -> str:
        if "name" in request.query:
            return request.query["name"][0]
        return request.data["meta"].get("name")

    wrapped = {
        objects.insert: guarded(objects.insert, insert_name),
        objects.delete: guarded(objects.delete, lambda r: r.params["object_id"]),
    }
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler in wrapped:
                monkeypatch.setitem(handlers, method, wrapped[handler])
    monkeypatch.setattr(objects, "insert", wrapped[objects.insert])


@pytest.mark.unit
def test_the_lease_on_gcs_is_a_compare_and_swap(gcs, monkeypatch):
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    _cas_emulator(monkeypatch)
    out = f"gs://{BUCKET}/leased"
    first = lease.acquire(out, "run-a")
    with pytest.raises(lease.LeaseHeld, match="run run-a"):
        lease.acquire(out, "run-b")
    assert lease.renew(out, "run-a").expires >= first.expires
    with pytest.raises(lease.LeaseLost):
        lease.renew(out, "run-b")
    lease.release(out, "run-a")
    assert lease.holder(out) is None
    # Expired: another run takes it over, and the first one's renewal fails from then on.
    monkeypatch.setenv(lease.TTL_ENV, "0")
    lease.acquire(out, "run-a", detached=True)  # names no process: only expiry frees it
    monkeypatch.delenv(lease.TTL_ENV)
    lease.acquire(out, "run-c")
    lease.release(out, "run-a")  # not its own any more: kept
    assert lease.holder(out).run_id == "run-c"
    with pytest.raises(lease.LeaseLost, match="run run-c"):
        lease.renew(out, "run-a")
    # Two takers of one expired lease: the swap lets one through.
    store = lease._store(out)
    record, token = store.read()
    assert store.replace(replace(record, run_id="x"), token)
    assert not store.replace(replace(record, run_id="y"), token)
    assert not store.create(lease.LeaseRecord(run_id="z", expires=0))
    lease.release(out, "x")
    assert lease.holder(out) is None


# --- item 2: late attempts ---------------------------------------------------------------------


def _interleaved(monkeypatch, point: str, k: int, other: Callable[[], object]) -> list[bool]:
    """At this process's k-th hit of ``point``, ``other`` (another attempt) runs whole first."""
    real_hit = failpoints.hit
    state = {"n": 0, "inside": False}
    ran: list[bool] = []

    def hit(name: str) -> None:
        if not state["inside"] and name == point:
            state["n"] += 1
            if state["n"] == k:
                state["inside"] = True
                try:
                    other()
                finally:
                    state["inside"] = False
                ran.append(True)
        real_hit(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    return ran


HARMLESS = (publish.StagingIncomplete, lease.LeaseLost, FileNotFoundError)


@pytest.mark.parametrize("tfds", [False, True], ids=["finalize_publishes", "post_steps_publish"])
def test_a_late_attempt_after_its_run_published_changes_nothing(tmp_path, monkeypatch, tfds):
    """Attempt 1 stalls at the k-th hit of a point; attempt 2 runs whole (publishes, cleans up); attempt 1
    carries on. It may fail, but the output stays the published dataset with _SUCCESS."""
    from beam_pipeline.run.poststeps import PostStepsFn, PostStepsSettings

    base = _job(tmp_path / "in", tmp_path / "proto", NEW_RUN, 2, post_steps=False)
    base = replace(base, cfg=replace(base.cfg, tfds_metadata=tfds))

    def at(out: Path):
        return replace(
            base,
            cfg=replace(base.cfg, output=str(out)),
            layout=replace(base.layout, tmp_dir=str(out / Path(base.layout.tmp_dir).name)),
        )

    def whole(job) -> None:
        info = run_until_finalized(job, lambda: None)
        if tfds:
            list(PostStepsFn(PostStepsSettings.of(job.cfg), job.layout).process(info))

    ref = tmp_path / "ref"
    whole(at(ref))
    want = _check_complete(ref)
    want_files = snapshot(ref)
    points = ["finalize.rename", "finalize.write", "publish.manifest", "publish.move", "publish.delete"]
    points += ["poststeps.step"] if tfds else []
    late = 0
    for point in points:
        for k in range(1, 30):
            out = tmp_path / f"{point}-{k}"
            job = at(out)
            if tfds:  # finalized once; the two attempts are of the post-steps
                info = run_until_finalized(job, lambda: None)
                step = lambda job=job, info=info: list(
                    PostStepsFn(PostStepsSettings.of(job.cfg), job.layout).process(info)
                )  # noqa: E731
            else:
                step = lambda job=job: run_until_finalized(job, lambda: None)  # noqa: E731
            ran = _interleaved(monkeypatch, point, k, step)
            try:
                step()
            except HARMLESS:
                pass
            monkeypatch.undo()
            if not ran:
                shutil.rmtree(out)
                break
            late += 1
            assert _check_complete(out)["run_id"] == want["run_id"], (point, k)
            assert snapshot(out) == want_files, (point, k)
            shutil.rmtree(out)
    assert late >= 8


# --- item 4: a self-incremental run killed in publish ---------------------------------------------


def _self_incremental_killed_in_publish(tmp_path, monkeypatch) -> tuple:
    """A dataset, one image added, then `--incremental-from out --output out --overwrite` SIGKILLed at its 3rd
    publish move. Returns (output, the flags of that run)."""
    root, out = _photos(tmp_path / "in"), tmp_path / "out"
    flags = ("--input", str(root), "--output", str(out), "--target-shard-mb", "0.001")
    convert(*flags)
    write(str(root / "cat" / "new.png"), image_bytes("png", 31, 17, seed=99))
    again = (*flags, "--incremental-from", str(out), "--overwrite")
    monkeypatch.setenv(failpoints.ENV, "publish.move:3:kill")
    killed = run_cli("convert", *again, "--no-transform", "--no-tfds-metadata")
    assert killed.returncode == -signal.SIGKILL
    monkeypatch.delenv(failpoints.ENV)
    return out, again


def test_a_self_incremental_run_killed_while_publishing_finishes_when_run_again(tmp_path, monkeypatch):
    out, again = _self_incremental_killed_in_publish(tmp_path, monkeypatch)
    assert not (out / "_SUCCESS").exists()
    done = convert(*again)
    assert "finished the publish of run" in done.stderr
    info = _check_complete(out)
    assert info["examples"] == 9 and info["incremental"]["from"] == str(out)
    assert info["incremental"]["added"] == 0  # the killed run's dataset, finished, had the new file already
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


# --- item 6: a user's files under the TFT folders ------------------------------------------------


def _publish_over_user_files(put: Callable[[str, bytes], None], get: Callable[[], dict[str, bytes]], out: str) -> None:
    run = "20991231-000000-feedf00d"
    old_info = {"run_id": "old", "transform": {"files": ["transform_fn/saved_model.pb", "transform_fn/assets/label"]}}
    old = {"ds-train.tfrecord-00000-of-00001": b"old", "dataset.json": json.dumps(old_info).encode(), "_SUCCESS": b""}
    old |= {"transform_fn/saved_model.pb": b"old graph", "transform_fn/assets/label": b"a\n"}
    user = {"transform_fn/notes.txt": b"mine", "transformed_metadata/sub/keep.txt": b"also mine"}
    shards = [{"file": f"ds-train.tfrecord-0000{i}-of-00002"} for i in range(2)]
    new_info = {"run_id": run, "status": "ok", "splits": {"train": {"shards": shards}}, "sink": "write_to_tfrecord"}
    new_info["transform"] = {"files": ["transform_fn/saved_model.pb"]}
    new = {f"ds-train.tfrecord-0000{i}-of-00002": b"new %d" % i for i in range(2)}
    new |= {"dataset.json": json.dumps(new_info).encode(), "rejects.jsonl": b"", "transform_fn/saved_model.pb": b"g"}
    for name, data in {**old, **user}.items():
        put(name, data)
    for name, data in new.items():
        put(f".beam_pipeline-tmp-{run}/{name}", data)
    publish.publish(f"{out}/.beam_pipeline-tmp-{run}", out)
    assert get() == {**new, **user, "_SUCCESS": b""}


@pytest.mark.unit
def test_publish_leaves_a_users_files_under_the_tft_folders_alone(tmp_path):
    out = tmp_path / "out"

    def put(name: str, data: bytes) -> None:
        write(str(out / name), data)

    def get() -> dict[str, bytes]:
        return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    _publish_over_user_files(put, get, str(out))


@pytest.mark.unit
def test_publish_on_gcs_leaves_a_users_files_under_the_tft_folders_alone(gcs):
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    bucket = gcs.bucket(BUCKET)

    def put(name: str, data: bytes) -> None:
        bucket.blob(f"user-tft/{name}").upload_from_string(data)

    def get() -> dict[str, bytes]:
        return {b.name[len("user-tft/") :]: b.download_as_bytes() for b in gcs.list_blobs(BUCKET, prefix="user-tft/")}

    _publish_over_user_files(put, get, f"gs://{BUCKET}/user-tft")


# --- a run killed while it holds the lease, in each phase: the same command run again succeeds ---------

# Run in a real process: the CLI with one function patched to SIGKILL the process where it is called.
_KILL_AT = """
import os, runpy, signal, sys
from beam_pipeline import lease
from beam_pipeline.run import convert
where = sys.argv.pop(1)
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
if where == "before_pipeline":  # the lease taken, the previous dataset read, nothing written yet
    convert._run_claimed = die
elif where == "after_publish":  # _SUCCESS written and staging cleaned up, the lease not yet released
    lease.release = die
sys.argv[0] = "beam_pipeline"
runpy.run_module("beam_pipeline", run_name="__main__")
"""


@pytest.mark.parametrize("incremental", [False, True], ids=["overwrite", "self_incremental"])
@pytest.mark.parametrize(
    "where", ["before_pipeline", "writer.record:2:kill", "publish.success:1:kill", "after_publish"]
)
def test_a_run_killed_holding_the_lease_is_followed_by_the_same_command(tmp_path, where, incremental):
    """SIGKILL while holding the output's lease, in each phase; the same command at once: it takes the dead
    run's lease (its pid is gone: no waiting for the ttl), exits 0, _SUCCESS over a dataset that verifies."""
    root, out = _photos(tmp_path / "in"), tmp_path / "out"
    flags = ["--input", str(root), "--output", str(out), "--target-shard-mb", "0.001", "--overwrite"]
    flags += ["--incremental-from", str(out)] if incremental else []
    convert(*flags[:6])
    write(str(root / "cat" / "new.png"), image_bytes("png", 31, 17, seed=99))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if where.endswith(":kill"):
        cmd = [sys.executable, "-m", "beam_pipeline", "convert", *flags]
        env[failpoints.ENV] = where
    else:
        cmd = [sys.executable, "-c", _KILL_AT, where, "convert", *flags]
    cmd += ["--no-transform", "--no-tfds-metadata"]
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert json.loads((out / lease.LEASE).read_text())["pid"]  # left behind, naming a gone process
    again = run_cli("convert", *flags, "--no-transform", "--no-tfds-metadata")
    assert again.returncode == 0, again.stderr
    info = _check_complete(out)
    assert info["examples"] == 9
    assert not (out / lease.LEASE).exists()


# Both processes past their output checks (an empty folder), then released onto the lease at one instant.
_AT_ONCE = """
import os, runpy, sys, time
from beam_pipeline import lease
ready, go = sys.argv.pop(1), sys.argv.pop(1)
real = lease.acquire
def acquire(*args, **kwargs):
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    return real(*args, **kwargs)
lease.acquire = acquire
sys.argv[0] = "beam_pipeline"
runpy.run_module("beam_pipeline", run_name="__main__")
"""


def test_two_runs_started_at_one_instant_on_an_empty_output_exactly_one_proceeds(tmp_path):
    root, out, go = _photos(tmp_path / "in"), tmp_path / "out", tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs, ready = [], []
    for seed in ("1", "2"):
        ready.append(tmp_path / f"ready-{seed}")
        cmd = [sys.executable, "-c", _AT_ONCE, str(ready[-1]), str(go), "convert", "--input", str(root),
               "--output", str(out), "--seed", seed, "--target-shard-mb", "0.001", "--no-transform",
               "--no-tfds-metadata"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for path, proc in zip(ready, procs, strict=True):
        _wait_for(path, proc)
    go.touch()
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    winner = ["1", "2"][[code for code, _ in results].index(0)]
    [loser_err] = [err for code, err in results if code == 2]
    assert len(loser_err.strip().splitlines()) == 1 and "lease" in loser_err and "Traceback" not in loser_err
    info = _check_complete(out)
    assert str(info["seed"]) == winner
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_run_without_overwrite_that_gets_the_lease_after_another_run_published_is_refused(tmp_path):
    """B checks the empty output, then stalls before taking the lease; A runs whole and publishes. B then gets
    the free lease: without --overwrite it must not replace A's complete dataset."""
    root, out, go = _photos(tmp_path / "in"), tmp_path / "out", tmp_path / "go"
    ready = tmp_path / "ready"
    flags = ["--input", str(root), "--output", str(out), "--target-shard-mb", "0.001", "--no-transform",
             "--no-tfds-metadata"]  # fmt: skip
    b = subprocess.Popen(
        [sys.executable, "-c", _AT_ONCE, str(ready), str(go), "convert", *flags, "--seed", "7"],
        env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(ready, b)
        convert(*flags, "--seed", "3")
        a_files = snapshot(out)
    finally:
        go.touch()
    _, err = b.communicate(timeout=300)
    assert b.returncode == 2 and "--overwrite" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _check_complete(out)["seed"] == 3 and snapshot(out) == a_files


def test_clean_keeps_the_folder_of_a_publish_cut_short_that_the_same_command_finishes(tmp_path, monkeypatch):
    """A self-incremental run killed while publishing: inspect names its scratch folder and suggests `clean`.
    That folder holds the only plan to finish the publish (the output has no _SUCCESS): clean must keep it, or
    the same command is refused forever ("not a complete dataset")."""
    out, again = _self_incremental_killed_in_publish(tmp_path, monkeypatch)
    cleaned = run_cli("clean", str(out))
    assert cleaned.returncode == 0, cleaned.stderr
    assert "publish" in cleaned.stdout, cleaned.stdout
    done = convert(*again)
    assert "finished the publish of run" in done.stderr
    assert _check_complete(out)["examples"] == 9
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.unit
def test_a_detached_job_over_its_reject_budget_gives_up_the_lease(tmp_path):
    """A --detach job (its launcher is gone: the lease lasts 24 h, publish releases it) that may not publish over
    an existing dataset (too many rejects) leaves that dataset alone, and must give the lease up too: else the
    re-run after fixing the input is refused for a day."""
    from beam_pipeline.config import ConvertConfig

    first = _job(tmp_path / "in", tmp_path / "out", NEW_RUN, 2, post_steps=False)
    run_until_finalized(first, lambda: None)
    before = snapshot(tmp_path / "out")
    second = _job(tmp_path / "in", tmp_path / "out", "20991231-000001-5ec0bd00", 2, post_steps=False)
    cfg: ConvertConfig = replace(second.cfg, detach=True, max_reject_fraction=0.0, reject_allowance=0)
    job = replace(second, cfg=cfg, layout=replace(second.layout, leased=True))
    lease.acquire(cfg.output, job.layout.run_id, detached=True)  # as the launcher takes it before submitting
    info = run_until_finalized(job, lambda: None)
    assert info.status == outcome.TOO_MANY_REJECTS
    assert snapshot(tmp_path / "out") == before
    assert lease.holder(cfg.output) is None


@pytest.mark.unit
def test_a_late_finalize_attempt_stalled_before_its_first_step_leaves_nothing_in_the_output(tmp_path, monkeypatch):
    """Attempt 1 of finalize finds its run unpublished, then stalls; attempt 2 runs whole (publishes, removes
    the staging folder); attempt 1 carries on. The output must be exactly the published dataset: not even a
    recreated scratch folder of the run (convert and inspect would report it, clean could not tell it dead)."""
    job = _job(tmp_path / "in", tmp_path / "out", NEW_RUN, 2, post_steps=False)
    real = run_finalize.published_run
    ran = []

    def stalls(*args, **kwargs):
        found = real(*args, **kwargs)
        if not ran:
            ran.append(True)
            monkeypatch.setattr(run_finalize, "published_run", real)
            run_until_finalized(job, lambda: None)  # the retry, whole
        return found

    monkeypatch.setattr(run_finalize, "published_run", stalls)
    try:
        run_until_finalized(job, lambda: None)
    except HARMLESS:
        pass
    assert ran
    out = tmp_path / "out"
    _check_complete(out)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    "damage",
    [b"xx", b"[1, 2]\n", b'{"run_id": "x", "transform": {"files": ', b"[" * 100_000 + b"]" * 100_000],
    ids=["not-json", "not-an-object", "cut-short", "nested-too-deep"],
)
def test_a_damaged_dataset_json_in_the_output_is_replaced_not_a_stuck_output(tmp_path, damage):
    """The output's dataset.json damaged (a disk, a hand edit): every later run into that output used to fail
    in publish, --overwrite too. It is replaced, the old run's shards go, and inspect says what is wrong instead
    of a traceback. Files under the TFT folders (the old run's transform, or a user's: nothing tells which) used
    to stay beside the new dataset, under its _SUCCESS (a reader would apply the old graph): the run is refused
    at the start, in one line naming them, nothing written; with them moved away the same command goes through."""
    src, out = _photos(tmp_path / "src"), tmp_path / "out"
    convert("--input", str(src), "--output", str(out), "--name", "old")
    write(str(out / "transform_fn" / "saved_model.pb"), b"the old run's graph, or a user's file")
    (out / "dataset.json").write_bytes(damage)
    shown = run_cli("inspect", str(out))
    assert shown.returncode == 2 and "Traceback" not in shown.stderr
    assert shown.stderr.startswith(f"error: {out}: dataset.json is damaged (")
    before = snapshot(out, raw=True)
    refused = run_cli("convert", "--input", str(src), "--output", str(out), "--overwrite", "--no-transform")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "dataset.json is damaged" in refused.stderr and "1 files under transform_fn/" in refused.stderr
    assert "(transform_fn/saved_model.pb)" in refused.stderr and "delete those folders" in refused.stderr
    assert snapshot(out, raw=True) == before
    shutil.rmtree(out / "transform_fn")
    convert("--input", str(src), "--output", str(out), "--overwrite")
    info = _check_complete(out)
    assert info["examples"] == 8
    assert not list(out.glob("old-*")) and not [d for d in publish.TFT_DIRS if (out / d).exists()]


@pytest.mark.parametrize(
    "transform", [[1], {"files": "transform_fn/x"}, {"files": [1, None]}, "yes"], ids=["list", "text", "ints", "str"]
)
def test_an_output_dataset_json_whose_transform_is_of_another_shape_does_not_stop_every_run(tmp_path, transform):
    """Valid JSON whose "transform" is not {"files": [paths]} (a hand edit, another tool): every --overwrite run
    failed in finalize ("'list' object has no attribute 'get'"). No TFT file is known to be the old run's then."""
    src, out = _photos(tmp_path / "src"), tmp_path / "out"
    convert("--input", str(src), "--output", str(out), "--name", "old")
    info = json.loads((out / "dataset.json").read_text())
    (out / "dataset.json").write_text(json.dumps({**info, "transform": transform}))
    convert("--input", str(src), "--output", str(out), "--overwrite")
    assert _check_complete(out)["examples"] == 8


def test_tft_files_of_a_publish_cut_short_do_not_stay_under_the_next_runs_success(tmp_path, monkeypatch):
    """B publishes over A with a transform and is killed after moving its TFT folders in, before its dataset.json
    (moved last). C, A's command again (no transform), used to leave B's transform_fn/ beside a dataset.json
    that records no transform: reader.load(transformed=True) applied B's graph (another label vocabulary)."""
    src = _photos(tmp_path / "src")
    more = tmp_path / "more"
    shutil.copytree(src, more)
    write(str(more / "bird" / "b.png"), image_bytes("png", 30, 20, seed=9))
    flags = ["--target-shard-mb", "0.001"]
    out, probe = tmp_path / "out", tmp_path / "probe"
    convert("--input", str(src), "--output", str(out), *flags)  # A
    convert("--input", str(more), "--output", str(probe), *flags, transform=True)
    moves = sum(1 for p in probe.rglob("*") if p.is_file() and p.name not in ("_SUCCESS", "dataset.json"))
    monkeypatch.setenv(failpoints.ENV, f"publish.move:{moves + 1}:kill")  # B: every file in but dataset.json
    killed = run_cli("convert", "--input", str(more), "--output", str(out), *flags, "--overwrite")
    monkeypatch.delenv(failpoints.ENV)
    assert killed.returncode == -signal.SIGKILL and (out / "transform_fn").is_dir()
    convert("--input", str(src), "--output", str(out), *flags, "--overwrite")  # C
    info = _check_complete(out)
    assert "transform" not in info and info["labels"] == ["cat", "dog"]
    assert not [d for d in publish.TFT_DIRS if (out / d).exists()]
    from beam_pipeline import reader

    with pytest.raises(ValueError, match="converted without a transform"):
        reader.load(str(out), "train", transformed=True)


def test_a_users_file_under_a_tft_folder_beside_a_dataset_is_never_written_over(tmp_path):
    """Beside a --no-transform dataset (its dataset.json records no TFT file), a user's metadata/schema.pbtxt:
    a run with a transform moved its own schema.pbtxt over it. Its publish now stops before changing anything,
    naming the file; a run without a transform writes nothing there and publishes, the file kept. A publish
    plan of a run killed inside its publish that lists the same path makes it that run's only at the size that
    run moved there."""
    src, out = _photos(tmp_path / "src"), tmp_path / "out"
    convert("--input", str(src), "--output", str(out))
    write(str(out / "metadata" / "schema.pbtxt"), b"my schema")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    stopped = run_cli("convert", "--input", str(src), "--output", str(out), "--overwrite", "--seed", "3")  # TFT
    assert stopped.returncode == 1 and "metadata/schema.pbtxt is no run's" in stopped.stderr, stopped.stderr
    assert len(stopped.stderr.strip().splitlines()) == 1
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and ".beam_pipeline-tmp" not in
            str(p)} == before  # fmt: skip
    convert("--input", str(src), "--output", str(out), "--overwrite", "--seed", "5")  # no transform
    assert _check_complete(out)["seed"] == 5 and (out / "metadata" / "schema.pbtxt").read_bytes() == b"my schema"
    plan = out / ".beam_pipeline-tmp-20260101-000000-deadbeef" / publish.PUBLISH_MANIFEST
    write(str(plan), json.dumps({"files": {"metadata/schema.pbtxt": 321}, "run_id": "x"}).encode())
    assert publish.runs_tft_files(str(out), storage.sizes_under(str(out)), []) == []
    write(str(plan), json.dumps({"files": {"metadata/schema.pbtxt": len(b"my schema")}, "run_id": "x"}).encode())
    assert publish.runs_tft_files(str(out), storage.sizes_under(str(out)), []) == ["metadata/schema.pbtxt"]


def test_tft_files_of_a_version_that_did_not_list_them_go_with_its_dataset(tmp_path):
    """A dataset with a transform whose dataset.json has no transform.files (versions before they were
    listed): a --no-transform night removes its TFT folders as that run's, and the next night, with or without
    a transform, publishes (was: kept, then every later night refused or stuck)."""
    src, out = _photos(tmp_path / "src"), tmp_path / "out"
    convert("--input", str(src), "--output", str(out), transform=True)
    info = json.loads((out / "dataset.json").read_text())
    del info["transform"]["files"]
    (out / "dataset.json").write_text(json.dumps(info))
    convert("--input", str(src), "--output", str(out), "--overwrite")
    assert not [d for d in publish.TFT_DIRS if (out / d).exists()]
    convert("--input", str(src), "--output", str(out), "--overwrite", transform=True)
    assert "transform" in _check_complete(out)


@pytest.mark.unit
def test_two_sdist_builds_from_one_setup_folder_take_turns(tmp_path):
    """Two runs submitted from one checkout at once: the second waits for the first's ``setup.py sdist``, which
    writes beside setup.py (the tests' own builds broke each other so). The lock is on the folder: no file."""
    from beam_pipeline.run.workers import setup_folder_lock

    order: list[str] = []
    with setup_folder_lock(str(tmp_path)):
        second = threading.Thread(target=lambda: _take(setup_folder_lock(str(tmp_path)), order))
        second.start()
        second.join(0.5)
        assert second.is_alive()  # waiting for the first
        order.append("first done")
    second.join(10)
    assert order == ["first done", "second"]
    assert list(tmp_path.iterdir()) == []


def _take(lock, order: list[str]) -> None:
    with lock:
        order.append("second")
