"""Near-duplicate images, as groups: images tied by pairs whose perceptual hashes (images/phash.py) differ in
at most ``--near-duplicate-distance`` bits *and* whose second measure agrees (docs/leakage.md).

    index parts ──► each image's hashes ──► distinct hashes (one worker) ──► search ──► groups (side input)
    index parts ──► the images of groups, per part ──► per group (bounded) ──► group lines ──► sorted parts

- **Groups, not pairs.** A group is a connected set of images: k frames of one scene are one line, not
  k(k - 1)/2 pairs. A line lists up to ``GROUP_SIZE`` of its images and the ties that join them (a tree:
  one tie per image but the first, the closest ties first); the rest are counted. Output, memory and time
  grow with the images, not with the pairs.
- **The search** runs on one worker over the distinct hashes (32 bytes each: 32 MB for a million images,
  nothing per pair): ``BANDS`` bands, each a fixed random choice of ``BAND_BITS`` of the pHash's 64 bits.
  Two hashes ``d`` bits apart agree on a band with probability C(64 - d, 20) / C(64, 20), so on at least
  one of 128 with probability 0.9999 at d = 6, 0.995 at 8, 0.88 at 10. Hashes that share a band value are
  compared all with all while they are at most ``EXHAUSTIVE`` (the usual case); a larger run of one value
  (near-identical frames, blank tiles) is compared against its first hash and each hash's neighbour in
  order, so its cost stays linear: the images that tie are already one group.
- **Confirmed.** A candidate within the distance is a tie only when the second measure agrees too
  (``confirm``): the dHash within ``DHASH_MAX`` bits, and the colour of the four quarters within
  ``COLOUR_MAX`` (a grey picture and a coloured one only when both hashes are close). Each tie and group
  says how sure it is: ``exact`` (the same hashes), ``sure`` (both measures well inside), ``likely``.
- **Deterministic.** Hashes are sorted, ties ordered by (distance, dHash bits, colour, hashes), the tree is
  the minimum one in that order, and the file is sorted: the same bytes whatever the engine's order.
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations

from . import failpoints
from .hashing import part_of
from .images.phash import CONFIRM_NAME, FULL, GREY_SHARE, HASH_NAME, HEX, entry_hash
from .index import read_index
from .metadata import NEAR_DUPLICATES_JSONL, REJECT_PARTS
from .storage import open_lines, write_text
from .vocab.records import ShardResult, choose_results

FORMAT = 2  # near_duplicates.jsonl's version (its first line); 1: pairs and crowds, without that line
DEFAULT_DISTANCE = 10  # bits of 64: imagededup's default for pHash too (docs/leakage.md has the measurements)
GROUP_SIZE = 100  # images a group line lists (the rest are counted)
BANDS = 128
BAND_BITS = 20
EXHAUSTIVE = 64  # hashes of one band value compared all with all; more: against the first and a neighbour
DHASH_MAX = 16  # dHash bits a tie may differ in (copies: at most 9 measured; distinct photos: 21 or more)
DHASH_SURE = 8
COLOUR_MAX = 12  # of 255: a quarter's red or green share (copies: at most 7; distinct photos: 15 or more)
GREY_SPREAD = 4  # a picture whose shares are all within this of GREY_SHARE has no colour to compare
PART_BUCKETS = 64  # part files of near_duplicates.jsonl, merged in order by finalize
PARTS_FOLDER = "near_duplicates"  # under the staging folder's rejects parts (never published)
SPLIT_ORDER = ("train", "validation", "test")
LEVELS = ("likely", "sure", "exact")  # how sure a tie or group is, least first
KEY = np.dtype([("ph", "<u8"), ("dh", "<u8"), ("col", "<u8")])  # one distinct image look: its three hashes


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


def split_rank(split: str) -> tuple[int, str]:
    return (SPLIT_ORDER.index(split) if split in SPLIT_ORDER else len(SPLIT_ORDER), split)


def splits_key(splits: Iterable[str]) -> str:
    """ "train" for a group inside one split, "train+test" across two: train, validation, test first."""
    return "+".join(sorted(set(splits), key=split_rank))


def first_split(splits: Iterable[str]) -> str:
    """The split a group spanning several keeps (``--near-duplicates drop-leaks``): train, validation, test."""
    return min(splits, key=split_rank)


def key_of(full: str) -> tuple[int, int, int]:
    return int(full[:HEX], 16), int(full[HEX : 2 * HEX], 16), int(full[2 * HEX :], 16)


# ---- the search (pure numpy: one worker, the distinct hashes) --------------------------------------------


def _bits(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 (numpy >= 2 counts them itself; older numpy by bytes)."""
    count_bits = getattr(np, "bitwise_count", None)
    if count_bits is not None:
        return count_bits(x).astype(np.int64)
    return np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1).astype(np.int64)


