"""The GCS backend: every google-cloud-storage client and Beam GcsIO of the project is made here.

    gcs.gcsio()            # this thread's GcsIO (read threads: one client each, reused)
    gcs.client()           # the process's storage.Client (listings, batches, the lease)

Both are rebuilt when the pipeline options (a later pipeline in the same
process) or the emulator endpoint (STORAGE_EMULATOR_HOST) changed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from .failures import causes

SCHEME = "gs://"
# Renames/deletes per GCS batch request (Beam's gcsio allows at most 100).
BATCH = 100


def owns(path: str) -> bool:
    """Whether ``path`` is a GCS URL; other schemes never reach here (config.unsupported_scheme refuses them)."""
    return path.startswith(SCHEME)


# ---- clients ----------------------------------------------------------------------------------

_THREAD = threading.local()
_PROCESS: dict[str, Any] = {}
_PROCESS_LOCK = threading.Lock()


def reset() -> None:
    """Forgets the process's client: the next call makes a new one (a run started afresh in this process)."""
    with _PROCESS_LOCK:
        _PROCESS.clear()


def _made_for() -> tuple[Any, str | None]:
    # The options FileSystems.set_options gave this worker (Beam's GCS file system reads them the same way).
    return getattr(FileSystems, "_pipeline_options", None), os.environ.get("STORAGE_EMULATOR_HOST")


def _stale(old: tuple[Any, str | None] | None, now: tuple[Any, str | None]) -> bool:
    return old is None or old[0] is not now[0] or old[1] != now[1]


def _new_gcsio(options: Any) -> Any:
    from apache_beam.io.gcp import gcsio
    from apache_beam.options.pipeline_options import PipelineOptions

    return gcsio.GcsIO(pipeline_options=options or PipelineOptions())


def gcsio() -> Any:
    """This thread's GCS client (Beam's GcsIO, built once per thread from the pipeline's options).

    Beam's GCSFileSystem makes a new GcsIO, hence a new storage.Client and a
    new connection pool, on every open, and its reader fetches the object's
    metadata before its bytes: two round trips and a TLS handshake per image.
    The read threads live as long as the process (process_pool), so a client
    is rebuilt when the options (a later pipeline in the same process) or the
    emulator endpoint changed.
    """
    made_for = _made_for()
    client = getattr(_THREAD, "gcsio", None)
    if client is None or _stale(getattr(_THREAD, "made_for", None), made_for):
        from apache_beam.io.gcp import gcsio_retry
        from apache_beam.options.pipeline_options import PipelineOptions

        client = _THREAD.gcsio = _new_gcsio(made_for[0])
        _THREAD.retry = gcsio_retry.get_retry(made_for[0] or PipelineOptions())
        _THREAD.made_for = made_for
    return client


def shared_gcsio() -> Any:
    """One Beam GcsIO (one storage client and HTTP session) per process, made on first use: batches, listings,
    the lease."""
    made_for = _made_for()
    with _PROCESS_LOCK:
        if "gcsio" not in _PROCESS or _stale(_PROCESS.get("made_for"), made_for):
            _PROCESS["gcsio"] = _new_gcsio(made_for[0])
            _PROCESS["made_for"] = made_for
        return _PROCESS["gcsio"]


def client() -> Any:
    """The process's google-cloud-storage Client."""
    return shared_gcsio().client


def split(path: str) -> tuple[str, str]:
    """gs://bucket/a/b → ("bucket", "a/b"); the bucket itself → ("bucket", "")."""
    bucket, _, name = path.split("://", 1)[1].partition("/")
    return bucket, name


def _prefix(folder: str) -> tuple[str, str]:
    """gs://bucket/a/b → ("bucket", "a/b/"); the bucket itself → ("bucket", "")."""
    bucket, prefix = split(folder)
    prefix = prefix.rstrip("/")
    return bucket, prefix + "/" if prefix else ""


# ---- reading ----------------------------------------------------------------------------------


