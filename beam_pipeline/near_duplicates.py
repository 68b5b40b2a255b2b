"""Near-duplicate images: pairs of records whose perceptual hashes (images/phash.py) differ in at most
``--near-duplicate-distance`` bits, found inside the job, by a banded join (docs/leakage.md).

    shard results ──► index parts' (phash, path, split) ──► images per hash (bounded) ──┬─► groups
                                                                                      └─► band buckets
    band buckets ──► hash pairs within the distance ──► (side input) path pairs ──► sorted parts ──► finalize

- **One hash, many images.** Images are first gathered per hash value by a combiner that keeps at most
  ``GROUP_SIZE`` + 1 of them (the smallest paths) and counts the rest: 10,000 copies of a blank frame never
  meet in one place. A hash shared by more than ``GROUP_SIZE`` images is one *group* line, listing its
  first ``GROUP_SIZE`` paths, and takes no further part in the join.
- **Bands.** Each other hash is keyed by ``BANDS`` bands, each a fixed random choice of ``BAND_BITS`` of
  its 64 bits. Two hashes ``d`` bits apart agree on a band with probability C(64 - d, 20) / C(64, 20), so
  on at least one of 128 with probability 0.9999 at d = 6, 0.995 at d = 8, 0.88 at d = 10 and 0.56 at
  d = 12; two random hashes meet in some band with probability ~1.2e-4 (128 / 2^20), so n images make
  ~6e-5 n² candidates. Candidates are checked by their exact distance: nothing farther than the
  threshold is reported. Band entries travel as numpy batches (``BandBatches``), not one element each.
- **Crowded buckets.** A band value shared by more than ``BUCKET_CAP`` distinct hashes is not compared
  (its pairs are usually found through another band); dataset.json counts such buckets.
- **Deterministic.** Bands, buckets, pairs and groups depend on the hashes only, and the file is sorted,
  whatever order the engine runs things in.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations

from . import failpoints
from .hashing import part_of
from .images.phash import HASH_NAME, valid_hash
from .index import read_index
from .metadata import NEAR_DUPLICATES_JSONL, REJECT_PARTS
from .storage import open_lines, write_text
from .vocab.records import ShardResult, choose_results

DEFAULT_DISTANCE = 10  # bits of 64: imagededup's default for pHash too (docs/leakage.md has the measurements)
GROUP_SIZE = 100  # images sharing one hash beyond which they are one group line (its first GROUP_SIZE paths)
BANDS = 128
BAND_BITS = 20
BUCKET_CAP = 5_000  # distinct hashes one band value may hold and still be compared (~12.5 M distances)
COARSE_BITS = 3  # 8 groups of band values per band the engine shuffles (BandBatches): 1,024 keys in all
FLUSH_HASHES = 50_000  # hashes a BandBatches bundle holds before it sends their band entries on
PART_BUCKETS = 64  # part files of near_duplicates.jsonl, merged in order by finalize
PARTS_FOLDER = "near_duplicates"  # under the staging folder's rejects parts (never published)
SPLIT_ORDER = ("train", "validation", "test")


def band_masks() -> tuple[int, ...]:
    """The bands' 64-bit masks: BANDS fixed pseudo-random choices of BAND_BITS of the 64 bits, from sha256 (the
    same on every Python: which pairs are candidates is part of the output's contract)."""

    def rank(band: int, bit: int) -> bytes:
        return hashlib.sha256(f"band {band} bit {bit}".encode()).digest()

    return tuple(
        sum(1 << b for b in sorted(range(64), key=lambda bit, band=band: rank(band, bit))[:BAND_BITS])
        for band in range(BANDS)
    )


MASKS = band_masks()


def split_key(a: str, b: str) -> str:
    """ "train" for a pair inside one split, "train/test" across two: train, validation, test first."""
    if a == b:
        return a
    x, y = sorted((a, b), key=_split_rank)
    return f"{x}/{y}"


def _split_rank(split: str) -> tuple[int, str]:
    return (SPLIT_ORDER.index(split) if split in SPLIT_ORDER else len(SPLIT_ORDER), split)


# ---- the steps ---------------------------------------------------------------------------------


