"""The per-file index (``index.jsonl``): where every converted file's record is, and what it came from.

One JSON line per record, in shard order then record order::

    {"shard": "ds-train.tfrecord-00000-of-00002", "path": "cats/a.jpg", "size": 1234,
     "mtime": 1700000000.25, "split": "train", "record": 0, "offset": 0, "length": 2345,
     "sha256": "…", "label": "cats", "label_id": 0}

``record`` is the record's position in its shard; ``offset`` is where the
record's TFRecord frame starts in the shard's (uncompressed) stream and
``length`` the Example's byte length, so a reader seeks to one record without
scanning the shard (``formats``: each format reads a record by its entry).
``sha256`` is the stored image's (the record's ``image/sha256``);
``size``/``mtime`` are the source file's as listed (GCS: the object's update
time). Incremental runs (``--incremental-from``) read it to find files that
did not change.

Each shard writer writes its shard's lines to a part file next to the temp
shard (``_index/``, never published); finalize streams the chosen parts into
``index.jsonl``, putting the final shard name first on each line. Memory: a
line at a time, on both sides.

Uncompressed shards also get ``idx/<shard file>.idx``: a line ``offset
frame_size`` per record, the random-access index NVIDIA DALI's TFRecord
reader and the ``tfrecord`` package take (their ``tfrecord2idx`` format),
written by the shard writer as it goes and renamed by finalize.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.pvalue import AsSingleton
from apache_beam.typehints.decorators import no_annotations

from . import examples
from . import resume as resume_files
from .annotations.objects import digest as annotations_digest
from .formats import registry
from .images.phash import HEX, entry_hash
from .metadata import REJECTS_JSONL
from .sources.rules import class_values
from .storage import is_remote, open_lines
from .vocab.dataset_info import DatasetInfo
from .vocab.reasons import MISSING, NEAR_DUPLICATE_LEAK, UNREADABLE
from .vocab.refs import (
    REF_CODER,
    Previous,
    PreviousReject,
    Ref,
    as_ref,
)  # the previous run's record of a file: defined with Ref
from .writer import pieces

INDEX_JSONL = "index.jsonl"
# Inside the staging folder, never published: one index part per written shard.
INDEX_PARTS = "_index"
# Published: one random-access index per uncompressed shard, IDX_DIR/<shard file>.idx.
IDX_DIR = "idx"


def extras_digest(ref: Ref) -> str:
    """A short digest of the manifest's extra columns and the image's annotations: a record (or a kept
    reject) is reusable only if they are unchanged. Without annotations it is the extra columns' alone."""
    notes = annotations_digest(ref.annotations)
    if not ref.extras and not notes:
        return ""
    columns = [[k, v] for k, v in ref.extras]
    values = [*columns, ["annotations", notes]] if notes else columns
    text = json.dumps(values, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def part_line(
    ref: Ref,
    record: int,
    offset: int,
    length: int,
    sha256: str,
    label_id: int | list[int] | None,
    converted: str | None = None,
    phash: str | None = None,
    size: tuple[int, int] | None = None,
) -> str:
    """One record's index line as the writer stores it (finalize adds the shard's final name in front).
    ``converted``: the source format the stored bytes were converted from, so a later run that reuses the
    record counts it in dataset.json's ``converted`` as this one did. ``phash``: the source's perceptual
    hash (images/phash.py), which the near-duplicate join reads, and a later run that reuses the record keeps.
    ``size``: the stored image's (width, height), which dataset.json's ``image_sizes`` counts, a reuse too."""
    entry: dict[str, Any] = {
        "path": ref.relpath,
        "size": ref.size,
        "mtime": ref.mtime,
        "split": ref.split,
        "record": record,
        "offset": offset,
        "length": length,
        "sha256": sha256,
        "label": ref.label,
        "label_id": label_id,
    }
    digest = extras_digest(ref)
    if digest:
        entry["extras"] = digest
    if converted:
        entry["converted"] = converted
    if phash:
        entry["phash"] = phash[:HEX]
        if phash[HEX:]:
            entry["confirm"] = phash[HEX:]  # the second measure (images/phash.py)
    if size:
        entry["width"], entry["height"] = size
    return json.dumps(entry, ensure_ascii=False) + "\n"


def idx_line(offset: int, length: int) -> bytes:
    """One record's line of a shard's ``.idx`` file: its frame's offset and the frame's size in bytes.

    The format NVIDIA DALI's ``readers.tfrecord`` and the ``tfrecord``
    package's readers take as ``index_path`` (their ``tfrecord2idx`` writes it).
    """
    return f"{offset} {length + registry.TFRECORD.frame_overhead}\n".encode("ascii")


def with_shard(line: str, shard_file: str) -> str:
    """A part line with ``"shard"`` first (a string splice: no parse per line in finalize)."""
    return '{"shard": ' + json.dumps(shard_file, ensure_ascii=False) + ", " + line[1:]


def write_index(parts: list[tuple[str, str]], dest: str) -> None:
    """Streams (part path, final shard file name) parts, in order, into ``dest``."""
    with FileSystems.create(dest, compression_type="uncompressed") as out:
        for part, shard_file in parts:
            with open_lines(part) as fh:
                for raw in fh:
                    line = raw.decode("utf-8")
                    if line.strip():
                        out.write(with_shard(line, shard_file).encode("utf-8"))


def read_index(path: str) -> Iterator[dict[str, Any]]:
    """The entries of an ``index.jsonl`` (local or gs://), streamed."""
    with open_lines(path) as fh:
        for raw in fh:
            if raw.strip():
                yield json.loads(raw.decode("utf-8"))


def unchanged(entry: Mapping[str, Any], ref: Ref) -> bool:
    """The previous run's entry describes this very file: same relative path, size and mtime."""
    return entry.get("path") == ref.relpath and entry.get("size") == ref.size and entry.get("mtime") == ref.mtime


# ---- incremental runs ------------------------------------------------------------------------

# Settings that shape a record's bytes (images.ImageOptions): a previous run's
# records are reused only when all of them are the same.
RECORD_POLICY_KEYS = (
    "max_pixels",
    "max_total_pixels",
    "max_frames",
    "max_file_mb",
    "min_size",
    "apply_exif_orientation",
    "strip_exif",
    "resize_max_side",
    "reencode",
    "on_unsupported",
    "max_mask_pixels",
)
# Versions whose change may change what a file decodes to.
RECORD_VERSION_KEYS = ("beam_pipeline", "beam_pipeline_code", "pillow")
ADDED, CHANGED, UNCHANGED, DROPPED = "added", "changed", "unchanged", "dropped"
# A line of the previous index.jsonl or rejects.jsonl this run cannot read (damaged, cut short, not ours):
# it is left out, so its file is read and converted afresh, and dataset.json counts it.
UNREADABLE_LINE = "unreadable_previous_lines"
# Rejects an unchanged file keeps: every reason but these, which say nothing about the
# file's bytes (it was gone, or this job could not read it, when the previous run looked).
RETRIED_REASONS = frozenset({MISSING, UNREADABLE, NEAR_DUPLICATE_LEAK})  # a leak depends on the other files


@dataclass(frozen=True)
class PreviousRun:
    """A previous output whose records may be copied (``reusable_run`` checked the run-wide conditions)."""

    output: str
    features: Mapping[str, Any]  # its dataset.json feature spec: the extra columns' types must match
    # its dataset.json versions (RECORD_VERSION_KEYS): each writer compares them with its own, as
    # the machine that decodes (a Dataflow worker) may run other code than the one that launched
    versions: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def same_code_here(self) -> bool:
        """Whether this process would decode as the previous run did (beam_pipeline code, Pillow)."""
        from . import metadata

        now = metadata.package_versions()
        return all(self.versions.get(k) == now.get(k) for k in RECORD_VERSION_KEYS)


def reuse_problem(previous: str, info: DatasetInfo, config: Mapping[str, Any]) -> str | None:
    """Why no record of the previous output ``previous`` (its dataset.json ``info``) can be this run's, or None.

    It needs an ``index.jsonl`` (the planned sink writes one), uncompressed
    shards (a record is read at its offset), ArrayRecord shards on a local
    disk (the library reads local files), and the image policy and
    beam_pipeline code/Pillow versions of this run. Its label ids are kept
    either way. The previous output's format may be the other one: records
    are the same Example bytes in either.
    """
    if info.format not in registry.FORMATS:
        return f"its shards are in format {info.format!r}, which this version does not read"
    fmt = registry.get(info.format)
    if fmt.missing():  # a TFRecord night after an ArrayRecord one, where the library is not installed
        install = f"pip install 'beam_pipeline[{fmt.extra}]'"
        return f"its shards are {info.format}, whose library is not installed here ({install})"
    if not fmt.ranged_remote_reads and is_remote(previous):
        return f"its shards are {info.format} on a store: reading one record there fetches its whole shard"
    if not FileSystems.exists(FileSystems.join(previous, INDEX_JSONL)):
        return f"it has no {INDEX_JSONL} (written by --sink write_to_tfrecord or an older version)"
    if info.compression != "none":
        return f"its shards are {info.compression}-compressed"
    old = info.config
    policy = [k for k in RECORD_POLICY_KEYS if old.get(k) != config.get(k)]
    if policy:
        return "its image policy differs (" + ", ".join(f"--{k.replace('_', '-')}" for k in policy) + ")"
    if not _previous_run(previous, info).same_code_here():
        return "it was written by other beam_pipeline code or another Pillow"
    return None


def info_shape_problem(info: Mapping[str, Any]) -> str | None:
    """What about a previous dataset.json's shape ``reuse_problem`` could not read (a JSON object whose
    ``config``, ``versions`` or ``features`` is not an object, a feature that is not one, a ``compression``
    that is not text), or None. Such a file is damaged like one that is not JSON."""
    for key in ("config", "versions", "features"):
        if info.get(key) is not None and not isinstance(info[key], dict):
            return f"its {key!r} is not a JSON object"
    if not all(isinstance(v, dict) for v in (info.get("features") or {}).values()):
        return "a feature of its 'features' is not a JSON object"
    if info.get("compression") is not None and not isinstance(info["compression"], str):
        return "its 'compression' is not text"
    return None


def _previous_run(previous: str, info: DatasetInfo) -> PreviousRun:
    versions = info.versions
    # The object keys are the code's (its digest is compared); each record's annotations are compared by their
    # digest (extras_digest): the writers compare the rest, the image and manifest features.
    features = {k: v for k, v in info.features.items() if v.get("source") != "annotations"}
    return PreviousRun(previous, features, {k: versions.get(k) for k in RECORD_VERSION_KEYS})


def reusable_run(previous: str, info: DatasetInfo, config: Mapping[str, Any]) -> PreviousRun | None:
    """A PreviousRun when the previous run's records can be this run's (``reuse_problem``), else None
    (everything is converted)."""
    return None if reuse_problem(previous, info, config) else _previous_run(previous, info)


def kept_reject(entry: Mapping[str, Any], ref: Ref) -> bool:
    """A previous ``rejects.jsonl`` line (joined to ``ref`` by path) that still holds: same size and mtime, a
    reason about the bytes, and the same manifest row (its extra columns' digest: a value in the row may have
    caused the reject, e.g. ``bad_value``)."""
    return (
        entry.get("size") == ref.size
        and entry.get("mtime") == ref.mtime
        and entry["reason"] not in RETRIED_REASONS
        and entry.get("extras", "") == extras_digest(ref)
    )


def reject_key(entry: Mapping[str, Any], root: str) -> str:
    """The path a previous reject joins on: its file's path relative to the input root, as ``Ref.relpath`` is."""
    from .sources.rules import relative_path

    return relative_path(entry.get("source") or entry["path"], root)


def previous_of(entry: Mapping[str, Any], output: str) -> Previous:
    return Previous(
        FileSystems.join(output, entry["shard"]),
        registry.of_shard(entry["shard"]).locate(entry),
        int(entry["length"]),
        str(entry["sha256"]),
        tuple(entry["label"]) if isinstance(entry.get("label"), list) else entry.get("label"),
        entry.get("label_id"),
        str(entry.get("extras", "")),
        entry.get("converted"),
        entry_hash(entry) or None,
        _size(entry),
    )


def _size(entry: Mapping[str, Any]) -> tuple[int, int] | None:
    width, height = entry.get("width"), entry.get("height")
    if isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0:
        return width, height
    return None  # an index of an older version, or a damaged line: counted as unknown


def reusable_record(ref: Ref, label_ids: Mapping[str, int]) -> bool:
    """The previous record of ``ref`` is byte for byte what converting it now would write.

    The file is unchanged (the join attached ``ref.previous`` only then);
    its label text and id, and its extra columns, must be too.
    """
    prev = ref.previous
    if not isinstance(prev, Previous):
        return False
    try:
        label_id, _ = class_values(ref.label, label_ids)
    except KeyError:  # a label without an id: nothing to compare with
        return False
    return prev.label == ref.label and prev.label_id == label_id and prev.extras == extras_digest(ref)


class DamagedRecord(ValueError):
    """A previous record that fails a check: its file is converted afresh, never copied."""


def read_previous(prev: Previous, relpath: str) -> bytes:
    """The previous record of ``relpath``, read at its offset and checked (``check_record``) before it is copied.

    A copied record gets a fresh frame, so a damaged one copied unchecked would
    pass every later CRC check: a DamagedRecord says it must be converted again.
    """
    fmt = registry.of_shard(prev.shard)
    where = f"{prev.shard}@{prev.offset}" if fmt.position_key == "offset" else f"{prev.shard} record {prev.offset}"
    try:
        data = fmt.read_one(prev.shard, prev.offset)
    except ValueError as e:  # damaged, cut short or not there
        raise DamagedRecord(str(e)) from None
    if len(data) != prev.length:
        raise DamagedRecord(f"{where}: {len(data)} bytes, the index says {prev.length}")
    check_record(data, prev.sha256, relpath, where)
    return data


def check_record(record: bytes, sha256: str, relpath: str, where: str = "") -> None:
    """Raises DamagedRecord unless ``record`` holds ``relpath``'s image whose digest is ``sha256``, as its
    ``image/key/sha256`` says: intact CRCs around altered bytes (or an index pointing elsewhere) fail here."""
    try:
        fmap = examples.Example.FromString(record).features.feature
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError: the bytes are no Example
        raise DamagedRecord(f"{where}: not an Example ({type(e).__name__})") from None

    def first(key: str) -> bytes | None:
        values = fmap[key].bytes_list.value if key in fmap else ()
        return values[0] if len(values) == 1 else None

    image, key, name = first(examples.ENCODED), first(examples.SHA256), first(examples.FILENAME)
    if image is None or name != relpath.encode("utf-8", "surrogateescape"):
        raise DamagedRecord(f"{where}: not the record of {relpath}")
    digest = hashlib.sha256(image).hexdigest()
    if key != digest.encode("ascii") or digest != sha256:
        raise DamagedRecord(f"{where}: the image bytes' sha256 is not the one recorded for {relpath}")


class MatchPreviousFn(beam.DoFn):
    """(relpath, {"refs": [Ref], "previous": [entry], "rejects": [reject]}) → Refs, ``previous`` set when unchanged.

    ``previous`` becomes a Previous (where the record is) for a file in the
    previous index, a PreviousReject for a file the previous run rejected for
    its bytes (``kept_reject``). Tagged CHANGES: one of
    added/changed/unchanged/dropped per listed file, for dataset.json: added
    when the previous run had neither a record nor a reject of its path,
    unchanged when one of them has its size and mtime (whether or not it can
    be reused), changed otherwise; dropped per previous record nobody listed.
    """

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: tuple[str, Mapping[str, Iterable[bytes]]]) -> Iterator[Any]:
        _, joined = element
        refs = [REF_CODER.decode(ref) for ref in joined["refs"]]
        entries = [json.loads(entry) for entry in joined["previous"]]
        rejects = [json.loads(entry) for entry in joined.get("rejects", ())]
        if not refs:
            for entry in entries:
                yield beam.pvalue.TaggedOutput(CHANGES, DROPPED)
                yield beam.pvalue.TaggedOutput(DROPPED_PATHS, str(entry.get("path", "")))
            return
        for ref in refs:
            entry = next((e for e in entries if unchanged(e, ref)), None)
            if entry is not None:
                yield beam.pvalue.TaggedOutput(CHANGES, UNCHANGED)
                yield dataclasses.replace(ref, previous=previous_of(entry, self._output))
                continue
            kept = next((r for r in rejects if kept_reject(r, ref)), None)
            if kept is not None:
                yield beam.pvalue.TaggedOutput(CHANGES, UNCHANGED)
                yield dataclasses.replace(ref, previous=PreviousReject(kept["reason"], kept.get("detail", "")))
                continue
            same = any(e.get("size") == ref.size and e.get("mtime") == ref.mtime for e in [*entries, *rejects])
            yield beam.pvalue.TaggedOutput(CHANGES, UNCHANGED if same else CHANGED if entries or rejects else ADDED)
            yield ref


