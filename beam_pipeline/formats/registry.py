"""The output formats, by name (``get``) and by shard file name (``of_shard``)."""

from __future__ import annotations

from .array_record import FORMAT as ARRAY_RECORD
from .base import OutputFormat, RecordWriter
from .tfrecord import FORMAT as TFRECORD

FORMATS: dict[str, OutputFormat] = {f.name: f for f in (TFRECORD, ARRAY_RECORD)}
DEFAULT = TFRECORD.name

__all__ = ["DEFAULT", "FORMATS", "OutputFormat", "RecordWriter", "get", "of_shard", "shard_parts"]


def get(name: str | None) -> OutputFormat:
    """The format called ``name`` (None: the default); KeyError for an unknown name."""
    return FORMATS[name or DEFAULT]


def shard_parts(basename: str) -> tuple[OutputFormat, str] | None:
    """(format, the name before ``.{format}-``) when ``basename`` is a shard name this tool writes, else None."""
    stem = basename[:-3] if basename.endswith(".gz") else basename
    for fmt in FORMATS.values():
        head, sep, tail = stem.rpartition(f".{fmt.name}-")
        parts = tail.split("-of-")
        if sep and head and len(parts) == 2 and all(p.isdigit() and len(p) == 5 for p in parts):
            return fmt, head
    return None


def of_shard(path: str) -> OutputFormat:
    """The format of a shard file by its name (a path or a base name): a final shard name, or a writer's temp file
    (``train-00003-<uuid>.array_record``); ValueError for another name."""
    name = path.rsplit("/", 1)[-1]
    found = shard_parts(name)
    if found is not None:
        return found[0]
    for fmt in FORMATS.values():
        if name.endswith(f".{fmt.name}"):
            return fmt
    raise ValueError(f"{path}: not a shard name this version writes ({', '.join(FORMATS)})")
