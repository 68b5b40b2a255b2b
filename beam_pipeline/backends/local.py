"""The local backend: files on this machine's (or a shared mount's) file system."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

# errno values of a hard link the file system cannot make (another device, no links, too many): copy instead.
NO_HARD_LINKS = (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EOPNOTSUPP)


def read_image(path: str, size: int, options: Any, header_bytes: int, check_header: Callable[..., Any]) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        if options is not None and size > 4 * header_bytes:
            verdict = check_header(fh.read(header_bytes), options)
            if verdict is not None:
                raise verdict
            fh.seek(0)  # re-read the head: cheaper than joining (a copy of the whole file)
        limit = options.max_file_bytes if options is not None else 0
        if not limit:
            return fh.read()
        # One byte over the limit proves a file that grew. read(n) allocates n bytes up front, so
        # ask for the listed size (+1, which proves it grew) first, not the limit (256 MB per read).
        first = fh.read(min(limit, size) + 1) if size >= 0 else fh.read(limit + 1)
        if size < 0 or len(first) <= size or len(first) > limit:
            return first
        return first + fh.read(limit + 1 - len(first))  # it grew since it was listed: the rest, to the limit


def stat(path: str) -> Any:
    fs = FileSystems.get_filesystem(path)
    return fs.metadata(path) if fs.exists(path) else None


def write_atomic(path: str, data: bytes) -> None:
    """Written under a temporary name, then renamed into place: whole or not at all."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    part = f"{path}.{os.getpid()}-{threading.get_ident()}.part"
    with open(part, "wb") as fh:
        fh.write(data)
    os.replace(part, path)


def link_or_copy(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)  # no second copy of the bytes
    except OSError as e:
        if e.errno not in NO_HARD_LINKS:
            raise
        FileSystems.copy([src], [dst])


def subfolders(prefix: str) -> list[str]:
    """The folders whose full paths start with ``prefix`` (a folder and the start of a name): one listdir."""
    folder, start = os.path.split(prefix)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(folder, n) for n in names if n.startswith(start))


def has_any(folder: str) -> bool:
    return os.path.isdir(folder)


# An odd entry's rejects: (path, is a folder) -> reject records (the listing's, which knows the input's root).
Odd = Callable[[str, bool], Iterable[Any]]


def is_folder(path: str) -> bool:
    return os.path.isdir(path)


def kind(path: str) -> str | None:
    return "folder" if os.path.isdir(path) else ("file" if os.path.exists(path) else None)


def is_file(path: str) -> bool:
    return os.path.exists(path) and not os.path.isdir(path)


def resolved(path: str) -> str:
    return os.path.realpath(path)


def absolute_pattern(text: str) -> str:
    return os.path.join(os.getcwd(), os.path.expanduser(text))


def usage(folder: str) -> tuple[int, int, float | None]:
    """(files, bytes, newest modification time) of everything under ``folder`` (links not followed)."""
    files, size, newest = 0, 0, None
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:  # removed meanwhile (its run cleaning up)
                continue
            files, size = files + 1, size + st.st_size
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return files, size, newest


def entries(folder: str, into: Sequence[str]) -> list[str]:
    """The folder's own names, and ``SUB/name`` for the names inside each of its folders ``into`` names."""
    if not os.path.isdir(folder):
        return []
    found = os.listdir(folder)
    for sub in into:
        if os.path.isdir(os.path.join(folder, sub)):
            found += [f"{sub}/{n}" for n in os.listdir(os.path.join(folder, sub))]
    return found


def remove_tree(path: str) -> None:
    shutil.rmtree(path)


