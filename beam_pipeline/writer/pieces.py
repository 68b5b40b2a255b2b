"""A shard's refs through small files, for runners that hand a group to a worker as one message.

On Flink and Spark a GroupByKey's output reaches the Python worker as one
element per key, the whole group encoded inline, and the runner checks that a
worker keeps up only every 100 messages (runner.DATA_BUFFER_BYTES). A
shard's refs grouped by shard are then one message of up to
planning.MAX_REF_BYTES_PER_SHARD each, and while a writer works on one
shard, the stage's next shards wait in the TaskManager's direct memory: a
whole partition's refs, which grow with the images (a 6,000-row manifest
with 25 KB columns failed with "Direct buffer memory" this way). So there:

    refs ─ AssignPiece ─ GroupByPiece ─ WritePiece ─ GroupByShard ─ the shard writer (read_refs)

A shard's refs are cut into pieces of ~PIECE_REF_BYTES (by key), each group
(split, shard, piece) is written as one file under the run's scratch folder
(``resume.SHARD_REFS``), and the shard writer receives only the pieces' paths
and reads them itself (``read_refs``), so a shard's refs never cross the data
channel as one element. Every message on the channel is then
bounded whatever the images, and no group passes Flink's sort-record limit.

A piece's file is its refs in key order, whole or absent (written under a
temporary name, then renamed; a GCS object appears whole), so a retried or
duplicated attempt writes the same bytes. The files stay in the scratch
folder and go with it after publish (resume.SCRATCH_ONLY).

On the local runner (``PackPiecesFn``) there is no shuffle of refs at all:

    refs ─ PackPieces ─ GroupByShard ─ the shard writer (read_refs)

That runner keeps a shuffle's whole input and output in its own memory, and
hands a stage its whole input as one message: a GroupByKey of refs cost
three encoded copies of every ref of the run at once (its table, its
output, the write stage's input; 0.2 KB per image). PackPieces keeps each
shard's encoded refs of its bundle and writes them as a file when they
reach PACK_PIECE_BYTES, all of them when the bundle's reach
PACK_BUFFER_BYTES and when it ends. A file is named by the digest of its
bytes: an attempt whose output the runner drops leaves a file nobody reads,
a repeated one the same file.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from .. import hashing, storage
from ..planning import ShardPlan, assign_shard
from ..resume import SHARD_REFS
from ..vocab.refs import REF_CODER, Ref

# Refs per piece, in encoded bytes: a message of the data channel (64 KB) holds one or two.
PIECE_REF_BYTES = 32 * 1024
# PackPiecesFn: a shard's refs are written once they reach PACK_PIECE_BYTES, and every shard's once the
# bundle holds PACK_BUFFER_BYTES (so the memory it keeps is bounded however many shards the plan has).
PACK_PIECE_BYTES = 1024 * 1024
PACK_BUFFER_BYTES = 8 * 1024 * 1024


ShardKey = tuple[str, int]
PieceKey = tuple[str, int, int]


def pieces_per_shard(plan: ShardPlan) -> int:
    """How many pieces each of a split's shards is cut into: its refs over PIECE_REF_BYTES (at least 1)."""
    return max(1, math.ceil(plan.ref_bytes / plan.num_shards / PIECE_REF_BYTES))


def assign_piece(ref: Ref, plans: Mapping[str, ShardPlan]) -> tuple[PieceKey, Ref]:
    """((split, shard, piece), ref): the shard as planning.assign_shard gives it, the piece by the ref's key."""
    plan = plans[ref.split]
    return (ref.split, plan.shard_of(hashing.bucket_of(ref.key)), ref.key % pieces_per_shard(plan)), ref


def piece_path(scratch: str, split: str, shard: int, piece: int) -> str:
    return FileSystems.join(scratch, SHARD_REFS, f"{_split_tag(split)}-{shard:05d}-{piece:05d}.refs")


def sort_key(ref: Ref) -> tuple[int, str, str]:
    """The order a shard's records are written in (and a piece's refs stored in)."""
    return ref.key, ref.relpath, ref.path


def frame(encoded: Iterable[bytes]) -> bytes:
    """Items after their lengths (a piece file's bytes: each ref's RefCoder bytes)."""
    out = create_OutputStream()
    for item in encoded:
        out.write(item, True)
    return out.get()


def unframe(data: bytes) -> list[bytes]:
    """The items ``frame`` gave ``data`` of."""
    stream = create_InputStream(data)
    items = []
    while stream.size() > 0:
        items.append(stream.read_all(True))
    return items


def _unframe(data: bytes) -> Iterator[Ref]:
    return map(REF_CODER.decode, unframe(data))