def chosen_index_parts(results: Sequence[ShardResult]) -> list[str]:
    """The index parts of the shards finalize publishes (one result per shard, as ``choose_results``)."""
    return sorted(r.index_path for r in choose_results(results).values() if r.index_path and r.records)


def read_hashes(part: str) -> Iterator[tuple[str, tuple[str, str]]]:
    """(phash, (path, split)) of each record of an index part; ("", …) for a record without a hash."""
    for entry in read_index(part):
        yield valid_hash(entry.get("phash")), (entry["path"], entry["split"])


class HashMembers(beam.CombineFn):  # type: ignore[misc]
    """(path, split) of one hash → (count, {split: count}, the GROUP_SIZE + 1 smallest (path, split))."""

    def create_accumulator(self) -> tuple[int, dict[str, int], list[tuple[str, str]]]:
        return 0, {}, []

    def add_input(self, acc: Any, member: tuple[str, str]) -> Any:
        count, splits, kept = acc
        splits[member[1]] = splits.get(member[1], 0) + 1
        member = tuple(member)
        if member not in kept:
            kept.append(member)
            if len(kept) > GROUP_SIZE + 1:
                kept.remove(max(kept))
        return count + 1, splits, kept

    def merge_accumulators(self, accs: Iterable[Any]) -> Any:
        count, splits, kept = 0, {}, []
        for n, s, k in accs:
            count += n
            for split, m in s.items():
                splits[split] = splits.get(split, 0) + m
            kept = heapq.nsmallest(GROUP_SIZE + 1, set(kept) | set(map(tuple, k)))
        return count, splits, kept

    def extract_output(self, acc: Any) -> Any:
        count, splits, kept = acc
        return count, dict(sorted(splits.items())), sorted(kept)


def group_or_members(element: tuple[str, Any]) -> Iterator[Any]:
    """A hash of over GROUP_SIZE images → a group line (tagged "groups") and (hash, {split: n}) (tagged
    "crowd_hashes"); else (hash, members)."""
    phash, (count, splits, members) = element
    if count > GROUP_SIZE:
        yield beam.pvalue.TaggedOutput("crowd_hashes", (phash, splits))
        yield beam.pvalue.TaggedOutput(
            "groups",
            {
                "group": [path for path, _ in members[:GROUP_SIZE]],
                "images": count,
                "splits": splits,
                "distance": 0,
            },
        )
    else:
        yield phash, members


def exact_pairs(element: tuple[str, list[tuple[str, str]]]) -> Iterator[dict[str, Any]]:
    """Pairs of images with the same hash (distance 0)."""
    _, members = element
    for i, a in enumerate(members):
        for b in members[i + 1 :]:
            yield pair_line(a, b, 0)


def pair_line(a: tuple[str, str], b: tuple[str, str], d: int) -> dict[str, Any]:
    (pa, sa), (pb, sb) = sorted((a, b))
    return {"a": pa, "b": pb, "split_a": sa, "split_b": sb, "distance": d}


class BandBatches(beam.DoFn):  # type: ignore[misc]
    """(hash, members) → ((band, coarse value), uint64 bytes): every hash under each of its BANDS band values,
    in numpy batches per bundle, COARSE groups of band values per band. The engine carries a few thousand
    byte strings per batch instead of BANDS small elements per image (Beam's cost per element, not the
    comparisons, was most of the join's CPU)."""

    def start_bundle(self) -> None:
        self._values: list[int] = []

    def process(self, element: tuple[str, Any]) -> Iterator[tuple[tuple[int, int], bytes]]:
        self._values.append(int(element[0], 16))
        if len(self._values) >= FLUSH_HASHES:
            yield from self._flush()

    def finish_bundle(self) -> Iterator[Any]:
        from apache_beam.transforms.window import GlobalWindows

        for kv in self._flush():
            yield GlobalWindows.windowed_value(kv)

    def _flush(self) -> Iterator[tuple[tuple[int, int], bytes]]:
        import numpy as np

        if not self._values:
            return
        values = np.array(self._values, dtype=np.uint64)
        self._values = []
        for band, mask in enumerate(MASKS):
            coarse = coarse_of(values & np.uint64(mask))
            order = np.argsort(coarse, kind="stable")
            bounds = np.flatnonzero(np.diff(coarse[order])) + 1
            for chunk in np.split(order, bounds):
                yield (band, int(coarse[chunk[0]])), values[chunk].tobytes()


