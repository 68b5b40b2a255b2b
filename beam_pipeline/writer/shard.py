"""Writing shards: read, decode, validate, build the Example, stream to a temp file.

``WriteShardFn`` gets one shard's refs (only references crossed the shuffle),
sorts them by shuffle key, reads them on a pool of I/O threads (more reads
in flight than decode threads, so small objects on GCS are not
latency-bound), decodes them on a pool of one thread per core (Pillow and
hashlib release the GIL); local files are read by the decode thread itself,
in batches, unless reads turn out slower than decodes (``read_then_convert``).
Both pools are the process's, shared by every
writer instance in it (a Dataflow SDK process runs one per bundle thread).
It takes the results in order and streams records to a uniquely named
temp file in the run's output format (``formats``: TFRecord by default).  Finalize later gives
the temp file its final name.

Memory is bounded per machine, not by thread counts: file bytes read ahead
and decoded pixels in flight each have a per-process budget (``Budget``;
``ImageOptions.memory_budget_bytes`` per machine, shared by the SDK processes
of a worker VM). A file over ``--max-file-mb`` (from the listing) is never
read; a large file's head is read and checked first.

Errors: a missing file or one this job may not read is a reject (but a shard
of 8 or more refs that are all denied fails: the job's account lacks access,
and the error names the bucket); any other I/O error (a GCS 429/503, a
reset connection, an expired token) fails the bundle so the runner retries
it: a transient error must not drop an image.

    (split, shard), [Ref] ──► ShardResult (split, shard, tmp_path, index_path, records, bytes, labels, …)
                         └──► rejects: {"path", "reason", "detail"}
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from .. import failpoints, index, resume, storage
from ..annotations.join import CountingDoFn, record_counts
from ..formats import registry
from ..images.options import ImageOptions, Prepared, Rejected
from ..sources.rules import REJECTS, class_values, label_names
from ..storage import permanent_reason, read_bytes, storage_root
from ..vocab.records import ShardResult, size_bucket
from ..vocab.refs import Ref
from . import pieces
from .budget import budgets, decode_threads, process_pool
from .readahead import read_then_convert
from .records import Reused, convert_one, decode_one, examples_features, read_cost, reject_row, result_bytes

NAMESPACE = "beam_pipeline"
_LOG = logging.getLogger(__name__)


class Progress:
    """Counts the shard writers of this process update, for the launcher's live progress line.

    Only in-process runners (the local default) share it with the launcher;
    elsewhere it stays at zero and no progress is shown.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.images = 0
        self.rejected = 0
        self.shards = 0

    def add(self, images: int = 0, rejected: int = 0, shards: int = 0) -> None:
        with self._lock:
            self.images += images
            self.rejected += rejected
            self.shards += shards

    def snapshot(self) -> tuple[int, int, int]:
        with self._lock:
            return self.images, self.rejected, self.shards


PROGRESS = Progress()

# Images decoded ahead of the writer, per decode thread.
PREFETCH_PER_THREAD = 2
# Reads in flight per shard writer (GCS reads of small objects are latency-bound).
IO_THREADS = 16
# Local files go to the pools in batches of about this many bytes (2-3 small JPEGs; 1 MB batches left
# threads idle on a loaded 2-core machine): one future, budget charge and
# thread hand-off per batch, not per image (GCS reads stay one per task, to keep many in flight).
LOCAL_BATCH_BYTES = 250_000
# Images written between two updates of the shared progress counts (a lock each).
PROGRESS_EVERY = 64


# A shard with at least this many refs, every one of them denied, fails its bundle (see WriteShardFn).
DENIED_SHARD_MIN = 8


