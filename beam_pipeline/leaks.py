"""``--near-duplicates drop-leaks``: every validation or test image within ``--near-duplicate-distance`` bits of a
training image becomes a ``near_duplicate_leak`` reject before the shards are planned (docs/leakage.md).

Shards are planned on the refs' bytes, so the leaks must be known first: each listed image is read and
checked once more here, at the check's 1/8 scale for a JPEG, and hashed (an unchanged file of an
``--incremental-from`` night keeps its previous hash unread). The hashes go through the same join as the
report (``near_duplicates.NearDuplicateLines``); a leak is the non-train side of a pair across train and
another split, or a non-train image whose hash a crowd shares with train images. Only refs and hashes cross
the shuffles. The kept refs are exactly those of a run over the input without the leaked files, so its
shards are the same bytes, whatever the order or the engine.

    kept, rejects = refs | DropLeaks(image_options, max_distance)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.typehints.decorators import no_annotations

from .images.options import ImageOptions, Rejected
from .near_duplicates import NearDuplicateLines
from .sources.rules import REJECTS
from .vocab.reasons import NEAR_DUPLICATE_LEAK
from .vocab.refs import Ref, reject

TRAIN = "train"


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
        phash = previous.phash if isinstance(previous, Previous) and previous.phash else self._hash(ref)
        if phash:
            yield phash, (ref.relpath, ref.split)

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


def leaks_of(line: Mapping[str, Any]) -> Iterator[tuple[str, tuple[int, str, str]]]:
    """(leaked path, (distance, training image, the reject's detail)) of a pair across train and another split."""
    if "group" in line:
        return
    for mine, theirs in (("b", "a"), ("a", "b")):
        if line[f"split_{theirs}"] == TRAIN and line[f"split_{mine}"] != TRAIN:
            other, d = line[theirs], line["distance"]
            yield line[mine], (d, other, f"near-duplicate of {other} (train), {d} bits apart")


def crowd_leaks(
    element: tuple[str, tuple[str, str]], crowds: Mapping[str, Mapping[str, int]]
) -> Iterator[tuple[str, tuple[int, str, str]]]:
    """A non-train image whose hash a crowd (over 100 images of one hash) shares with train images."""
    phash, (path, split) = element
    splits = crowds.get(phash)
    if splits and split != TRAIN and splits.get(TRAIN):
        detail = f"one of {sum(splits.values())} images of one perceptual hash, {splits[TRAIN]} of them in train"
        yield path, (0, "", detail)


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
        found = hashed | "Join" >> NearDuplicateLines(self._max)
        crowds = beam.pvalue.AsDict(found["crowd_hashes"])
        leaks = (
            (
                found["lines"] | "PairLeaks" >> beam.FlatMap(leaks_of),
                hashed | "CrowdLeaks" >> beam.FlatMap(crowd_leaks, crowds),
            )
            | "AllLeaks" >> beam.Flatten()
            | "ClosestTrainImage" >> beam.CombinePerKey(min)
        )
        by_path = refs | "RefsByPath" >> beam.Map(lambda ref: (ref.relpath, ref))
        out = (
            {"refs": by_path, "leaks": leaks}
            | "JoinLeaks" >> beam.CoGroupByKey()
            | "KeepOrReject" >> beam.FlatMap(keep_or_reject).with_outputs(REJECTS, main="kept")
        )
        return out.kept, out[REJECTS]