def one_level(folder: str, odd: Odd) -> Iterator[Any]:
    """Direct entries of ``folder``, by name: subfolders as str (not entered through a link, like os.walk),
    files as (path, size, mtime), and what ``odd`` makes of a folder (each) or a file that cannot be read."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:  # as os.walk: an unreadable folder lists nothing
        return
    for entry in entries:
        if entry.is_dir():  # follows symlinks, like os.walk's dirnames
            yield from odd(entry.path, True)
            if not entry.is_symlink():  # os.walk does not descend into a linked folder
                yield entry.path
            continue
        try:
            yield entry.path, os.path.getsize(entry.path), os.path.getmtime(entry.path)
        except OSError:
            yield from odd(entry.path, False)


def tree(folder: str, odd: Odd) -> Iterator[Any]:
    """Every file below ``folder`` as (path, size, mtime); what ``odd`` makes of each folder and odd file."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames:
            yield from odd(os.path.join(dirpath, name), True)
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                yield path, os.path.getsize(path), os.path.getmtime(path)
            except OSError:  # Beam's listing drops it too
                yield from odd(path, False)


def move(pairs: Sequence[tuple[str, str]], kept: set[str], each: Callable[[], None] | None, guard: Any) -> None:
    """Renames one at a time, the lease checked around each; a src in ``kept`` is linked, not moved."""
    for src, dst in pairs:
        if each:
            each()
        if guard:
            guard.before()
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if src in kept:
            _link_in_place_of(src, dst)
        else:
            os.replace(src, dst)
        if guard:
            guard.after()


def _link_in_place_of(src: str, dst: str) -> None:
    """``dst`` becomes a second name of ``src`` (replacing what was there in one rename); ``src`` stays.

    The link is made beside ``src`` first (in the staging folder: a kill in between leaves nothing in the
    output). Done already when they are one file (a retried publish); moved where there are no hard links.
    """
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return
    part = src + ".link"
    if os.path.lexists(part):
        os.remove(part)
    try:
        os.link(src, part)
    except OSError as e:
        if e.errno not in NO_HARD_LINKS:
            raise
        os.replace(src, dst)
        return
    os.replace(part, dst)


def delete(paths: Sequence[str], each: Callable[[], None] | None, guard: Any) -> None:
    for path in paths:
        if each:
            each()
        if guard:
            guard.before()
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(path, ignore_errors=True)
        if guard:
            guard.after()


def remove_folder(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_empty_dirs(root: str) -> None:
    """Folders left empty under ``root`` (after moving or deleting their files) go."""
    if not os.path.isdir(root):
        return
    for dirpath, _, _ in sorted(os.walk(root), key=lambda t: -len(t[0])):
        try:
            os.rmdir(dirpath)  # only succeeds when empty
        except OSError:
            pass


# ---- compare-and-swap: the lease ----------------------------------------------------------------


class LockedFile:
    """One file changed only by compare-and-swap: created whole by a hard link (fails if it exists), changed
    or removed under ``flock`` on the file, after checking it is still the file at that path (a removed one is
    retried). The token is the content read."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> tuple[bytes, Any] | None:
        with self._locked() as fd:
            if fd is None:
                return None
            data = _read_fd(fd)
            return data, data

    def create(self, data: bytes) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        part = f"{self.path}.{os.getpid()}-{threading.get_ident()}.part"
        with open(part, "wb") as fh:
            fh.write(data)
        try:
            os.link(part, self.path)  # whole or not at all; fails if it exists
            return True
        except FileExistsError:
            return False
        finally:
            os.remove(part)

    def replace(self, data: bytes, token: Any) -> bool:
        with self._locked() as fd:
            if fd is None or _read_fd(fd) != token:
                return False
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            return True

    def delete(self, token: Any) -> bool:
        with self._locked() as fd:
            if fd is None or _read_fd(fd) != token:
                return False
            os.remove(self.path)
            return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int | None]:
        """The file, open and locked (None if there is none); the lock is on the file at the path."""
        import fcntl

        while True:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                yield None
                return
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError as e:  # a file system without locks: unlocked, best effort
                    if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                try:
                    same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    yield fd
                    return
            finally:
                os.close(fd)  # releases the lock


def _read_fd(fd: int) -> bytes:
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 65536, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)