def read_image(path: str, size: int, options: Any, header_bytes: int, check_header: Callable[..., Any]) -> bytes:
    """An image's bytes: its head first (checked) when it is large, then the rest of the same generation."""
    from apache_beam.io.gcp.gcsio import parse_gcs_path

    client = gcsio()
    bucket, name = parse_gcs_path(path)
    blob = client.client.bucket(bucket).blob(name)
    retry = _THREAD.retry
    # Never more than one byte over the limit, whatever the object became since it was listed.
    last = options.max_file_bytes if options is not None and options.max_file_bytes else None
    if options is not None and size > 4 * header_bytes:
        head = blob.download_as_bytes(start=0, end=header_bytes - 1, raw_download=True, retry=retry)
        verdict = check_header(head, options)
        if verdict is not None:
            raise verdict
        try:
            # The rest of the same object generation: an object replaced in between fails the
            # request (412) and the bundle, instead of joining the head of one file to another's tail.
            return head + blob.download_as_bytes(
                start=header_bytes, end=last, raw_download=True, retry=retry, if_generation_match=blob.generation
            )
        except Exception as e:
            if getattr(e, "code", None) == 416:  # shrank since it was listed: the head is all of it
                return head
            raise
    return blob.download_as_bytes(end=last, raw_download=True, retry=retry)


def stat(path: str) -> Any:
    try:
        return FileSystems.get_filesystem(path).metadata(path)  # one request; raises BeamIOError
    except Exception as e:
        if any(type(c).__name__ == "NotFound" or isinstance(c, FileNotFoundError) for c in causes(e)):
            return None
        raise


# ---- writing, listing, moving, deleting -------------------------------------------------------


def write_atomic(path: str, data: bytes) -> None:
    """A GCS object appears complete or not at all."""
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        fh.write(data)


def subfolders(prefix: str) -> list[str]:
    """The "folders" whose names start with ``prefix`` (gs://bucket/path/start), sorted: one listing with a
    delimiter, so the objects inside them are not listed."""
    from apache_beam.io.gcp.gcsio import parse_gcs_path

    bucket, name = parse_gcs_path(prefix, object_optional=True)
    blobs = client().list_blobs(bucket, prefix=name, delimiter="/")
    for _ in blobs.pages:  # the prefixes are known once every page is read
        pass
    return sorted(f"gs://{bucket}/{p.rstrip('/')}" for p in blobs.prefixes)


def has_any(folder: str) -> bool:
    """Whether any object is under ``folder``."""
    from apache_beam.io.gcp.gcsio import parse_gcs_path

    bucket, name = parse_gcs_path(folder.rstrip("/") + "/")
    return any(True for _ in client().list_blobs(bucket, prefix=name, max_results=1))


def is_folder(path: str) -> bool:
    """Any prefix may be a folder (one with nothing under it lists empty)."""
    return True


def kind(path: str) -> str | None:
    return "folder"  # any prefix may be one


def is_file(path: str) -> bool:
    return FileSystems.exists(path)


def resolved(path: str) -> str:
    return path  # no links in a bucket


def absolute_pattern(text: str) -> str:
    return text


def _below(folder: str) -> list[Any]:
    return FileSystems.match([folder.rstrip("/") + "/**"])[0].metadata_list


def usage(folder: str) -> tuple[int, int, float | None]:
    """(objects, bytes, newest update time) of everything under ``folder``."""
    found = _below(folder)
    times = [m.last_updated_in_seconds for m in found if m.last_updated_in_seconds]
    return len(found), sum(m.size_in_bytes for m in found), max(times) if times else None


def entries(folder: str, into: Sequence[str]) -> list[str]:
    """Every object's path under ``folder``, relative to it (a bucket has no levels to stop at)."""
    return [m.path[len(folder.rstrip("/")) + 1 :] for m in _below(folder)]


def remove_tree(path: str) -> None:
    files = [m.path for m in _below(path)]
    if files:
        FileSystems.delete(files)


def one_level(folder: str, odd: Any = None) -> Iterator[tuple[str, int, float] | str]:
    """Direct entries of ``folder``: files as (path, size, mtime), then subfolders as str (no odd entries)."""
    bucket, prefix = _prefix(folder)
    pages = client().list_blobs(bucket, prefix=prefix, delimiter="/")
    for blob in pages:
        updated = blob.updated.timestamp() if blob.updated else 0.0
        yield f"gs://{bucket}/{blob.name}", blob.size or 0, updated
    for sub in sorted(pages.prefixes):  # complete once every page was read
        yield f"gs://{bucket}/{sub.rstrip('/')}"


