"""What every annotation source's join shares: the output tags, the tagged join, the counters and their sum.

A source (``coco.JoinCoco``, ``voc.JoinVoc``) turns its files into
(relative path, (tag, per-image annotations)) pairs, joins them to the listed
images by that path (``keyed_ref``, ``join_tagged``) and returns
``{"refs", REJECTS, OBJECT_REJECTS, SKIPPED, COUNTS}``; ``Counts`` and
``sum_counts`` make the COUNTS the rest of the pipeline (finalize's
``objects`` block) reads, the same for every source.

Why not ``beam.CoGroupByKey``: it adds a tagging Map per input, a Flatten and
a merging Map around its GroupByKey, each a Python hop per element on the
local runner. Here the keying step tags its own output, and the DoFn after
the GroupByKey splits the tags (``untag``). Counters are summed inside the
DoFns that see each image and leave once per bundle (``Counts``), not as one
element per image: a retried bundle's outputs are discarded with it, so the
sums stay exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

OBJECT_REJECTS = "object_rejects"
COUNTS = "counts"
REFS = "refs"  # the listed images' tag in a join_tagged input

# dataset.json "objects" counters (besides the per-reason object rejects)
OBJECTS_KEPT = "kept"
IMAGES_WITHOUT_OBJECTS = "images_without_annotations"
IMAGES_ALL_REJECTED = "images_with_every_object_rejected"


def image_counters(given: int, kept: int) -> list[str]:
    """The image counter an annotated image adds (COUNTS): none of its own objects, or every one rejected."""
    if given == 0:
        return [IMAGES_WITHOUT_OBJECTS]
    return [IMAGES_ALL_REJECTED] if kept == 0 else []


def record_counts(annotations: Any) -> list[tuple[str, int]]:
    """The counters a written record adds: its objects kept, and its image counter. Counted where records are
    written, so an image the writer rejects (its size, its decode, its masks) counts neither."""
    objects = getattr(annotations, "objects", None)
    if objects is None:  # no annotations, or a semantic mask
        return []
    kept = len(objects)
    given = annotations.given if annotations.given is not None else kept
    return [(OBJECTS_KEPT, kept), *((counter, 1) for counter in image_counters(given, kept))]


def keyed_ref(ref: Any) -> tuple[str, tuple[str, Any]]:
    """A listed image keyed by its path relative to --input (the key annotation files are joined on), tagged REFS."""
    return (ref.relpath, (REFS, ref))


def join_tagged(label: str, *keyed: beam.PCollection) -> beam.PCollection:
    """(key, (tag, value)) collections → (key, [(tag, value), ...]): CoGroupByKey's grouping without its hops."""
    flat = keyed[0] if len(keyed) == 1 else keyed | f"{label}Inputs" >> beam.Flatten()
    return flat | label >> beam.GroupByKey()


def untag(values: Iterable[tuple[str, Any]], *tags: str) -> tuple[list[Any], ...]:
    """A join_tagged group's values split by tag, in ``tags``' order (each list in the group's order)."""
    split: dict[str, list[Any]] = {tag: [] for tag in tags}
    for tag, value in values:
        split[tag].append(value)
    return tuple(split[tag] for tag in tags)


class Counts:
    """One bundle's counter sums, held by a DoFn (reset in start_bundle) and emitted by its finish_bundle.

    A few (counter, n) elements per bundle instead of one per image or object reject.
    """

    def __init__(self) -> None:
        self._sums: Counter[str] = Counter()

    def reset(self) -> None:
        self._sums = Counter()

    def add(self, counter: str, n: int = 1) -> None:
        self._sums[counter] += n

    def emit(self) -> Iterator[beam.pvalue.TaggedOutput]:
        """The sums as COUNTS outputs of finish_bundle (which needs WindowedValues; the job is globally windowed)."""
        for counter, n in sorted(self._sums.items()):
            yield beam.pvalue.TaggedOutput(COUNTS, WindowedValue((counter, n), MIN_TIMESTAMP, (GlobalWindow(),)))
        self._sums = Counter()


class CountingDoFn(beam.DoFn):
    """A DoFn whose counters (``self._counts``, a Counts) leave once per bundle, from its finish_bundle.

    Subclasses call ``super().__init__()`` and add to ``self._counts`` in ``process``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._counts = Counts()

    def start_bundle(self) -> None:
        self._counts.reset()

    def finish_bundle(self) -> Iterator[beam.pvalue.TaggedOutput]:
        yield from self._counts.emit()


def sum_counts(*counts: beam.PCollection) -> beam.PCollection:
    """(counter, n) of every DoFn's Counts, summed: objects kept, image counters, object rejects by reason."""
    flat = counts[0] if len(counts) == 1 else counts | "AllObjectCounts" >> beam.Flatten()
    return flat | "SumObjectCounts" >> beam.CombinePerKey(sum)
