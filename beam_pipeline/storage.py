"""Storage I/O, local and ``gs://`` alike: an image file's bytes, small text files, what a failed read means.

Every stage reads and writes through here or Beam ``FileSystems`` directly;
this module imports no stage (only ``images``, for the limits a read checks
and the reason codes a failed read becomes), so anything may import it.

    data = read_bytes("gs://bucket/a.jpg", size, image_options)  # raises Rejected: missing, unreadable, too_large
    write_text(path, text); read_json(path); list_dir(folder)

``permanent_reason`` tells an error that says the file is gone or forbidden
for good (a reject) from one that may pass (a 429/503, a reset connection,
an expired token: the bundle fails and the runner retries it).

One layer, two backends (``backends.local``, ``backends.gcs``) behind one interface; callers ask
it, never the path's scheme::

    backend_for(path)                   # the module that does it for this path
    open_lines(path); read_bytes(path, size, options)   # streams, ranged reads
    write_atomic(path, text)            # whole or not at all
    sizes_under(folder); files_under(folder); subfolders(prefix); has_any(folder)
    move_files(pairs, existing, ...); delete_files(paths, ...)   # batched on GCS
    cas_file(path)                      # create-if-absent, replace/delete-if-unchanged (the lease)

Every GCS client is made in ``backends.gcs`` (``gcs.gcsio()``, ``gcs.client()``).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any, Protocol

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from .backends import gcs, local
from .backends.failures import causes as causes
from .backends.gcs import BATCH as BATCH
from .backends.gcs import ChangesTooOften as ChangesTooOften
from .backends.local import NO_HARD_LINKS as NO_HARD_LINKS
from .errors import UsageError, last_line
from .images.check import check_header
from .images.options import ImageOptions, Rejected
from .vocab.reasons import MISSING, TOO_LARGE, UNREADABLE

_LOG = logging.getLogger(__name__)

# A file larger than this has its head read and checked (check_header) before the rest.
HEADER_BYTES = 256 * 1024
MB = 1_000_000


# ---- small files ------------------------------------------------------------------------------


def write_text(path: str, text: str) -> None:
    with FileSystems.create(path) as fh:
        fh.write(text.encode("utf-8"))


# Buffer of a file read a line at a time.
LINE_BUFFER_BYTES = 1 << 20


def open_lines(path: str) -> io.BufferedReader:
    """``path`` (local or gs://) opened to be read a line at a time, through a buffer.

    A gs:// file from ``FileSystems.open`` has no ``peek``, so each line read from it alone costs one
    ``read`` call per byte (~120 µs a line: 20 minutes for a 10 M-line index); the buffer reads 1 MB at a time.
    """
    return io.BufferedReader(FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED), LINE_BUFFER_BYTES)


def read_json(path: str) -> dict[str, Any]:
    """A JSON file (local or gs://), e.g. dataset.json."""
    with FileSystems.open(path, compression_type="uncompressed") as fh:
        return json.loads(fh.read().decode("utf-8"))


def read_json_object(path: str) -> dict[str, Any]:
    """``read_json`` of a file this tool writes as one JSON object (dataset.json): ValueError when the file is
    damaged (not UTF-8 or JSON, cut short, nested deeper than json.loads goes, not an object). A read that
    fails (a transient storage error, a missing file) raises as it did: only damage is told apart."""
    try:
        value = read_json(path)
    except RecursionError:
        raise ValueError(f"{path}: JSON nested deeper than Python's reader goes") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def list_dir(path: str) -> list[str]:
    """Full paths of the files directly inside ``path`` (local or gs://)."""
    pattern = FileSystems.join(path, "*")
    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # noqa: BLE001 - a missing folder lists as empty
        return []
    prefix = path.rstrip("/") + "/"
    return sorted(m.path for m in found if "/" not in m.path[len(prefix) :])


# ---- reading ---------------------------------------------------------------------------------

# errno values that say the file itself is unreadable for good (a retry cannot help).
_MISSING_ERRNOS = {errno.ENOENT, errno.ENOTDIR}
_PERMANENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG}


def permanent_reason(error: BaseException) -> str | None:
    """``missing`` or ``unreadable`` when ``error`` says the file is gone or forbidden; None for anything else.

    Local files: by errno. GCS (google-cloud-storage, which Beam's gcsio uses
    too): NotFound (404) is missing, Forbidden (403) is unreadable unless GCS
    says it is a rate limit. Beam wraps some errors in BeamIOError (with the
    cause in ``exception_details`` or ``__cause__``); those are looked through.
    Everything else, a 429/5xx after the client's own retries, a reset
    connection, a timeout, a failed token refresh (401), is transient.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            if error.errno in _MISSING_ERRNOS:
                return MISSING
            if error.errno in _PERMANENT_ERRNOS:
                return UNREADABLE
            return None
        try:
            from google.api_core import exceptions as gexc
        except ImportError:  # no GCS support installed: no GCS errors either
            gexc = None
        if gexc is not None:
            if isinstance(error, gexc.NotFound):
                return MISSING
            if isinstance(error, gexc.Forbidden):
                reasons = {str(e.get("reason", "")) for e in getattr(error, "errors", []) or [] if isinstance(e, dict)}
                return None if reasons & {"rateLimitExceeded", "userRateLimitExceeded"} else UNREADABLE
        details = getattr(error, "exception_details", None)  # BeamIOError: {path: exception}
        if isinstance(details, dict) and len(details) == 1:
            error = next(iter(details.values()))
            continue
        error = error.__cause__ or error.__context__
    return None


def permission_denied(error: BaseException) -> bool:
    """True when ``error`` (or what it wraps) says this job may not read the file.

    EACCES/EPERM locally; on GCS a 403 that is not a rate limit.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error.errno in (errno.EACCES, errno.EPERM)
        try:
            from google.api_core import exceptions as gexc
        except ImportError:
            gexc = None
        if gexc is not None and isinstance(error, gexc.Forbidden):
            return permanent_reason(error) == UNREADABLE
        details = getattr(error, "exception_details", None)
        if isinstance(details, dict) and len(details) == 1:
            error = next(iter(details.values()))
            continue
        error = error.__cause__ or error.__context__
    return False


def storage_root(path: str) -> str:
    """``gs://bucket`` of a GCS path; the folder of a local one: where a permission problem lives."""
    if gcs.owns(path):
        return "gs://" + gcs.split(path)[0]
    return os.path.dirname(path) or "."


def read_bytes(path: str, size: int = -1, options: ImageOptions | None = None) -> bytes:
    """The file's bytes, raw (never decompressed by extension).

    Rejected when the file is missing or may not be read (``permanent_reason``),
    or, given ``options``, when it is over ``max_file_bytes`` (by ``size``, from
    the listing, before anything is read; and by what was read) or its head
    already breaks a limit. Any other error is raised: the bundle fails and the
    runner retries it.
    """
    limit = options.max_file_bytes if options is not None else 0
    if limit and size > limit:
        raise Rejected(TOO_LARGE, f"{size} bytes is over --max-file-mb {limit / MB:g}")
    try:
        data = backend_for(path).read_image(path, size, options, HEADER_BYTES, check_header)
    except Rejected:
        raise
    except Exception as e:
        reason = permanent_reason(e)
        if reason is None:
            raise
        rejected = Rejected(reason, f"{type(e).__name__}: {e}")
        rejected.denied = permission_denied(e)  # type: ignore[attr-defined] - read by WriteShardFn
        raise rejected from None
    if limit and len(data) > limit:  # the file grew after it was listed
        raise Rejected(TOO_LARGE, f"{len(data)} bytes is over --max-file-mb {limit / MB:g}")
    return data


# ---- gs:// access before a run ------------------------------------------------------------------
# A check before the pipeline starts gives up after this long (the client retries transient errors until
# then): a wrong bucket, missing credentials or no network is one line within seconds, not the client's
# two-minute retry loop followed by a listing that looks empty.
GCS_CHECK_DEADLINE_S = 15.0
_GCS_CHECK_TIMEOUT_S = (5.0, 10.0)  # connect, read: per request

# Why this process talks to GCS anonymously (no credentials found, --no_auth): said when GCS refuses.
_ANONYMOUS_BECAUSE: dict[str, str] = {}


class GcsAccessError(Exception):
    """A gs:// location could not be checked; the text says why and what to do."""


def settle_gcs_credentials(no_auth: bool = False) -> None:
    """Decides once, quickly, whether this process reaches GCS with credentials or anonymously.

    Beam looks the credentials up on first use, retrying a lookup that finds
    none for ~25 s before it falls back to an anonymous client. Finding none is
    no passing fault (no ``GOOGLE_APPLICATION_CREDENTIALS``, no gcloud login,
    not on Google Cloud), so one lookup decides here and Beam's cache is given
    the answer: anonymous when none are found, with ``--no_auth`` or against
    an emulator; otherwise Beam's own lookup, which then succeeds at once.
    Anonymous reads of a public bucket work either way.
    """
    try:
        from apache_beam.internal.gcp import auth
    except ImportError:  # no GCS support installed
        return
    creds = getattr(auth, "_Credentials", None)
    if creds is None or not hasattr(creds, "_credentials_init"):  # another Beam: it looks them up itself
        return
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        because = "an emulator needs none"
    elif no_auth:
        because = "--no_auth"
    else:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            google.auth.default()
            return
        except DefaultCredentialsError as e:
            because = f"no credentials found: {last_line(e)}"
    with creds._credentials_lock:  # noqa: SLF001 - Beam has no public switch for its anonymous fallback
        creds._credentials_init = True  # noqa: SLF001
        creds._credentials = None  # noqa: SLF001
    _ANONYMOUS_BECAUSE["why"] = because


def gcs_check(path: str, *, folder: bool) -> bool:
    """Whether ``path`` (a gs:// folder: anything under it; a file: the object) exists, asked with a short
    deadline. Raises GcsAccessError naming the cause when GCS cannot be asked or refuses (no network,
    a missing bucket, credentials, permission): never a False for a listing that failed."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, _, name = path[len("gs://") :].partition("/")
    retry = DEFAULT_RETRY.with_timeout(GCS_CHECK_DEADLINE_S)
    try:
        client = gcs.gcsio().client
        if folder:
            prefix = name.rstrip("/") + "/" if name.strip("/") else ""
            blobs = client.list_blobs(bucket, prefix=prefix, max_results=1, timeout=_GCS_CHECK_TIMEOUT_S, retry=retry)
            return any(True for _ in blobs)
        return client.bucket(bucket).get_blob(name, timeout=_GCS_CHECK_TIMEOUT_S, retry=retry) is not None
    except Exception as e:  # noqa: BLE001 - every failure is named (gcs_problem), none passes for "not there"
        raise GcsAccessError(gcs_problem(e, bucket)) from None


def gcs_problem(error: BaseException, bucket: str) -> str:
    """One line: why a request to GCS about ``bucket`` failed, and what to do."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    anonymous = _ANONYMOUS_BECAUSE.get("why")
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    where = f"the GCS emulator at {emulator} (STORAGE_EMULATOR_HOST)" if emulator else "Google Cloud Storage"
    cause = error
    if isinstance(error, gexc.RetryError) and error.cause is not None:
        cause = error.cause  # the last attempt's error, after the deadline
    if isinstance(cause, gexc.NotFound):
        return f"no bucket gs://{bucket} (GCS: 404 Not Found)"
    if isinstance(cause, (gexc.Unauthorized, gexc.Forbidden)):
        said = _answer(cause)
        if anonymous:
            return (
                f"GCS refused an anonymous request ({said}); this process has no credentials ({anonymous}): "
                "run 'gcloud auth application-default login' or set GOOGLE_APPLICATION_CREDENTIALS to a key file"
            )
        if isinstance(cause, gexc.Unauthorized):
            return f"GCS refused the credentials ({said}): run 'gcloud auth application-default login' again"
        return (
            f"permission denied on gs://{bucket} ({said}): the account needs to list and read it "
            "(e.g. roles/storage.objectViewer), and to write for an output"
        )
    if isinstance(cause, aexc.RefreshError):
        return f"the credentials could not be refreshed ({last_line(cause)}): log in again or check the key file"
    if isinstance(cause, aexc.TransportError) or _is_connection_error(cause):
        return f"cannot reach {where} ({_root_cause(cause)}): check the network connection or proxy"
    if isinstance(cause, gexc.GoogleAPICallError):
        return f"GCS answered {_answer(cause)}"
    if cause is not error:  # the deadline passed on another error
        return f"no answer from {where} within {GCS_CHECK_DEADLINE_S:.0f} s ({_root_cause(cause)})"
    return f"{type(error).__name__}: {last_line(error)}"


def _answer(error: Any) -> str:
    """'403 alice@x does not have storage.objects.list access ...': the code and GCS's last line of text."""
    lines = [line.strip() for line in str(getattr(error, "message", "") or "").splitlines() if line.strip()]
    return f"{error.code} {lines[-1]}" if lines else str(error.code)


def _is_connection_error(error: BaseException) -> bool:
    import requests

    return isinstance(error, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError))


