"""The output-format seam (beam_pipeline/formats): the registry, and every format's writer and readers."""

from __future__ import annotations

import ast
import gzip
import io
from pathlib import Path

import pytest
from apache_beam.io.tfrecordio import _TFRecordUtil

from beam_pipeline import metadata
from beam_pipeline.formats import registry
from beam_pipeline.formats.tfrecord import read_record_at

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "beam_pipeline"
RECORDS = [b"", b"x", bytes(range(256)) * 40, b"last"]


def test_shard_names_say_their_format_and_are_found_again():
    tf = registry.get("tfrecord")
    assert registry.get(None) is tf and registry.DEFAULT == "tfrecord"
    assert tf.shard_name("pets", "train", 0, 4, "none") == "pets-train.tfrecord-00000-of-00004"
    assert tf.shard_name("pets", "train", 3, 4, "gzip") == "pets-train.tfrecord-00003-of-00004.gz"
    assert registry.shard_parts("pets-train.tfrecord-00003-of-00004.gz") == (tf, "pets-train")
    assert registry.of_shard("gs://b/out/my.set-val.tfrecord-00000-of-00001") is tf
    for not_ours in ("pets-train.tfrecord-0-of-4", "pets-train.tfrecord", ".tfrecord-00000-of-00001", "a.txt"):
        assert registry.shard_parts(not_ours) is None and not metadata.is_shard_file(not_ours)
    ar = registry.get("array_record")
    assert ar.shard_name("pets", "val", 2, 3, "none") == "pets-val.array_record-00002-of-00003"
    assert registry.of_shard("/out/pets-val.array_record-00002-of-00003") is ar
    assert metadata.is_shard_file("pets-val.array_record-00002-of-00003")  # publish, retention and clean see it
    assert metadata.is_idx_file("idx/pets-train.tfrecord-00000-of-00001.idx")
    assert registry.of_shard("/out/.beam_pipeline-tmp-x/train-00003-0f3a.array_record") is ar  # a writer's temp file
    with pytest.raises(ValueError, match="not a shard name this version writes"):
        registry.of_shard("/out/notes.txt")
    with pytest.raises(KeyError):
        registry.get("parquet")


@pytest.mark.parametrize("name", sorted(registry.FORMATS))
def test_every_format_reads_back_what_it_wrote(tmp_path, name):
    """Write, then each reader: every record in order, the count, chosen positions, one record by its entry."""
    fmt = registry.get(name)
    if fmt.missing():
        pytest.skip(fmt.missing())
    path = str(tmp_path / fmt.shard_name("ds", "train", 0, 1, "none"))
    with fmt.create(path, "none") as out:
        wheres = [out.write(r) for r in RECORDS]
    assert list(fmt.records(path)) == RECORDS
    assert fmt.count(path) == len(RECORDS)
    assert list(fmt.read_at(path, {1, 3})) == [(1, RECORDS[1]), (3, RECORDS[3])]
    assert list(fmt.read_at(path, set())) == []
    for i, (record, offset) in enumerate(zip(RECORDS, wheres, strict=True)):
        entry = {"record": i, "offset": offset, "length": len(record)}
        assert fmt.read_one(path, fmt.locate(entry)) == record
    if fmt.frame_overhead is None:
        assert wheres == [None] * len(RECORDS)
    else:  # byte offsets: each frame starts where the ones before it end
        sizes = [len(r) + fmt.frame_overhead for r in RECORDS]
        assert wheres == [sum(sizes[:i]) for i in range(len(RECORDS))]


def test_tfrecord_frames_are_beams_and_gzip_shards_are_gzip(tmp_path):
    fmt = registry.get("tfrecord")
    plain, packed = str(tmp_path / "a.tfrecord-00000-of-00001"), str(tmp_path / "a.tfrecord-00000-of-00001.gz")
    for path, compression in ((plain, "none"), (packed, "gzip")):
        with fmt.create(path, compression) as out:
            for r in RECORDS:
                out.write(r)
    beam_file = io.BytesIO()
    for r in RECORDS:
        _TFRecordUtil.write_record(beam_file, r)
    assert Path(plain).read_bytes() == beam_file.getvalue() == gzip.decompress(Path(packed).read_bytes())
    assert list(fmt.records(packed)) == RECORDS
    with open(plain, "rb") as fh:
        assert read_record_at(fh, len(RECORDS[0]) + 16) == RECORDS[1]


def test_a_damaged_record_is_a_value_error_that_says_where(tmp_path):
    fmt = registry.get("tfrecord")
    path = tmp_path / "a.tfrecord-00000-of-00001"
    with fmt.create(str(path), "none") as out:
        out.write(b"one")
        second = out.write(b"two")
    data = bytearray(path.read_bytes())
    data[-5] ^= 1  # the second record's data
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"@{second}: not a valid TFRecord frame"):
        fmt.read_one(str(path), second)
    with pytest.raises(ValueError, match="no record there"):
        fmt.read_one(str(path), len(data))
    with pytest.raises(ValueError):
        list(fmt.records(str(path)))


def test_only_a_formats_own_module_imports_beams_private_tfrecord_helpers():
    """Framing, CRCs and record reads live behind the seam: no other module reaches for _TFRecordUtil."""
    users = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "apache_beam.io.tfrecordio":
                if any(alias.name.startswith("_") for alias in node.names):
                    users.append(str(path.relative_to(PACKAGE)))
    assert users == ["formats/tfrecord.py"]
