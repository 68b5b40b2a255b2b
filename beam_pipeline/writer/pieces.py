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
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping

import apache_beam as beam
from apache_beam.coders import IterableCoder
from apache_beam.io.filesystems import FileSystems

from .. import hashing, storage
from ..planning import ShardPlan, assign_shard
from ..resume import SHARD_REFS
from ..vocab.refs import Ref, RefCoder

# Refs per piece, in encoded bytes: a message of the data channel (64 KB) holds one or two.
PIECE_REF_BYTES = 32 * 1024

_CODER = IterableCoder(RefCoder())

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
    # a split's name is any text a manifest gives: a digest of it names the file
    tag = hashlib.sha256(split.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return FileSystems.join(scratch, SHARD_REFS, f"{tag}-{shard:05d}-{piece:05d}.refs")


def sort_key(ref: Ref) -> tuple[int, str, str]:
    """The order a shard's records are written in (and a piece's refs stored in)."""
    return ref.key, ref.relpath, ref.path


class WritePieceFn(beam.DoFn):
    """((split, shard, piece), refs) → ((split, shard), the piece's file), the file written."""

    def __init__(self, scratch: str) -> None:
        super().__init__()
        self._scratch = scratch

    def process(self, element: tuple[PieceKey, Iterable[Ref]]) -> Iterator[tuple[ShardKey, str]]:
        (split, shard, piece), refs = element
        path = piece_path(self._scratch, split, shard, piece)
        storage.backend_for(path).write_atomic(path, _CODER.encode(sorted(refs, key=sort_key)))
        yield (split, shard), path


def read_refs(paths: Iterable[str]) -> list[Ref]:
    """The refs of a shard's piece files, in key order (the shard writer's first step on Flink and Spark)."""
    refs: list[Ref] = []
    for path in sorted(set(paths)):  # a duplicated attempt may name a piece twice: the same file
        with FileSystems.open(path) as fh:
            refs.extend(_CODER.decode(fh.read()))
    refs.sort(key=sort_key)
    return refs


def group_refs_by_shard(
    refs: beam.PCollection, plans: beam.PCollection, scratch: str, through_files: bool
) -> beam.PCollection:
    """refs → ((split, shard), the shard's refs) by one GroupByKey; when ``through_files``, ((split, shard),
    the paths of its piece files) for the writer to read (``read_refs``: in its own stage, as a step with
    side inputs starts a stage on Flink). ``plans``: the singleton {split: ShardPlan}. Applied in the
    caller's transform."""
    plans_input = beam.pvalue.AsSingleton(plans)
    if not through_files:
        return (
            refs
            | "AssignShard" >> beam.Map(assign_shard, plans_input).with_output_types(tuple[ShardKey, Ref])
            # ((split, shard), Ref): only references cross the shuffle, each in ~100 bytes (RefCoder)
            | "GroupByShard" >> beam.GroupByKey()
        )
    return (
        refs
        | "AssignPiece" >> beam.Map(assign_piece, plans_input).with_output_types(tuple[PieceKey, Ref])
        | "GroupByPiece" >> beam.GroupByKey()
        | "WritePiece" >> beam.ParDo(WritePieceFn(scratch)).with_output_types(tuple[ShardKey, str])
        | "GroupByShard" >> beam.GroupByKey()
    )