class WriteShardFn(beam.DoFn):
    """((split, shard), [Ref]) → one shard file under the run's temp folder."""

    def __init__(
        self,
        tmp_dir: str,
        compression: str,
        threads: int,
        image_options: ImageOptions | None = None,
        previous: index.PreviousRun | None = None,
        resume_from: Sequence[str] = (),
        object_names: bool = False,
        multi_label: bool = False,
        refs_in_pieces: bool = False,
        output_format: str = registry.DEFAULT,
    ) -> None:
        self._tmp_dir = tmp_dir
        self._format = registry.get(output_format)
        # Flink and Spark: a shard's values are the paths of its refs' piece files, read here (pieces.py)
        self._refs_in_pieces = refs_in_pieces
        # A names-only annotation source's label list names object classes: its records have no image/class/label.
        self._object_names = object_names
        self._multi_label = multi_label  # --label-separator: label lists (the feature spec a previous run must have)
        self._previous = previous  # --incremental-from: unchanged files' records are copied from it
        # Where finished shards of earlier runs may be (resume.py): this run's own scratch folder
        # first (a bundle retried after its shard was finished), then earlier runs', newest first.
        self._resume_from = (tmp_dir, *(s for s in resume_from if s != tmp_dir))
        self._compression = compression
        self._threads = threads
        self._image_options = image_options or ImageOptions()
        self._records = beam.metrics.Metrics.counter(NAMESPACE, "records_written")
        self._rejected = beam.metrics.Metrics.counter(NAMESPACE, "images_rejected")
        self._shards = beam.metrics.Metrics.counter(NAMESPACE, "shards_written")
        self._reused = beam.metrics.Metrics.counter(NAMESPACE, "records_reused")
        self._reconverted = beam.metrics.Metrics.counter(NAMESPACE, "records_reconverted")
        self._resumed = beam.metrics.Metrics.counter(NAMESPACE, "shards_resumed")

    def setup(self) -> None:
        # Shared by the writers of this process (like the budgets); each keeps its own window.
        self._pool = process_pool("decode", decode_threads(self._threads))
        self._io_pool = process_pool("read", IO_THREADS)
        self._read_budget, self._decode_budget = budgets(self._image_options)
        # The launcher checked the previous run's code against its own; this process decodes.
        self._previous_code_ok = self._previous is not None and self._previous.same_code_here()

    def process(
        self,
        element: tuple[tuple[str, int], Iterable[Ref] | Iterable[str]],
        labels: Sequence[str],
        extra_types: Mapping[str, str],
    ) -> Iterator[Any]:
        (split, shard), values = element
        if self._refs_in_pieces:
            ordered = pieces.read_refs(values)  # type: ignore[arg-type]  # the pieces' paths
        else:
            ordered = sorted(values, key=pieces.sort_key)  # type: ignore[arg-type]  # the refs
        reuse = self._reuses_previous(labels, extra_types)
        digest = resume.shard_digest(
            split,
            shard,
            ordered,
            labels,
            extra_types,
            self._image_options,
            self._compression,
            self._previous.output if reuse and self._previous is not None else None,
            output_format=self._format.name,
        )
        paths = self._attempt_paths(split, shard)
        finished = resume.find_finished(self._resume_from, split, shard, digest, own=self._tmp_dir)
        if finished is not None:
            taken = resume.adopt(finished, paths)
            if taken is not None:
                yield from self._resumed_shard(split, shard, digest, taken)
                return
            # Its source vanished half-way: the files linked so far share their bytes with that run's
            # (maybe published) files, so the shard is written under new names, never through them.
            paths = self._attempt_paths(split, shard)
        write = ShardWrite(self, split, shard, ordered, labels, extra_types, reuse, paths)
        yield from write.write()  # rejects, as they come
        write.check_access()
        result = write.result()
        self._count(write)
        # The shard is closed: a later run (or a retry of this bundle) with the same digest takes it.
        if not write.retried:
            resume.write_marker(self._tmp_dir, split, shard, digest, result.to_json())
        failpoints.hit("writer.result")
        yield result

    def _reuses_previous(self, labels: Sequence[str], extra_types: Mapping[str, str]) -> bool:
        """Whether unchanged files' records may be copied from the previous run (same code, same features)."""
        return (
            self._previous is not None
            and self._previous_code_ok
            and self._previous.features
            == examples_features(() if self._object_names else labels, extra_types, self._multi_label)
        )

    def _count(self, write: ShardWrite) -> None:
        """Metrics and progress of a shard written afresh (its rejects were counted as they came)."""
        self._records.inc(write.records)
        self._reused.inc(write.reused)
        self._reconverted.inc(len(write.reconverted))
        if write.reconverted:  # one line per shard: a gone previous shard would otherwise make one per record
            more = f" (and {len(write.reconverted) - 1} more)" if len(write.reconverted) > 1 else ""
            _LOG.warning("previous record not reused, converted afresh: %s%s", min(write.reconverted), more)
        self._shards.inc()
        PROGRESS.add(shards=1)

    def _attempt_paths(self, split: str, shard: int) -> dict[str, str]:
        """This attempt's files: a retried bundle writes new ones, and only the committed attempt's reach finalize."""
        stem = f"{split}-{shard:05d}-{uuid.uuid4().hex}"
        paths = {
            "tmp_path": FileSystems.join(self._tmp_dir, f"{stem}.{self._format.name}"),
            "index_path": FileSystems.join(self._tmp_dir, index.INDEX_PARTS, f"{stem}.jsonl"),
            "rejects_path": resume.rejects_path(self._tmp_dir, stem),
        }
        # offsets of a gzip shard are no file positions, and a format without byte offsets has none: no .idx
        if self._compression == "none" and self._format.frame_overhead is not None:
            paths["idx_path"] = FileSystems.join(self._tmp_dir, index.INDEX_PARTS, f"{stem}.idx")
        return paths

    def _resumed_shard(self, split: str, shard: int, digest: str, result: ShardResult) -> Iterator[Any]:
        """A shard an earlier attempt or run finished with the same digest (its files copied): rejects, result."""
        rejected = 0
        for row in resume.read_rejects(result.rejects_path):
            rejected += 1
            yield beam.pvalue.TaggedOutput(REJECTS, row)
        resume.write_marker(self._tmp_dir, split, shard, digest, result.to_json())
        self._rejected.inc(rejected)
        self._records.inc(result.records)
        self._shards.inc()
        self._resumed.inc()
        PROGRESS.add(images=result.records, rejected=rejected, shards=1)
        failpoints.hit("writer.result")
        yield result