def _root_cause(error: BaseException) -> str:
    """The innermost cause's text: 'Connection refused', 'Name or service not known', not requests' wrapping."""
    seen: set[int] = set()
    while True:
        inner = error.__cause__ or error.__context__
        if inner is None and error.args and isinstance(error.args[0], BaseException):
            inner = error.args[0]
        reason = getattr(error, "reason", None)
        if inner is None and isinstance(reason, BaseException):
            inner = reason
        if inner is None or id(inner) in seen:
            break
        seen.add(id(error))
        error = inner
    text = last_line(error)
    match = re.search(r"\[Errno -?\d+\] ([^')\]]+)", text)
    return match.group(1).strip() if match else text


# ---- one interface, two backends ------------------------------------------------------------------


class Guard(Protocol):
    """Checked right before and after each change (lease.Guard): a run whose lease was taken stops."""

    def before(self) -> None: ...

    def after(self) -> None: ...


class CasFile(Protocol):
    """A file changed only by compare-and-swap; ``token`` is what ``read`` returned with the bytes."""

    def read(self) -> tuple[bytes, Any] | None: ...

    def create(self, data: bytes) -> bool: ...

    def replace(self, data: bytes, token: Any) -> bool: ...

    def delete(self, token: Any) -> bool: ...


def backend_for(path: str) -> ModuleType:
    """``gcs`` for a ``gs://`` path, ``local`` for one on this machine: modules with the same functions
    (read_image, write_atomic, subfolders, has_any, move, delete)."""
    return gcs if gcs.owns(path) else local


