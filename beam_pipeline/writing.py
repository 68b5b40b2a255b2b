"""Writing shards: read, decode, validate, build the Example, stream to a temp file.

``WriteShardFn`` gets one shard's refs (only references crossed the shuffle),
sorts them by shuffle key, reads and decodes them on a small thread pool
(Pillow and hashlib release the GIL; results are taken in order, with a
bounded window so memory stays at a few images) and streams TFRecords to a
uniquely named temp file through Beam ``FileSystems``.  Finalize later gives
the temp file its final name.

    (split, shard), [Ref] ──► {"split", "shard", "tmp_path", "records", "bytes", "labels"}
                         └──► rejects: {"path", "reason", "detail"}
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil

from . import examples, failpoints
from .images import DECODE_ERROR, MISSING, UNREADABLE, ImageOptions, Prepared, Rejected, prepare_image
from .listing import REJECTS, Ref, coerce, reject

NAMESPACE = "beam_pipeline"


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


def compression_type(name: str) -> str:
    return CompressionTypes.GZIP if name == "gzip" else CompressionTypes.UNCOMPRESSED


def read_bytes(path: str) -> bytes:
    """The file's bytes, raw (never decompressed by extension); Rejected on I/O errors."""
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            return fh.read()
    except FileNotFoundError as e:
        raise Rejected(MISSING, str(e)) from None
    except Exception as e:  # OSError, BeamIOError, GCS HTTP errors
        text = str(e)
        if "No such file" in text or "Not found" in text or "404" in text:
            raise Rejected(MISSING, text) from None
        raise Rejected(UNREADABLE, f"{type(e).__name__}: {text}") from None


def build_record(
    ref: Ref,
    data: bytes,
    label_ids: Mapping[str, int],
    extra_types: Mapping[str, str],
    image_options: ImageOptions | None = None,
) -> tuple[bytes, Prepared]:
    """Validates ``data`` (prepare_image decodes it), converts it if the policy says so; (Example bytes, Prepared)."""
    prepared = prepare_image(data, image_options)
    info = prepared.info
    features: dict[str, Any] = {
        examples.ENCODED: prepared.data,
        examples.FORMAT: info.format,
        examples.HEIGHT: info.height,
        examples.WIDTH: info.width,
        examples.CHANNELS: info.channels,
        examples.FILENAME: ref.relpath,
        examples.SHA256: hashlib.sha256(prepared.data).hexdigest(),
    }
    if ref.label is not None:
        features[examples.LABEL] = label_ids[ref.label]
        features[examples.LABEL_TEXT] = ref.label
    for column, value in ref.extras:
        try:
            features[column] = coerce(value, extra_types.get(column, "string"))
        except (TypeError, ValueError):
            continue  # an empty/odd value in a numeric column: feature left out
    return examples.build_example(dict(sorted(features.items()))), prepared


def convert_one(
    ref: Ref,
    label_ids: Mapping[str, int],
    extra_types: Mapping[str, str],
    image_options: ImageOptions | None = None,
) -> tuple[bytes, Prepared] | Rejected:
    """Reads and converts one ref; a Rejected is returned (not raised) for the writer to route.

    An error nobody foresaw (a Pillow plugin failing in a new way on a hostile
    file) rejects that one input as ``decode_error`` with the exception in the
    detail: one odd file must not fail the job.
    """
    try:
        return build_record(ref, read_bytes(ref.path), label_ids, extra_types, image_options)
    except Rejected as r:
        return r
    except Exception as e:  # noqa: BLE001 - see above
        return Rejected(DECODE_ERROR, f"unexpected {type(e).__name__}: {e}")


def ordered_map(pool: ThreadPoolExecutor, fn: Any, items: Iterable[Any], window: int) -> Iterator[tuple[Any, Any]]:
    """(item, fn(item)) in input order, with at most ``window`` calls in flight."""
    pending: collections.deque[tuple[Any, Future]] = collections.deque()
    it = iter(items)
    for item in itertools.islice(it, window):
        pending.append((item, pool.submit(fn, item)))
    while pending:
        item, future = pending.popleft()
        for nxt in itertools.islice(it, 1):
            pending.append((nxt, pool.submit(fn, nxt)))
        yield item, future.result()


def decode_threads(requested: int) -> int:
    return requested if requested > 0 else (os.cpu_count() or 1)