# What the join keeps of a previous index line: the keys ``unchanged`` and ``previous_of`` read.
_JOINED_KEYS = ("path", "size", "mtime", "shard", "record", "offset", "length", "sha256", "label", "label_id", "extras",
                "converted", "phash", "confirm", "width", "height")  # fmt: skip


def _packed(entry: Mapping[str, Any], keys: Iterable[str] | None = None) -> bytes:
    """A previous line as it waits in the join: compact JSON (of ``keys`` only, when given). The local runner
    keeps a shuffle's values as Python objects, ~1.5 KB for a parsed index line against ~300 bytes."""
    kept = entry if keys is None else {k: entry[k] for k in keys if k in entry}
    return json.dumps(kept, separators=(",", ":")).encode()


CHANGES = "changes"
DROPPED_PATHS = "dropped_paths"
DROPPED_NAMED = 10  # dropped records dataset.json names (the first, by path): the rest are the previous index's


def index_entry(entry: Any) -> bool:
    """A previous index.jsonl line this run can use: what ``unchanged`` and ``previous_of`` read, well typed."""
    if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("shard"), str)):
        return False
    found = registry.shard_parts(entry["shard"].rsplit("/", 1)[-1])
    if found is None:  # not a shard name this version writes
        return False
    where = found[0].position_key  # TFRecord: offset; ArrayRecord: record
    return (
        all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in (where, "length"))
        and 0 <= entry[where] < 2**63
        and 0 <= entry["length"] < 2**63
        and isinstance(entry.get("sha256"), str)
    )


