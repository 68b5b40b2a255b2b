"""``inspect``: look at a converted dataset — summary, full verification, contact sheet.

    python -m beam_pipeline inspect OUTPUT                       # summary (80 columns)
    python -m beam_pipeline inspect OUTPUT --verify              # read every record; exit 1 on the first problem
    python -m beam_pipeline inspect OUTPUT --contact-sheet s.png --n 64 --split train

Works on local folders and gs:// (Beam FileSystems).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import examples, index, metadata, storage
from .annotations import objects
from .annotations.masks import PNG_SIGNATURE, SEGMENTATION_ENCODED
from .errors import UsageError, last_line
from .examples import parse_example
from .formats import registry
from .storage import open_lines, read_json_object
from .vocab.dataset_info import DatasetInfo, IncrementalInfo, ShardEntry

WIDTH = 80


class VerifyError(Exception):
    """A shard that does not hold what dataset.json says; the message names shard and record."""


def check_access(output: str) -> None:
    """A gs:// output is asked about first, with a short deadline (storage.gcs_check): no network, no bucket
    or no credentials is one line saying so, not minutes of the GCS client's retries."""
    try:
        storage.check_reachable(output)
    except storage.GcsAccessError as e:
        raise UsageError(f"{output}: {e}") from None


def read_info(output: str) -> DatasetInfo:
    path = FileSystems.join(output, metadata.DATASET_JSON)
    if not FileSystems.exists(path):
        raise UsageError(f"{output}: no dataset.json (not a beam_pipeline output, or an unfinished run)")
    try:
        info = DatasetInfo.from_json(read_json_object(path))
    except ValueError as e:
        raise UsageError(f"{output}: dataset.json is damaged ({last_line(e)})") from None
    if info.format not in registry.FORMATS:
        raise UsageError(
            f"{output}: its shards are in format {info.format!r}, which this version does not read "
            f"(it reads {', '.join(registry.FORMATS)}): a newer beam_pipeline wrote it"
        )
    return info


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def summary(output: str, info: DatasetInfo, split: str | None = None) -> str:
    """The dataset at a glance, fitted to 80 columns."""
    complete = FileSystems.exists(FileSystems.join(output, metadata.SUCCESS))
    status = "complete (_SUCCESS)" if complete else "INCOMPLETE: no _SUCCESS"
    if not complete and info.status == "too_many_rejects":
        fraction = info.config.get("max_reject_fraction")
        status += f" (more rejects than --max-reject-fraction {fraction:g})" if fraction is not None else ""
    elif not complete and info.status == "no_object_kept":
        total = info.objects.rejects.total if info.objects is not None else None
        status += f" (no object kept: {total} rejected)"
    elif not complete and info.status == "nothing_converted":
        status += " (no image converted)"
    lines = [f"{info.name}  ({output})", f"status: {status}"]
    lines.append(
        f"{info.examples:,} examples, {_mb(info.bytes)}, {info.format}, compression {info.compression}, "
        f"seed {info.seed}"
    )
    lines.append("")
    lines.append(f"{'split':<12}{'examples':>10}{'shards':>8}{'total':>14}{'smallest':>13}{'largest':>13}")
    for name, s in info.splits.items():
        if split and name != split:
            continue
        sizes = [x.bytes for x in s.shards] or [0]
        lines.append(
            f"{name:<12}{s.examples:>10,}{s.num_shards:>8}{_mb(s.bytes):>14}{_mb(min(sizes)):>13}{_mb(max(sizes)):>13}"
        )
    for name in info.empty_splits or ():
        if not split or name == split:
            lines.append(f"{name:<12}{0:>10}  every listed file rejected (rejects.jsonl)")
    labels = info.labels
    if labels:
        counts: dict[str, int] = {}
        for name, s in info.splits.items():
            if split and name != split:
                continue
            for label, c in (s.labels or {}).items():
                counts[label] = counts.get(label, 0) + c
        top = max(counts.values() or [1])
        lines += ["", f"labels ({len(labels)}){' in ' + split if split else ''}:"]
        for i, label in enumerate(labels[:30]):
            c = counts.get(label, 0)
            bar = "#" * max(0, round(36 * c / top))
            lines.append(f"  {i:>3} {label[:20]:<20} {c:>9,} {bar}")
        if len(labels) > 30:
            lines.append(f"  ... {len(labels) - 30} more")
    rejects = info.rejects
    lines += ["", f"rejects: {rejects.total:,}" + (" (rejects.jsonl)" if rejects.total else "")]
    for reason, c in list(rejects.by_reason.items())[:8]:
        lines.append(f"  {reason:<20} {c:>9,}")
    skipped = info.skipped
    if skipped.total:
        lines.append(
            f"skipped: {skipped.total:,} (" + ", ".join(f"{k} {v}" for k, v in skipped.by_reason.items()) + ")"
        )
    converted = converted_count(info)
    if converted:
        lines.append(f"converted: {converted[0]:,} {converted[1]}")
    lines += near_duplicate_lines(info.near_duplicates)
    lines += incremental_lines(info.incremental)
    lines += change_lines(info.changes)
    resumed = info.resumed
    if resumed:
        runs = len(resumed.from_runs) or 1
        lines.append(
            f"resumed: {resumed.shards:,} shards ({resumed.records:,} records) from "
            + ("an earlier run" if runs == 1 else f"{runs} earlier runs")
            + " that did not finish"
        )
    cfg = info.config
    src = cfg.get("input") or cfg.get("manifest")
    lines += ["", f"source: {src}", f"target shard: {cfg.get('target_shard_mb')} MB, sink {info.sink}"]
    versions = info.versions
    made = [f"{k} {v}" for k, v in versions.items()]
    line = "made with:"
    for part in made:
        if len(line) + len(part) + 2 > WIDTH:
            lines.append(line + ",")
            line = "          "
        line += (" " if line.endswith(":") or not line.strip() else ", ") + part
    lines.append(line)
    return "\n".join(line[:WIDTH] if len(line) > WIDTH else line for line in lines)