def is_remote(path: str) -> bool:
    """Whether ``path`` lives in a bucket, not on this machine's disk. For the few callers that must say so
    (a Dataflow worker cannot read a local path; a message), not to choose how to do something."""
    return gcs.owns(path)


def normalize(path: str) -> str:
    """A folder as the run names it: a bucket path without its trailing slash; a local one absolute."""
    return path.rstrip("/") if gcs.owns(path) else os.path.abspath(os.path.expanduser(path))


def stat(path: str) -> Any:
    """FileMetadata (path, size, mtime) of the file at exactly ``path`` (no glob), or None if there is none.
    Raises on errors other than "not found" (permission, network)."""
    return backend_for(path).stat(path)


def names_of(folder: str) -> list[str]:
    """The names a folder goes by: itself, and locally the folder its links lead to."""
    return [folder] if gcs.owns(folder) else [folder, os.path.realpath(folder)]


def check_reachable(path: str) -> None:
    """A gs:// folder is asked about with a short deadline (gcs_check): GcsAccessError names what is wrong (no
    network, no bucket, no credentials) instead of minutes of the client's retries. Nothing to ask locally."""
    if gcs.owns(path):
        settle_gcs_credentials()
        gcs_check(path, folder=True)


def is_absolute(path: str) -> bool:
    """A path that names a place of its own (``/x``, ``gs://b/x``), not one relative to a folder."""
    return gcs.owns(path) or path.startswith("/")


