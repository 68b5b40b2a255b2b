"""gs:// input and output against a real GCS protocol server (gcp-storage-emulator on loopback)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import apache_beam as beam
import pytest

from beam_pipeline.run import previous, publish, workers

from .conftest import BUCKET, convert, gcs_that_does_not_answer, load_info, run_cli
from .imagegen import broken_bytes, image_bytes, write

pytestmark = pytest.mark.e2e


@pytest.mark.smoke
def test_gs_input_and_output_match_a_local_run(gcs, tmp_path):
    root = tmp_path / "photos"
    for i in range(12):
        label = ["cat", "dog"][i % 2]
        write(
            str(root / label / f"{i} img.{['jpg', 'png'][i % 3 == 0]}"),
            image_bytes(["jpeg", "png"][i % 3 == 0], seed=i),
        )
    write(str(root / "cat" / "broken.jpg"), broken_bytes("truncated"))
    bucket = gcs.bucket(BUCKET)
    for path in root.rglob("*"):
        if path.is_file():
            bucket.blob(f"in/{path.relative_to(root)}").upload_from_filename(str(path))

    args = ["--name", "pets", "--seed", "5", "--split-ratios", "train=0.5,test=0.5", "--target-shard-mb", "0.004",
            "--max-reject-fraction", "0.1"]  # fmt: skip
    local = tmp_path / "local"
    convert("--input", str(root), "--output", str(local), *args, transform=True)
    convert("--input", f"gs://{BUCKET}/in", "--output", f"gs://{BUCKET}/out", "--no_auth", *args, transform=True)

    remote = {b.name[len("out/") :]: b for b in gcs.list_blobs(BUCKET, prefix="out/")}
    info = load_info(local)
    shard_files = [s["file"] for split in info["splits"].values() for s in split["shards"]]
    assert len(shard_files) > 2
    for name in shard_files:
        assert remote[name].download_as_bytes() == (local / name).read_bytes(), name
    for name in ("_SUCCESS", "dataset.json", "labels.txt", "rejects.jsonl", "transform_fn/saved_model.pb"):
        assert name in remote, name
    assert any(n.startswith("transformed_metadata/") for n in remote)
    assert any(n.startswith("transform_fn/assets/") for n in remote)
    assert not any(n.startswith(".beam_pipeline-tmp-") for n in remote)
    assert b"truncated" in remote["rejects.jsonl"].download_as_bytes()
    remote_labels = remote["labels.txt"].download_as_bytes()
    assert remote_labels == Path(local / "labels.txt").read_bytes()

    # inspect works on the bucket too: summary, full verification, contact sheet written back to gs://
    result = run_cli(
        "inspect", f"gs://{BUCKET}/out", "--verify", "--contact-sheet", f"gs://{BUCKET}/sheet.png", "--n", "4"
    )
    assert result.returncode == 0, result.stderr
    assert "verified 12 records" in result.stdout
    assert gcs.bucket(BUCKET).blob("sheet.png").download_as_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_incremental_from_latest_on_gcs_takes_the_newest_complete_earlier_date(gcs, tmp_path):
    """{date} in an inner folder of a gs:// output; one listing of the bucket finds the earlier dates."""
    root = tmp_path / "photos"
    for i in range(10):
        write(str(root / ["cat", "dog"][i % 2] / f"{i}.png"), image_bytes("png", seed=i))
    bucket = gcs.bucket(BUCKET)
    for path in root.rglob("*"):
        if path.is_file():
            bucket.blob(f"nightly-in/{path.relative_to(root)}").upload_from_filename(str(path))
    template = f"gs://{BUCKET}/nightly/{{date}}/photos"
    nightly = ["--input", f"gs://{BUCKET}/nightly-in", "--output", template, "--incremental-from", "latest",
               "--name", "pets", "--target-shard-mb", "0.004", "--no_auth"]  # fmt: skip

    first = convert(*nightly, "--run-date", "2026-05-01")
    assert first.stderr.strip() == (
        f"note: --incremental-from latest: no earlier complete dataset for {template}; converting everything"
    )
    # Not to be taken, though they look complete: a later date, a folder that is no date; and a killed night.
    for folder, files in (("2026-05-09", ("_SUCCESS", "index.jsonl", "labels.txt")),
                          ("notes", ("_SUCCESS", "index.jsonl", "labels.txt")),
                          ("2026-05-03", ("index.jsonl", "labels.txt"))):  # fmt: skip
        for name in files:
            bucket.blob(f"nightly/{folder}/photos/{name}").upload_from_string(
                b"cat\ndog\n" if name == "labels.txt" else b""
            )
    write(str(root / "cat" / "new.png"), image_bytes("png", seed=99))
    bucket.blob("nightly-in/cat/new.png").upload_from_filename(str(root / "cat" / "new.png"))
    second = convert(*nightly, "--run-date", "2026-05-04")
    assert "note:" not in second.stderr

    info = json.loads(bucket.blob("nightly/2026-05-04/photos/dataset.json").download_as_bytes())
    assert info["incremental"]["from"] == f"gs://{BUCKET}/nightly/2026-05-01/photos"
    assert (info["incremental"]["reused"], info["incremental"]["added"]) == (10, 1)
    assert bucket.blob("nightly/2026-05-04/photos/_SUCCESS").exists()