def near_duplicate_lines(near: Mapping[str, Any] | None) -> list[str]:
    """dataset.json's near_duplicates: groups (or an older run's pairs), those across splits (leakage) one line
    each."""
    from .near_duplicates import block_lines

    if not near:
        return []
    text, across = block_lines(near)
    lines = [f"near-duplicates: {text} (<= {near.get('max_distance')} bits, {near.get('file')})"]
    return lines + [f"  {key:<20} {n:>9,}" for key, n in across]


def converted_count(info: DatasetInfo) -> tuple[int, str] | None:
    """``(2, "stored as PNG (from jpeg 1, tiff 1)")``: images re-encoded, into what, from which source formats.

    dataset.json's ``converted`` counts them by source format; what they became
    follows from the image policy in its ``config`` (images.prepare_image):
    JPEG with --reencode; else a JPEG TF reads, rotated or resized, stays JPEG
    and everything else becomes PNG.
    """
    counts = info.converted
    if not counts:
        return None
    cfg = info.config
    if cfg.get("reencode"):
        into = "JPEG"
    elif cfg.get("resize_max_side") or cfg.get("apply_exif_orientation"):
        into = "PNG (JPEGs TensorFlow reads, rotated or resized: JPEG)"
    else:
        into = "PNG"
    sources = ", ".join(f"{k} {v:,}" for k, v in counts.items())
    return sum(counts.values()), f"stored as {into} (from {sources})"


def incremental_lines(inc: IncrementalInfo | None) -> list[str]:
    """What an --incremental-from run took from the previous dataset (dataset.json "incremental")."""
    if not inc:
        return []
    files = ", ".join(f"{k} {getattr(inc, k):,}" for k in ("unchanged", "added", "changed", "dropped"))
    kept = inc.rejects_kept
    again = inc.reconverted
    unreadable = inc.unreadable_previous_lines
    return [
        "",
        f"incremental: reused {inc.reused:,} records, converted {inc.converted:,}",
        f"  files: {files}",
        *([f"  rejects kept: {kept:,} (unchanged files, not read again)"] if kept else []),
        *([f"  reconverted: {again:,} (previous record damaged or gone)"] if again else []),
        *(
            [f"  unreadable previous lines: {unreadable:,} (damaged index/rejects lines; files converted afresh)"]
            if unreadable
            else []
        ),
        f"  from: {inc.source}",
    ]