def coarse_of(masked: Any) -> Any:
    """Which of COARSE groups a band value (a uint64 array) goes to: its top bits after a multiplicative mix,
    so every band spreads over every group whichever of the 64 bits it holds."""
    import numpy as np

    with np.errstate(over="ignore"):
        return (masked * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - COARSE_BITS)


class CompareBucket(beam.DoFn):  # type: ignore[misc]
    """((band, coarse), [uint64 bytes, ...]) → (smaller hash, larger hash, distance) of each pair that shares
    the band's value and is within ``max_distance``; a band value of over BUCKET_CAP hashes is counted
    (tagged "crowded"), not compared."""

    def __init__(self, max_distance: int) -> None:
        self._max = max_distance

    def process(self, element: tuple[tuple[int, int], Iterable[bytes]]) -> Iterator[Any]:
        import numpy as np

        (band, _), chunks = element
        values = np.concatenate([np.frombuffer(c, dtype=np.uint64) for c in chunks])
        if len(values) < 2:
            return
        masked = values & np.uint64(MASKS[band])
        # by band value alone (2.4x faster than lexsort with the hash as a second key); each bucket's hashes
        # are put in order below, so the pairs do not depend on the order the chunks arrived in
        order = np.argsort(masked)
        masked, values = masked[order], values[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(masked)) + 1))
        sizes = np.diff(np.concatenate((starts, [len(values)])))
        # most candidates are buckets of two: their distances at once
        firsts = starts[sizes == 2]
        x, y = values[firsts], values[firsts + 1]
        a, b = np.minimum(x, y), np.maximum(x, y)
        dist = _bit_counts(a ^ b)
        close = np.flatnonzero(dist <= self._max)
        yield from zip(a[close].tolist(), b[close].tolist(), dist[close].tolist(), strict=True)
        for i in np.flatnonzero(sizes > 2):
            start, size = int(starts[i]), int(sizes[i])
            if size > BUCKET_CAP:
                yield beam.pvalue.TaggedOutput("crowded", 1)
            else:
                yield from _close_pairs(sorted(values[start : start + size].tolist()), self._max)


def _bit_counts(x: Any) -> Any:
    """Set bits of each uint64 of ``x`` (numpy >= 2 counts them itself; older numpy by bytes)."""
    import numpy as np

    count_bits = getattr(np, "bitwise_count", None)
    if count_bits is not None:
        return count_bits(x).astype(np.int64)
    return np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1).astype(np.int64)


def _close_pairs(values: list[int], max_distance: int) -> Iterator[tuple[int, int, int]]:
    """Pairs of ``values`` (sorted) within ``max_distance`` bits: numpy for a large bucket, else one by one."""
    import numpy as np

    count_bits = getattr(np, "bitwise_count", None)  # numpy >= 2
    if len(values) < 64 or count_bits is None:
        for i, a in enumerate(values):
            for b in values[i + 1 :]:
                d = (a ^ b).bit_count()
                if d <= max_distance:
                    yield a, b, d
        return
    arr = np.array(values, dtype=np.uint64)
    for i in range(len(arr) - 1):
        dist = count_bits(arr[i + 1 :] ^ arr[i])
        for j in np.flatnonzero(dist <= max_distance):
            yield values[i], values[i + 1 + int(j)], int(dist[j])


def hex_of(value: int) -> str:
    return f"{value:016x}"


def both_ways(pair: tuple[int, int, int]) -> list[tuple[str, tuple[str, int]]]:
    a, b, d = hex_of(pair[0]), hex_of(pair[1]), pair[2]
    return [(a, (b, d)), (b, (a, d))]


def pair_halves(element: tuple[str, list[Any]], partners: Mapping[str, list[tuple[str, int]]]) -> Iterator[Any]:
    """(hash, members) → ((hash a, hash b, distance), members) for each close hash it pairs with."""
    phash, members = element
    for other, d in partners.get(phash, ()):
        yield (min(phash, other), max(phash, other), d), members