class ShardWrite:
    """One attempt at writing one shard: its refs, in order, to a temp shard file, index part, .idx, rejects.

    ``write()`` feeds the refs through read → decode on the writer's pools
    (``read_then_convert``) and writes each result as it comes: a record with
    its index and .idx lines, or a reject. ``check_access()`` then fails the
    bundle when the job may not read any of the shard's images, and
    ``result()`` is what finalize gets and the resume marker keeps.
    """

    def __init__(
        self,
        fn: WriteShardFn,
        split: str,
        shard: int,
        refs: Sequence[Ref],
        labels: Sequence[str],
        extra_types: Mapping[str, str],
        reuse: bool,
        paths: Mapping[str, str],
    ) -> None:
        self._fn = fn  # its pools, budgets, options and counters
        self.split, self.shard, self.refs, self.paths = split, shard, refs, paths
        self._label_ids = {label: i for i, label in enumerate(labels)}
        self._extra_types = extra_types
        self._reuse = reuse  # records of unchanged files are copied from the previous run
        self.records = 0
        self.reused = 0
        self.kept = 0  # previous rejects kept without reading their files
        self.denied, self._first_denied = 0, ""  # reads refused for permission (not the tracebacks: 100k per shard)
        self.retried = False  # a reject that says nothing of the file's bytes: no marker (resume.py)
        self.label_counts: collections.Counter[str] = collections.Counter()
        self.converted: collections.Counter[str] = collections.Counter()
        self.sizes: collections.Counter[str] = collections.Counter()  # records per shorter-side bucket
        self.objects: collections.Counter[str] = collections.Counter()  # objects kept, image counters (detection)
        self.reconverted: list[str] = []  # unchanged files whose previous record was gone or damaged (read threads)
        self._rejects_out: Any = None  # made at the first reject: most shards have none
        self._unreported = 0  # records not yet in PROGRESS (updated every PROGRESS_EVERY)

    # ---- the steps, in order -----------------------------------------------------------------

    def write(self) -> Iterator[Any]:
        """Every ref's record or reject, in order, into this attempt's files; yields the rejects (tagged)."""
        fn = self._fn
        prefetch = PREFETCH_PER_THREAD * decode_threads(fn._threads)
        local = not any(storage.is_remote(ref.path) for ref in self.refs)
        results = read_then_convert(
            self.refs,
            self.read,
            self.convert,
            fn._io_pool,
            fn._pool,
            window=prefetch if local else max(IO_THREADS, prefetch),  # batches (local) or images in flight
            budget=fn._read_budget,
            # too large: never read; reused: a record, not the file, is read
            cost=functools.partial(read_cost, reuse=self._reuse, limit=fn._image_options.max_file_bytes),
            size=result_bytes,
            batch_bytes=LOCAL_BATCH_BYTES if local else 0,
            # a night's reused records are read from the previous shards, and convert does nothing with them:
            # their reads would always look slower than their conversions
            read_inline=local and not self._reuse,
        )
        # closing(): if writing fails, the reads still in flight give their bytes back at once.
        with contextlib.closing(results), contextlib.ExitStack() as self._files:
            self.open_files()
            try:
                for ref, result in results:
                    if isinstance(result, Rejected):
                        yield self.write_reject(ref, result)
                    else:
                        self.write_record(ref, result)
            finally:
                PROGRESS.add(images=self._unreported)
                self._unreported = 0

    def open_files(self) -> None:
        """This attempt's shard, index part and .idx (uncompressed shards only), closed when ``write`` ends."""
        fn = self._fn
        self._out = self._files.enter_context(fn._format.create(self.paths["tmp_path"], fn._compression))
        self._index_out = self._create(self.paths["index_path"])
        self._idx_out = self._create(self.paths["idx_path"]) if "idx_path" in self.paths else None

    def _create(self, path: str) -> Any:
        return self._files.enter_context(FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED))

    def read(self, ref: Ref) -> bytes | Rejected | Reused:
        """On a read thread: the previous run's record or reject of an unchanged file, else the file's bytes."""
        if self._reuse and isinstance(ref.previous, index.PreviousReject):
            kept = Rejected(ref.previous.reason, ref.previous.detail)  # its bytes were rejected: not read again
            kept.kept = True  # type: ignore[attr-defined] - counted in write_reject
            return kept
        if self._reuse and index.reusable_record(ref, self._label_ids):
            try:
                return Reused(index.read_previous(ref.previous, ref.relpath))  # not read, not decoded again
            except Exception as e:  # noqa: BLE001 - only a gone or damaged previous shard falls through
                if not isinstance(e, ValueError) and permanent_reason(e) is None:
                    raise  # transient: the runner retries the bundle
                self.reconverted.append(f"{ref.relpath}: {e}")  # converted afresh below, like a new file
        try:
            return read_bytes(ref.path, ref.size, self._fn._image_options)
        except Rejected as r:
            return r

    def convert(self, ref: Ref, data: bytes | Reused) -> tuple[bytes, Prepared, str] | Rejected | Reused:
        """On a decode thread: the Example record of the file's bytes (a reused record as it is)."""
        if isinstance(data, Reused):
            return data
        fn = self._fn
        result = decode_one(ref, data, self._label_ids, self._extra_types, fn._image_options, fn._decode_budget.hold)
        if isinstance(result, Rejected):
            return result
        # The record holds the image bytes; the waiting result keeps their digest, no second copy.
        record, prepared, sha256 = result
        return record, Prepared(b"", prepared.info, prepared.converted_from, phash=prepared.phash), sha256

    def write_record(self, ref: Ref, result: tuple[bytes, Prepared, str] | Reused) -> None:
        """One record into the shard, its line into the index part (and .idx); counts."""
        self._unreported += 1
        if self._unreported >= PROGRESS_EVERY:
            PROGRESS.add(images=self._unreported)
            self._unreported = 0
        if isinstance(result, Reused):
            previous = ref.previous
            record, sha, converted, phash = result.record, previous.sha256, previous.converted, previous.phash
            size = previous.size
            self.reused += 1
        else:
            record, prepared, sha = result
            converted, phash = prepared.converted_from, prepared.phash
            size = (prepared.info.width, prepared.info.height)
        failpoints.hit("writer.record")
        offset = self._out.write(record)
        label_id, _ = class_values(ref.label, self._label_ids)
        line = index.part_line(ref, self.records, offset, len(record), sha, label_id, converted, phash, size)
        self.sizes[size_bucket(size)] += 1
        self._index_out.write(line.encode("utf-8"))
        if self._idx_out is not None:
            self._idx_out.write(index.idx_line(offset, len(record)))
        self.records += 1
        self.label_counts.update(label_names(ref.label))  # a multi-label image counts under each of its labels
        for counter, n in record_counts(ref.annotations):
            self.objects[counter] += n
        if converted:  # a reused record counts as the run that converted it did
            self.converted[converted] += 1

    def write_reject(self, ref: Ref, rejected: Rejected) -> Any:
        """One reject into this attempt's rejects file (made at the first); returns it as the tagged output."""
        if getattr(rejected, "denied", False):
            self.denied += 1
            self._first_denied = self._first_denied or rejected.detail
        self.kept += getattr(rejected, "kept", False)
        self.retried = self.retried or rejected.reason in index.RETRIED_REASONS
        self._fn._rejected.inc()
        PROGRESS.add(rejected=1)
        row = reject_row(ref, rejected)
        if self._rejects_out is None:
            self._rejects_out = self._create(self.paths["rejects_path"])
        self._rejects_out.write((json.dumps(row) + "\n").encode("ascii"))  # \u-escapes keep any path
        return beam.pvalue.TaggedOutput(REJECTS, row)

    def check_access(self) -> None:
        """Fails the bundle when not one image of the shard may be read for permission (8 refs or more).

        Records copied from a previous run and kept rejects read none. Then the
        job's account lacks access, and every image becoming an "unreadable"
        reject would hide that: the bundle fails, with the reason, so the job does too.
        """
        refs = self.refs
        if self.denied >= DENIED_SHARD_MIN and self.denied == len(refs) - self.reused - self.kept:
            where = sorted({storage_root(ref.path) for ref in refs})
            raise PermissionError(
                f"permission denied reading every one of the {len(refs)} images of shard "
                f"{self.split}-{self.shard:05d} from {', '.join(where[:3])}{' …' if len(where) > 3 else ''}: the "
                "account the job runs as may not read them (on GCS: grant the workers' service account "
                "storage.objects.get, e.g. roles/storage.objectViewer, on the bucket); "
                f"first error: {self._first_denied}"
            )

    def result(self) -> ShardResult:
        """The closed shard, as finalize gets it and the resume marker keeps it."""
        size = FileSystems.match([self.paths["tmp_path"]])[0].metadata_list[0].size_in_bytes
        return ShardResult(
            split=self.split,
            shard=self.shard,
            tmp_path=self.paths["tmp_path"],
            index_path=self.paths["index_path"],
            rejects_path=self.paths["rejects_path"] if self._rejects_out is not None else None,
            idx_path=self.paths.get("idx_path"),
            records=self.records,
            bytes=size,
            labels=dict(sorted(self.label_counts.items())),
            converted=dict(sorted(self.converted.items())),
            sizes=dict(sorted(self.sizes.items())),
            objects=dict(sorted(self.objects.items())),
            reused=self.reused,
            reconverted=len(self.reconverted),
            rejects_kept=self.kept,
        )