NOTES = 20  # change notes shown; the rest are in dataset.json's changes


def change_lines(changes: Mapping[str, Any] | None) -> list[str]:
    """What moved since the --incremental-from dataset: the notes run/changes.notes wrote into dataset.json's
    ``changes``, the lines the run's summary printed."""
    if not changes:
        return []
    notes = list(changes.get("notes") or [])
    lines = ["since the previous night:"] + [f"  {note}" for note in notes[:NOTES]]
    if len(notes) > NOTES:
        lines.append(f"  ... {len(notes) - NOTES} more in dataset.json's changes")
    if not notes:
        share = changes.get("share")
        lines.append("  nothing moved past " + (f"--change-share {share:g}" if share is not None else "the share"))
    return lines


def _shard_path(output: str, shard: ShardEntry) -> str:
    return FileSystems.join(output, shard.file)


def iter_records(path: str) -> Iterator[bytes]:
    """Every record of a shard in its format (by its name), checked (ValueError on a bad one)."""
    return registry.of_shard(path).records(path)


def _progress(done: int, total: int, stream: Any) -> None:
    if not stream.isatty():
        return
    width = 40
    filled = int(width * done / max(total, 1))
    stream.write(f"\rverify [{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,}")
    stream.flush()


def verify(output: str, info: DatasetInfo, split: str | None = None, stream: Any = sys.stderr) -> int:
    """Reads every record once and checks it against everything that describes it. Returns records read.

    Per record: both CRCs, the Example parse, ``image/key/sha256`` against
    the image bytes, the decode to the recorded shape, its ``index.jsonl``
    line (offset, length, sha256, label id and text, path, split) and its
    ``.idx`` line; per shard the record count of dataset.json; and every
    index line belongs to exactly one record. Memory stays flat whatever the
    dataset's size: index.jsonl (written in shard order) and each ``.idx``
    are read a line at a time beside the shard they describe. A detection
    dataset's records also get their objects checked (``check_objects``).
    """
    from .analysis import quiet_native_logs

    with quiet_native_logs():
        import tensorflow as tf

    _no_stray_shards(output, info)
    cats = objects.categories_of(info)
    categories = None if cats is None else dict(cats)
    if cats is not None:
        _check_category_files(output, cats)
    total = sum(s.examples for n, s in info.splits.items() if not split or n == split)
    done = 0
    with _index_lines(output, info) as lines:
        for name, s in info.splits.items():
            for shard in s.shards:
                if split and name != split:
                    if lines is not None:
                        lines.skip(shard.file)
                    continue
                for _ in _verify_shard(output, info, name, shard, lines, tf, categories):
                    done += 1
                    if done % 64 == 0:
                        _progress(done, total, stream)
        if lines is not None:
            lines.finish()
    _progress(done, total, stream)
    if stream.isatty():
        stream.write("\n")
    return done


def _check_category_files(output: str, categories: list[tuple[int, str]]) -> None:
    """labels.txt and label_map.pbtxt are exactly what dataset.json's categories make (ids index labels.txt)."""
    wanted = {
        metadata.LABELS_TXT: "".join(f"{name}\n" for name in objects.labels_lines(categories)),
        objects.LABEL_MAP_PBTXT: objects.label_map_pbtxt(categories),
    }
    for name, text in wanted.items():
        path = FileSystems.join(output, name)
        if not FileSystems.exists(path):
            raise VerifyError(f"{name}: missing")
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            if fh.read() != text.encode("utf-8"):
                raise VerifyError(f"{name}: does not name {metadata.DATASET_JSON}'s categories")


def _no_stray_shards(output: str, info: DatasetInfo) -> None:
    """A shard-named file dataset.json does not list fails: a reader's glob (``ds-train.tfrecord-*``) would read it."""
    listed = set(info.shard_files())
    prefix = output.rstrip("/") + "/"
    for path in storage.list_dir(output):
        name = path[len(prefix) :]
        if metadata.is_shard_file(name) and name not in listed:
            raise VerifyError(f"{name}: a shard file dataset.json does not list (a glob over the shards would read it)")