def test_multi_process_runner_with_post_steps_in_the_job_matches_an_in_process_run(gcs, tmp_path, monkeypatch):
    """Two worker processes (fresh interpreters: the emulator address reaches them through the
    environment), the post-steps as the job's last step, publishing onto the bucket; shards
    byte for byte those of a local in-process run."""
    site = Path(__file__).parent / "emulator_site"  # skips each worker's credential lookup
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    root = tmp_path / "photos"
    for i in range(16):
        label = ["cat", "dog"][i % 2]
        write(str(root / label / f"{i}.{['jpg', 'png'][i % 3 == 0]}"), image_bytes(["jpeg", "png"][i % 3 == 0], seed=i))
    write(str(root / "dog" / "broken.jpg"), broken_bytes("text"))
    bucket = gcs.bucket(BUCKET)
    for path in root.rglob("*"):
        if path.is_file():
            bucket.blob(f"mp-in/{path.relative_to(root)}").upload_from_filename(str(path))
    # An older dataset in the output, with a shard name the new run does not make.
    bucket.blob("mp-out/mp-train.tfrecord-00000-of-00009").upload_from_string(b"old shard")
    bucket.blob("mp-out/dataset.json").upload_from_string(b'{"run_id": "old"}')
    bucket.blob("mp-out/_SUCCESS").upload_from_string(b"")

    args = ["--name", "mp", "--seed", "3", "--split-ratios", "train=0.7,test=0.3", "--target-shard-mb", "0.005",
            "--max-reject-fraction", "0.1"]  # fmt: skip
    local = tmp_path / "local"
    convert("--input", str(root), "--output", str(local), *args, tfds=True)
    convert(
        "--input", f"gs://{BUCKET}/mp-in", "--output", f"gs://{BUCKET}/mp-out", "--overwrite", *args,
        "--direct_running_mode", "multi_processing", "--direct_num_workers", "2", "--post-steps", "job",
        tfds=True, timeout=600,
    )  # fmt: skip

    remote = {b.name[len("mp-out/") :]: b.download_as_bytes() for b in gcs.list_blobs(BUCKET, prefix="mp-out/")}
    info = load_info(local)
    shard_files = sorted(s["file"] for split in info["splits"].values() for s in split["shards"])
    assert len(shard_files) > 2
    assert sorted(n for n in remote if "/" not in n and ".tfrecord-" in n) == shard_files  # the old shard is gone
    assert sorted(n for n in remote if n.startswith("idx/")) == [f"idx/{f}.idx" for f in shard_files]
    for name in shard_files + [f"idx/{f}.idx" for f in shard_files]:
        assert remote[name] == (local / name).read_bytes(), name
    for name in ("labels.txt", "features.json"):
        assert remote[name] == (local / name).read_bytes(), name
    reasons = [(json.loads(line)["path"].rsplit("/", 1)[1], json.loads(line)["reason"]) for line in
               remote["rejects.jsonl"].decode().splitlines()]  # fmt: skip
    assert reasons == [("broken.jpg", "not_an_image")]
    remote_info = json.loads(remote["dataset.json"])
    assert remote_info["splits"] == info["splits"] and remote_info["rejects"] == info["rejects"]
    assert "_SUCCESS" in remote and not any(n.startswith(".beam_pipeline-tmp-") for n in remote)