def expand_pair(element: tuple[tuple[str, str, int], Iterable[list[Any]]]) -> Iterator[dict[str, Any]]:
    """((hash a, hash b, distance), [members of one, members of the other]) → the path pairs."""
    (_, _, d), halves = element
    first, second = list(halves)
    for a in first:
        for b in second:
            yield pair_line(a, b, d)


def line_key(line: Mapping[str, Any]) -> tuple[str, str]:
    """What near_duplicates.jsonl is sorted by: a pair's (a, b), a group's (first path, "")."""
    if "group" in line:
        return line["group"][0], ""
    return line["a"], line["b"]


def part_bucket(line: Mapping[str, Any]) -> int:
    return part_of(line_key(line)[0], PART_BUCKETS)


class WritePartFn(beam.DoFn):  # type: ignore[misc]
    """(bucket, [line]) → one sorted part file in the staging folder; yields its path (a retry rewrites it)."""

    def __init__(self, staging: str) -> None:
        self._staging = staging

    def process(self, element: tuple[int, Iterable[Mapping[str, Any]]]) -> Iterator[str]:
        bucket, lines = element
        path = FileSystems.join(self._staging, REJECT_PARTS, PARTS_FOLDER, f"part-{bucket:05d}.jsonl")
        failpoints.hit("near_duplicates.write")
        write_text(path, "".join(_dumps(line) for line in sorted(lines, key=line_key)))
        yield path