def tree(folder: str, odd: Any = None) -> Iterator[tuple[str, int, float]]:
    """Every object below ``folder`` as (path, size, mtime)."""
    bucket, prefix = _prefix(folder)
    for blob in client().list_blobs(bucket, prefix=prefix):
        updated = blob.updated.timestamp() if blob.updated else 0.0
        yield f"gs://{bucket}/{blob.name}", blob.size or 0, updated


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def not_found(error: Any) -> bool:
    return "404" in str(error) or "Not Found" in str(error) or "NotFound" in type(error).__name__


def move(pairs: Sequence[tuple[str, str]], kept: set[str], each: Callable[[], None] | None, guard: Any) -> None:
    """Copies in batches of BATCH (the lease checked around each), then deletes the sources not ``kept``."""
    for chunk in _chunks(pairs, BATCH):
        if each:
            for _ in chunk:
                each()
        if guard:
            guard.before()
        gcs = shared_gcsio()
        failed = [(s, d, e) for s, d, e in gcs.copy_batch(list(chunk)) if e is not None]
        if guard:
            guard.after()
        if failed:
            raise OSError(f"copying {failed[0][0]} to {failed[0][1]}: {failed[0][2]} ({len(failed)} failed)")
        moved = [s for s, _ in chunk if s not in kept]
        failed_deletes = [(p, e) for p, e in (gcs.delete_batch(moved) if moved else []) if e is not None]
        if failed_deletes and not all(not_found(e) for _, e in failed_deletes):
            raise OSError(f"deleting {failed_deletes[0][0]}: {failed_deletes[0][1]}")


def delete(paths: Sequence[str], each: Callable[[], None] | None, guard: Any) -> None:
    """Deletes in batches of BATCH; one already gone is fine."""
    for chunk in _chunks(paths, BATCH):
        if each:
            for _ in chunk:
                each()
        if guard:
            guard.before()
        failed = [(p, e) for p, e in shared_gcsio().delete_batch(list(chunk)) if e is not None and not not_found(e)]
        if guard:
            guard.after()
        if failed:
            raise OSError(f"deleting {failed[0][0]}: {failed[0][1]}")


# ---- compare-and-swap: the lease ----------------------------------------------------------------


class ChangesTooOften(RuntimeError):
    """A compare-and-swap file changed under every read."""


class GenerationFile:
    """One object changed only by generation preconditions: created with ``ifGenerationMatch=0``, replaced or
    deleted with ``ifGenerationMatch=<the generation read>``. The token is that generation."""

    def __init__(self, path: str, retries: int) -> None:
        from apache_beam.io.gcp.gcsio import parse_gcs_path

        bucket, self.name = parse_gcs_path(path)
        self.bucket = client().bucket(bucket)
        self.retries = retries

    def read(self) -> tuple[bytes, Any] | None:
        from google.api_core import exceptions

        for _ in range(self.retries):
            blob = self.bucket.get_blob(self.name)
            if blob is None:
                return None
            generation = blob.generation  # before the download, which may reset the blob's properties
            try:
                data = blob.download_as_bytes(if_generation_match=generation)
            except (exceptions.NotFound, exceptions.PreconditionFailed):
                continue  # changed between the two requests
            return data, generation
        raise ChangesTooOften(f"gs://{self.bucket.name}/{self.name}: changes too often to be read")

    def create(self, data: bytes) -> bool:
        return self._write(data, 0)

    def replace(self, data: bytes, token: Any) -> bool:
        return self._write(data, token)

    def _write(self, data: bytes, generation: int) -> bool:
        from google.api_core import exceptions

        try:
            self.bucket.blob(self.name).upload_from_string(
                data, content_type="application/json", if_generation_match=generation
            )
            return True
        except exceptions.PreconditionFailed:
            return False

    def delete(self, token: Any) -> bool:
        from google.api_core import exceptions

        try:
            self.bucket.blob(self.name).delete(if_generation_match=token)
            return True
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return False
