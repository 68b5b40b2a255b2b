"""--format array_record: the TFRecord run's records, for Grain and TFDS data sources, everywhere TFRecord works."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from beam_pipeline import reader
from beam_pipeline.config import OUTPUT_FORMATS, ConvertConfig, validate
from beam_pipeline.errors import UsageError
from beam_pipeline.examples import parse_example
from beam_pipeline.formats import array_record as array_record_format
from beam_pipeline.formats import registry

from .conftest import BUCKET, convert, load_info, run_cli
from .imagegen import broken_bytes, image_bytes, write

ARGS = ("--name", "pets", "--seed", "3", "--split-ratios", "train=0.6,validation=0.2,test=0.2",
        "--target-shard-mb", "0.01", "--max-reject-fraction", "0.2")  # fmt: skip


def make_input(root: Path, n: int = 30) -> Path:
    for i in range(n):
        kind = ["jpeg", "png", "gif"][i % 3]
        ext = {"jpeg": "jpg", "png": "png", "gif": "gif"}[kind]
        write(str(root / ["cat", "dog"][i % 2] / f"{i:03d}.{ext}"), image_bytes(kind, 24 + i % 5, 32, seed=i))
    write(str(root / "cat" / "broken.jpg"), broken_bytes("truncated"))
    return root


def records_by_name(out: Path) -> dict[tuple[str, bytes], tuple[str, int, bytes]]:
    """(split, image/filename) → (shard name without its format, position, record bytes), any format."""
    info = load_info(out)
    found = {}
    for split, s in info["splits"].items():
        for shard in s["shards"]:
            path = str(out / shard["file"])
            plain = shard["file"].replace(".array_record-", ".X-").replace(".tfrecord-", ".X-")
            for i, record in enumerate(registry.of_shard(path).records(path)):
                found[(split, parse_example(record)["image/filename"][0])] = (plain, i, record)
    return found


@pytest.mark.unit
def test_the_flag_lists_every_registered_format_and_refuses_what_the_format_cannot_do():
    assert set(OUTPUT_FORMATS) == set(registry.FORMATS)
    base = {"input": "/in", "output": "/out", "name": "ds", "format": "array_record"}
    validate(ConvertConfig(**base))
    for changes, said in (
        ({"compression": "gzip"}, "--compression gzip: --format array_record shards are not compressed as files"),
        ({"sink": "write_to_tfrecord"}, "--sink write_to_tfrecord writes TFRecord only"),
        ({"format": "parquet"}, "--format must be one of tfrecord, array_record"),
    ):
        with pytest.raises(UsageError, match="^" + said.replace("(", r"\(")):
            validate(ConvertConfig(**{**base, **changes}))


@pytest.mark.unit
def test_without_the_library_the_format_is_refused_in_one_line_naming_the_python(monkeypatch):
    monkeypatch.setattr(array_record_format.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match=r"needs the array-record package, not installed in this Python 3\.\d+ "):
        validate(ConvertConfig(input="/in", output="/out", name="ds", format="array_record"))


KINDS = ("jpeg", "jpeg_gray", "jpeg_progressive", "png", "png_gray", "png_la", "png_rgba", "png_palette",
         "png_palette_transparent", "png_16bit", "gif", "gif_animated", "bmp", "bmp_rgba", "bmp_gray", "webp",
         "webp_rgba", "bmp_palette")  # fmt: skip


@pytest.mark.unit
def test_decode_gives_tensorflows_pixels_for_every_stored_kind(tf):
    """reader.decode (Pillow, numpy) against tf.io.decode_image(channels=3) on the bytes a record stores of each kind
    (prepare_image: a palette BMP becomes a PNG); JPEGs against TensorFlow's accurate DCT, the one Pillow's libjpeg
    uses. An RGBA WebP, kept as it is, TensorFlow refuses with channels=3; decode drops its alpha."""
    from beam_pipeline.examples import build_example
    from beam_pipeline.images.convert import prepare_image

    for kind in KINDS:
        data = prepare_image(image_bytes(kind, 20, 28, seed=7)).data
        got = reader.decode(build_example({"image/encoded": data, "image/class/label": 4}))
        if kind == "webp_rgba":
            assert got["image"].shape == (20, 28, 3)
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.io.decode_image(data, channels=3)
            continue
        if kind.startswith("jpeg"):
            want = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        else:
            want = tf.io.decode_image(data, channels=3, expand_animations=False).numpy()
        assert got["image"].dtype == want.dtype and got["image"].shape == want.shape, kind
        assert (got["image"] == want).all(), kind
        assert got["label"] == 4


@pytest.mark.unit
def test_a_shard_bound_for_a_store_is_copied_only_once_complete(tmp_path, monkeypatch):
    """Written locally, copied at close; a failed write or copy leaves no local file and copies nothing."""
    copies = []
    monkeypatch.setattr(array_record_format, "_copy", lambda src, dst: copies.append((Path(src).read_bytes(), dst)))
    monkeypatch.setattr(array_record_format.tempfile, "tempdir", str(tmp_path))
    fmt = registry.get("array_record")
    with fmt.create("gs://b/out/x.array_record-00000-of-00001", "none") as out:
        assert out.write(b"one") is None
        assert list(tmp_path.iterdir()) and not copies  # on the local disk until complete
    assert [dst for _, dst in copies] == ["gs://b/out/x.array_record-00000-of-00001"]
    assert not list(tmp_path.iterdir())  # the local copy is removed

    class Full:
        def __init__(self, *args):
            pass

        def write(self, record):
            raise RuntimeError("write() failed: No space left on device")

        def close(self):
            pass

    monkeypatch.setattr(array_record_format._module(), "ArrayRecordWriter", Full)
    with pytest.raises(OSError, match="No space left on device"), fmt.create("gs://b/out/y", "none") as out:
        out.write(b"two")
    assert len(copies) == 1 and not list(tmp_path.iterdir())


@pytest.mark.unit
def test_records_are_not_reused_one_at_a_time_from_array_record_on_a_store_nor_from_an_unknown_format():
    from beam_pipeline.index import reuse_problem
    from beam_pipeline.vocab.dataset_info import DatasetInfo

    def info(fmt: str) -> DatasetInfo:
        return DatasetInfo.from_json({"name": "ds", "examples": 1, "config": {"format": fmt}})

    assert reuse_problem("gs://b/prev", info("array_record"), {}) == (
        "its shards are array_record on a store: reading one record there fetches its whole shard"
    )
    assert reuse_problem("/prev", info("parquet"), {}) == (
        "its shards are in format 'parquet', which this version does not read"
    )


@pytest.mark.unit
def test_a_night_after_an_array_record_night_without_the_library_converts_afresh_and_says_why(monkeypatch):
    from beam_pipeline.index import reuse_problem
    from beam_pipeline.vocab.dataset_info import DatasetInfo

    monkeypatch.setattr(array_record_format.importlib.util, "find_spec", lambda name: None)
    info = DatasetInfo.from_json({"name": "ds", "examples": 1, "config": {"format": "array_record"}})
    assert reuse_problem("/prev", info, {}) == (
        "its shards are array_record, whose library is not installed here (pip install 'beam_pipeline[array_record]')"
    )


@pytest.mark.unit
def test_without_the_library_reading_or_writing_a_shard_names_the_install(monkeypatch, tmp_path):
    import array_record.python

    from beam_pipeline.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "array_record.python.array_record_module", None)  # import fails
    monkeypatch.delattr(array_record.python, "array_record_module", raising=False)
    with pytest.raises(MissingExtraError, match=r"need the array-record package: pip install .*\[array_record\]"):
        registry.get("array_record").create(str(tmp_path / "a.array_record-00000-of-00001"), "none")


@pytest.mark.unit
def test_open_readers_evict_and_share_safely_across_threads(tmp_path, monkeypatch):
    """Three shards through a cache of two, eight threads reading random records: every read is the right record,
    and no reader is left open beyond the cache."""
    import random
    import threading

    fmt = registry.get("array_record")
    shards = {}
    for s in range(3):
        path = str(tmp_path / f"d-train.array_record-0000{s}-of-00003")
        with fmt.create(path, "none") as out:
            for i in range(50):
                out.write(f"{s}:{i}".encode() * 20)
        shards[path] = s
    cache = array_record_format._OpenReaders(2)
    monkeypatch.setattr(array_record_format, "_READERS", cache)
    errors = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            path = rng.choice(list(shards))
            i = rng.randrange(50)
            try:
                assert fmt.read_one(path, i) == f"{shards[path]}:{i}".encode() * 20
            except Exception as e:  # noqa: BLE001 - collected for the assertion below
                errors.append(e)

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(cache._open) <= 2
    with pytest.raises(ValueError, match="no record 50 "):
        fmt.read_one(next(iter(shards)), 50)


@pytest.mark.unit
def test_local_copies_of_a_process_that_died_are_removed_by_the_next(tmp_path):
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    left = tmp_path / f"beam_pipeline-ar-{dead}-x.array_record"
    mine = tmp_path / f"beam_pipeline-ar-{os.getpid()}-y.array_record"
    other = tmp_path / "beam_pipeline-ar-notapid.array_record"
    for f in (left, mine, other):
        f.write_bytes(b"x")
    assert array_record_format.sweep_dead_copies(str(tmp_path)) == [left.name]
    assert not left.exists() and mine.exists() and other.exists()


@pytest.mark.unit
def test_a_damaged_or_cut_short_shard_is_a_value_error(tmp_path):
    fmt = registry.get("array_record")
    path = tmp_path / "a.array_record-00000-of-00001"
    with fmt.create(str(path), "none") as out:
        for i in range(20):
            out.write(bytes([i]) * 3000)
    data = path.read_bytes()
    path.write_bytes(data[:3500] + bytes([data[3500] ^ 0xFF]) + data[3501:])
    with pytest.raises(ValueError, match="hash mismatch|not a readable ArrayRecord file"):
        list(fmt.records(str(path)))
    at = data.index(bytes([7]) * 3000) + 100  # inside record 7: the error comes at its record, after 0-6
    path.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    read = []
    with pytest.raises(ValueError, match=r"record 7: .*hash mismatch"):
        read.extend(fmt.records(str(path)))
    assert read == [bytes([i]) * 3000 for i in range(7)]
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable ArrayRecord file"):
        fmt.count(str(path))
    with pytest.raises(ValueError, match="not a readable ArrayRecord file"):
        fmt.read_one(str(path), 0)


@pytest.mark.e2e
@pytest.mark.smoke
def test_the_records_are_the_tfrecord_runs_and_grain_tfds_and_the_reader_read_every_one(tmp_path, tf):
    src = make_input(tmp_path / "in")
    tfr, arr = tmp_path / "tfr", tmp_path / "arr"
    convert("--input", str(src), "--output", str(tfr), *ARGS)
    convert("--input", str(src), "--output", str(arr), *ARGS, "--format", "array_record", "--report", tfds=True)

    # the same plan, order and records: shard for shard, position for position, byte for byte
    want, got = records_by_name(tfr), records_by_name(arr)
    assert len(got) == 30 and got == want
    info = load_info(arr)
    assert info["config"]["format"] == "array_record" and "idx_files" not in info
    assert sum(len(s["shards"]) for s in info["splits"].values()) > 3
    assert not (arr / "idx").exists()
    entries = [json.loads(line) for line in (arr / "index.jsonl").read_text().splitlines()]
    assert all(e["offset"] is None for e in entries)
    for e in entries:  # record is the position: the index finds every record
        assert got[(e["split"], e["path"].encode())][1:] == (e["record"], want[(e["split"], e["path"].encode())][2])
    assert json.loads((arr / "dataset_info.json").read_text())["fileFormat"] == "array_record"

    import grain
    import tensorflow_datasets as tfds

    for split, s in info["splits"].items():
        files = [str(arr / shard["file"]) for shard in s["shards"]]
        stored = [r for f in files for r in registry.get("array_record").records(f)]
        dataset = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(files))
        assert [dataset[i] for i in range(len(dataset))] == stored
        source = reader.source(str(arr), split)
        assert len(source) == len(stored) and source.__getitems__([0, len(stored) - 1]) == [stored[0], stored[-1]]
        data_source = tfds.builder_from_directory(str(arr)).as_data_source(split)
        assert len(data_source) == len(stored)
        assert [data_source[i]["image/filename"] for i in range(len(stored))] == [
            parse_example(r)["image/filename"][0] for r in stored
        ]

    # decode: the values reader.load gives the TFRecord output, without TensorFlow (JPEGs with the accurate DCT, as
    # Pillow decodes them; TensorFlow's default fast one differs by a few levels)
    by_name = {}
    for ex in reader.load(str(tfr), "train", shuffle=False).as_numpy_iterator():
        encoded = ex["image/encoded"]
        if encoded[:2] == b"\xff\xd8":
            image = tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        else:
            image = tf.io.decode_image(encoded, channels=3, expand_animations=False).numpy()
        by_name[ex["image/filename"]] = (image, ex["image/class/label"])
    for i in range(len(reader.source(str(arr), "train"))):
        values = reader.decode(reader.source(str(arr), "train")[i])
        image, label = by_name[values["filename"]]
        assert values["image"].dtype == image.dtype and (values["image"] == image).all()
        assert values["label"] == label
    with pytest.raises(ValueError, match=r"holds array_record shards, which tf.data does not read: use .*source\("):
        reader.load(str(arr), "train")
    with pytest.raises(ValueError, match="source\\(\\) reads ArrayRecord outputs"):
        reader.source(str(tfr), "train")

    result = run_cli("inspect", str(arr), "--verify")
    assert result.returncode == 0, result.stderr
    assert "verified 30 records: chunk hashes, Example parse" in result.stdout
    assert "array_record" in (arr / "report.html").read_text()


@pytest.mark.e2e
def test_the_grain_training_loop_in_the_docs_runs_as_written(tmp_path, monkeypatch):
    """docs/grain.md's loop, the block as it is there, on a converted folder: two epochs of whole batches."""
    import re

    src = make_input(tmp_path / "in", 80)
    convert("--input", str(src), "--output", str(tmp_path / "photos-ar"), "--format", "array_record",
            "--split-ratios", "train=1", "--max-reject-fraction", "0.2")  # fmt: skip
    page = (Path(__file__).parent.parent / "docs" / "grain.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "grain.MapDataset" in b]
    monkeypatch.chdir(tmp_path)
    printed = []
    exec(compile(block, "docs/grain.md", "exec"), {"print": printed.append, "__name__": "docs"})  # noqa: S102
    assert printed == ["5 steps of 32 images"]  # 80 records, 2 epochs: 160 in batches of 32


@pytest.mark.e2e
def test_nights_cross_formats_reusing_records_and_a_run_replaces_the_other_formats_shards(tmp_path):
    src = make_input(tmp_path / "in", 12)
    night1, night2, night3 = (tmp_path / f"n{i}" for i in (1, 2, 3))
    convert("--input", str(src), "--output", str(night1), *ARGS)
    convert("--input", str(src), "--output", str(night2), *ARGS, "--format", "array_record",
            "--incremental-from", str(night1))  # fmt: skip
    convert("--input", str(src), "--output", str(night3), *ARGS, "--incremental-from", str(night2))
    assert load_info(night2)["incremental"]["reused"] == 12 and load_info(night3)["incremental"]["reused"] == 12
    tfrecord_files = sorted(p.name for p in night1.iterdir() if ".tfrecord-" in p.name)
    for name in tfrecord_files:  # through ArrayRecord and back: the same bytes
        assert (night3 / name).read_bytes() == (night1 / name).read_bytes(), name

    # the same output, the other format: the old shards and their idx/ files go at publish
    convert("--input", str(src), "--output", str(night1), *ARGS, "--format", "array_record", "--overwrite")
    names = sorted(p.name for p in night1.iterdir())
    assert not [n for n in names if ".tfrecord-" in n] and not (night1 / "idx").exists()
    listed = sorted(shard["file"] for s in load_info(night1)["splits"].values() for shard in s["shards"])
    assert [n for n in names if ".array_record-" in n] == listed and listed
    assert run_cli("inspect", str(night1), "--verify").returncode == 0


@pytest.mark.e2e
def test_a_run_killed_half_way_resumes_its_finished_array_record_shards(tmp_path, monkeypatch):
    src = make_input(tmp_path / "in", 18)
    out = tmp_path / "out"
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.result:3:kill")
    killed = run_cli("convert", "--input", str(src), "--output", str(out), *ARGS, "--format", "array_record",
                     "--no-transform", "--no-tfds-metadata", process=True)  # fmt: skip
    assert killed.returncode != 0 and not (out / "_SUCCESS").exists()
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    convert("--input", str(src), "--output", str(out), *ARGS, "--format", "array_record")
    assert load_info(out)["resumed"]["shards"] >= 2
    reference = tmp_path / "ref"
    convert("--input", str(src), "--output", str(reference), *ARGS, "--format", "array_record")
    assert records_by_name(out) == records_by_name(reference)


@pytest.mark.e2e
def test_gs_output_is_the_local_runs_bytes_and_a_failed_upload_leaves_the_old_dataset(gcs, tmp_path, monkeypatch):
    src = make_input(tmp_path / "in", 12)
    local = tmp_path / "local"
    convert("--input", str(src), "--output", str(local), *ARGS, "--format", "array_record")
    remote = f"gs://{BUCKET}/arr"
    convert("--input", str(src), "--output", remote, "--no_auth", *ARGS)  # an older TFRecord dataset
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.upload:2:kill")
    killed = run_cli("convert", "--input", str(src), "--output", remote, "--no_auth", *ARGS, "--format",
                     "array_record", "--overwrite", "--no-transform", "--no-tfds-metadata", process=True)  # fmt: skip
    assert killed.returncode != 0
    published = {b.name[len("arr/") :] for b in gcs.list_blobs(BUCKET, prefix="arr/") if "/." not in b.name}
    assert not [n for n in published if ".array_record-" in n] and "_SUCCESS" in published  # the old dataset
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    convert("--input", str(src), "--output", remote, "--no_auth", *ARGS, "--format", "array_record", "--overwrite")
    blobs = {b.name[len("arr/") :]: b for b in gcs.list_blobs(BUCKET, prefix="arr/")}
    shard_files = [s["file"] for split in load_info(local)["splits"].values() for s in split["shards"]]
    for name in shard_files:
        assert blobs[name].download_as_bytes() == (local / name).read_bytes(), name
    assert not [n for n in blobs if ".tfrecord-" in n or n.startswith("idx/")]
    result = run_cli("inspect", remote, "--verify")
    assert result.returncode == 0, result.stderr
    assert "verified 12 records: chunk hashes" in result.stdout