def test_publish_on_gcs_finishes_after_a_crash_at_any_batch(gcs, monkeypatch):
    """Batched renames and deletes (2 per batch here) on the emulator: a crash before any batch,
    then the retried step's published_run(), ends with exactly the new dataset."""
    from beam_pipeline import failpoints, storage
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    monkeypatch.setattr(storage.gcs, "BATCH", 2)
    run = "20991231-000000-feedf00d"
    old = {f"ds-train.tfrecord-0000{i}-of-00003": b"old %d" % i for i in range(3)}
    recorded = {"run_id": "old", "transform": {"files": ["transform_fn/saved_model.pb", "transform_fn/assets/label"]}}
    old |= {"dataset.json": json.dumps(recorded).encode(), "labels.txt": b"a\n", "_SUCCESS": b""}
    old |= {"transform_fn/saved_model.pb": b"old graph", "transform_fn/assets/label": b"a\n"}
    new = {f"ds-train.tfrecord-0000{i}-of-00002": b"new %d" % i for i in range(2)}
    new |= {"dataset.json": json.dumps({"run_id": run, "status": "ok"}).encode(), "labels.txt": b"a\nb\n"}
    new |= {"rejects.jsonl": b"", "transform_fn/saved_model.pb": b"new graph", "transform_fn/variables/v": b"v"}
    bucket = gcs.bucket(BUCKET)

    def contents(prefix: str) -> dict[str, bytes]:
        return {
            b.name[len(prefix) :]: b.download_as_bytes()
            for b in gcs.list_blobs(BUCKET, prefix=prefix)
            if not b.name[len(prefix) :].startswith((".beam_pipeline-tmp-", ".beam_pipeline-lease"))
        }

    swept = {}
    for point in ("publish.move", "publish.delete", "publish.success"):
        for k in range(1, 30):
            prefix = f"sweep-{point}-{k}/"
            out, staging = f"gs://{BUCKET}/{prefix[:-1]}", f"gs://{BUCKET}/{prefix}.beam_pipeline-tmp-{run}"
            for name, data in old.items():
                bucket.blob(prefix + name).upload_from_string(data)
            for name, data in new.items():
                bucket.blob(f"{prefix}.beam_pipeline-tmp-{run}/{name}").upload_from_string(data)
            monkeypatch.setenv(failpoints.ENV, f"{point}:{k}")
            failpoints.reset()
            try:
                publish.publish(staging, out)
                crashed = False
            except failpoints.FailpointError:
                crashed = True
                now = contents(prefix)
                assert "_SUCCESS" not in now or now in (old, {**new, "_SUCCESS": b""}), (point, k)
            monkeypatch.delenv(failpoints.ENV)
            assert publish.published_run(out, staging, run).run_id == run  # the retried step
            assert contents(prefix) == {**new, "_SUCCESS": b""}, (point, k)
            assert not list(gcs.list_blobs(BUCKET, prefix=f"{prefix}.beam_pipeline-tmp-"))
            if not crashed:
                break
            swept[point] = k
    assert swept == {"publish.move": 7, "publish.delete": 5, "publish.success": 1}


class _ProjectSeenByWorker(beam.DoFn):
    def process(self, _):
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import GoogleCloudOptions

        options = FileSystems._pipeline_options  # noqa: SLF001 - what Beam's GCS file system reads
        yield None if options is None else options.view_as(GoogleCloudOptions).project


def test_multi_processing_workers_get_the_pipeline_options(tmp_path):
    """A fresh worker process sees the job's options (GCS settings for FileSystems), as in Beam's DirectRunner."""
    from beam_pipeline.runner import make_options

    options, runner = make_options(
        ["--direct_running_mode=multi_processing", "--direct_num_workers=2", "--project=probe-project"]
    )
    out = tmp_path / "seen"
    with beam.Pipeline(runner=runner, options=options) as p:
        _ = (
            p
            | beam.Create([1])
            | beam.ParDo(_ProjectSeenByWorker())
            | beam.Map(lambda v, path=str(out): open(path, "w").write(str(v)))
        )
    assert out.read_text() == "probe-project"