def verified_what(info: DatasetInfo) -> str:
    """What verify checked of this dataset (index.jsonl and idx/ only where the dataset has them)."""
    parts = [registry.get(info.format).checksums, "Example parse", "image sha256", "decoded shapes", "counts"]
    if info.categories is not None:
        parts += [f"{metadata.LABELS_TXT} and {objects.LABEL_MAP_PBTXT}", "object boxes, ids and masks"]
    parts += [index.INDEX_JSONL] if _has_index(info) else []
    parts += [f"{index.IDX_DIR}/"] if info.idx_files else []
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _has_index(info: DatasetInfo) -> bool:
    """The planned sink's writers write index.jsonl; ``--sink write_to_tfrecord`` writes none."""
    return info.sink == "planned"


def _verify_shard(
    output: str,
    info: DatasetInfo,
    split: str,
    shard: ShardEntry,
    lines: _IndexLines | None,
    tf: Any,
    categories: dict[int, str] | None = None,
) -> Iterator[None]:
    """Checks one shard's records (yields once per record), its .idx and its index lines."""
    file = shard.file
    path = _shard_path(output, shard)
    if not FileSystems.exists(path):
        raise VerifyError(f"{file}: missing")
    idx = _IdxLines(output, info.idx_files.format(file=file)) if info.idx_files else None
    fmt = registry.get(info.format)  # read_info refused a format this version does not read
    frame = fmt.frame_overhead  # None: the format's records have no byte offsets
    with idx or contextlib.nullcontext():
        count, offset = 0, 0
        try:
            for count, record in enumerate(fmt.records(path), start=1):  # noqa: B007
                where = f"{file} record {count - 1}"
                ex = _check_record(record, where, tf)
                if categories is not None:
                    problem = check_objects(ex, categories, tf)
                    if problem:
                        raise VerifyError(f"{where}: {problem}")
                problem = check_label_map(ex, tf)
                if problem:
                    raise VerifyError(f"{where}: {problem}")
                if lines is not None:
                    lines.check(file, split, count - 1, None if frame is None else offset, len(record), ex)
                if idx is not None and frame is not None:
                    idx.check(where, offset, len(record) + frame)
                offset += len(record) + (frame or 0)
                yield
        except ValueError as e:  # CRC or framing
            raise VerifyError(f"{file} record {count}: {str(e).splitlines()[0][:120]}") from None
        if count != shard.records:
            raise VerifyError(f"{file}: {count} records, dataset.json says {shard.records}")
        if lines is not None:
            lines.end_of_shard(file, count)
        if idx is not None:
            idx.finish(count)


def _check_record(record: bytes, where: str, tf: Any) -> dict[str, list[Any]]:
    """The parsed Example, after checking its image against its sha256 and its recorded shape."""
    try:
        ex = parse_example(record)
        image = ex[examples.ENCODED][0]
        recorded_sha = ex[examples.SHA256][0].decode("ascii", "replace")
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        raise VerifyError(f"{where}: {type(e).__name__}: {str(e).splitlines()[0][:120]}") from None
    actual_sha = hashlib.sha256(image).hexdigest()
    if actual_sha != recorded_sha:
        raise VerifyError(
            f"{where}: the image bytes have sha256 {actual_sha[:16]}…, {examples.SHA256} says {recorded_sha[:16]}…"
        )
    try:
        decoded = tf.io.decode_image(image, expand_animations=False)
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        raise VerifyError(f"{where}: {type(e).__name__}: {str(e).splitlines()[0][:120]}") from None
    recorded = (ex[examples.HEIGHT][0], ex[examples.WIDTH][0], ex[examples.CHANNELS][0])
    if tuple(decoded.shape) != recorded:
        raise VerifyError(f"{where}: decodes to {tuple(decoded.shape)}, recorded {recorded}")
    return ex


def _tf_error(e: Exception) -> str:
    """A TensorFlow op's error in a few words: its type and first line, without the ``{{function_node ...}}``
    prefix eager ops put in front of the message."""
    lines = re.sub(r"^\{\{[^}]*\}\}\s*", "", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:120]}" if lines else type(e).__name__