class DecodeFn(CountingDoFn):
    """Ref → (split, label, record) for the WriteToTFRecord sink; tagged: rejects, and COUNTS (the objects of
    the records decoded, per bundle, as the planned sink's shard results hold them)."""

    def __init__(self, image_options: ImageOptions | None = None) -> None:
        super().__init__()
        self._rejected = beam.metrics.Metrics.counter(NAMESPACE, "images_rejected")
        self._image_options = image_options or ImageOptions()
        self._label_ids: tuple[Sequence[str] | None, dict[str, int]] = (None, {})

    def setup(self) -> None:
        _, self._decode_budget = budgets(self._image_options)

    def process(self, ref: Ref, labels: Sequence[str], extra_types: Mapping[str, str]) -> Iterator[Any]:
        if self._label_ids[0] is not labels:  # the side input: build the id map once, not per image
            self._label_ids = (labels, {label: i for i, label in enumerate(labels)})
        result = convert_one(ref, self._label_ids[1], extra_types, self._image_options, self._decode_budget.hold)
        if isinstance(result, Rejected):
            self._rejected.inc()
            yield beam.pvalue.TaggedOutput(REJECTS, reject_row(ref, result))
        else:
            for counter, n in record_counts(ref.annotations):
                self._counts.add(counter, n)
            yield ref.split, ref.label, result[0]