@pytest.mark.unit
def test_line_files_on_gcs_are_read_in_buffers_not_a_byte_per_call(gcs):
    """A gs:// file opened through Beam has no peek, so iterating its lines read it one byte per call (~120 µs
    a line: 20 minutes for a 10 M-line index.jsonl in finalize). Every line reader goes through a buffer."""
    from apache_beam.io.filesystems import FileSystems

    from beam_pipeline import index, resume
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    lines = [json.dumps({"path": f"img/{i:05d}.jpg", "record": i, "reason": "x"}) + "\n" for i in range(3000)]
    gcs.bucket(BUCKET).blob("lines/part.jsonl").upload_from_string("".join(lines))
    path = f"gs://{BUCKET}/lines/part.jsonl"
    with FileSystems.open(path) as fh:
        reader = type(fh)
    calls = []
    original = reader.read

    def counted(self, *args):
        calls.append(args)
        return original(self, *args)

    reader.read = counted
    try:
        assert [e["record"] for e in index.read_index(path)] == list(range(3000))
        assert len(list(resume.read_rejects(path))) == 3000
        index.write_index([(path, "ds-train.tfrecord-00000-of-00001")], f"gs://{BUCKET}/lines/index.jsonl")
    finally:
        reader.read = original
    assert len(calls) < 60, len(calls)  # 3 files of ~200 KB in 1 MB buffers, not ~600,000 one-byte reads
    written = gcs.bucket(BUCKET).blob("lines/index.jsonl").download_as_bytes().decode().splitlines()
    assert len(written) == 3000 and json.loads(written[-1])["record"] == 2999


@pytest.mark.pipeline
def test_latest_on_gcs_lists_the_dated_folders_not_every_nights_files(gcs, monkeypatch):
    """A glob over gs://b/nightly/????-??-??/_SUCCESS lists every object under nightly/ (every night's shards:
    millions a year without --keep-last). The dated folders are listed instead, and _SUCCESS looked for newest
    first: a later date, a killed night and a folder that is no date are passed over."""
    from apache_beam.io.filesystems import FileSystems

    workers.use_anonymous_gcs_for_emulator()
    bucket = gcs.bucket(BUCKET)
    nights = {"2026-03-01": True, "2026-03-02": True, "2026-03-03": False, "2026-03-09": True, "notes": True}
    for night, complete in nights.items():
        names = [f"pets-train.tfrecord-{i:05d}-of-00040" for i in range(40)] + ["_SUCCESS"] * complete
        for name in names:
            bucket.blob(f"glob/nightly/{night}/photos/{name}").upload_from_string(b"")

    def no_glob(patterns, *args, **kwargs):
        raise AssertionError(f"a glob listing on gs://: {patterns}")

    monkeypatch.setattr(FileSystems, "match", staticmethod(no_glob))
    template = f"gs://{BUCKET}/glob/nightly/{{date}}/photos"
    found = previous._complete_earlier_folders(template, "unused", "2026-03-05")  # noqa: SLF001
    assert found == [f"gs://{BUCKET}/glob/nightly/2026-03-02/photos"]
    assert previous._complete_earlier_folders(template, "unused", "2026-03-01") == []  # noqa: SLF001


# ---- gs:// access that fails: one line naming the cause, within seconds ----------------------------------


def _convert_in_process(capsys, *args: str) -> tuple[int, str, float]:
    import time

    from beam_pipeline.cli import main

    started = time.monotonic()
    code = main(["convert", *args, "--no-transform", "--no-tfds-metadata"])
    return code, capsys.readouterr().err.strip(), time.monotonic() - started