def _one_channel_png_problem(png: bytes, ex: dict[str, list[Any]], tf: Any) -> str | None:
    """Why ``png`` (an instance mask or a label map) is not a one-channel PNG of the record's height x width as
    TensorFlow decodes it, as the end of a sentence naming it (" is not a PNG", ": <the error>", ...); or None."""
    if not png.startswith(PNG_SIGNATURE):  # decode_png reads other formats too
        return " is not a PNG"
    try:
        shape = tuple(tf.io.decode_png(png).shape)
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return f": {_tf_error(e)}"
    height, width = ex[examples.HEIGHT][0], ex[examples.WIDTH][0]
    if shape != (height, width, 1):
        return f" decodes to {'x'.join(map(str, shape))}, the image is {height}x{width}"
    return None


def check_label_map(ex: dict[str, list[Any]], tf: Any) -> str | None:
    """What is wrong with one parsed record's semantic label map (``--masks``), or None (also: none there): it
    must decode, as TensorFlow reads it, to the record's height x width with one channel."""
    stored = ex.get(SEGMENTATION_ENCODED)
    problem = _one_channel_png_problem(stored[0], ex, tf) if stored else None
    return f"label map{problem}" if problem else None


# Lists with one value per object beside the four box lists; difficult/truncated/view are checked where present.
_PER_OBJECT = (objects.CLASS_LABEL, objects.CLASS_TEXT, objects.IS_CROWD, objects.AREA)
_PER_OBJECT_IF_PRESENT = (objects.DIFFICULT, objects.TRUNCATED, objects.VIEW)
_BOXES = (objects.XMIN, objects.YMIN, objects.XMAX, objects.YMAX)


def check_objects(ex: dict[str, list[Any]], categories: dict[int, str], tf: Any) -> str | None:
    """What is wrong with one parsed record's objects, or None.

    Boxes in [0, 1] with min <= max; every per-object list as long as the
    boxes; class ids among dataset.json's categories, with their names as
    class/text; masks none or one per object, each a PNG of the record's
    height x width with one channel (what Model Garden's decoder expects).
    """
    count = len(ex.get(objects.XMIN, []))
    for key in (*_BOXES, *_PER_OBJECT, *(k for k in _PER_OBJECT_IF_PRESENT if k in ex)):
        if len(ex.get(key, [])) != count:
            return f"{key} has {len(ex.get(key, []))} values, the boxes {count}"
    for key in _BOXES:
        for i, value in enumerate(ex.get(key, [])):
            if not 0.0 <= value <= 1.0:  # NaN too
                return f"{key}[{i}] is {value:g}, outside [0, 1]"
    for i, (xmin, ymin, xmax, ymax) in enumerate(zip(*(ex.get(k, []) for k in _BOXES), strict=True)):
        if xmin > xmax:
            return f"object {i}: xmin {xmin:g} > xmax {xmax:g}"
        if ymin > ymax:
            return f"object {i}: ymin {ymin:g} > ymax {ymax:g}"
    for i, (label, text) in enumerate(
        zip(ex.get(objects.CLASS_LABEL, []), ex.get(objects.CLASS_TEXT, []), strict=True)
    ):
        if label not in categories:
            return f"object {i}: class id {label} is not a category of {metadata.DATASET_JSON}"
        if text.decode("utf-8", "replace") != categories[label]:
            return (
                f"object {i}: class text {text.decode('utf-8', 'replace')!r}, category {label} is {categories[label]!r}"
            )
    masks = ex.get(objects.MASK, [])
    if masks and len(masks) != count:
        return f"{len(masks)} masks for {count} objects"
    for i, png in enumerate(masks):
        problem = _one_channel_png_problem(png, ex, tf)
        if problem:
            return f"mask {i}{problem}"
    return None


def _text(ex: dict[str, list[Any]], key: str) -> str | None:
    values = ex.get(key)
    return values[0].decode("utf-8", "surrogateescape") if values else None