def _split_tag(split: str) -> str:
    # a split's name is any text a manifest gives: a digest of it names the file
    return hashlib.sha256(split.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class WritePieceFn(beam.DoFn):
    """((split, shard, piece), refs) → ((split, shard), the piece's file), the file written."""

    def __init__(self, scratch: str) -> None:
        super().__init__()
        self._scratch = scratch

    def process(self, element: tuple[PieceKey, Iterable[Ref]]) -> Iterator[tuple[ShardKey, str]]:
        (split, shard, piece), refs = element
        path = piece_path(self._scratch, split, shard, piece)
        storage.backend_for(path).write_atomic(path, frame(map(REF_CODER.encode, sorted(refs, key=sort_key))))
        yield (split, shard), path


class PackFn(beam.DoFn):
    """element → (key, a file of the bundle's items of that key): items (bytes) are held per key and written as one
    file, named by the digest of its bytes, when a key's reach PACK_PIECE_BYTES, every key's when the bundle
    holds PACK_BUFFER_BYTES, and the rest when the bundle ends. Subclasses say what an element's key and item
    are (``keyed``) and name the file (``file_name``)."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self._folder = folder

    def start_bundle(self) -> None:
        self._held: dict[Any, list[bytes]] = {}
        self._sizes: dict[Any, int] = {}
        self._total = 0

    def keyed(self, element: Any, *side: Any) -> tuple[Any, bytes]:
        raise NotImplementedError

    def file_name(self, key: Any, digest: str) -> str:
        raise NotImplementedError

    def process(self, element: Any, *side: Any) -> Iterator[tuple[Any, str]]:
        key, item = self.keyed(element, *side)
        self._held.setdefault(key, []).append(item)
        size = self._sizes[key] = self._sizes.get(key, 0) + len(item)
        self._total += len(item)
        if size >= PACK_PIECE_BYTES:
            yield self._write(key)
        if self._total >= PACK_BUFFER_BYTES:
            yield from self._write_all()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        for out in self._write_all():
            yield WindowedValue(out, GlobalWindow().max_timestamp(), [GlobalWindow()])

    def _write_all(self) -> Iterator[tuple[Any, str]]:
        for key in sorted(self._held):
            yield self._write(key)

    def _write(self, key: Any) -> tuple[Any, str]:
        data = frame(self._held.pop(key))
        self._total -= self._sizes.pop(key)
        path = FileSystems.join(self._folder, self.file_name(key, hashlib.sha256(data).hexdigest()[:32]))
        storage.backend_for(path).write_atomic(path, data)
        return key, path


class PackPiecesFn(PackFn):
    """ref → ((split, shard), a piece file of its shard's refs) (the local runner's path: no shuffle of refs).
    Side input: the plans {split: ShardPlan}."""

    def __init__(self, scratch: str) -> None:
        super().__init__(FileSystems.join(scratch, SHARD_REFS))

    def keyed(self, ref: Ref, plans: Mapping[str, ShardPlan]) -> tuple[ShardKey, bytes]:
        return (ref.split, plans[ref.split].shard_of(hashing.bucket_of(ref.key))), REF_CODER.encode(ref)

    def file_name(self, key: ShardKey, digest: str) -> str:
        split, shard = key
        return f"{_split_tag(split)}-{shard:05d}-{digest}.refs"

    def process(self, ref: Ref, plans: Mapping[str, ShardPlan]) -> Iterator[tuple[ShardKey, str]]:
        return super().process(ref, plans)


def items_of(path: str) -> list[bytes]:
    """The items of a file PackFn wrote, in its order."""
    with FileSystems.open(path) as fh:
        return unframe(fh.read())


def read_refs(paths: Iterable[str]) -> list[Ref]:
    """The refs of a shard's piece files, in key order (the shard writer's first step on Flink and Spark)."""
    refs: list[Ref] = []
    for path in sorted(set(paths)):  # a duplicated attempt may name a piece twice: the same file
        with FileSystems.open(path) as fh:
            refs.extend(_unframe(fh.read()))
    refs.sort(key=sort_key)
    return refs


# How a shard's refs reach its writer (group_refs_by_shard)
GROUP = "group"  # one GroupByKey of the refs (Dataflow, whose shuffle streams a group to the worker; unknown runners)
PIECES = "pieces"  # grouped into pieces, written, the paths grouped (Flink, Spark)
PACK = "pack"  # packed per bundle into files, the paths grouped (the local runner)


def group_refs_by_shard(refs: beam.PCollection, plans: beam.PCollection, scratch: str, how: str) -> beam.PCollection:
    """refs → ((split, shard), the shard's refs) by one GroupByKey (GROUP); or ((split, shard), the paths of
    its piece files) for the writer to read (PIECES, PACK; ``read_refs``: in the writer's own stage, as a step
    with side inputs starts a stage on Flink). ``plans``: the singleton {split: ShardPlan}. Applied in the
    caller's transform."""
    plans_input = beam.pvalue.AsSingleton(plans)
    if how == GROUP:
        return (
            refs
            | "AssignShard" >> beam.Map(assign_shard, plans_input).with_output_types(tuple[ShardKey, Ref])
            # ((split, shard), Ref): only references cross the shuffle, each in ~100 bytes (RefCoder)
            | "GroupByShard" >> beam.GroupByKey()
        )
    if how == PACK:
        paths = refs | "PackPieces" >> beam.ParDo(PackPiecesFn(scratch), plans_input).with_output_types(
            tuple[ShardKey, str]
        )
    else:
        paths = (
            refs
            | "AssignPiece" >> beam.Map(assign_piece, plans_input).with_output_types(tuple[PieceKey, Ref])
            | "GroupByPiece" >> beam.GroupByKey()
            | "WritePiece" >> beam.ParDo(WritePieceFn(scratch)).with_output_types(tuple[ShardKey, str])
        )
    return paths | "GroupByShard" >> beam.GroupByKey()