def test_a_gcs_server_that_does_not_answer_is_named_not_an_empty_folder(monkeypatch, capsys, tmp_path):
    """The server down (a closed loopback port): before, ~2 min of retries, then 'the folder is empty'."""
    address = gcs_that_does_not_answer(monkeypatch)
    code, err, took = _convert_in_process(capsys, "--input", "gs://b/photos", "--output", str(tmp_path / "out"))
    assert code == 2
    assert err.splitlines() == [
        f"error: --input gs://b/photos: cannot reach the GCS emulator at {address} "
        "(STORAGE_EMULATOR_HOST) (Connection refused): check the network connection or proxy"
    ]
    assert took < 15
    assert not (tmp_path / "out").exists()

    from beam_pipeline.cli import main

    for command in ("inspect", "clean"):
        started = time.monotonic()
        assert main([command, "gs://b/out"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: gs://b/out: cannot reach the GCS emulator at {address}")
        assert time.monotonic() - started < 15, command


def test_a_missing_bucket_or_an_empty_prefix_is_said_so(gcs, capsys, tmp_path):
    gcs.bucket(BUCKET).blob("full/cat/a.png").upload_from_string(image_bytes("png", seed=1))
    cases = [
        (["--input", "gs://no-such-bucket/photos"], "--input gs://no-such-bucket/photos: no bucket gs://no-such-bucket"),
        (["--input", f"gs://{BUCKET}/nothing-here"], f"--input gs://{BUCKET}/nothing-here: nothing under it"),
        (["--input", f"gs://{BUCKET}/full", "--output", "gs://no-bucket/x"], "--output gs://no-bucket/x: no bucket"),
        (["--manifest", f"gs://{BUCKET}/none.csv"], f"--manifest gs://{BUCKET}/none.csv: no such file"),
    ]  # fmt: skip
    for args, needle in cases:
        if "--output" not in args:
            args = [*args, "--output", str(tmp_path / "out")]
        code, err, _ = _convert_in_process(capsys, *args)
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: " + needle), (args, err)


@pytest.mark.unit
def test_without_credentials_the_lookup_goes_anonymous_at_once_and_a_refusal_says_why(monkeypatch):
    """No GOOGLE_APPLICATION_CREDENTIALS, no gcloud login, not on Google Cloud: Beam would retry ~25 s."""
    import time

    from apache_beam.internal.gcp import auth
    from google.api_core import exceptions as gexc
    from google.auth.compute_engine import _metadata

    from beam_pipeline import storage

    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent-gcloud-config")
    monkeypatch.setattr(_metadata, "is_on_gce", lambda request: False)  # no metadata server probe from a test
    monkeypatch.setattr(auth._Credentials, "_credentials_init", False)
    monkeypatch.setattr(auth._Credentials, "_credentials", None)
    monkeypatch.setattr(storage, "_ANONYMOUS_BECAUSE", {})
    started = time.monotonic()
    storage.settle_gcs_credentials()
    assert time.monotonic() - started < 5
    assert auth._Credentials._credentials_init and auth._Credentials._credentials is None  # Beam: anonymous
    assert storage._ANONYMOUS_BECAUSE["why"].startswith("no credentials found: Your default credentials")

    refused = gexc.Unauthorized("Anonymous caller does not have storage.objects.list access to the bucket.")
    said = storage.gcs_problem(refused, "b")
    assert said.startswith("GCS refused an anonymous request (401 Anonymous caller does not have storage.objects.list")
    assert "no credentials found" in said and "gcloud auth application-default login" in said
    assert "GOOGLE_APPLICATION_CREDENTIALS" in said


@pytest.mark.unit
def test_each_kind_of_gcs_failure_names_its_cause(monkeypatch):
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    from beam_pipeline import storage

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(storage, "_ANONYMOUS_BECAUSE", {})
    down = requests.ConnectionError("HTTPSConnectionPool(host='storage.googleapis.com'): Max retries exceeded")
    down.__context__ = OSError(-2, "Name or service not known")
    cases = [
        (gexc.RetryError("Timeout of 15.0s", down), "cannot reach Google Cloud Storage (Name or service not known)"),
        (gexc.NotFound("The specified bucket does not exist."), "no bucket gs://b (GCS: 404 Not Found)"),
        (gexc.Forbidden("ci@p.iam.gserviceaccount.com does not have storage.objects.list access"),
         "permission denied on gs://b (403 ci@p.iam.gserviceaccount.com does not have storage.objects.list access)"),
        (gexc.Unauthorized("Invalid Credentials"), "GCS refused the credentials (401 Invalid Credentials)"),
        (aexc.RefreshError("invalid_grant: Token has been revoked."), "the credentials could not be refreshed"),
        (gexc.ServiceUnavailable("backend error"), "GCS answered 503 backend error"),
        (gexc.RetryError("Timeout of 15.0s exceeded", gexc.TooManyRequests("slow down")), "GCS answered 429 slow down"),
    ]  # fmt: skip
    for error, start in cases:
        assert storage.gcs_problem(error, "b").startswith(start), (error, storage.gcs_problem(error, "b"))