class _IndexLines:
    """index.jsonl read a line at a time beside the shards: each line must be the next record's."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self._line = 0
        self._next: dict[str, Any] | None = None
        self._advance()

    def _advance(self) -> None:
        self._next = None
        for raw in self._fh:
            self._line += 1
            if not raw.strip():
                continue
            try:
                self._next = json.loads(raw.decode("utf-8"))
            except ValueError:
                raise VerifyError(f"{index.INDEX_JSONL} line {self._line}: not a JSON line") from None
            if not isinstance(self._next, dict):
                raise VerifyError(f"{index.INDEX_JSONL} line {self._line}: not a JSON object")
            return

    def _at(self) -> str:
        return f"{index.INDEX_JSONL} line {self._line}"

    def check(
        self, file: str, split: str, record: int, offset: int | None, length: int, ex: dict[str, list[Any]]
    ) -> None:
        where = f"{file} record {record}"
        entry = self._next
        if entry is None:
            raise VerifyError(f"{where}: no line in {index.INDEX_JSONL} (it ends at line {self._line})")
        if entry.get("shard") != file or entry.get("record") != record:
            raise VerifyError(
                f"{where}: {self._at()} is for {entry.get('shard')} record {entry.get('record')}"
                " (one line per record, in shard order)"
            )
        label = ex.get(examples.LABEL)
        want: dict[str, Any] = {
            "offset": offset,
            "length": length,
            "sha256": _text(ex, examples.SHA256),
            "label_id": label[0] if label else None,
            "label": _text(ex, examples.LABEL_TEXT),
            "split": split,
        }
        if isinstance(entry.get("label_id"), list):  # multi-label: the ids as in the record, the names sorted
            names = sorted(t.decode("utf-8", "surrogateescape") for t in ex.get(examples.LABEL_TEXT, []))
            want.update(label_id=list(label or []), label=names)
        if examples.FILENAME in ex:
            want["path"] = _text(ex, examples.FILENAME)
        for key, value in want.items():
            if entry.get(key) != value:
                raise VerifyError(f"{where}: {self._at()} says {key} {entry.get(key)!r}, the record has {value!r}")
        self._advance()

    def skip(self, file: str) -> None:
        """Passes over a shard not being verified (--split)."""
        while self._next is not None and self._next.get("shard") == file:
            self._advance()

    def end_of_shard(self, file: str, count: int) -> None:
        if self._next is not None and self._next.get("shard") == file:
            raise VerifyError(
                f"{file} record {self._next.get('record')}: {self._at()} names a record the shard does not have"
                f" ({count} records)"
            )

    def finish(self) -> None:
        if self._next is not None:
            raise VerifyError(
                f"{self._at()}: {self._next.get('shard')} record {self._next.get('record')} is not a record of"
                " dataset.json's shards, in shard order"
            )


@contextlib.contextmanager
def _index_lines(output: str, info: DatasetInfo) -> Iterator[_IndexLines | None]:
    """The dataset's index.jsonl, or None for a sink that writes none (``--sink write_to_tfrecord``)."""
    if not _has_index(info):
        yield None
        return
    path = FileSystems.join(output, index.INDEX_JSONL)
    if not FileSystems.exists(path):
        raise VerifyError(f"{index.INDEX_JSONL}: missing")
    with open_lines(path) as fh:
        yield _IndexLines(fh)


class _IdxLines:
    """A shard's .idx read a line at a time: each line names one record's frame, offset and size, in order."""

    def __init__(self, output: str, rel: str) -> None:
        self._rel = rel
        self._path = FileSystems.join(output, rel)
        self._line = 0

    def __enter__(self) -> _IdxLines:
        if not FileSystems.exists(self._path):
            raise VerifyError(f"{self._rel}: missing")
        self._fh = open_lines(self._path)
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()

    def check(self, where: str, offset: int, size: int) -> None:
        line = self._fh.readline().decode("ascii", "replace")
        self._line += 1
        if line.split() != [str(offset), str(size)]:
            got = repr(line.strip()) if line else "no line"
            raise VerifyError(f"{self._rel} line {self._line}: {got}, the shard has {offset} {size} ({where})")

    def finish(self, count: int) -> None:
        rest = sum(1 for raw in self._fh if raw.strip())
        if rest:
            raise VerifyError(f"{self._rel}: {count + rest} lines, the shard has {count} records")


def _read_at(path: str, wanted: set[int]) -> Iterator[tuple[int, bytes]]:
    """(index, record) of the given indexes of one shard, in file order, one at a time (a caller that keeps
    only what it needs of each holds one record, not all): its format reads them (``formats``)."""
    return registry.of_shard(path).read_at(path, wanted)