class WriteShardFn(beam.DoFn):
    """((split, shard), [Ref]) → one shard file under the run's temp folder."""

    def __init__(self, tmp_dir: str, compression: str, threads: int, image_options: ImageOptions | None = None) -> None:
        self._tmp_dir = tmp_dir
        self._compression = compression
        self._threads = threads
        self._image_options = image_options or ImageOptions()
        self._records = beam.metrics.Metrics.counter(NAMESPACE, "records_written")
        self._rejected = beam.metrics.Metrics.counter(NAMESPACE, "images_rejected")
        self._shards = beam.metrics.Metrics.counter(NAMESPACE, "shards_written")

    def setup(self) -> None:
        self._pool = ThreadPoolExecutor(decode_threads(self._threads), thread_name_prefix="decode")

    def teardown(self) -> None:
        self._pool.shutdown(wait=False)

    def process(
        self,
        element: tuple[tuple[str, int], Iterable[Ref]],
        labels: Sequence[str],
        extra_types: Mapping[str, str],
    ) -> Iterator[Any]:
        (split, shard), refs = element
        ordered = sorted(refs, key=lambda r: (r.key, r.relpath, r.path))
        label_ids = {label: i for i, label in enumerate(labels)}
        # A retried bundle writes a new temp file; only the committed attempt's
        # path reaches finalize, so attempts never mix.
        tmp_path = FileSystems.join(self._tmp_dir, f"{split}-{shard:05d}-{uuid.uuid4().hex}.tfrecord")
        records = 0
        label_counts: collections.Counter[str] = collections.Counter()
        converted: collections.Counter[str] = collections.Counter()
        window = PREFETCH_PER_THREAD * decode_threads(self._threads)
        options = self._image_options
        with FileSystems.create(tmp_path, compression_type=compression_type(self._compression)) as out:
            for ref, result in ordered_map(
                self._pool, lambda r: convert_one(r, label_ids, extra_types, options), ordered, window
            ):
                if isinstance(result, Rejected):
                    self._rejected.inc()
                    PROGRESS.add(rejected=1)
                    yield beam.pvalue.TaggedOutput(REJECTS, reject(ref.path, result.reason, result.detail))
                    continue
                PROGRESS.add(images=1)
                record, prepared = result
                failpoints.hit("writer.record")
                _TFRecordUtil.write_record(out, record)
                records += 1
                if ref.label is not None:
                    label_counts[ref.label] += 1
                if prepared.converted_from:
                    converted[prepared.converted_from] += 1
        self._records.inc(records)
        self._shards.inc()
        PROGRESS.add(shards=1)
        size = FileSystems.match([tmp_path])[0].metadata_list[0].size_in_bytes
        failpoints.hit("writer.result")
        yield {
            "split": split,
            "shard": shard,
            "tmp_path": tmp_path,
            "records": records,
            "bytes": size,
            "labels": dict(sorted(label_counts.items())),
            "converted": dict(sorted(converted.items())),
        }


class DecodeFn(beam.DoFn):
    """Ref → (split, label, record) for the WriteToTFRecord sink; rejects tagged."""

    def __init__(self, image_options: ImageOptions | None = None) -> None:
        self._rejected = beam.metrics.Metrics.counter(NAMESPACE, "images_rejected")
        self._image_options = image_options or ImageOptions()
        self._label_ids: tuple[Sequence[str] | None, dict[str, int]] = (None, {})

    def process(self, ref: Ref, labels: Sequence[str], extra_types: Mapping[str, str]) -> Iterator[Any]:
        if self._label_ids[0] is not labels:  # the side input: build the id map once, not per image
            self._label_ids = (labels, {label: i for i, label in enumerate(labels)})
        result = convert_one(ref, self._label_ids[1], extra_types, self._image_options)
        if isinstance(result, Rejected):
            self._rejected.inc()
            yield beam.pvalue.TaggedOutput(REJECTS, reject(ref.path, result.reason, result.detail))
        else:
            yield ref.split, ref.label, result[0]


def count_records(path: str) -> int:
    """Records in a TFRecord file (any compression Beam detects from the name)."""
    count = 0
    with FileSystems.open(path) as fh:
        while _TFRecordUtil.read_record(fh) is not None:
            count += 1
    return count