def same_file_key(path: str) -> str:
    """Paths name the same file when their keys match: ``./a.jpg`` and ``a.jpg`` are one local file."""
    return path if gcs.owns(path) else os.path.normpath(path)


def write_atomic(path: str, text: str) -> None:
    """Whole or not at all: a GCS object appears complete; locally a rename makes it so."""
    backend_for(path).write_atomic(path, text.encode("utf-8"))


def copy_file(src: str, dst: str) -> None:
    """``dst`` (local or gs://, its folder made) gets a copy of ``src``'s bytes, through Beam FileSystems."""
    with (
        FileSystems.open(src, compression_type="uncompressed") as fh,
        FileSystems.create(dst, compression_type="uncompressed") as out,
    ):
        shutil.copyfileobj(fh, out)


def link_or_copy(src: str, dst: str) -> None:
    """``dst`` gets ``src``'s bytes: a hard link where the file system has them, else a copy."""
    if gcs.owns(src) or gcs.owns(dst):
        FileSystems.copy([src], [dst])
    else:
        local.link_or_copy(src, dst)


def subfolders(prefix: str) -> list[str]:
    """The folders whose full paths start with ``prefix`` (``OUT/.tmp-``): names only, nothing under them is
    listed. A missing parent has none; any other error is raised."""
    return backend_for(prefix).subfolders(prefix)