def reject_entry(entry: Any) -> bool:
    """A previous rejects.jsonl line this run can use: a path (or source) and a reason, as ``kept_reject`` reads."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("source") or entry.get("path"), str)
        and isinstance(entry.get("reason"), str)
        and isinstance(entry.get("detail", ""), str)
    )


class ParsePreviousLine(beam.DoFn):
    """A line of the previous output's index.jsonl or rejects.jsonl (bytes, read with BytesCoder) → its entry;
    one that is not UTF-8 or not valid JSON (cut short, damaged, nested deeper than Python's reader goes) or
    lacks what the join reads is tagged CHANGES ``UNREADABLE_LINE`` instead: its file is then read and
    converted afresh, never a crashed run."""

    def __init__(self, usable: Any) -> None:
        self._usable = usable

    def process(self, line: bytes) -> Iterator[Any]:
        try:
            entry = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            entry = None
        if entry is not None and self._usable(entry):
            yield entry
        elif line.strip():
            yield beam.pvalue.TaggedOutput(CHANGES, UNREADABLE_LINE)


# ---- the local runner's join: on disk, one bucket of paths at a time -------------------------------------------
#
# The local runner keeps a shuffle in its memory: a CoGroupByKey of every listed file with its previous index
# line took ~2 KB per listed file (2.6 GB for a night over 1 M tiles). There, each side is packed per bundle
# into files by a hash bucket of the path (writer/pieces.PackFn), only the files' paths are joined by bucket,
# and each bucket is matched from its files: memory is one bucket's, whatever the number of files.

# Previous index bytes per bucket: a bucket's lines are held as a dict while it is matched (~1.3× the bytes).
JOIN_BUCKET_BYTES = 16 * 1024 * 1024
# Tonight's refs are not counted before the join: a night that lists far more files than the previous index
# holds (a dataset grown tenfold) shares them over at least this many buckets (~6 MB of refs each per 1 M).
MIN_JOIN_BUCKETS = 16


def join_buckets(index_path: str) -> int:
    """Buckets for a previous index of this size."""
    try:
        size = FileSystems.match([index_path])[0].metadata_list[0].size_in_bytes
    except (OSError, IndexError, BeamIOError):  # gone since the launcher looked: nothing to reuse
        return MIN_JOIN_BUCKETS
    return max(MIN_JOIN_BUCKETS, -(-size // JOIN_BUCKET_BYTES))


def _path_bucket(path: str, buckets: int) -> int:
    digest = hashlib.blake2b(path.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


class PackByPathFn(pieces.PackFn):
    """(path, value bytes) → (bucket, a file of (path, value) pairs of that bucket)."""

    def __init__(self, scratch: str, kind: str, buckets: int) -> None:
        super().__init__(FileSystems.join(scratch, resume_files.JOIN_FILES))
        self._kind = kind
        self._buckets = buckets

    def keyed(self, pair: tuple[str, bytes]) -> tuple[int, bytes]:
        path, value = pair
        return _path_bucket(path, self._buckets), pieces.frame([path.encode("utf-8", "surrogatepass"), value])

    def file_name(self, bucket: int, digest: str) -> str:
        return f"{self._kind}-{bucket:05d}-{digest}.pairs"

    def process(self, pair: tuple[str, bytes]) -> Iterator[tuple[int, str]]:
        return super().process(pair)


def _pairs(paths: Iterable[str]) -> Iterator[tuple[str, bytes]]:
    for path in sorted(paths):  # only committed bundles' files; a file named twice held its items twice
        for item in pieces.items_of(path):
            key, value = pieces.unframe(item)
            yield key.decode("utf-8", "surrogatepass"), value


class MatchBucketFn(beam.DoFn):
    """(bucket, {"refs", "previous", "rejects": file paths}) → what MatchPreviousFn gives for each path of it."""

    def __init__(self, output: str) -> None:
        self._match = MatchPreviousFn(output)

    def process(self, element: tuple[int, Mapping[str, Iterable[str]]]) -> Iterator[Any]:
        _, files = element
        joined: dict[str, dict[str, list[bytes]]] = {}
        for kind in ("refs", "previous", "rejects"):
            for path, value in _pairs(files.get(kind, ())):
                joined.setdefault(path, {"refs": [], "previous": [], "rejects": []})[kind].append(value)
        for path in sorted(joined):
            yield from self._match.process((path, joined.pop(path)))


class JoinPrevious(beam.PTransform):
    """refs → {"refs": refs (unchanged files carry ``previous``), CHANGES: {kind: count} (one element)}."""

    def __init__(self, output: str, root: str, scratch: str | None = None) -> None:
        super().__init__()
        self._output = output
        self._root = root  # this run's input root: previous rejects join on their path relative to it
        # the local runner: the join goes through files in this scratch folder, one bucket at a time
        self._scratch = scratch

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> dict[str, beam.PCollection]:
        index_path = FileSystems.join(self._output, INDEX_JSONL)
        unreadable: list[beam.PCollection] = []
        if FileSystems.exists(index_path):
            entries = (
                refs.pipeline
                | "ReadPreviousIndex" >> beam.io.ReadFromText(index_path, coder=BytesCoder())
                | "ParsePreviousIndex" >> beam.ParDo(ParsePreviousLine(index_entry)).with_outputs(CHANGES, main="ok")
            )
            unreadable.append(entries[CHANGES])
            previous = entries.ok | "PreviousByPath" >> beam.Map(lambda e: (e["path"], _packed(e, _JOINED_KEYS)))
        else:  # its label ids are kept, nothing is reused (reuse_problem): every file counts as added
            previous = refs.pipeline | "NoPreviousIndex" >> beam.Create([])
        rejects_path = FileSystems.join(self._output, REJECTS_JSONL)
        if FileSystems.exists(rejects_path):
            # only files that were read have a size and mtime in rejects.jsonl (kept_reject needs them)
            root = self._root
            rows = (
                refs.pipeline
                | "ReadPreviousRejects" >> beam.io.ReadFromText(rejects_path, coder=BytesCoder())
                | "ParsePreviousRejects" >> beam.ParDo(ParsePreviousLine(reject_entry)).with_outputs(CHANGES, main="ok")
            )
            unreadable.append(rows[CHANGES])
            rejects = rows.ok | "PreviousRejectByPath" >> beam.Map(lambda r: (reject_key(r, root), _packed(r)))
        else:
            rejects = refs.pipeline | "NoPreviousRejects" >> beam.Create([])
        # refs as bytes too (RefCoder): a decoded Ref waiting in the join is ~400 bytes, encoded ~120
        by_path = refs | "RefByPath" >> beam.Map(lambda r: (r.relpath, REF_CODER.encode(r))).with_output_types(
            tuple[str, bytes]
        )
        sides = {"refs": by_path, "previous": previous, "rejects": rejects}
        if self._scratch is None:
            matched = (
                sides
                | "JoinByPath" >> beam.CoGroupByKey()
                | "MatchPrevious"
                >> beam.ParDo(MatchPreviousFn(self._output)).with_outputs(CHANGES, DROPPED_PATHS, main="refs")
            )
        else:
            buckets = join_buckets(index_path)
            files = {
                kind: side | f"Pack_{kind}" >> beam.ParDo(PackByPathFn(self._scratch, kind, buckets))
                for kind, side in sides.items()
            }
            matched = (
                files
                | "JoinByBucket" >> beam.CoGroupByKey()
                | "MatchPrevious"
                >> beam.ParDo(MatchBucketFn(self._output)).with_outputs(CHANGES, DROPPED_PATHS, main="refs")
            )
        first_dropped = matched[DROPPED_PATHS] | "FirstDropped" >> beam.combiners.Top.Smallest(DROPPED_NAMED)
        counts = (
            (matched[CHANGES], *unreadable)
            | "WithUnreadableLines" >> beam.Flatten()
            | "CountChanges" >> beam.combiners.Count.PerElement()
            | "AllChanges" >> beam.combiners.ToDict()
            | "WithFirstDropped"
            >> beam.Map(lambda counts, first: {**counts, "dropped_first": sorted(first)}, AsSingleton(first_dropped))
        )
        refs = matched.refs | "Refs" >> beam.Map(as_ref).with_output_types(Ref)  # in vocab.refs.RefCoder
        return {"refs": refs, CHANGES: counts}
