"""``--near-duplicates drop-leaks``: in every near-duplicate group that spans splits, the images outside the
group's first split (train, then validation, then test) become ``near_duplicate_leak`` rejects before the
shards are planned (docs/leakage.md).

Shards are planned on the refs' bytes, so the leaks must be known first: each listed image is read and
checked once more here, at the check's 1/8 scale for a JPEG, and hashed (an unchanged file of an
``--incremental-from`` night keeps its previous hashes unread). The hashes go through the same search as the
report (``near_duplicates.search``), so the groups are the report's. Only refs and hashes cross the shuffles.
The kept refs are exactly those of a run over the input without the leaked files, so its shards are the
same bytes, whatever the order or the engine.

    kept, rejects = refs | DropLeaks(image_options, max_distance)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.typehints.decorators import no_annotations

from .images.options import ImageOptions, Rejected
from .images.phash import FULL
from .near_duplicates import KEY, GroupIndex, first_split, group_index, key_of
from .sources.rules import REJECTS
from .vocab.reasons import NEAR_DUPLICATE_LEAK
from .vocab.refs import Ref, as_ref, reject


class HashRefFn(beam.DoFn):  # type: ignore[misc]
    """Ref → (phash, (relpath, split)); nothing for a file that cannot be read or checked (the writer rejects it
    with its reason later). ``reuse``: the previous night's records may be reused (index.reusable_run: same
    code, so the same hash), so an unchanged file keeps its hash, and one it rejected for its bytes stays out."""

    def __init__(self, options: ImageOptions, reuse: bool = False) -> None:
        self._options = options
        self._reuse = reuse

    def process(self, ref: Ref) -> Iterator[tuple[str, tuple[str, str]]]:
        from .index import Previous, PreviousReject

        previous = ref.previous if self._reuse else None
        if isinstance(previous, PreviousReject):
            return  # rejected again unread by the writer: never a record, so never a leak's other side
        reused = previous.phash if isinstance(previous, Previous) and previous.phash else None
        full = reused if reused and len(reused) == FULL else self._hash(ref)
        if full and len(full) == FULL:
            yield full, (ref.relpath, ref.split)

    def _hash(self, ref: Ref) -> str | None:
        from .images.check import _decode, _open, _quietly
        from .images.convert import needs_full_decode
        from .images.phash import perceptual_hash
        from .storage import permanent_reason, read_bytes

        try:
            data = read_bytes(ref.path, ref.size, self._options)
        except Rejected:
            return None
        except Exception as e:
            if permanent_reason(e) is None:
                raise  # transient: the runner retries the bundle
            return None

        def check_and_hash() -> str | None:
            img, tf_reading, _ = _open(data, self._options)
            _decode(img, pixels=needs_full_decode(img, tf_reading, self._options))  # as the writer will
            return perceptual_hash(img)

        try:
            return _quietly(check_and_hash)
        except Rejected:
            return None


def grouped_image(element: tuple[str, tuple[str, str]], index: GroupIndex) -> Iterator[tuple[int, tuple[str, str]]]:
    """(hashes, (relpath, split)) → (its group, (split, relpath)) for an image in a near-duplicate group."""
    full, (path, split) = element
    group = int(index.groups_of(np.array([key_of(full)], dtype=KEY))[0])
    if group >= 0:
        yield group, (split, path)


class GroupSplits(beam.CombineFn):  # type: ignore[misc]
    """(split, relpath) of a group's images → {split: (images, its smallest path)}."""

    def create_accumulator(self) -> dict[str, tuple[int, str]]:
        return {}

    def add_input(self, acc: dict[str, tuple[int, str]], member: tuple[str, str]) -> dict[str, tuple[int, str]]:
        split, path = member
        n, first = acc.get(split, (0, path))
        acc[split] = (n + 1, min(first, path))
        return acc

    def merge_accumulators(self, accs: Iterable[dict[str, tuple[int, str]]]) -> dict[str, tuple[int, str]]:
        out: dict[str, tuple[int, str]] = {}
        for acc in accs:
            for split, (n, first) in acc.items():
                m, other = out.get(split, (0, first))
                out[split] = (m + n, min(first, other))
        return out

    def extract_output(self, acc: dict[str, tuple[int, str]]) -> dict[str, tuple[int, str]]:
        return dict(sorted(acc.items()))


def leak_of(
    element: tuple[int, tuple[str, str]], spanning: Mapping[int, Mapping[str, tuple[int, str]]]
) -> Iterator[tuple[str, tuple[int, str, str]]]:
    """An image of a group that spans splits, outside the group's first split (train, validation, test) →
    (relpath, (0, the kept split's first image, the reject's detail))."""
    group, (split, path) = element
    splits = spanning.get(group)
    keep = first_split(splits) if splits else split
    if splits and split != keep:
        n, example = splits[keep]
        total = sum(m for m, _ in splits.values())
        detail = f"near-duplicate group of {total} images, {n} of them in {keep} (first: {example})"
        yield path, (0, example, detail)


def keep_or_reject(element: tuple[str, Mapping[str, Iterable[Any]]]) -> Iterator[Any]:
    """(relpath, {"refs", "leaks"}) → the refs, or their leak rejects (tagged REJECTS)."""
    _, grouped = element
    leaks = list(grouped["leaks"])  # at most one: the closest training image
    for ref in grouped["refs"]:
        if leaks:
            yield beam.pvalue.TaggedOutput(REJECTS, reject(ref.path, NEAR_DUPLICATE_LEAK, leaks[0][2]))
        else:
            yield ref


class DropLeaks(beam.PTransform):  # type: ignore[misc]
    """refs → (kept refs, near_duplicate_leak rejects)."""

    def __init__(self, options: ImageOptions, max_distance: int, reuse: bool = False) -> None:
        super().__init__()
        self._options = options
        self._max = max_distance
        self._reuse = reuse  # the previous night's records may be reused (its hashes too)

    @no_annotations  # a dict or tuple of PCollections has no Beam type hint; each PCollection has its own
    def expand(self, refs: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        hashed = refs | "HashImages" >> beam.ParDo(HashRefFn(self._options, self._reuse))
        index = group_index(hashed | "Looks" >> beam.Map(lambda kv: kv[0]), self._max)
        grouped = hashed | "GroupedImages" >> beam.FlatMap(grouped_image, index)
        spanning = (
            grouped
            | "SplitsPerGroup" >> beam.CombinePerKey(GroupSplits())
            | "SpanningGroups" >> beam.Filter(lambda kv: len(kv[1]) > 1)
        )
        leaks = (
            grouped
            | "Leaks" >> beam.FlatMap(leak_of, beam.pvalue.AsDict(spanning))
            | "OneLeakPerImage" >> beam.CombinePerKey(min)
        )
        by_path = refs | "RefsByPath" >> beam.Map(lambda ref: (ref.relpath, ref)).with_output_types(tuple[str, Ref])
        out = (
            {"refs": by_path, "leaks": leaks}
            | "JoinLeaks" >> beam.CoGroupByKey()
            | "KeepOrReject" >> beam.FlatMap(keep_or_reject).with_outputs(REJECTS, main="kept")
        )
        return out.kept | "Kept" >> beam.Map(as_ref).with_output_types(Ref), out[REJECTS]
