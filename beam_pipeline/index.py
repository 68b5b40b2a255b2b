"""The per-file index (``index.jsonl``): where every converted file's record is, and what it came from.

One JSON line per record, in shard order then record order::

    {"shard": "ds-train.tfrecord-00000-of-00002", "path": "cats/a.jpg", "size": 1234,
     "mtime": 1700000000.25, "split": "train", "record": 0, "offset": 0, "length": 2345,
     "sha256": "…", "label": "cats", "label_id": 0}

``offset`` is where the record's TFRecord frame starts in the shard's
(uncompressed) stream and ``length`` the Example's byte length, so
``read_record_at(shard, offset)`` reads one record without scanning the
shard. ``sha256`` is the stored image's (the record's ``image/sha256``);
``size``/``mtime`` are the source file's as listed (GCS: the object's update
time). Incremental runs (``--incremental-from``) read it to find files that
did not change.

Each shard writer writes its shard's lines to a part file next to the temp
shard (``_index/``, never published); finalize streams the chosen parts into
``index.jsonl``, putting the final shard name first on each line. Memory: a
line at a time, on both sides.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Mapping
from typing import IO, Any

from apache_beam.io.filesystems import FileSystems

from .listing import Ref

INDEX_JSONL = "index.jsonl"
# Inside the staging folder, never published: one index part per written shard.
INDEX_PARTS = "_index"
# A TFRecord frame: length (8 bytes), its CRC (4), data, data CRC (4).
FRAME_OVERHEAD = 16


def extras_digest(ref: Ref) -> str:
    """A short digest of the manifest's extra columns: a record is reusable only if they are unchanged."""
    if not ref.extras:
        return ""
    text = json.dumps([[k, v] for k, v in ref.extras], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def part_line(ref: Ref, record: int, offset: int, length: int, sha256: str, label_id: int | None) -> str:
    """One record's index line as the writer stores it (finalize adds the shard's final name in front)."""
    entry: dict[str, Any] = {
        "path": ref.relpath,
        "size": ref.size,
        "mtime": ref.mtime,
        "split": ref.split,
        "record": record,
        "offset": offset,
        "length": length,
        "sha256": sha256,
        "label": ref.label,
        "label_id": label_id,
    }
    digest = extras_digest(ref)
    if digest:
        entry["extras"] = digest
    return json.dumps(entry, ensure_ascii=False) + "\n"


def with_shard(line: str, shard_file: str) -> str:
    """A part line with ``"shard"`` first (a string splice: no parse per line in finalize)."""
    return '{"shard": ' + json.dumps(shard_file, ensure_ascii=False) + ", " + line[1:]


def write_index(parts: list[tuple[str, str]], dest: str) -> None:
    """Streams (part path, final shard file name) parts, in order, into ``dest``."""
    with FileSystems.create(dest, compression_type="uncompressed") as out:
        for part, shard_file in parts:
            with FileSystems.open(part, compression_type="uncompressed") as fh:
                for raw in fh:
                    line = raw.decode("utf-8")
                    if line.strip():
                        out.write(with_shard(line, shard_file).encode("utf-8"))


def read_index(path: str) -> Iterator[dict[str, Any]]:
    """The entries of an ``index.jsonl`` (local or gs://), streamed."""
    with FileSystems.open(path, compression_type="uncompressed") as fh:
        for raw in fh:
            if raw.strip():
                yield json.loads(raw.decode("utf-8"))


def read_record_at(fh: IO[bytes], offset: int) -> bytes:
    """The record whose frame starts at ``offset`` of an uncompressed TFRecord stream (CRCs not checked)."""
    fh.seek(offset)
    header = fh.read(12)
    if len(header) != 12:
        raise ValueError(f"no TFRecord frame at offset {offset}")
    (length,) = struct.unpack("<Q", header[:8])
    data = fh.read(length)
    if len(data) != length:
        raise ValueError(f"truncated TFRecord at offset {offset}")
    return data


def unchanged(entry: Mapping[str, Any], ref: Ref) -> bool:
    """The previous run's entry describes this very file: same relative path, size and mtime."""
    return entry.get("path") == ref.relpath and entry.get("size") == ref.size and entry.get("mtime") == ref.mtime
