"""TFRecord: records framed as length, masked CRC32C of the length, data, masked CRC32C of the data.

The only module that uses Beam's TFRecord helpers (``_TFRecordUtil``: its C CRC32C and its checked
reader). Shards may be gzip-compressed (``--compression gzip``, a ``.gz`` name); a record's
``offset`` is its frame's start in the uncompressed stream, so ``idx/`` files (DALI's
``tfrecord2idx`` format) exist for uncompressed shards only.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil

from .base import OutputFormat, RecordWriter

# length (8 bytes), its CRC (4), data, data CRC (4)
FRAME_OVERHEAD = 16
_HEAD = 12


def frame_record(record: bytes) -> tuple[bytes, bytes]:
    """The frame around ``record``: (length + its masked CRC32C, the record's masked CRC32C).

    The same bytes as Beam's ``_TFRecordUtil.write_record`` (and its C CRC32C), without joining them
    to a copy of the record.
    """
    length = struct.pack("<Q", len(record))
    masked = _TFRecordUtil._masked_crc32c
    return length + struct.pack("<I", masked(length)), struct.pack("<I", masked(record))


def compression_type(name: str) -> str:
    return CompressionTypes.GZIP if name == "gzip" else CompressionTypes.UNCOMPRESSED


class TFRecordWriter(RecordWriter):
    """Frames records into a file Beam's ``FileSystems`` creates (local or a store's, gzip or not)."""

    def __init__(self, path: str, compression: str) -> None:
        self._out: Any = FileSystems.create(path, compression_type=compression_type(compression))
        self._offset = 0

    def write(self, record: bytes) -> int:
        head, tail = frame_record(record)
        out = self._out
        out.write(head)  # three writes, no joined copy of the record (the file object buffers the small ones)
        out.write(record)
        out.write(tail)
        offset = self._offset
        self._offset = offset + len(record) + FRAME_OVERHEAD
        return offset

    def close(self) -> None:
        self._out.close()


class TFRecord(OutputFormat):
    name = "tfrecord"
    compressions = ("none", "gzip")
    record_overhead = FRAME_OVERHEAD
    frame_overhead = FRAME_OVERHEAD
    position_key = "offset"  # a record's frame offset: read with one seek, no scan

    def create(self, path: str, compression: str) -> TFRecordWriter:
        return TFRecordWriter(path, compression)

    def records(self, path: str) -> Iterator[bytes]:
        with FileSystems.open(path) as fh:  # compression from the name (.gz)
            while (record := _TFRecordUtil.read_record(fh)) is not None:
                yield record

    def read_at(self, path: str, wanted: set[int]) -> Iterator[tuple[int, bytes]]:
        """The other records are skipped by their length headers, seeking past their bytes (on GCS a seek is a
        new ranged read, not a download; a gzip shard decompresses past them). CRCs not checked."""
        if not wanted:
            return
        last = max(wanted)
        with FileSystems.open(path) as fh:
            for index in range(last + 1):
                header = fh.read(_HEAD)
                if len(header) < _HEAD:
                    break
                (length,) = struct.unpack("<Q", header[:8])
                if index in wanted:
                    record = fh.read(length)
                    fh.read(4)
                    yield index, record
                else:
                    fh.seek(length + 4, os.SEEK_CUR)

    def read_one(self, path: str, where: int) -> bytes:
        """Read at byte ``where`` of an uncompressed shard; Beam's reader checks both masked CRC32Cs (C speed)."""
        offset = where
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.seek(offset)
            try:
                data = _TFRecordUtil.read_record(fh)
            except ValueError:  # its message holds the whole record in hex: not repeated
                raise ValueError(f"{path}@{offset}: not a valid TFRecord frame (CRC mismatch or cut short)") from None
        if data is None:
            raise ValueError(f"{path}@{offset}: no record there (the shard ends)")
        return data


def read_record_at(fh: Any, offset: int) -> bytes:
    """The record whose frame starts at ``offset`` of an open uncompressed TFRecord stream (CRCs not checked)."""
    fh.seek(offset)
    header = fh.read(_HEAD)
    if len(header) != _HEAD:
        raise ValueError(f"no TFRecord frame at offset {offset}")
    (length,) = struct.unpack("<Q", header[:8])
    data = fh.read(length)
    if len(data) != length:
        raise ValueError(f"truncated TFRecord at offset {offset}")
    return data


FORMAT = TFRecord()