class Looks:
    """The distinct hashes' fields as the comparisons need them."""

    def __init__(self, keys: np.ndarray) -> None:
        self.ph, self.dh = keys["ph"], keys["dh"]
        shares = keys["col"].astype("<u8").view(np.uint8).reshape(-1, 8).astype(np.int16)
        self.shares = shares
        self.grey = np.all(np.abs(shares - GREY_SHARE) <= GREY_SPREAD, axis=1)


def confirm(looks: Looks, i: np.ndarray, j: np.ndarray, max_distance: int) -> tuple[np.ndarray, ...]:
    """For candidate pairs (i, j): (kept mask, pHash bits, dHash bits, colour difference, level)."""
    d = _bits(looks.ph[i] ^ looks.ph[j])
    near = d <= max_distance
    if not near.all():  # most candidates of a band are far apart: the rest only for those that are not
        kept, d2, dd, dc, level = confirm(looks, i[near], j[near], max_distance)
        out = [np.zeros(len(i), bool), d, np.zeros(len(i), np.int64), np.zeros(len(i), np.int64)]
        out.append(np.zeros(len(i), np.int64))
        for target, value in zip(out[:1] + out[2:], (kept, dd, dc, level), strict=True):
            target[near] = value
        return tuple(out)
    dd = _bits(looks.dh[i] ^ looks.dh[j])
    dc = np.abs(looks.shares[i] - looks.shares[j]).max(axis=1) if len(i) else np.zeros(0, np.int64)
    gi, gj = looks.grey[i], looks.grey[j]
    colour_ok = (gi & gj) | (~gi & ~gj & (dc <= COLOUR_MAX))
    close = (d <= max_distance // 2) & (dd <= DHASH_SURE)
    kept = (d <= max_distance) & (dd <= DHASH_MAX) & (colour_ok | ((gi != gj) & close))
    level = np.where(close & colour_ok, 1, 0)
    return kept, d, dd, dc, level


def _run_pairs(order: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Candidate pairs (i, j), i < j, of the runs of equal band value: all with all in a run of at most
    EXHAUSTIVE, else each against the run's first and its neighbour; and how many runs were large."""
    firsts, seconds = [], []
    for size in np.unique(sizes[(sizes >= 2) & (sizes <= EXHAUSTIVE)]):
        rows = order[starts[sizes == size][:, None] + np.arange(size)]  # (runs, size)
        a, b = np.triu_indices(int(size), 1)
        firsts.append(rows[:, a].reshape(-1))
        seconds.append(rows[:, b].reshape(-1))
    large = np.flatnonzero(sizes > EXHAUSTIVE)
    for r in large:
        members = order[starts[r] : starts[r] + sizes[r]]
        firsts += [np.full(len(members) - 1, members[0]), members[:-1]]
        seconds += [members[1:], members[1:]]
    if not firsts:
        empty = np.zeros(0, np.int64)
        return empty, empty, len(large)
    x, y = np.concatenate(firsts), np.concatenate(seconds)
    return np.minimum(x, y), np.maximum(x, y), len(large)


def _spanning(n: int, parts: np.ndarray, edges: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The edges (i, j, d, dd, dc, level) that join the parts they connect into a minimum spanning forest over
    ``parts`` (each look's part: a look number), in the order (d, dd, dc, i, j): unique, so the same whatever
    order the edges came in."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import minimum_spanning_tree

    order = np.lexsort((edges["j"], edges["i"], edges["dc"], edges["dd"], edges["d"]))
    e = {k: v[order] for k, v in edges.items()}
    a, b = parts[e["i"]], parts[e["j"]]
    low, high = np.minimum(a, b), np.maximum(a, b)
    _, best = np.unique(low * n + high, return_index=True)  # the closest edge between two parts
    best = np.sort(best)
    rank = (best + 1).astype(np.float64)  # unique weights in the order above
    tree = minimum_spanning_tree(coo_matrix((rank, (low[best], high[best])), shape=(n, n)).tocsr()).tocoo()
    keep = np.sort(tree.data.astype(np.int64) - 1)
    return {k: v[keep] for k, v in e.items()}


def _parts(n: int, forest: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each look's part under ``forest``'s edges: the smallest look it is joined to."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(forest["i"])), (forest["i"], forest["j"])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    smallest = np.full(labels.max() + 1, n, np.int64)
    np.minimum.at(smallest, labels, np.arange(n))
    return smallest[labels]


BAND_POSITIONS = tuple(tuple(b for b in range(64) if mask >> b & 1) for mask in MASKS)


def _band_values(ph: np.ndarray, positions: Sequence[int]) -> np.ndarray:
    """The band's BAND_BITS bits of each hash, packed into the low bits."""
    value = np.zeros(len(ph), np.uint64)
    for k, bit in enumerate(positions):
        value |= ((ph >> np.uint64(bit)) & np.uint64(1)) << np.uint64(k)
    return value


def search(keys: np.ndarray, counts: np.ndarray, max_distance: int) -> dict[str, Any]:
    """The groups among distinct ``keys`` (KEY, sorted) of ``counts`` images each: {"tree": the ties (node
    indices, distances, level), "component": each node's group (its smallest node; -1: alone),
    "large_runs": runs compared against their first hash and a neighbour}.

    Band by band: candidates whose looks are in one part already are not compared again (in a large group
    almost all of them), the confirmed ties of the band join parts by a minimum spanning forest over the
    parts, closest first, and the parts are relabelled."""
    n = len(keys)
    if not n:
        return {"tree": _joined([]), "component": np.zeros(0, np.int64), "large_runs": 0}
    looks = Looks(keys)
    numbers = np.arange(n, dtype=np.uint64)
    parts = np.arange(n, dtype=np.int64)
    found: list[dict[str, np.ndarray]] = []
    large_runs = 0
    for positions in BAND_POSITIONS:
        # the band's value above the look's number: unique keys, so the order is the same on every machine
        keyed = (_band_values(looks.ph, positions) << np.uint64(32)) | numbers
        order = np.argsort(keyed)
        value = keyed[order] >> np.uint64(32)
        starts = np.concatenate(([0], np.flatnonzero(value[1:] != value[:-1]) + 1)).astype(np.int64)
        sizes = np.diff(np.concatenate((starts, [n])))
        i, j, large = _run_pairs(order, starts, sizes)
        large_runs += large
        apart = parts[i] != parts[j]
        i, j = i[apart], j[apart]
        kept, d, dd, dc, level = confirm(looks, i, j, max_distance)
        if not kept.any():
            continue
        ties = {"i": i[kept], "j": j[kept], "d": d[kept], "dd": dd[kept], "dc": dc[kept], "level": level[kept]}
        found.append(_spanning(n, parts, ties))
        parts = _parts(n, _joined(found))
    forest = _joined(found)
    component = parts.copy()
    sizes = np.bincount(parts, minlength=n)
    alone = (sizes[parts] == 1) & (counts < 2)
    component[alone] = -1
    return {"tree": forest, "component": component, "large_runs": large_runs}


def _joined(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    fields = ("i", "j", "d", "dd", "dc", "level")
    return {k: np.concatenate([np.zeros(0, np.int64)] + [p[k] for p in parts]).astype(np.int64) for k in fields}


class GroupIndex:
    """What the search found, as the steps after it read it (a side input: numpy arrays, ~80 bytes a grouped
    look, nothing for the others): each grouped look's group (its smallest grouped look) and images, and each
    group's tree of ties (node numbers are positions in ``keys``)."""

    def __init__(self, keys: np.ndarray, counts: np.ndarray, found: Mapping[str, Any]) -> None:
        component = found["component"]
        grouped = np.flatnonzero(component >= 0)
        position = np.full(len(keys), -1, np.int64)
        position[grouped] = np.arange(len(grouped))
        self.large_runs = int(found["large_runs"])
        self.keys = keys[grouped]  # sorted, as ``keys``
        self.group = position[component[grouped]]
        self.counts = counts[grouped]
        tree = found["tree"]
        i, j = position[tree["i"]], position[tree["j"]]
        owner = self.group[i]
        order = np.argsort(owner, kind="stable")
        self.tree = np.stack([owner, i, j, tree["d"], tree["dd"], tree["dc"], tree["level"]])[:, order]
        # the looks a group line may list: all of a group of at most GROUP_SIZE images, else those
        # _listed_nodes picks (only these looks' paths are gathered: a group's members stay bounded)
        images = np.bincount(self.group, weights=self.counts, minlength=len(self.keys))
        self.listed = images[self.group] <= GROUP_SIZE
        for group in np.flatnonzero(images > GROUP_SIZE).tolist():
            self.listed[_listed_nodes(group, self.ties(group), self)] = True

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``keys``' group (or -1) and its node (meaningful where the group is not -1)."""
        at = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        if not len(self.keys):
            return np.full(len(keys), -1, np.int64), at
        return np.where(self.keys[at] == keys, self.group[at], -1), at

    def groups_of(self, keys: np.ndarray) -> np.ndarray:
        """Each of ``keys``' group, or -1."""
        return self.lookup(keys)[0]

    def ties(self, group: int) -> list[tuple[int, int, int, int, int, int]]:
        """(node, node, pHash bits, dHash bits, colour difference, level) of the group's tree."""
        lo, hi = np.searchsorted(self.tree[0], [group, group + 1])
        return [tuple(t) for t in self.tree[1:, lo:hi].T.tolist()]

    def count(self, node: int) -> int:
        return int(self.counts[node])


def _listed_nodes(start: int, ties: Sequence[tuple[int, ...]], index: GroupIndex) -> list[int]:
    """The looks a group line lists, in order: breadth first over its tree from its smallest look (neighbours
    by index), until they hold GROUP_SIZE images; each after the first is tied to one before it."""
    around: dict[int, list[int]] = {}
    for i, j, *_ in ties:
        around.setdefault(i, []).append(j)
        around.setdefault(j, []).append(i)
    out, seen, images = [start], {start}, index.count(start)
    at = 0
    while at < len(out) and images < GROUP_SIZE:
        for other in sorted(around.get(out[at], ())):
            if other not in seen and images < GROUP_SIZE:
                seen.add(other)
                out.append(other)
                images += index.count(other)
        at += 1
    return out


# ---- the steps ---------------------------------------------------------------------------------


def chosen_index_parts(results: Sequence[ShardResult]) -> list[str]:
    """The index parts of the shards finalize publishes (one result per shard, as ``choose_results``)."""
    return sorted(r.index_path for r in choose_results(results).values() if r.index_path and r.records)


def part_looks(part: str) -> Iterator[Any]:
    """An index part → its distinct looks and their image counts (KEY array, counts), and (tagged "counted")
    (hashed, unhashed): a record without both hashes (an older index, --near-duplicates off) is unhashed."""
    hashes, unhashed = [], 0
    for entry in read_index(part):
        full = entry_hash(entry)
        if len(full) == FULL:
            hashes.append(key_of(full))
        else:
            unhashed += 1
    yield beam.pvalue.TaggedOutput("counted", (len(hashes), unhashed))
    if hashes:
        yield distinct(np.array(hashes, dtype=KEY), np.ones(len(hashes), np.int64))


def distinct(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct looks with their counts summed."""
    unique, inverse = np.unique(keys, return_inverse=True)
    return unique, np.bincount(inverse.reshape(-1), weights=counts, minlength=len(unique)).astype(np.int64)


class AllLooks(beam.CombineFn):  # type: ignore[misc]
    """(looks, counts) batches, or one image's 48 hex digits each → every distinct look and its images, sorted
    (32 bytes a look)."""

    def create_accumulator(self) -> list[Any]:
        return []

    def add_input(self, acc: list[Any], batch: Any) -> list[Any]:
        if isinstance(batch, str):
            batch = (np.array([key_of(batch)], dtype=KEY), np.ones(1, np.int64))
        acc.append(batch)
        if len(acc) > 1024:
            acc[:] = [self._merged(acc)]
        return acc

    def merge_accumulators(self, accs: Iterable[list[Any]]) -> list[Any]:
        batches = [b for acc in accs for b in acc]
        return [self._merged(batches)] if batches else []

    def extract_output(self, acc: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        return self._merged(acc) if acc else (np.zeros(0, KEY), np.zeros(0, np.int64))

    @staticmethod
    def _merged(batches: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        return distinct(np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))


def find_groups(looks: tuple[np.ndarray, np.ndarray], max_distance: int) -> GroupIndex:
    keys, counts = looks
    return GroupIndex(keys, counts, search(keys, counts, max_distance))


def members_of_part(part: str, index: GroupIndex) -> list[tuple[int, Any]]:
    """An index part → (group, its members here: GroupMembers' accumulator) for each group it holds images of;
    nothing, and the part not read again, when there are no groups."""
    if not len(index.keys):
        return []
    entries = [(e["path"], e["split"], full) for e in read_index(part) if len(full := entry_hash(e)) == FULL]
    keys = np.array([key_of(full) for _, _, full in entries], dtype=KEY)
    groups, nodes = index.lookup(keys)
    here: dict[int, list[Any]] = {}
    for at in np.flatnonzero(groups >= 0).tolist():
        path, split, _ = entries[at]
        node = int(nodes[at])
        here.setdefault(int(groups[at]), []).append((node if index.listed[node] else -1, path, split))
    return [(group, GroupMembers.of(members)) for group, members in sorted(here.items())]


class GroupMembers(beam.CombineFn):  # type: ignore[misc]
    """One group's images → (count, {split: n}, {listed look: its GROUP_SIZE smallest (path, split)}): the looks
    its line will not list are counted, not kept (GroupIndex.listed), so a group of a million images is small."""

    @staticmethod
    def of(members: Iterable[tuple[int, str, str]]) -> Any:
        acc = GroupMembers().create_accumulator()
        for member in members:
            acc = GroupMembers._add(acc, member)
        return acc

    def create_accumulator(self) -> Any:
        return 0, {}, {}

    @staticmethod
    def _add(acc: Any, member: tuple[int, str, str]) -> Any:
        """``member``: (look, path, split); look -1 for a look the line will not list: counted only."""
        count, splits, looks = acc
        node, path, split = member
        splits[split] = splits.get(split, 0) + 1
        if node < 0:
            return count + 1, splits, looks
        kept = looks.setdefault(node, [])
        kept.append((path, split))
        if len(kept) > 2 * GROUP_SIZE:
            kept[:] = heapq.nsmallest(GROUP_SIZE, kept)
        return count + 1, splits, looks

    def add_input(self, acc: Any, partial: Any) -> Any:
        """Its inputs are accumulators already: one per index part (``members_of_part``)."""
        return self.merge_accumulators([acc, partial])

    def merge_accumulators(self, accs: Iterable[Any]) -> Any:
        count, splits, looks = 0, {}, {}
        for n, s, k in accs:
            count += n
            for split, m in s.items():
                splits[split] = splits.get(split, 0) + m
            for node, kept in k.items():
                looks[node] = heapq.nsmallest(GROUP_SIZE, set(looks.get(node, [])) | set(map(tuple, kept)))
        return count, splits, looks

    def extract_output(self, acc: Any) -> Any:
        count, splits, looks = acc
        return (
            count,
            dict(sorted(splits.items())),
            {n: sorted(set(map(tuple, k)))[:GROUP_SIZE] for n, k in looks.items()},
        )


def group_line(element: tuple[int, Any], index: GroupIndex) -> dict[str, Any]:
    """(group, members) → its line: the listed paths, how many images in all and per split, the ties that join
    the listed images (a tree, closest first), and how sure the group is (its least sure tie)."""
    group, (count, splits, looks) = element
    tree = index.ties(group)
    listed_nodes = _listed_nodes(group, tree, index) if tree else [group]
    first = {node: looks[node][0][0] for node in listed_nodes if looks.get(node)}
    listed: list[str] = []
    ties: list[dict[str, Any]] = []
    for node in listed_nodes:
        for path, _ in looks.get(node, [])[: GROUP_SIZE - len(listed)]:
            listed.append(path)
            if path != first[node]:
                ties.append(_tie(first[node], path, 0, 0, 0, 2))
    for i, j, d, dd, dc, level in tree:
        if i in first and j in first:
            ties.append(_tie(first[i], first[j], d, dd, dc, level))
    ties.sort(key=lambda t: (t["distance"], t["dhash"], t["colour"], t["a"], t["b"]))
    level = min((LEVELS.index(t["confidence"]) for t in ties), default=2)
    return {
        "group": sorted(listed),
        "images": count,
        "splits": splits,
        "confidence": LEVELS[level],
        "ties": ties,
    }


def _tie(a: str, b: str, d: int, dd: int, dc: int, level: int) -> dict[str, Any]:
    a, b = sorted((a, b))
    return {"a": a, "b": b, "distance": d, "dhash": dd, "colour": dc, "confidence": LEVELS[level]}


def header_line(max_distance: int) -> dict[str, Any]:
    """near_duplicates.jsonl's first line: its format and what the groups were found with."""
    return {
        "near_duplicates": FORMAT,
        "hash": HASH_NAME,
        "confirm": CONFIRM_NAME,
        "max_distance": max_distance,
        "group_size": GROUP_SIZE,
    }


def line_key(line: Mapping[str, Any]) -> tuple[str, str]:
    """What near_duplicates.jsonl is sorted by: the header first, a group's (first path, ""), an old file's
    pair (a, b)."""
    if "near_duplicates" in line:
        return "", ""
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
    """The lines of sorted parts (or of whole files, either format), merged in order: (line_key, raw line);
    one line per part in memory."""

    def lines(part: str) -> Iterator[tuple[tuple[str, str], bytes]]:
        with open_lines(part) as fh:
            for raw in fh:
                if raw.strip():
                    yield line_key(json.loads(raw)), raw

    return heapq.merge(*(lines(p) for p in sorted(set(parts))), key=lambda kv: kv[0])


def merge_parts(parts: Sequence[str], dest: str, max_distance: int = DEFAULT_DISTANCE) -> None:
    """The header line, then the sorted parts merged into one sorted file (``merged``)."""
    with FileSystems.create(dest, compression_type="uncompressed") as out:
        out.write(_dumps(header_line(max_distance)).encode("utf-8"))
        for _, raw in merged(parts):
            out.write(raw)


def groups_of_file(lines: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    """The groups of a near_duplicates.jsonl of either format: a version 1 file's pairs become groups of two
    (its crowds are groups already); the header is skipped."""
    for line in lines:
        if "near_duplicates" in line:
            continue
        if "group" in line:
            yield dict(line)
        elif "a" in line:
            yield {
                "group": [line["a"], line["b"]],
                "images": 2,
                "splits": dict(sorted(collections.Counter([line["split_a"], line["split_b"]]).items())),
                "confidence": "likely",
                "ties": [_tie(line["a"], line["b"], line["distance"], -1, -1, 0)],
            }


class CountGroups(beam.CombineFn):  # type: ignore[misc]
    """Group lines → dataset.json's counts: groups by the splits they span, images in groups, groups per
    confidence, and the images outside each group's first split (what drop-leaks drops)."""

    def create_accumulator(self) -> dict[str, Any]:
        return {"groups": {}, "confidence": {}, "images": 0, "across": 0, "leaking": 0}

    def add_input(self, acc: dict[str, Any], line: Mapping[str, Any]) -> dict[str, Any]:
        key = splits_key(line["splits"])
        acc["groups"][key] = acc["groups"].get(key, 0) + 1
        acc["confidence"][line["confidence"]] = acc["confidence"].get(line["confidence"], 0) + 1
        acc["images"] += line["images"]
        if len(line["splits"]) > 1:
            acc["across"] += 1
            keep = first_split(line["splits"])
            acc["leaking"] += sum(n for s, n in line["splits"].items() if s != keep)
        return acc

    def merge_accumulators(self, accs: Iterable[dict[str, Any]]) -> dict[str, Any]:
        out = self.create_accumulator()
        for acc in accs:
            for kind in ("groups", "confidence"):
                for key, n in acc[kind].items():
                    out[kind][key] = out[kind].get(key, 0) + n
            for kind in ("images", "across", "leaking"):
                out[kind] += acc[kind]
        return out

    def extract_output(self, acc: dict[str, Any]) -> dict[str, Any]:
        groups = dict(sorted(acc["groups"].items(), key=lambda kv: _key_rank(kv[0])))
        confidence = {level: acc["confidence"][level] for level in reversed(LEVELS) if level in acc["confidence"]}
        return {**acc, "groups": groups, "confidence": confidence}


def _key_rank(key: str) -> tuple[Any, ...]:
    return tuple(split_rank(s) for s in key.split("+"))


def summary_block(
    max_distance: int, counts: Mapping[str, Any], hashed: int, unhashed: int, large_runs: int
) -> dict[str, Any]:
    """dataset.json's ``near_duplicates``."""
    return {
        "format": FORMAT,
        "hash": HASH_NAME,
        "confirm": CONFIRM_NAME,
        "max_distance": max_distance,
        "file": NEAR_DUPLICATES_JSONL,
        "images_hashed": hashed,
        "images_unhashed": unhashed,
        "groups": dict(counts.get("groups", {})),
        "images_in_groups": counts.get("images", 0),
        "confidence": dict(counts.get("confidence", {})),
        "across_splits": counts.get("across", 0),
        "images_outside_first_split": counts.get("leaking", 0),
        "large_runs": large_runs,
    }


def _summarize(
    _: Any, max_distance: int, counts: Mapping[str, Any], hashed: Sequence[tuple[int, int]], index: GroupIndex
) -> dict[str, Any]:
    return summary_block(max_distance, counts, sum(h for h, _ in hashed), sum(u for _, u in hashed), index.large_runs)


def group_index(looks: beam.PCollection, max_distance: int) -> beam.pvalue.AsSingleton:
    """(looks, counts) batches → the GroupIndex, as a side input."""
    return beam.pvalue.AsSingleton(
        looks | "AllLooks" >> beam.CombineGlobally(AllLooks()) | "Search" >> beam.Map(find_groups, max_distance)
    )


class FindNearDuplicates(beam.PTransform):  # type: ignore[misc]
    """Shard results → {"parts": sorted part file paths, "summary": one dict (dataset.json's block)}."""

    def __init__(self, staging: str, max_distance: int) -> None:
        super().__init__()
        self._staging = staging
        self._max = max_distance

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, results: beam.PCollection) -> dict[str, beam.PCollection]:
        p = results.pipeline
        parts = (
            results
            | "AllShardResults" >> beam.combiners.ToList()
            | "ChosenIndexParts" >> beam.FlatMap(chosen_index_parts)
            | "SpreadIndexParts" >> beam.Reshuffle()
        )
        looks = parts | "PartLooks" >> beam.FlatMap(part_looks).with_outputs("counted", main="looks")
        index = group_index(looks.looks, self._max)
        lines = (
            parts
            | "GroupMembersPerPart" >> beam.FlatMap(members_of_part, index)
            | "GroupMembers" >> beam.CombinePerKey(GroupMembers())
            | "GroupLines" >> beam.Map(group_line, index)
        )
        written = (
            lines
            | "PartBucket" >> beam.Map(lambda line: (part_bucket(line), line))
            | "GroupParts" >> beam.GroupByKey()
            | "WriteParts" >> beam.ParDo(WritePartFn(self._staging))
        )
        counts = lines | "CountGroups" >> beam.CombineGlobally(CountGroups())
        summary = (
            p
            | "OneSummary" >> beam.Create([None])
            | "Summarize"
            >> beam.Map(
                _summarize,
                self._max,
                beam.pvalue.AsSingleton(counts),
                beam.pvalue.AsList(looks.counted),
                index,
            )
        )
        return {"parts": written, "summary": summary}


def block_lines(near: Mapping[str, Any]) -> tuple[str, list[tuple[str, int]]]:
    """dataset.json's ``near_duplicates`` (this format or a version 1 block of pairs) as a phrase and its
    across-splits counts: what the summary, ``inspect`` and the report say."""
    if near.get("format") != FORMAT:  # version 1: pairs and crowds
        pairs = near.get("pairs") or {}
        across = [(k, n) for k, n in pairs.items() if "/" in k]
        crowds = sum((near.get("groups") or {}).values())
        text = f"{sum(pairs.values()):,} pairs, {sum(n for _, n in across):,} across splits"
        return text + (f", {crowds:,} crowds of 100+ copies" if crowds else ""), across
    groups = near.get("groups") or {}
    across = [(k, n) for k, n in groups.items() if "+" in k]
    sure = {k: n for k, n in (near.get("confidence") or {}).items() if n}
    text = (
        f"{sum(groups.values()):,} groups of {near.get('images_in_groups', 0):,} images, "
        f"{sum(n for _, n in across):,} across splits"
    )
    if across:
        text += f" ({near.get('images_outside_first_split', 0):,} images outside their group's first split)"
    if sure:
        text += "; " + ", ".join(f"{n:,} {k}" for k, n in sure.items())
    return text, across
