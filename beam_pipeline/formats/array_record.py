"""ArrayRecord: Riegeli chunks with an index in the footer, read at any position (JAX/Grain, TFDS data sources).

Written for random access as TFDS and Grain write it: one record per chunk group (``group_size:1``), so
reading record *i* decodes that record only. The chunks are stored uncompressed: the records are mostly
JPEG/PNG bytes, which zstd (ArrayRecord's default) cannot shrink, and reading them back would pay for it.
``--compression`` must be ``none`` for this format.

The library writes and reads local files only (its own GCS path does not go through Beam's FileSystems,
nor honour a storage emulator): a shard bound for ``gs://`` is written to a local temporary file, then copied
to its place when it is complete (through Beam's ``FileSystems``), so the local disk a writer needs is the shards it
has open, one per writer thread. A shard on a store is read from a local copy of it.

Records have no byte offsets: ``index.jsonl``'s ``offset`` is null, ``record`` is the position, and there
are no ``idx/`` files (DALI's index is TFRecord's).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from .. import failpoints
from .base import OutputFormat, RecordWriter

# One record per chunk group (random access), stored as it is.
WRITER_OPTIONS = "group_size:1,uncompressed"
# A reader of one record, or a few: no read-ahead, no thread pool.
RANDOM_ACCESS = "readahead_buffer_size:0,max_parallelism:0"
# Records read per call while streaming a whole file.
BATCH = 256
# Local shards kept open per process for one-record reads (a night's reused records: each open reads the
# shard's footer index, ~24 bytes per record).
OPEN_READERS = 8


def _module() -> Any:
    """The library; MissingExtraError (one line: what to install) where it is not installed."""
    try:
        from array_record.python import array_record_module
    except ImportError as e:
        from ..errors import MissingExtraError

        raise MissingExtraError("ArrayRecord shards need the array-record package", "array_record") from e
    return array_record_module


def _is_remote(path: str) -> bool:
    return "://" in path


# Local copies of store shards: named with the process's id, so a later process removes those of a process
# that died before removing its own (killed, preempted, out of memory).
_TEMP_PREFIX = "beam_pipeline-ar-"
_swept: set[str] = set()
_sweep_lock = threading.Lock()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def sweep_dead_copies(folder: str | None = None) -> list[str]:
    """Removes the local shard copies that processes no longer running left in ``folder`` (the temp folder)."""
    folder = folder or tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            pid = name[len(_TEMP_PREFIX) :].split("-", 1)[0] if name.startswith(_TEMP_PREFIX) else ""
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, name))
                    removed.append(name)
    return removed


def _local_temp(suffix: str) -> str:
    folder = tempfile.gettempdir()
    with _sweep_lock:
        if folder not in _swept:  # once per process and folder
            _swept.add(folder)
            sweep_dead_copies(folder)
    fd, local = tempfile.mkstemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", suffix=suffix, dir=folder)
    os.close(fd)
    return local


def _readable(path: str) -> None:
    """Raises the file's own OSError (gone, permission denied) before the library, which says only "not ok"."""
    with open(path, "rb"):
        pass


def _not_readable(path: str) -> ValueError:
    return ValueError(f"{path}: not a readable ArrayRecord file (damaged, cut short or another format)")


class ArrayRecordFileWriter(RecordWriter):
    """Records into a local ArrayRecord file; for a store's path, the file is copied there once complete."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._local = _local_temp(".array_record") if _is_remote(path) else path
        try:
            self._writer = _module().ArrayRecordWriter(self._local, WRITER_OPTIONS)
        except RuntimeError as e:  # the library's: a folder that is not there, a file it may not create
            self._drop_local()
            raise OSError(f"writing ArrayRecord shard {self._path}: {str(e).splitlines()[0][:200]}") from None
        except BaseException:
            self._drop_local()
            raise
        self._closed = False

    def write(self, record: bytes) -> None:
        try:
            self._writer.write(record)
        except RuntimeError as e:  # the library's I/O errors (a full disk): said as what they are
            raise OSError(f"writing ArrayRecord shard {self._path}: {e}") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()  # raises on a failed write of the last chunks or the footer
        except RuntimeError as e:
            self._drop_local()
            raise OSError(f"writing ArrayRecord shard {self._path}: {e}") from None
        except BaseException:
            self._drop_local()
            raise
        if self._local != self._path:
            try:
                failpoints.hit("writer.upload")
                _copy(self._local, self._path)  # a GCS object appears only when its upload completes
            finally:
                self._drop_local()

    def abort(self) -> None:
        """The shard failed half-way: the file is closed and, when it was bound for a store, never copied."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._writer.close()
        self._drop_local()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _drop_local(self) -> None:
        if self._local != self._path:
            with contextlib.suppress(OSError):
                os.remove(self._local)


def _copy(src: str, dst: str) -> None:
    """``storage.copy_file``: through Beam's FileSystems, a store's path on either side."""
    from .. import storage

    storage.copy_file(src, dst)


def _open_checked(local: str, options: str, shown: str) -> Any:
    """An open ArrayRecordReader of the local file ``local`` (``shown``: the path said in errors). The file's own
    OSError (gone, permission denied) comes first; the library says only "not ok" and does not raise."""
    _readable(local)
    reader = _module().ArrayRecordReader(local, options)
    if not reader.ok():
        with contextlib.suppress(RuntimeError):  # closing a failed reader raises its error again
            reader.close()
        raise _not_readable(shown)
    return reader


