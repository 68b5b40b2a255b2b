"""What every annotation source's join shares: the output tags, the counters and their sum.

A source (``coco.JoinCoco``, ``voc.JoinVoc``) turns its files into
(relative path, per-image annotations) pairs, joins them to the listed
images by that path (``keyed_ref``) and returns
``{"refs", REJECTS, OBJECT_REJECTS, SKIPPED, COUNTS}``; ``count_objects``
makes the COUNTS the rest of the pipeline (finalize's ``objects`` block)
reads, the same for every source.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam

OBJECT_REJECTS = "object_rejects"
COUNTS = "counts"

# dataset.json "objects" counters (besides the per-reason object rejects)
OBJECTS_KEPT = "kept"
IMAGES_WITHOUT_OBJECTS = "images_without_annotations"
IMAGES_ALL_REJECTED = "images_with_every_object_rejected"


def image_counters(given: int, kept: int) -> list[str]:
    """The image counter an annotated image adds (COUNTS): none of its own objects, or every one rejected."""
    if given == 0:
        return [IMAGES_WITHOUT_OBJECTS]
    return [IMAGES_ALL_REJECTED] if kept == 0 else []


def keyed_ref(ref: Any) -> tuple[str, Any]:
    """A listed image keyed by its path relative to --input: the key annotation files are joined on."""
    return (ref.relpath, ref)


def count_objects(
    refs: beam.PCollection, image_counts: beam.PCollection, object_rejects: beam.PCollection
) -> beam.PCollection:
    """(counter, n) summed: objects kept (on the joined refs), image counters (names), object rejects by reason."""
    kept = refs | "ObjectsKept" >> beam.Map(lambda r: (OBJECTS_KEPT, len(r.annotations.objects)))
    images = image_counts | "ImageCounts" >> beam.Map(lambda name: (name, 1))
    reasons = object_rejects | "ObjectRejectReason" >> beam.Map(lambda r: (r["reason"], 1))
    return (kept, images, reasons) | "AllObjectCounts" >> beam.Flatten() | "SumObjectCounts" >> beam.CombinePerKey(sum)