def kind(path: str) -> str | None:
    """What is at ``path`` locally: "folder", "file" or None (nothing); a bucket path is a "folder" (any
    prefix may be one: ask has_any whether anything is under it)."""
    return backend_for(path).kind(path)


def is_folder(path: str) -> bool:
    """Whether ``path`` may be listed as a folder: a local folder that exists; any bucket prefix."""
    return backend_for(path).is_folder(path)


def not_on_this_worker(flag: str, path: str, what: str = "folder") -> str:
    """The launcher found ``path`` (its pre-flight checks passed) but the worker reading it does not: a local
    path on a cluster whose workers do not share this machine's disk. Said as such, not as an empty input or a
    worker's traceback."""
    import socket

    verb = "lists" if what == "folder" else "reads"
    return (
        f"{flag} {path}: no such {what} on the worker that {verb} it (host {socket.gethostname()}), though "
        "the machine that started the run has it: on a cluster every worker must see the input, on a shared "
        "file system mounted at the same path or in gs://"
    )


def open_input(path: str, worker_flag: str | None = None) -> Any:
    """``FileSystems.open(path)``, uncompressed. ``worker_flag``: the file is read in the job, after the launcher
    found it (--coco, --manifest): a worker that does not see it raises UsageError ``not_on_this_worker``."""
    try:
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except FileNotFoundError:
        if worker_flag is None:
            raise
        raise UsageError(not_on_this_worker(worker_flag, path, "file")) from None


def check_folder_on_worker(path: str, flag: str) -> str:
    """``path`` when this worker sees it as a folder; UsageError ``not_on_this_worker`` naming ``flag`` otherwise
    (path first: a ``beam.Map`` step's element)."""
    if not is_folder(path):
        raise UsageError(not_on_this_worker(flag, path))
    return path


def is_file(path: str) -> bool:
    """Whether a file (an object) is at exactly ``path``; locally anything there but a folder."""
    return backend_for(path).is_file(path)


def resolved(path: str) -> str:
    """``path`` with its links followed (locally, in every existing part of it); a bucket has no links."""
    return backend_for(path).resolved(path)


def absolute_pattern(text: str) -> str:
    """A glob as the run lists it: a local one from the working folder (not normalised: ``..`` stays)."""
    return backend_for(text).absolute_pattern(text)


def usage(folder: str) -> tuple[int, int, float | None]:
    """(files, bytes, newest modification time) of everything under ``folder``."""
    return backend_for(folder).usage(folder)


def entries(folder: str, into: Sequence[str] = ()) -> list[str]:
    """What ``folder`` holds, relative to it: locally its own names plus ``SUB/name`` inside each ``into``
    folder; on GCS every object under it. A missing folder holds nothing; other errors are raised."""
    return backend_for(folder).entries(folder, into)


def remove_tree(path: str) -> None:
    """The folder and everything under it go now; an error is raised (unlike remove_folder)."""
    backend_for(path).remove_tree(path)