def _one(path: str, reader: Any, where: int) -> bytes:
    total = reader.num_records()
    if not 0 <= where < total:
        raise ValueError(f"{path}: no record {where} (the shard has {total})")
    return _checked(path, reader.read, [where])[0]


@contextlib.contextmanager
def _reader(path: str, options: str = "") -> Iterator[Any]:
    """An open ArrayRecordReader of ``path`` (a store's file through a local copy); ValueError if unreadable."""
    local = path
    if _is_remote(path):
        local = _local_temp(".array_record")
    try:
        if local != path:
            _copy(path, local)
        reader = _open_checked(local, options, path)
        try:
            yield reader
        finally:
            reader.close()
    finally:
        if local != path:
            with contextlib.suppress(OSError):
                os.remove(local)


def _checked(path: str, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except RuntimeError as e:  # a chunk's hash mismatch, a position past the end
        raise ValueError(f"{path}: {str(e).splitlines()[0][:200]}") from None


class _OpenReaders:
    """A few local shards' random-access readers, kept open (least recently used closed first), one lock each.

    A reader is opened outside the cache's lock (opening reads the shard's footer index), so the read
    threads of other shards do not wait for it; the first of two threads opening the same shard wins.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[tuple[Any, ...], tuple[Any, threading.Lock]] = collections.OrderedDict()

    def read(self, path: str, where: int) -> bytes:
        st = os.stat(path)  # FileNotFoundError for a gone shard; a rewritten one gets a new reader
        key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
        if entry is None:
            entry = self._add(key, _open_checked(path, RANDOM_ACCESS, path))
        reader, lock = entry
        with lock:
            if not reader.is_open():  # closed by an eviction since it was taken: read through a fresh one
                return _read_one_uncached(path, where)
            return _one(path, reader, where)

    def _add(self, key: tuple[Any, ...], reader: Any) -> tuple[Any, threading.Lock]:
        evicted = []
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                entry = self._open[key] = (reader, threading.Lock())
                reader = None
                while len(self._open) > self._size:
                    evicted.append(self._open.popitem(last=False)[1])
            self._open.move_to_end(key)
        if reader is not None:  # another thread opened this shard first
            reader.close()
        for old, old_lock in evicted:
            with old_lock:  # after any read in progress
                old.close()
        return entry


_READERS = _OpenReaders(OPEN_READERS)


def _read_one_uncached(path: str, where: int) -> bytes:
    with _reader(path, RANDOM_ACCESS) as reader:
        return _one(path, reader, where)


class ArrayRecord(OutputFormat):
    name = "array_record"
    compressions = ("none",)
    # Per record with group_size:1, uncompressed: its chunk's header, the footer's index entry and Riegeli's
    # block headers (24 bytes per 64 KiB). Measured against TFRecord's 16: +42 bytes per 2.4 KB tile, +200
    # per 144 KB photo. The shard plan is the same for every format (planning.RECORD_OVERHEAD), so an
    # ArrayRecord shard holds the same records as the TFRecord one, a little larger.
    record_overhead = 60
    frame_overhead = None
    extra = "array_record"
    checksums = "chunk hashes"
    ranged_remote_reads = False  # a store's shard is read from a local copy of it

    def missing(self) -> str | None:
        if importlib.util.find_spec("array_record") is None:
            version = ".".join(map(str, sys.version_info[:2]))
            return (
                f"--format array_record needs the array-record package, not installed in this Python {version} "
                "(pip install 'beam_pipeline[array_record]')"
            )
        return None

    def create(self, path: str, compression: str) -> ArrayRecordFileWriter:
        if compression != "none":
            raise ValueError(f"ArrayRecord shards are not {compression}-compressed (--compression none)")
        return ArrayRecordFileWriter(path)

    def records(self, path: str) -> Iterator[bytes]:
        """In batches; a batch that fails is read again one record at a time, so the error comes at its record."""
        with _reader(path) as reader:
            total = reader.num_records()
            for start in range(0, total, BATCH):
                end = min(start + BATCH, total)
                try:
                    batch = reader.read(start, end)
                except RuntimeError:
                    for i in range(start, end):
                        yield _checked(f"{path} record {i}", reader.read, [i])[0]
                else:
                    yield from batch

    def read_at(self, path: str, wanted: set[int]) -> Iterator[tuple[int, bytes]]:
        if not wanted:
            return
        with _reader(path, RANDOM_ACCESS) as reader:
            positions = sorted(i for i in wanted if 0 <= i < reader.num_records())
            for start in range(0, len(positions), BATCH):
                some = positions[start : start + BATCH]
                yield from zip(some, _checked(path, reader.read, some), strict=True)

    def read_one(self, path: str, where: int) -> bytes:
        """A local shard's reader stays open for the next record (``_OpenReaders``); a store's shard is fetched."""
        if _is_remote(path):
            return _read_one_uncached(path, where)
        return _READERS.read(path, where)

    def count(self, path: str) -> int:
        with _reader(path) as reader:
            return int(reader.num_records())


FORMAT = ArrayRecord()