def _dumps(line: Mapping[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False) + "\n"


def merged(parts: Sequence[str]) -> Iterator[tuple[tuple[str, str], bytes]]:
    """The lines of sorted parts, merged in order: (line_key, raw line); one line per part in memory."""

    def lines(part: str) -> Iterator[tuple[tuple[str, str], bytes]]:
        with open_lines(part) as fh:
            for raw in fh:
                if raw.strip():
                    yield line_key(json.loads(raw)), raw

    return heapq.merge(*(lines(p) for p in sorted(set(parts))), key=lambda kv: kv[0])


def merge_parts(parts: Sequence[str], dest: str) -> None:
    """The sorted parts merged into one sorted file (``merged``)."""
    with FileSystems.create(dest, compression_type="uncompressed") as out:
        for _, raw in merged(parts):
            out.write(raw)


class CountLines(beam.CombineFn):  # type: ignore[misc]
    """Pair and group lines → {"pairs": {split key: n}, "groups": {split key: n}}."""

    def create_accumulator(self) -> dict[str, dict[str, int]]:
        return {"pairs": {}, "groups": {}}

    def add_input(self, acc: dict[str, dict[str, int]], line: Mapping[str, Any]) -> dict[str, dict[str, int]]:
        if "group" in line:
            kind, key = "groups", "+".join(sorted(line["splits"], key=_split_rank))
        else:
            kind, key = "pairs", split_key(line["split_a"], line["split_b"])
        acc[kind][key] = acc[kind].get(key, 0) + 1
        return acc

    def merge_accumulators(self, accs: Iterable[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {"pairs": {}, "groups": {}}
        for acc in accs:
            for kind, counts in acc.items():
                for key, n in counts.items():
                    out[kind][key] = out[kind].get(key, 0) + n
        return out

    def extract_output(self, acc: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        return {kind: dict(sorted(counts.items(), key=lambda kv: _key_rank(kv[0]))) for kind, counts in acc.items()}


def _key_rank(key: str) -> tuple[Any, ...]:
    return tuple(_split_rank(s) for s in key.replace("+", "/").split("/"))


def summary_block(
    max_distance: int, counts: Mapping[str, Mapping[str, int]], hashed: int, unhashed: int, crowded: int
) -> dict[str, Any]:
    """dataset.json's ``near_duplicates``."""
    pairs, groups = counts.get("pairs", {}), counts.get("groups", {})
    return {
        "hash": HASH_NAME,
        "max_distance": max_distance,
        "file": NEAR_DUPLICATES_JSONL,
        "images_hashed": hashed,
        "images_unhashed": unhashed,
        "pairs": dict(pairs),
        "groups": dict(groups),
        "across_splits": sum(n for key, n in pairs.items() if "/" in key),
        "crowded_buckets": crowded,
    }


def _summarize(
    _: Any, max_distance: int, counts: Mapping[str, Mapping[str, int]], hashed: Sequence[tuple[bool, int]], crowded: int
) -> dict[str, Any]:
    by = dict(hashed)
    return summary_block(max_distance, counts, by.get(True, 0), by.get(False, 0), crowded)


class NearDuplicateLines(beam.PTransform):  # type: ignore[misc]
    """(phash, (path, split)) of every image → {"lines": pair and crowd lines, "crowded": 1 per crowded band
    value, "crowd_hashes": (phash, {split: n}) of each crowd}."""

    def __init__(self, max_distance: int) -> None:
        super().__init__()
        self._max = max_distance

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, hashed: beam.PCollection) -> dict[str, beam.PCollection]:
        per_hash = (
            hashed
            | "ImagesPerHash" >> beam.CombinePerKey(HashMembers())
            | "GroupsOrMembers" >> beam.FlatMap(group_or_members).with_outputs("groups", "crowd_hashes", main="members")
        )
        members = per_hash.members
        found = (
            members
            | "BandBatches" >> beam.ParDo(BandBatches())
            | "GroupBandBuckets" >> beam.GroupByKey()
            | "CompareBuckets" >> beam.ParDo(CompareBucket(self._max)).with_outputs("crowded", main="pairs")
        )
        partners = (
            found.pairs
            | "DistinctHashPairs" >> beam.Distinct()
            | "BothWays" >> beam.FlatMap(both_ways)
            | "PartnersPerHash" >> beam.GroupByKey()
        )
        # only the hashes with a close partner go on: a side input as large as the pairs found, read whole
        # once per bundle (a multimap side input asks the runner's state API once per image: ~0.5 ms each)
        close = (
            members
            | "PairHalves" >> beam.FlatMap(pair_halves, beam.pvalue.AsDict(partners))
            | "GroupPairHalves" >> beam.GroupByKey()
            | "PathPairs" >> beam.FlatMap(expand_pair)
        )
        lines = (
            members | "ExactPairs" >> beam.FlatMap(exact_pairs),
            close,
            per_hash.groups,
        ) | "AllLines" >> beam.Flatten()
        return {"lines": lines, "crowded": found.crowded, "crowd_hashes": per_hash.crowd_hashes}


class FindNearDuplicates(beam.PTransform):  # type: ignore[misc]
    """Shard results → {"parts": sorted part file paths, "summary": one dict (dataset.json's block)}."""

    def __init__(self, staging: str, max_distance: int) -> None:
        super().__init__()
        self._staging = staging
        self._max = max_distance

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, results: beam.PCollection) -> dict[str, beam.PCollection]:
        p = results.pipeline
        records = (
            results
            | "AllShardResults" >> beam.combiners.ToList()
            | "ChosenIndexParts" >> beam.FlatMap(chosen_index_parts)
            | "SpreadIndexParts" >> beam.Reshuffle()
            | "ReadHashes" >> beam.FlatMap(read_hashes)
        )
        hashed = records | "Hashed" >> beam.Filter(lambda kv: bool(kv[0]))
        counted = (
            records
            | "HashedOrNot" >> beam.Map(lambda kv: (bool(kv[0]), 1))
            | "CountHashedOrNot" >> beam.CombinePerKey(sum)
        )
        found = hashed | "Join" >> NearDuplicateLines(self._max)
        lines = found["lines"]
        parts = (
            lines
            | "PartBucket" >> beam.Map(lambda line: (part_bucket(line), line))
            | "GroupParts" >> beam.GroupByKey()
            | "WriteParts" >> beam.ParDo(WritePartFn(self._staging))
        )
        counts = lines | "CountLines" >> beam.CombineGlobally(CountLines())
        crowded = found["crowded"] | "CountCrowded" >> beam.CombineGlobally(sum)
        summary = (
            p
            | "OneSummary" >> beam.Create([None])
            | "Summarize"
            >> beam.Map(
                _summarize,
                self._max,
                beam.pvalue.AsSingleton(counts),
                beam.pvalue.AsList(counted),
                beam.pvalue.AsSingleton(crowded),
            )
        )
        return {"parts": parts, "summary": summary}