def has_any(folder: str) -> bool:
    """Whether ``folder`` exists (locally) / has any object under it (GCS)."""
    return backend_for(folder).has_any(folder)


def sizes_under(path: str) -> dict[str, int]:
    """{relative path: size} of every file under ``path`` (one listing; hidden folders not entered locally)."""
    prefix = path.rstrip("/") + "/"
    try:
        found = FileSystems.match([FileSystems.join(path, "**")])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing there
        return {}
    return {m.path[len(prefix) :]: m.size_in_bytes for m in found if m.path.startswith(prefix)}


def files_under(path: str) -> list[str]:
    prefix = path.rstrip("/") + "/"
    return sorted(prefix + rel for rel in sizes_under(path))


def move_files(
    pairs: Sequence[tuple[str, str]],
    existing: set[str],
    kept: Iterable[str] = (),
    each: Callable[[], None] | None = None,
    guard: Guard | None = None,
) -> None:
    """Renames each (src, dst); a pair whose src is gone and dst present is done already.

    ``existing`` holds the paths known to exist (from listings made just
    before), so no request per file asks. A pair with neither side present
    raises FileNotFoundError: a file of the run is lost. ``each`` runs once per
    file before it changes (a failpoint); ``guard`` is checked around each
    rename (locally) or batch (GCS). A src in ``kept`` stays where it is: dst
    becomes a hard link to it (locally; moved where the file system has none)
    or a copy (GCS).
    """
    kept = set(kept)
    todo = []
    for src, dst in pairs:
        if src in existing:
            todo.append((src, dst))
        elif dst not in existing:
            raise FileNotFoundError(f"{src}: gone, and {dst} is not there either")
    local.move([p for p in todo if not gcs.owns(p[0])], kept, each, guard)
    gcs.move([p for p in todo if gcs.owns(p[0])], kept, each, guard)


def delete_files(paths: Sequence[str], each: Callable[[], None] | None = None, guard: Guard | None = None) -> None:
    """Deletes files (batched on GCS); one already gone is fine. ``each``, ``guard``: as for move_files."""
    local.delete([p for p in paths if not gcs.owns(p)], each, guard)
    gcs.delete([p for p in paths if gcs.owns(p)], each, guard)


def delete_quietly(paths: Sequence[str]) -> None:
    for path in paths:
        try:
            FileSystems.delete([path])
        except Exception as e:  # noqa: BLE001 - already gone is fine
            _LOG.debug("could not delete %s: %s", path, e)


def delete_tree(path: str) -> None:
    """Deletes a scratch folder and everything under it."""
    delete_files(files_under(path))
    remove_folder(path)


def make_temp_folder(root: str | None, prefix: str) -> str:
    """A new folder for scratch work: ``root/<prefix><random>`` in a bucket (made by writing into it), a
    fresh local one under ``root`` (the system's temp folder when None) otherwise."""
    if root and gcs.owns(root):
        return FileSystems.join(root, f"{prefix}{uuid.uuid4().hex}")
    return tempfile.mkdtemp(prefix=prefix, dir=root)


def remove_temp_folder(path: str) -> None:
    """A ``make_temp_folder`` folder and everything in it goes (what cannot be removed locally stays)."""
    if gcs.owns(path):
        delete_tree(path)
    else:
        local.remove_folder(path)


def remove_folder(path: str) -> None:
    """Locally the folder and what is left under it go; on GCS there is no folder once its objects are gone."""
    if not gcs.owns(path):
        local.remove_folder(path)


def remove_empty_dirs(root: str) -> None:
    """Folders left empty under ``root`` (after moving or deleting their files) go; GCS has no folders."""
    if not gcs.owns(root):
        local.remove_empty_dirs(root)


def cas_file(path: str, retries: int) -> CasFile:
    """``path`` as a compare-and-swap file: a lock-file scheme locally, generation preconditions on GCS
    (``retries``: reads of an object that changed in between before ChangesTooOften)."""
    return gcs.GenerationFile(path, retries) if gcs.owns(path) else local.LockedFile(path)
