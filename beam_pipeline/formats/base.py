"""The one interface every output format implements (``formats.get(name)`` gives one).

A format owns what depends on how records sit in a file, and nothing else:

- its name (``--format``, dataset.json's ``config.format``, TFDS's ``fileFormat``) and its shard
  names, ``{dataset}-{split}.{name}-00000-of-00004`` (TFDS's own pattern, with ``.gz`` for a gzip
  TFRecord shard);
- writing: ``create(path, compression)`` gives a ``RecordWriter`` whose ``write(record)`` frames
  one record and returns its byte offset in the uncompressed stream (``None`` for a format whose
  records have no byte offsets a reader could seek to);
- the bytes a record adds beyond its own (shard planning);
- reading: every record of a file, checked (``records``); given positions of one file, in order
  (``read_at``); one record where its index entry says (``locate``, then ``read_one``); the count
  (``count``).

Everything else (the Example bytes, the index, the plan, the shuffle, publish) is the same for
every format, so a run in one format and a run in the other hold the same records.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Any


class RecordWriter(abc.ABC):
    """One open shard file: framed records in order. A context manager; ``close`` finishes the file."""

    @abc.abstractmethod
    def write(self, record: bytes) -> int | None:
        """Writes one record; its frame's byte offset in the uncompressed stream, or None (no byte offsets)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finishes and closes the file (a writer may hold the file's footer until then)."""

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class OutputFormat(abc.ABC):
    """An output format: one module (``formats/<name>.py``) and one line in ``formats.FORMATS``."""

    #: ``--format``'s value, the shard names' part after the split, TFDS's ``fileFormat``.
    name: str = ""
    #: The ``--compression`` values the format takes ("none" always).
    compressions: tuple[str, ...] = ("none",)
    #: Bytes the format adds per record beyond the record's own (the plan's size estimate).
    record_overhead: int = 0
    #: Bytes around a record in the file when records have byte offsets (index ``offset``, ``idx/``), else None.
    frame_overhead: int | None = None
    #: The pip extra that installs the format's library ("" when the required packages do).
    extra: str = ""
    #: What ``records`` checks of each record (said by ``inspect --verify``).
    checksums: str = "CRCs"
    #: Whether ``read_one`` on a store (gs://) reads about one record's bytes, not the whole shard: an
    #: incremental run reuses a previous output's records one at a time only where it does.
    ranged_remote_reads: bool = True

    def shard_name(self, name: str, split: str, index: int, count: int, compression: str) -> str:
        suffix = ".gz" if compression == "gzip" else ""
        return f"{name}-{split}.{self.name}-{index:05d}-of-{count:05d}{suffix}"

    def missing(self) -> str | None:
        """Why this format cannot be written or read here (its library is not installed), or None."""
        return None

    @abc.abstractmethod
    def create(self, path: str, compression: str) -> RecordWriter:
        """A writer of a new shard file at ``path`` (local or a store's)."""

    @abc.abstractmethod
    def records(self, path: str) -> Iterator[bytes]:
        """Every record of a shard file, in order, checked (ValueError on a damaged one)."""

    @abc.abstractmethod
    def read_at(self, path: str, wanted: set[int]) -> Iterator[tuple[int, bytes]]:
        """(position, record) of the given positions of one shard, in file order, one at a time."""

    #: The ``index.jsonl`` key that says where ``read_one`` finds a record: its position by default.
    position_key: str = "record"

    def locate(self, entry: Mapping[str, Any]) -> int:
        """Where ``read_one`` finds the record of an ``index.jsonl`` entry (its ``position_key``)."""
        return int(entry[self.position_key])

    @abc.abstractmethod
    def read_one(self, path: str, where: int) -> bytes:
        """The record at ``where`` (``locate``'s answer) of a shard file, checked.

        ValueError when it is damaged or not there (the message says which)."""

    def count(self, path: str) -> int:
        """Records in a shard file."""
        return sum(1 for _ in self.records(path))
